"""A session's environment instance kept live between calls, and what a call does to it.

A call on a live instance needs neither a decode of the stored state nor a fork. Whether a call
changed the state is found by comparing ``pickle`` bytes of the attributes before and after
(pickle is C code, keeps object identity, and is never stored: the stored form stays the codec's
JSON). Only a call that changed something pays for encoding the new state and for its diff,
whose "before" view is kept from the previous change.

The instance is the session's truth only while it matches the stored state; ``handle`` says when
it can no longer be trusted (a tool raised, ran out of memory, or made a state that cannot be
stored), and the worker then ends the process. Standard library only.
"""

from __future__ import annotations

import _thread
import asyncio
import copy
import hashlib
import inspect
import json
import sys
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sandbox.state import decoder, encoder, view
from sandbox.state.deltas import Delta, DeltaError, apply, entries_in_place, field
from sandbox.state.parts import Parts, Unwatched, blob, shares
from sandbox.state.readonly import ReadOnly
from sandbox.state.signatures import binds, signature
from sandbox.state.view import Diff, no_diff
from sandbox.wire import answers
from sandbox.wire.limits import DEFAULTS
from sandbox.worker import randomness
from sandbox.worker.forks import (
    INVALID_ARGUMENTS,
    RESOURCE_LIMIT,
    TOOL_EXCEPTION,
    UNKNOWN_TOOL,
    Failure,
    Interrupt,
    describe,
)
from sandbox.worker.randomness import HIDDEN, Stream

if TYPE_CHECKING:
    from sandbox.worker.templatelodge import TemplateForm

# Call errors raised before any environment code ran: the instance is still what was stored.
UNTOUCHED = answers.UNTOUCHED
# A delta grows until it passes this share of its base (or COMPACT_FLOOR bytes, for small bases):
# then the call answers the whole state, which the service stores as the session's new base.
COMPACT_SHARE = 0.25
COMPACT_FLOOR = 16 * 1024
# The delta field of the session's stored randomness (see ``sandbox.worker.randomness``).
HIDDEN_FIELD = field(HIDDEN)


# Where the stored state names the instance's class when a tool assigned another (``self.__class__ =
# X``): never an attribute's name, since ``__class__`` is not kept in an instance's ``__dict__``.
CLASS_FIELD = "__class__"
_LOOK = object()  # (``_state``: look at the randomness now)


def public_state(instance: Any) -> dict[str, Any]:
    """The instance's attributes, all of them: private and dunder names too (``self.__version__``
    set in a tool), as pickle keeps them; a rebuild must give each one back."""
    return dict(vars(instance))


def instantiate(cls: type, init_config: dict[str, Any]) -> Any:
    """EnvScaler's convention, kept exactly for compatibility with its released data."""
    try:
        instance = cls(init_config)
    except TypeError:
        instance = cls()
    for key, value in init_config.items():
        setattr(instance, key, value)
    return instance


def resolver(module: types.ModuleType) -> Callable[[str], Any]:
    def resolve(qualname: str) -> Any:
        target: Any = module
        for part in qualname.split("."):
            target = getattr(target, part)
        return target

    return resolve


def encode(state: dict[str, Any], module_name: str, limit: int, owner: Any = None) -> str:
    try:
        text = encoder.encode_state(state, module_name, owner)
    except encoder.CodecError as exc:
        raise Failure(TOOL_EXCEPTION, f"the state cannot be serialized: {exc}") from None
    return _within(text, limit)


def _within(text: str, limit: int) -> str:
    size = len(text.encode())
    if size > limit:
        raise Failure(RESOURCE_LIMIT, f"the state would be {size} bytes, over the {limit} byte limit")
    return text


def fingerprint(state: dict[str, Any]) -> bytes | None:
    """Bytes equal for equal graphs (identity included); None if pickle refuses the state."""
    try:
        return blob(state)
    except Exception:
        return None


class LiveSession:
    """One session's instance of the environment class, and the stored form it was made from."""

    def __init__(self, module: types.ModuleType, cls: type, readonly: ReadOnly | None = None) -> None:
        self.module = module
        self.cls = cls
        self.readonly = readonly  # the tools proven to change nothing (see ``sandbox.state.readonly``)
        self.instance: Any = None
        self._text: str | None = ""  # the stored (encoded) state the instance matches (see ``text``)
        self.print: bytes | None = None  # its fingerprint
        self.shown: Any = None  # its view, once a diff needed it
        self.parts: Parts | None = None  # its encoding part by part, while it is a tree
        self.digest = ""  # of ``text``, for an instance built ahead of its sessions (a template)
        # While the service keeps the session as a base plus a delta (see ``sandbox.state.deltas``): the
        # delta, and the size of the base it is against. None: the service stores whole states.
        self.delta: Delta | None = None
        self.base_size = 0
        # Its randomness, and what the stored state holds of it (see ``sandbox.worker.randomness``).
        self.stream = Stream()
        self.hidden: str | None = None
        self.drew = False  # (a template) its ``__init__`` drew randomness: sessions must not share it

    def address_space(self, limits: Any) -> int:
        """One call's limit: the process holds this session alone."""
        return int(limits.memory_bytes)

    @property
    def text(self) -> str:
        """The stored (encoded) state the instance matches; after a watched call, joined from the
        parts only when something asks for the whole text."""
        if self._text is None:
            assert self.parts is not None
            self._text = self.parts.text()
        return self._text

    @text.setter
    def text(self, value: str) -> None:
        self._text = value

    def prepare(self, request: dict[str, Any]) -> None:
        """Build the instance of ``request`` (an ``init``) ahead of the sessions that will start from
        it: each is a fork of this process, whose ``init`` then costs nothing.

        Raises:
            Failure: the environment failed to initialise, or its state cannot be stored.
        """
        before = randomness.draws()
        self._init(request)
        self.drew = randomness.draws() != before or self.hidden is not None
        self.digest = hashlib.sha256(self.text.encode()).hexdigest()

    def handle(self, request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Answer ``request`` (``init``, or ``call`` with ``state`` when the instance must be rebuilt)."""
        if request.get("op") == "init" and self.digest:  # built ahead: the service may know the text
            known = request.get("known") == self.digest
            self.stream.begin(request)  # (its ``__init__`` drew nothing, see ``prepare``)
            self._based(request, None)
            return {"state": None if known else self.text, "digest": self.digest}, True
        if request.get("op") == "init":
            if "init_config" not in request and "template" in request:  # (see ``answers.NEED_CONFIG``)
                return {"error": {"type": answers.NEED_CONFIG, "message": "the template is not built here"}}, False
            answer = self._init(request)
            self._based(request, None)
            return answer, True
        if "state" in request or withheld(request):
            if not self._from_template(request):
                if "state" not in request:  # the template could not make the stored text: it is sent then
                    return {"error": {"type": answers.NEED_STATE, "message": "the stored state is needed"}}, False
                self._adopt(request, request["state"])
            self._based(request, request.get("delta"))
        try:
            return _without_hidden(self._call(request)), True
        except Failure as exc:
            return {"error": {"type": exc.kind, "message": exc.message}}, exc.kind in UNTOUCHED

    def delta_fields(self) -> dict[str, str] | None:
        """The session's delta against its base, while calls answer deltas."""
        return None if self.delta is None else dict(self.delta.fields)

    def revert(self, form: TemplateForm, fields: dict[str, str], *, looked: bool) -> bool:
        """Make the instance its template's again after a session's call in a template lodge
        (``sandbox.worker.templatelodge``): the template's own text put back at each of ``fields``
        (the session's delta before and after the call), then checked. ``looked``: the call was
        answered, so the parts are what the instance holds; else the whole state is looked at
        first, and every part that is not the template's is put back. False: it cannot be."""
        module = self.module

        def decode(part: str) -> Any:
            return decoder.decode(json.loads(part), resolver(module), self.instance)

        try:
            if not looked:
                self._sync(None)
                found = form.differing(self.parts) if self.parts is not None else None
                if found is None:
                    return False
                fields = dict.fromkeys(found, "=")
            back = form.back(fields)
            if back is None:
                return False
            apply(vars(self.instance), back, decode)
            self._sync(entries_in_place(back))
        except (Failure, DeltaError, Unwatched, encoder.CodecError, ValueError, TypeError, KeyError, RecursionError):
            return False
        if self.hidden is not None or not form.matches(self, back):
            return False
        self._text, self.digest, self.delta, self.print, self.shown = form.text, form.digest, None, None, None
        return True

    def _based(self, request: dict[str, Any], fields: Any) -> None:
        """Whether calls answer deltas: the service asks for them (``deltas``) on an init, whose state
        is the base, or brings the delta the stored state has (``delta``) with the state."""
        wanted = request.get("deltas") is True and (request.get("op") == "init" or isinstance(fields, dict))
        self.delta = Delta(fields) if wanted and self.parts is not None else None
        # (not joined for this: a state rebuilt from its template without its text has none yet)
        self.base_size = self.parts.size() if self._text is None and self.parts is not None else len(self.text)

    def _init(self, request: dict[str, Any]) -> dict[str, Any]:
        self.stream.begin(request)  # seeded (or not) before ``__init__``, as the request asks
        try:
            # Taken out of the request, so that once ``__init__`` returns nothing but the instance
            # holds what it kept of the config (EnvScaler sets each entry as an attribute): a
            # request still holding them would be a second holder of every attribute, and the
            # watch (``sandbox.state.watch``) would give up on the state for good.
            self.instance = instantiate(self.cls, request.pop("init_config", None) or {})
        except Interrupt:
            raise
        except BaseException as exc:
            raise Failure(TOOL_EXCEPTION, f"the environment failed to initialise: {describe(exc)}") from None
        state = self._state()
        self._remember(encode(state, self.module.__name__, _limit(request, "max_state_bytes", DEFAULTS.state_bytes),
                              self.instance), state)
        return {"state": self.text}

    def _state(self, current: Any = _LOOK) -> dict[str, Any]:
        """What is stored of the session: the instance's attributes and, once it has drawn, its
        randomness (last: it is new after the attributes, and a tree's parts keep their order).
        ``current``: the stream's value, when the caller has just looked (it is a 5 KB compare)."""
        state = public_state(self.instance)
        for reserved in (HIDDEN, CLASS_FIELD):  # (stored beside the attributes: one of theirs would be lost)
            if reserved in state:
                raise Failure(TOOL_EXCEPTION, f"the attribute name {reserved!r} is reserved for the session's "
                                              "stored state: name the attribute otherwise")
        if type(self.instance) is not self.cls:  # a tool assigned ``self.__class__``: a rebuild must too
            state[CLASS_FIELD] = type(self.instance).__qualname__
        self.hidden = self.stream.current() if current is _LOOK else current
        if self.hidden is not None:
            state[HIDDEN] = self.hidden
        return state

    def _take_class(self) -> None:
        """Give the rebuilt instance the class the stored state names, if a tool changed it."""
        name = self.instance.__dict__.pop(CLASS_FIELD, None)
        if isinstance(name, str):
            self.instance.__class__ = resolver(self.module)(name)

    def _from_template(self, request: dict[str, Any]) -> bool:
        """Become the stored state from the template's instance this process was forked from, by
        applying the session's delta to it (``known``: the digest of the base the delta is
        against): decoding only the parts the delta names, not the whole state. False when it
        cannot (another base, a state that is not watched, a delta that does not fit); the
        caller then decodes the whole state. Without the stored text (``withheld``) only a delta
        whose every field is an entry changed in place can be applied: each such entry is then
        checked to encode to the text the delta gives, and the parts joined are the stored text."""
        fields, text = request.get("delta"), request.get("state")
        if not (self.digest and request.get("known") == self.digest and isinstance(fields, dict)
                and self.parts is not None and self.parts.watched):
            return False
        self.digest = ""  # whatever happens, no longer the template's state
        module = self.module

        def decode(part: str) -> Any:
            return decoder.decode(json.loads(part), resolver(module), self.instance)

        names = list(self.parts.parts)
        try:
            stored = _hidden_field(fields.get(HIDDEN_FIELD))
            self.stream.begin(request, stored)
            changes = {k: v for k, v in fields.items() if k != HIDDEN_FIELD}
            apply(vars(self.instance), changes, decode)
            self._take_class()
            # Entries changed in place (most deltas, and none at all for a session at its base): only
            # they are looked at, the rest being the template's as its parts say.
            entries = entries_in_place(changes) if HIDDEN_FIELD not in fields else None
            self._sync(entries)
        except (DeltaError, Unwatched, encoder.CodecError, ValueError, TypeError, KeyError, RecursionError):
            return False
        if entries is not None and list(self.parts.parts) == names and self._encode_as(changes):
            self._text = text  # the stored text itself, if sent: nothing is joined
            return True
        return text is not None and self.text == text  # exactly the stored state, or it is decoded after all

    def _encode_as(self, changes: dict[str, str]) -> bool:
        """Whether each entry ``changes`` names now encodes to the text it gives: the other parts
        are the template's, whose text is the base's (its digest is the one the service knows),
        so the whole text is then the stored one."""
        assert self.parts is not None
        for name, value in changes.items():
            attribute, key = json.loads(name)
            entries = self.parts.parts[attribute].entries
            if entries is None or key not in entries or entries[key].member != f"{_dumps(key)}:{value[1:]}":
                return False
        return True

    def _sync(self, footprint: dict[str, set[str] | None] | None = None) -> None:
        """Bring the parts to what the instance now holds, looking only at what ``footprint`` names
        when it names anything (a function of its own: no variable of it may hold an object of the
        state when the watch counts holders)."""
        assert self.parts is not None
        state = self._state()
        self._join_hidden(state)
        self.parts.watch(state, footprint)
        self._text, self.print, self.shown = None, None, None

    def _join_hidden(self, state: dict[str, Any]) -> None:
        """The session's first draw: its randomness joins the watched parts, as an empty string
        last (where a delta adds it), so that the watch still finds what the call changed."""
        assert self.parts is not None
        parts = self.parts.parts
        if self.parts.watched and HIDDEN in state and HIDDEN not in parts and list(state)[:-1] == list(parts):
            self.parts.parts = {**parts, HIDDEN: self.parts.part(HIDDEN, "")}

    def _adopt(self, request: dict[str, Any], text: str) -> None:
        factory: Any = self.cls  # restore without __init__: the state is already built
        self.instance = factory.__new__(factory)
        state = decoder.decode(json.loads(text), resolver(self.module), self.instance)
        self.stream.begin(request, state.get(HIDDEN))
        self.hidden = self.stream.value
        self.instance.__dict__.update((k, v) for k, v in state.items() if k != HIDDEN)
        self._take_class()
        self._remember(text, state)  # (in the text's order, its randomness where the text has it)

    def _remember(self, text: str, state: dict[str, Any]) -> None:
        self.text, self.shown = text, None
        self._split(text, state)
        # (a watched state needs no fingerprint: its parts' bytes say what changed)
        self.print = None if self.parts is not None and self.parts.watched else fingerprint(state)

    def _split(self, text: str, state: dict[str, Any]) -> None:
        self.parts = None if shares(state, self.module.__name__) else Parts(self.module.__name__, state, json.loads(text))

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        watched = self.parts is not None and self.parts.watched
        # The proofs are of ``self.cls``'s methods: an instance whose ``__class__`` a tool assigned
        # runs another class's, and no tool is proven for it.
        kind = type(self.instance)
        reads = watched and self.readonly is not None and self.readonly.proven(request["name"], kind)
        result_view = self._run(request, reads)
        unchanged = {"ok": True, "result": result_view, "error": None, "state": None, "diff": no_diff()}
        if reads and _alone():
            # A watched state holds builtin values only, which such a tool can but read; and it calls
            # nothing that draws randomness (only the proof's builtins), and nothing else ran beside
            # it, so the streams are as they were: looking (a copy of the generator's 625 words,
            # compared) would cost a third of a read.
            return unchanged
        # A tool that drew randomness changed what is stored, whatever it did to the attributes.
        current = self.stream.current()
        drew = current != self.hidden
        if reads and not drew:
            return unchanged
        state = self._state(current)
        limit = _limit(request, "max_state_bytes", DEFAULTS.state_bytes)
        if watched and self.parts is not None:
            before = self.parts.parts
            self._join_hidden(state)
            footprint = None if self.readonly is None or drew else \
                self.readonly.footprint(request["name"], request.get("arguments") or {}, kind)
            try:
                seen = self.parts.watch(state, footprint)
            except Unwatched:
                pass  # the whole state says, below
            except encoder.CodecError as exc:
                raise Failure(TOOL_EXCEPTION, f"the state cannot be serialized: {exc}") from None
            else:
                return unchanged if seen is None else self._watched_answer(request, unchanged, before, seen, limit)
        after = fingerprint(state)
        if after is not None and after == self.print:
            return unchanged
        # (no fingerprint: pickle refused a value, and the codec says which, below)
        if self.parts is not None and not self.parts.watched and after is not None \
                and not shares(state, self.module.__name__):
            before = self.parts.parts
            try:
                text, change = self.parts.update(state)
            except encoder.CodecError as exc:
                raise Failure(TOOL_EXCEPTION, f"the state cannot be serialized: {exc}") from None
            return self._changed_parts(request, unchanged, before, text, change, after, limit)
        self.delta = None
        text = encode(state, self.module.__name__, limit, self.instance)
        if text == self.text:
            self.print = after
            return unchanged
        before_view = self.shown if self.shown is not None else view.view_encoded(json.loads(self.text))
        shown = view.view_encoded(json.loads(text))
        self.text, self.shown = text, shown
        self._split(text, state)
        self.print = None if self.parts is not None and self.parts.watched else after
        return {**unchanged, "state": text, "diff": view.diff(before_view, shown)}

    def _run(self, request: dict[str, Any], proven: bool = False) -> Any:
        """The tool's result, as its view: nothing here keeps the result itself, which may be an
        object of the state (a watched state counts who holds its objects). ``proven``: the tool
        is one the proofs hold for, so its class still resolves it to the plain function proven."""
        name = request["name"]
        method = getattr(self.instance, name) if proven else _tool(self.cls, self.instance, name)
        # A copy: a tool may keep an argument in the state, and the request must not hold it too.
        arguments = _copied(request.get("arguments") or {})
        try:
            if not binds(method, arguments):
                signature(method).bind(**arguments)
        except TypeError as exc:
            raise Failure(INVALID_ARGUMENTS, f"{name}: {exc}") from None
        try:
            result = method(**arguments)
            if inspect.iscoroutine(result):  # an async tool: run it to completion here
                result = asyncio.run(result)
        except Interrupt:
            raise
        except MemoryError:
            raise Failure(RESOURCE_LIMIT, "the tool ran out of memory") from None
        except BaseException as exc:
            raise Failure(TOOL_EXCEPTION, describe(exc)) from None
        result_view = view.view(result)
        size = len(json.dumps(result_view, ensure_ascii=False).encode())
        limit = _limit(request, "max_result_bytes", DEFAULTS.result_bytes)
        if size > limit:
            raise Failure(RESOURCE_LIMIT, f"the tool's result is {size} bytes, over the {limit} byte limit")
        return result_view

    def _changed_parts(self, request: dict[str, Any], unchanged: dict[str, Any], before: dict[str, Any],
                       text: str, change: Diff, after: bytes | None, limit: int) -> dict[str, Any]:
        """The answer to a call whose parts changed (``Parts.watch`` or ``Parts.update`` found which)."""
        same = text == self.text
        self.text, self.print, self.shown = _within(text, limit), after, None
        if same:
            return unchanged
        answer = {**unchanged, "state": text, "diff": change}
        if self.delta is not None and request.get("deltas") is True:
            return self._as_delta(answer, before)
        self.delta = None  # the service stores this whole state as the session's own
        return answer

    def _watched_answer(self, request: dict[str, Any], unchanged: dict[str, Any], before: dict[str, Any],
                        diff: Diff, limit: int) -> dict[str, Any]:
        """The answer to a call the watch saw change parts: the whole text is not even joined
        when the parts it changed are the answer."""
        assert self.parts is not None
        size = self.parts.size()
        if size > limit:
            raise Failure(RESOURCE_LIMIT, f"the state would be {size} bytes, over the {limit} byte limit")
        self._text, self.print, self.shown = None, None, None
        if self.delta is not None and request.get("deltas") is True:
            changes = self.delta.step(before, self.parts.parts)
            if changes is not None and self.delta.size <= max(COMPACT_FLOOR, self.base_size * COMPACT_SHARE):
                return {**unchanged, "diff": diff, "delta": changes}
            self.delta, self.base_size = Delta(), size
            return {**unchanged, "state": self.text, "diff": diff, "rebase": True}
        self.delta = None  # the service stores this whole state as the session's own
        return {**unchanged, "state": self.text, "diff": diff}

    def _as_delta(self, answer: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
        """A changed call's answer as the parts it changed; the whole state, as a new base, when
        they cannot say it (an attribute moved) or the delta has grown past its share of the base."""
        assert self.delta is not None and self.parts is not None
        changes = self.delta.step(before, self.parts.parts)
        if changes is not None and self.delta.size <= max(COMPACT_FLOOR, self.base_size * COMPACT_SHARE):
            return {**answer, "state": None, "delta": changes}
        self.delta, self.base_size = Delta(), len(self.text)
        return {**answer, "rebase": True}


def _alone() -> bool:
    """Whether nothing but the tool ran during its call: no thread beside it, no profile or trace
    hook (environment code may have set one in an earlier call, and it runs on every call)."""
    return sys.getprofile() is None and sys.gettrace() is None and _thread._count() == 0


def _copied(value: Any) -> Any:
    """A copy of decoded JSON (``copy.deepcopy`` of it, at a fifth of the cost: no memo is needed,
    as decoded JSON shares no object); anything else is deep-copied."""
    kind = type(value)
    if kind is dict:
        return {key: _copied(item) for key, item in value.items()}
    if kind is list:
        return [_copied(item) for item in value]
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    return copy.deepcopy(value)


def withheld(request: dict[str, Any]) -> bool:
    """A call bringing a session's delta against a template's state (``known``) but not its stored
    text: the service expects the template to make it (see ``sandbox.state.deltas.entries_in_place``)."""
    return request.get("op") == "call" and "state" not in request and isinstance(request.get("delta"), dict) \
        and type(request.get("known")) is str


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _hidden_field(value: Any) -> str | None:
    """The stored randomness a delta field's value holds (see ``sandbox.state.deltas``), or None."""
    if type(value) is not str or not value or value[0] == "-":
        return None
    text = value[1:] if value[0] == "=" else value[1:].partition(":")[2]
    try:
        stored = json.loads(text)
    except ValueError:
        return None
    return stored if type(stored) is str else None


def _without_hidden(answer: dict[str, Any]) -> dict[str, Any]:
    """A call's answer with its diff saying nothing of the stored randomness, which no view shows."""
    diff = answer.get("diff")
    if isinstance(diff, dict) and (diff.get("added") or diff.get("removed") or diff.get("changed")):
        answer["diff"] = {kind: [entry for entry in entries if not _of_hidden(entry)]
                          if kind in ("added", "removed", "changed") else entries for kind, entries in diff.items()}
    return answer


def _of_hidden(entry: Any) -> bool:
    path = str(entry.get("path", "")) if isinstance(entry, dict) else ""
    return path == f"/{HIDDEN}" or path.startswith(f"/{HIDDEN}/")


def _limit(request: dict[str, Any], name: str, default: int) -> int:
    return int(request.get(name, default))


def _tool(cls: type, instance: Any, name: str) -> Callable[..., Any]:
    if not isinstance(name, str) or name.startswith("_"):
        raise Failure(UNKNOWN_TOOL, f"unknown tool {name!r}")
    try:
        attribute = inspect.getattr_static(cls, name)
    except AttributeError:
        raise Failure(UNKNOWN_TOOL, f"unknown tool {name!r}") from None
    if isinstance(attribute, (property, type)) or not (
        callable(attribute) or isinstance(attribute, (staticmethod, classmethod))
    ):
        raise Failure(UNKNOWN_TOOL, f"{name!r} is not a tool")
    return getattr(instance, name)  # type: ignore[no-any-return]
