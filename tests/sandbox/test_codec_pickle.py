"""The codec against pickle's semantics: a state encoded and decoded is the state
``pickle.loads(pickle.dumps(state))`` gives, in iteration order, identity (aliasing, cycles),
time zones, bound methods' targets, back-references to the environment instance and depth. A
property test compares the two on random object graphs with sharing."""

from __future__ import annotations

import collections
import datetime as dt
import json
import pickle
import sys
import types
from collections.abc import Iterator
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sandbox.state.encoder
from sandbox.state.decoder import decode
from sandbox.state.encoder import encode_state
from sandbox.state.view import view, view_encoded
from sandbox.wire import protocol

ENV_MODULE = "ef_env_pickle_test"

ENV_SOURCE = '''
class Obj:
    def __init__(self, **attributes):
        self.__dict__.update(attributes)

    def poke(self, value):
        self.poked = value
        return self


class Env:
    def __init__(self):
        self.total = 0
        self.handlers = {"add": self._add}
        self.accounts = {}

    def _add(self, n):
        self.total += n
        return self.total

    def __private(self):
        return self.total


class Account:
    def __init__(self, bank, name):
        self.bank = bank
        self.name = name


class Registry(dict):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.label = "registry"


class Stack(list):
    pass


class Node:
    def __init__(self, value, next=None):
        self.value = value
        self.next = next
        self.prev = None
'''


@pytest.fixture(scope="module")
def env() -> Iterator[types.ModuleType]:
    module = types.ModuleType(ENV_MODULE)
    sys.modules[ENV_MODULE] = module
    exec(compile(ENV_SOURCE, f"<{ENV_MODULE}>", "exec"), module.__dict__)
    yield module
    del sys.modules[ENV_MODULE]


def _resolve(qualname: str) -> Any:
    target: Any = sys.modules[ENV_MODULE]
    for part in qualname.split("."):
        target = getattr(target, part)
    return target


def codec_trip(state: Any, owner: Any = None, into: Any = None) -> Any:
    text = encode_state(state, ENV_MODULE, owner) if owner is not None else encode_state(state, ENV_MODULE)
    assert protocol.depth_within(json.loads(text), 400)  # flat blocks below FLAT_DEPTH: JSON stays shallow
    return decode(json.loads(text), _resolve, into) if into is not None else decode(json.loads(text), _resolve)


def pickle_trip(state: Any) -> Any:
    return pickle.loads(pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL))


_ATOMS = (str, int, float, bool, type(None), bytes, dt.datetime, dt.date, dt.time, dt.timedelta, type)


def assert_same_graph(a: Any, b: Any) -> None:
    """``a`` and ``b`` are the same graph: the same types, values, iteration orders, and the same
    identity structure (an object met twice in one is met twice, at the same places, in the
    other). Walked with a stack: graphs may be deep."""
    pairs: dict[int, int] = {}
    back: dict[int, int] = {}
    keep: list[Any] = []
    todo = [(a, b, "")]
    while todo:
        x, y, at = todo.pop()
        assert type(x) is type(y), (at, type(x), type(y))
        if isinstance(x, _ATOMS) or isinstance(x, type) or (type(x) in (tuple, frozenset) and not x):
            assert x == y, at
            if isinstance(x, (dt.datetime, dt.time)):
                assert repr(x.tzinfo) == repr(y.tzinfo) and x.fold == y.fold, at
            continue
        if id(x) in pairs or id(y) in back:
            assert pairs.get(id(x)) == id(y) and back.get(id(y)) == id(x), f"identity differs at {at}"
            continue
        pairs[id(x)], back[id(y)] = id(y), id(x)
        keep += [x, y]
        children: list[tuple[Any, Any, str]] = []
        if isinstance(x, (list, tuple, collections.deque, set, frozenset)):
            assert len(x) == len(y), at
            children = [(p, q, f"{at}/{i}") for i, (p, q) in enumerate(zip(x, y, strict=True))]
            if isinstance(x, collections.deque):
                assert x.maxlen == y.maxlen, at
        elif isinstance(x, dict):
            assert len(x) == len(y), at
            for i, ((k1, v1), (k2, v2)) in enumerate(zip(x.items(), y.items(), strict=True)):
                children += [(k1, k2, f"{at}/key{i}"), (v1, v2, f"{at}/{k1!r}")]
            if isinstance(x, collections.defaultdict):
                children.append((x.default_factory, y.default_factory, f"{at}/factory"))
        elif isinstance(x, (types.MethodType, types.BuiltinMethodType)):
            assert x.__name__ == y.__name__ and getattr(x, "__func__", None) is getattr(y, "__func__", None), at
            children = [(x.__self__, y.__self__, f"{at}/__self__")]
        elif hasattr(x, "__dict__"):
            children = [(vars(x), vars(y), f"{at}/__dict__")]
        else:
            assert x == y, at
        todo.extend(reversed(children))


def assert_like_pickle(state: Any) -> Any:
    back = codec_trip(state)
    assert_same_graph(back, pickle_trip(state))
    return back


# --- each construct -------------------------------------------------------------------


def test_set_iteration_order_is_kept() -> None:
    members = {8}
    members.add(0)
    assert list(members) == [8, 0]
    back = assert_like_pickle({"members": members, "tags": frozenset(members)})
    assert next(iter(back["members"])) == 8 and list(back["tags"]) == list(frozenset(members))


def test_dict_order_is_kept_for_any_keys() -> None:
    state: dict[str, Any] = {"z": 1, "a": 2, "plain": {"b": 1, "a": 2},
             "mixed": {3: "x", "k": "y", (1, 2): "z", 1.5: "w", None: 0, frozenset({2, 1}): 1},
             "ints": {10: 0, 2: 1, 7: 2}}
    back = assert_like_pickle(state)
    assert list(back) == list(state)
    assert list(back["mixed"]) == list(state["mixed"]) and list(back["ints"]) == [10, 2, 7]


def test_named_time_zones_keep_their_rules_and_names() -> None:
    new_york = dt.datetime(2024, 1, 15, 9, 0, tzinfo=ZoneInfo("America/New_York"))
    est = dt.datetime(2024, 1, 15, 9, 0, tzinfo=dt.timezone(dt.timedelta(hours=-5), "EST"))
    unnamed = dt.datetime(2024, 1, 15, 9, 0, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    ambiguous = dt.datetime(2024, 11, 3, 1, 30, fold=1, tzinfo=ZoneInfo("America/New_York"))
    alarm = dt.time(7, 30, tzinfo=ZoneInfo("Europe/Paris"))
    state = {"ny": new_york, "est": est, "unnamed": unnamed, "utc": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
             "ambiguous": ambiguous, "alarm": alarm, "naive_fold": dt.datetime(2024, 1, 1, fold=1)}
    back = assert_like_pickle(state)
    pickled = pickle_trip(state)
    later = back["ny"] + dt.timedelta(days=180)
    assert later.utcoffset() == (pickled["ny"] + dt.timedelta(days=180)).utcoffset() == dt.timedelta(hours=-4)
    assert later.isoformat().endswith("-04:00") and later.tzname() == "EDT"
    assert back["est"].strftime("%Z") == "EST" and back["unnamed"].strftime("%Z") == "UTC+02:00"
    assert back["utc"].tzinfo is dt.UTC
    assert back["ambiguous"].fold == 1 and back["ambiguous"].utcoffset() == dt.timedelta(hours=-5)
    assert back["alarm"].tzinfo is ZoneInfo("Europe/Paris")
    assert view_encoded(json.loads(encode_state(state))) == view(state)


def test_other_tzinfo_classes_are_pickled() -> None:
    class Fixed(dt.tzinfo):
        def utcoffset(self, moment: Any) -> dt.timedelta:
            return dt.timedelta(hours=1)

    moment = dt.datetime(2024, 1, 1, tzinfo=ZoneInfo.no_cache("Europe/Paris"))
    encoded = json.loads(encode_state({"m": moment}))
    assert encoded["m"]["$ef"] == "pickle"
    assert decode(encoded)["m"] == moment
    with pytest.raises(sandbox.state.encoder.CodecError):  # a local class: pickle refuses it, as before
        encode_state({"m": dt.datetime(2024, 1, 1, tzinfo=Fixed())})  # type: ignore[abstract]


def test_bound_methods_stay_bound_to_the_rebuilt_objects(env: types.ModuleType) -> None:
    target = env.Obj(count=1)
    other = env.Obj()
    state = {"target": target, "hooks": {"poke": target.poke, "append": other.poke}, "same": [target.poke] * 2,
             "pushes": [].append}
    back = assert_like_pickle(state)
    assert back["hooks"]["poke"].__self__ is back["target"]
    back["hooks"]["poke"](5)
    assert back["target"].poked == 5
    assert back["same"][0] is back["same"][1]
    pushes = back["pushes"]
    pushes(3)
    assert pushes.__self__ == [3]


def test_the_instance_is_a_node_of_its_own_graph(env: types.ModuleType) -> None:
    """Back-references and bound methods of the environment instance decode to the instance being
    rebuilt, as in pickle's round trip of the instance itself."""
    bank = env.Env()
    bank.accounts["a"] = env.Account(bank, "a")
    bank.me = bank
    bank.hooks = [bank._add]
    state = dict(vars(bank))
    text = encode_state(state, ENV_MODULE, bank)
    assert '"$ef":"self"' in text
    rebuilt = env.Env.__new__(env.Env)
    rebuilt.__dict__.update(decode(json.loads(text), _resolve, rebuilt))
    pickled = pickle_trip(bank)
    for copy in (rebuilt, pickled):
        assert copy.accounts["a"].bank is copy and copy.me is copy
        assert copy.handlers["add"].__self__ is copy and copy.hooks[0].__self__ is copy
        copy.handlers["add"](4)
        assert copy.total == 4 and copy.hooks[0](1) == 5
    assert_same_graph(vars(rebuilt), vars(pickled))
    shown = view_encoded(json.loads(text))
    assert shown["me"] == {"$ref": ""} and shown["accounts"]["a"]["bank"] == {"$ref": ""}
    assert shown["handlers"]["add"] == "<bound method Env._add>"
    assert shown == view(state, owner=bank)


def test_a_private_method_is_found_by_its_mangled_name(env: types.ModuleType) -> None:
    """(pickle looks the method up by its unmangled name, and fails: the codec does better)"""
    bank = env.Env()
    bank.hooks = [bank._Env__private]
    rebuilt = env.Env.__new__(env.Env)
    rebuilt.__dict__.update(codec_trip(dict(vars(bank)), bank, rebuilt))
    assert rebuilt.hooks[0].__self__ is rebuilt and rebuilt.hooks[0]() == 0


def test_without_the_instance_a_back_reference_is_an_instance_holding_the_state(env: types.ModuleType) -> None:
    """A check decodes the state without an instance: ``acct.bank`` is then one made for it."""
    bank = env.Env()
    bank.accounts["a"] = env.Account(bank, "a")
    back = decode(json.loads(encode_state(dict(vars(bank)), ENV_MODULE, bank)), _resolve)
    made = back["accounts"]["a"].bank
    assert type(made) is env.Env and made.accounts is back["accounts"]
    made.handlers["add"](2)
    assert made.total == 2 and made.handlers["add"].__self__ is made


@pytest.mark.parametrize("holder", ["deque", "odict", "defaultdict", "counter-shared", "tuple", "set-of-tuples"])
def test_aliasing_through_collections_is_kept(holder: str) -> None:
    job: dict[str, Any] = {"id": 1, "done": False}
    held: Any
    if holder == "deque":
        held = collections.deque([job, job], maxlen=5)
    elif holder == "odict":
        held = collections.OrderedDict([("b", job), ("a", [job])])
    elif holder == "defaultdict":
        held = collections.defaultdict(list, {"open": [job]})
    elif holder == "counter-shared":
        counts = collections.Counter(a=2, b=1)
        held = [counts, {"c": counts}]
    elif holder == "tuple":
        held = (job, [job])
    else:
        key = (1, "x")
        held = [{key, (2, "y")}, {key: job}]
    state = {"by_id": {1: job}, "held": held, "again": held}
    back = assert_like_pickle(state)
    assert back["again"] is back["held"]
    if holder in ("deque", "odict", "defaultdict", "tuple"):
        inner = back["held"][0] if holder in ("deque", "tuple") else \
            back["held"]["b"] if holder == "odict" else back["held"]["open"][0]
        assert inner is back["by_id"][1]
    if holder == "defaultdict":
        assert back["held"]["new"] == [] and back["held"].default_factory is list
    if holder == "deque":
        assert back["held"].maxlen == 5


def test_a_collection_on_a_cycle_round_trips() -> None:
    queue: collections.deque[Any] = collections.deque()
    queue.append(queue)
    table: collections.OrderedDict[str, Any] = collections.OrderedDict()
    table["self"] = table
    grouped: collections.defaultdict[str, Any] = collections.defaultdict(list)
    grouped["me"].append(grouped)
    back = assert_like_pickle({"q": queue, "t": table, "g": grouped})
    assert back["q"][0] is back["q"] and back["t"]["self"] is back["t"] and back["g"]["me"][0] is back["g"]


def test_an_environment_subclass_of_dict_or_list_keeps_its_items(env: types.ModuleType) -> None:
    """(stored by its attributes alone, its items were lost: it is pickled, as a whole)"""
    registry = env.Registry(a=1)
    stack = env.Stack([1, 2])
    back = assert_like_pickle({"registry": registry, "stack": stack})
    assert back["registry"] == {"a": 1} and back["registry"].label == "registry" and back["stack"] == [1, 2]


# --- depth ----------------------------------------------------------------------------


def test_a_linked_list_of_100000_nodes_round_trips(env: types.ModuleType) -> None:
    head = None
    for value in range(100_000):
        head = env.Node(value, head)
    back = codec_trip({"head": head})["head"]
    total, count = 0, 0
    while back is not None:
        total, count = total + back.value, count + 1
        back = back.next
    assert count == 100_000 and total == sum(range(100_000))


def test_a_deep_doubly_linked_list_keeps_its_cycles(env: types.ModuleType) -> None:
    head = env.Node(0)
    node = head
    for value in range(1, 10_000):
        node.next = env.Node(value)
        node.next.prev = node
        node = node.next
    back = codec_trip({"head": head, "tail": node})
    assert back["tail"].prev.next is back["tail"]
    node = back["head"]
    for value in range(9_999):
        assert node.next.prev is node and node.value == value
        node = node.next
    assert node is back["tail"]


@pytest.mark.parametrize("shape", ["lists", "dicts", "tuples", "frozensets", "keyed", "deques", "mixed"])
def test_deep_nesting_of_every_container_round_trips(shape: str) -> None:
    value: Any = "leaf"
    for i in range(5_000):
        if shape == "lists":
            value = [value, i]
        elif shape == "dicts":
            value = {"k": value}
        elif shape == "tuples":
            value = (i, value)
        elif shape == "frozensets":
            value = frozenset({value, i})
        elif shape == "keyed":
            value = {(i,): value, i: "x"}
        elif shape == "deques":
            value = collections.deque([value])
        else:
            value = [(value,), {i: collections.OrderedDict(x=value)}] if i % 50 == 0 else [value]
    back = codec_trip({"deep": value})
    if shape != "frozensets":
        assert_same_graph(back, {"deep": value})
        return
    for i in reversed(range(5_000)):  # (a rebuilt frozenset may iterate otherwise than one built by a literal)
        assert len(back["deep"]) == 2 and i in back["deep"]
        back = {"deep": next(m for m in back["deep"] if m != i)}
    assert back["deep"] == "leaf"


def test_a_cycle_through_a_tuple_across_the_flat_cut_round_trips() -> None:
    """A shared tuple is written after its items: a cycle back to it from below the cut is
    written inside the flat block, and the tuple's outer occurrence refers to it there."""
    inner: list[Any] = []
    pair = (inner, "x")
    cursor = inner
    for _ in range(300):
        cursor.append([])
        cursor = cursor[0]
    cursor.append(pair)
    state = {"pair": pair, "again": pair}
    back = codec_trip(state)
    cursor = back["pair"][0]
    for _ in range(300):
        cursor = cursor[0]
    assert cursor[0] is back["pair"] is back["again"]


def test_views_of_deep_states_are_the_views_of_their_values(env: types.ModuleType) -> None:
    head: Any = None
    for value in range(2_000):
        head = env.Node(value, head)
    state = {"head": head, "other": [head.next.next]}
    shown = view_encoded(json.loads(encode_state(state, ENV_MODULE)))
    assert shown == view(state)


def test_states_written_before_still_decode() -> None:
    """Texts of the old format (sorted sets, pickled collections, ids and refs) decode as they did."""
    old = {"s": {"$ef": "set", "v": [0, 8]}, "f": {"$ef": "frozenset", "v": [1, 2]},
           "when": {"$ef": "datetime", "v": "2024-01-15T09:00:00-05:00"},
           "q": {"$ef": "pickle", "v": _b64(pickle.dumps(collections.deque([1, 2]))), "view": "deque([1, 2])"},
           "a": {"$ef": "id", "id": 1, "v": [1]}, "b": {"$ef": "ref", "id": 1}}
    back = decode(old)
    assert back["s"] == {0, 8} and back["f"] == frozenset({1, 2}) and back["q"] == collections.deque([1, 2])
    assert back["when"].utcoffset() == dt.timedelta(hours=-5) and back["a"] is back["b"]
    assert view_encoded(old)["q"] == "deque([1, 2])"


def _b64(raw: bytes) -> str:
    import base64

    return base64.b64encode(raw).decode("ascii")


# --- random graphs --------------------------------------------------------------------

_KINDS = ["list", "dict", "tuple", "set", "frozenset", "deque", "odict", "defaultdict", "counter", "obj", "method"]


@st.composite
def graphs(draw: Any) -> dict[str, Any]:
    """A state whose objects hold earlier ones (sharing) and, for mutable ones, later ones too
    (cycles, through tuples as well). Set members and Counter keys are hashed by value, so that
    the iteration order of a set does not depend on where objects live."""
    module = sys.modules[ENV_MODULE]
    scalars = st.one_of(st.integers(-5, 5), st.text("ab", max_size=2), st.none(), st.booleans(),
                        st.sampled_from([1.5, dt.date(2024, 1, 2), b"x"]))
    nodes: list[Any] = []
    hashed: list[Any] = []  # nodes hashed by value (tuples and frozensets of such)
    count = draw(st.integers(1, 12))
    for _ in range(count):
        kind = draw(st.sampled_from(_KINDS))
        picks = draw(st.lists(st.one_of(scalars, st.integers(0, 1000).map(lambda n: ("node", n))), max_size=4))

        def item(pick: Any, hashable: bool = False) -> Any:
            if type(pick) is tuple and pick[:1] == ("node",):
                pool = hashed if hashable else nodes
                return pool[pick[1] % len(pool)] if pool else 0
            return pick

        node: Any
        if kind == "list":
            node = [item(p) for p in picks]
        elif kind == "dict":
            node = {item(k, True): item(p) for k, p in zip(picks, reversed(picks), strict=True)}
        elif kind == "tuple":
            node = tuple(item(p) for p in picks)
        elif kind in ("set", "frozenset"):
            members = [item(p, True) for p in picks]
            node = set(members) if kind == "set" else frozenset(members)
        elif kind == "deque":
            node = collections.deque((item(p) for p in picks), maxlen=draw(st.sampled_from([None, 10])))
        elif kind == "odict":
            node = collections.OrderedDict((str(i), item(p)) for i, p in enumerate(picks))
        elif kind == "defaultdict":
            node = collections.defaultdict(draw(st.sampled_from([list, int, None])),
                                           {str(i): item(p) for i, p in enumerate(picks)})
        elif kind == "counter":
            node = collections.Counter({item(p, True): i for i, p in enumerate(picks)})
        elif kind == "obj":
            node = module.Obj(**{f"a{i}": item(p) for i, p in enumerate(picks)})
        else:
            objects = [n for n in nodes if type(n) is module.Obj]
            node = objects[-1].poke if objects else module.Obj().poke
        nodes.append(node)
        try:
            hash(node)
            if kind in ("tuple", "frozenset") and _value_hashed(node):
                hashed.append(node)
        except TypeError:
            pass
    for target, source in draw(st.lists(st.tuples(st.integers(0, 100), st.integers(0, 100)), max_size=6)):
        holder = nodes[target % len(nodes)]
        held = nodes[source % len(nodes)]
        if type(holder) in (list, collections.deque):
            holder.append(held)
        elif type(holder) in (dict, collections.OrderedDict, collections.defaultdict):
            holder[f"back{len(holder)}"] = held
        elif type(holder) is module.Obj:
            holder.__dict__[f"back{len(vars(holder))}"] = held
    roots = draw(st.lists(st.integers(0, 100), min_size=1, max_size=5))
    return {f"r{i}": nodes[n % len(nodes)] for i, n in enumerate(roots)}


def _value_hashed(node: Any) -> bool:
    todo = [node]
    while todo:
        item = todo.pop()
        if type(item) in (tuple, frozenset):
            todo.extend(item)
        elif not isinstance(item, (str, int, float, bool, type(None), bytes, dt.date)):
            return False
    return True


@pytest.mark.parametrize("flat_depth", [None, 1, 3])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state=graphs())
def test_random_graphs_round_trip_as_pickle_does(env: types.ModuleType, flat_depth: int | None,
                                                 state: dict[str, Any]) -> None:
    """Also with a tiny ``FLAT_DEPTH``: every graph is then written (mostly) as flat blocks."""
    saved = getattr(sandbox.state.encoder, "FLAT_DEPTH")  # noqa: B009 (read where the encoder reads it)
    if flat_depth is not None:
        setattr(sandbox.state.encoder, "FLAT_DEPTH", flat_depth)  # noqa: B010
    try:
        text = encode_state(state, ENV_MODULE)
        assert_same_graph(decode(json.loads(text), _resolve), pickle_trip(state))
        assert view_encoded(json.loads(text)) == view(state)
    finally:
        setattr(sandbox.state.encoder, "FLAT_DEPTH", saved)  # noqa: B010
