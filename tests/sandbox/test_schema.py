"""Static extraction of tool schemas from environment class source."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from service.catalog.schema import SchemaError, extract_tools


def _tools(source: str, class_name: str = "Env") -> dict[str, dict[str, Any]]:
    """Tool name -> the ``function`` part, for the class in ``source``."""
    tools = extract_tools(textwrap.dedent(source), class_name)
    for tool in tools:
        assert tool["type"] == "function"
    return {tool["function"]["name"]: tool["function"] for tool in tools}


def _params(source: str, method: str, class_name: str = "Env") -> dict[str, Any]:
    params: dict[str, Any] = _tools(source, class_name)[method]["parameters"]
    return params


def _prop(annotation: str, *, prelude: str = "") -> Any:
    """Schema of a single parameter annotated with ``annotation``."""
    source = f"{prelude}\nclass Env:\n    def f(self, x: {annotation}): pass\n"
    return _params(source, "f")["properties"]["x"]


# --- which methods are tools ------------------------------------------------


def test_tool_has_openai_function_shape() -> None:
    tools = extract_tools("class Env:\n    def ping(self, host: str) -> bool:\n        '''Ping.'''\n", "Env")
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": "ping",
                "description": "Ping.",
                "parameters": {
                    "type": "object",
                    "properties": {"host": {"type": "string"}},
                    "required": ["host"],
                    "additionalProperties": False,
                },
            },
        }
    ]


def test_only_public_methods_are_tools_in_source_order() -> None:
    source = """
    import functools

    class Env:
        counter = 0
        items: list = []
        name: str

        def __init__(self): self.x = 1
        def __repr__(self): return ""
        def _helper(self): pass
        def __private(self): pass
        def zeta(self): pass
        async def alpha(self): pass
        @property
        def size(self): return 1
        @size.setter
        def size(self, value): pass
        @functools.cached_property
        def cached(self): return 2
        class Nested: pass
        def beta(self): pass
    """
    assert list(_tools(source)) == ["zeta", "alpha", "beta"]


def test_staticmethod_keeps_first_param_and_classmethod_drops_cls() -> None:
    source = """
    class Env:
        @staticmethod
        def add(a: int, b: int) -> int: return a + b
        @classmethod
        def make(cls, name: str): pass
    """
    tools = _tools(source)
    assert list(tools["add"]["parameters"]["properties"]) == ["a", "b"]
    assert tools["add"]["parameters"]["required"] == ["a", "b"]
    assert list(tools["make"]["parameters"]["properties"]) == ["name"]


def test_inherited_methods_from_same_source_with_subclass_overrides() -> None:
    source = """
    from somewhere import External

    class Base:
        def shared(self, a: int):
            '''Base version.'''
        def only_base(self): pass
        def hidden(self): pass

    class Mixin:
        def mixed(self): pass

    class Env(Base, Mixin, External):
        hidden = None
        def shared(self, a: str):
            '''Env version.'''
        def own(self): pass
    """
    tools = _tools(source)
    assert set(tools) == {"shared", "only_base", "mixed", "own"}
    assert tools["shared"]["description"] == "Env version."
    assert tools["shared"]["parameters"]["properties"]["a"] == {"type": "string"}


def test_inheritance_cycles_and_diamonds_terminate() -> None:
    source = """
    class A(Env):
        def a(self): pass
    class Env(A):
        def e(self): pass
    """
    assert set(_tools(source)) == {"a", "e"}
    diamond = """
    class Root:
        def m(self) -> None: '''root'''
    class Left(Root):
        def m(self) -> None: '''left'''
    class Right(Root): pass
    class Env(Left, Right): pass
    """
    assert _tools(diamond)["m"]["description"] == "left"


# --- parameters -------------------------------------------------------------


def test_defaults_are_optional_and_literal_defaults_are_included() -> None:
    source = """
    SENTINEL = object()

    class Env:
        def f(self, a: str, b: int = 3, c: list = [1, (2, 3)], d: object = SENTINEL, e: float = -1.5,
              g: set = {1}, h: float = float("inf")): pass
    """
    params = _params(source, "f")
    assert params["required"] == ["a"]
    props = params["properties"]
    assert props["b"] == {"type": "integer", "default": 3}
    assert props["c"] == {"type": "array", "default": [1, [2, 3]]}
    assert props["d"] == {}
    assert props["e"] == {"type": "number", "default": -1.5}
    assert props["g"] == {"type": "array"}  # a set is not JSON
    assert props["h"] == {"type": "number"}


def test_none_default_makes_the_parameter_nullable() -> None:
    props = _params("class Env:\n    def f(self, limit: int = None): pass\n", "f")["properties"]
    assert props["limit"] == {"type": ["integer", "null"], "default": None}


def test_args_ignored_kwargs_allow_additional_properties_keyword_only_are_params() -> None:
    source = """
    class Env:
        def f(self, a: int, /, b: str, *args: int, c: bool, d: int = 1, **kwargs: str): pass
        def g(self, *, key: str): pass
    """
    tools = _tools(source)
    f = tools["f"]["parameters"]
    assert list(f["properties"]) == ["a", "b", "c", "d"]
    assert f["required"] == ["a", "b", "c"]
    assert f.get("additionalProperties", True) is True
    g = tools["g"]["parameters"]
    assert g["required"] == ["key"] and g["additionalProperties"] is False


def test_unannotated_and_unknown_parameters_have_no_constraint() -> None:
    source = """
    class Env:
        def f(self, a, b: Any, c: object, d: SomethingUnknown, e: mod.Thing, f: "not valid ((", g: 3): pass
    """
    props = _params(source, "f")["properties"]
    assert props == {name: {} for name in "abcdefg"}


# --- type mapping -----------------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        ("str", {"type": "string"}),
        ("int", {"type": "integer"}),
        ("float", {"type": "number"}),
        ("bool", {"type": "boolean"}),
        ("None", {"type": "null"}),
        ("dict", {"type": "object"}),
        ("Mapping", {"type": "object"}),
        ("list", {"type": "array"}),
        ("Sequence", {"type": "array"}),
        ("Iterable", {"type": "array"}),
        ("set", {"type": "array"}),
        ("tuple", {"type": "array"}),
        ("datetime", {"type": "string", "format": "date-time"}),
        ("datetime.date", {"type": "string", "format": "date"}),
    ],
)
def test_simple_type_mapping(annotation: str, expected: dict[str, Any]) -> None:
    assert _prop(annotation) == expected


def test_attribute_access_uses_final_name() -> None:
    assert _prop("typing.List[str]") == {"type": "array", "items": {"type": "string"}}
    assert _prop("t.Optional[t.Dict[str, int]]") == {
        "anyOf": [{"type": "object", "additionalProperties": {"type": "integer"}}, {"type": "null"}]
    }


def test_optional_and_pipe_none_are_nullable() -> None:
    for annotation in ("Optional[str]", "str | None", "Union[str, None]", "None | str"):
        assert _prop(annotation) == {"type": ["string", "null"]}
    assert _prop("Optional[List[int]]") == {
        "anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}]
    }
    assert _prop("Optional[Any]") == {}


def test_union_becomes_any_of() -> None:
    assert _prop("Union[int, str]") == {"anyOf": [{"type": "integer"}, {"type": "string"}]}
    assert _prop("int | str | None") == {
        "anyOf": [{"type": "integer"}, {"type": "string"}, {"type": "null"}]
    }
    assert _prop("int | Any") == {}


def test_literal_becomes_enum_with_inferred_type() -> None:
    assert _prop('Literal["a", "b"]') == {"type": "string", "enum": ["a", "b"]}
    assert _prop("typing.Literal[1, 2]") == {"type": "integer", "enum": [1, 2]}
    assert _prop('Literal["a", 1]') == {"enum": ["a", 1]}
    assert _prop('Optional[Literal["x"]]') == {
        "anyOf": [{"type": "string", "enum": ["x"]}, {"type": "null"}]
    }


def test_nested_list_dict_tuple() -> None:
    assert _prop("List[Dict[str, List[int]]]") == {
        "type": "array",
        "items": {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "integer"}},
        },
    }
    assert _prop("dict[str, Any]") == {"type": "object"}
    assert _prop("Tuple[int, ...]") == {"type": "array", "items": {"type": "integer"}}
    assert _prop("tuple[str, float]") == {
        "type": "array",
        "prefixItems": [{"type": "string"}, {"type": "number"}],
        "minItems": 2,
        "maxItems": 2,
    }
    assert _prop("set[str]") == {"type": "array", "items": {"type": "string"}}


def test_string_annotations_and_future_annotations_are_parsed() -> None:
    source = """
    from __future__ import annotations
    from typing import List, Optional

    class Env:
        def f(self, a: "List[str]", b: Optional["int"], c: list[int] | None = None): pass
    """
    props = _params(source, "f")["properties"]
    assert props["a"] == {"type": "array", "items": {"type": "string"}}
    assert props["b"] == {"type": ["integer", "null"]}
    assert props["c"] == {
        "anyOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}],
        "default": None,
    }


def test_typed_dict_parameters_become_nested_objects() -> None:
    source = """
    import typing
    from typing import TypedDict, NotRequired, Required

    class Address(TypedDict):
        city: str
        zip: NotRequired[str]

    class Person(typing.TypedDict, total=False):
        name: Required[str]
        age: int
        addresses: list[Address]

    class Employee(Person):
        company: str

    Point = TypedDict("Point", {"x": float, "y": "float"})

    class Env:
        def f(self, p: Person, e: "Employee", pt: Point): pass
    """
    props = _params(source, "f")["properties"]
    address = {
        "type": "object",
        "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
        "required": ["city"],
    }
    person_props = {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "addresses": {"type": "array", "items": address},
    }
    assert props["p"] == {"type": "object", "properties": person_props, "required": ["name"]}
    assert props["e"] == {
        "type": "object",
        "properties": {**person_props, "company": {"type": "string"}},
        "required": ["name", "company"],
    }
    assert props["pt"] == {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"],
    }


def test_recursive_typed_dict_does_not_loop() -> None:
    source = """
    class Node(TypedDict):
        value: int
        children: list["Node"]

    class Env:
        def f(self, tree: Node): pass
    """
    tree = _params(source, "f")["properties"]["tree"]
    assert tree["properties"]["children"] == {"type": "array", "items": {"type": "object"}}


def test_enum_subclass_becomes_enum_of_values() -> None:
    prelude = """
from enum import Enum, IntEnum, auto
class Color(str, Enum):
    RED = "red"
    GREEN = "green"
    def describe(self): return self.value
class Level(IntEnum):
    LOW = 1
    HIGH = 2
class Auto(Enum):
    A = auto()
"""
    assert _prop("Color", prelude=prelude) == {"type": "string", "enum": ["red", "green"]}
    assert _prop("Level", prelude=prelude) == {"type": "integer", "enum": [1, 2]}
    assert _prop("Auto", prelude=prelude) == {}


def test_module_level_type_aliases_are_followed() -> None:
    prelude = 'Status = Literal["open", "closed"]\nIds = list[int]\nLoop = Loop'
    assert _prop("Status", prelude=prelude) == {"type": "string", "enum": ["open", "closed"]}
    assert _prop("Ids", prelude=prelude) == {"type": "array", "items": {"type": "integer"}}
    assert _prop("Loop", prelude=prelude) == {}


# --- docstrings -------------------------------------------------------------


def test_no_docstring_gives_empty_description() -> None:
    assert _tools("class Env:\n    def f(self): pass\n")["f"]["description"] == ""


def test_google_docstring_summary_and_param_descriptions() -> None:
    source = '''
    class Env:
        def book(self, flight_id: str, seats, note: str = "", **extra) -> dict:
            """Book seats on a flight
            for the current user.

            Longer explanation that must not appear.

            Args:
                flight_id: The flight to book,
                    as printed on the ticket.
                seats (int): How many seats.
                note (str, optional): Free text.
                **extra: Ignored.

            Returns:
                dict: The booking record.
            """
    '''
    tool = _tools(source)["book"]
    assert tool["description"] == "Book seats on a flight for the current user."
    props = tool["parameters"]["properties"]
    assert props["flight_id"] == {
        "type": "string",
        "description": "The flight to book, as printed on the ticket.",
    }
    assert props["seats"] == {"type": "integer", "description": "How many seats."}
    assert props["note"] == {"type": "string", "default": "", "description": "Free text."}


def test_numpy_docstring_param_descriptions_and_types() -> None:
    source = '''
    class Env:
        def search(self, query, limit=10, tags=None):
            """Search the catalog.

            Parameters
            ----------
            query : str
                Text to look for.
            limit : int, optional
                Maximum number of hits.
            tags : list of str
                Filter.

            Returns
            -------
            list
                Matching items.
            """
    '''
    tool = _tools(source)["search"]
    assert tool["description"] == "Search the catalog."
    props = tool["parameters"]["properties"]
    assert props["query"] == {"type": "string", "description": "Text to look for."}
    assert props["limit"] == {"type": "integer", "default": 10, "description": "Maximum number of hits."}
    assert props["tags"] == {"default": None, "description": "Filter."}
    assert tool["parameters"]["required"] == ["query"]


def test_sphinx_docstring_param_descriptions_and_types() -> None:
    source = '''
    class Env:
        def transfer(self, src, dst, amount: float, memo=None):
            """Move money between accounts.

            :param str src: Source account.
            :param dst: Destination account,
                which must exist.
            :type dst: int
            :param amount: How much.
            :param memo: Note.
            :type memo: Optional[str]
            :returns: The new balance.
            """
    '''
    tool = _tools(source)["transfer"]
    assert tool["description"] == "Move money between accounts."
    props = tool["parameters"]["properties"]
    assert props["src"] == {"type": "string", "description": "Source account."}
    assert props["dst"] == {"type": "integer", "description": "Destination account, which must exist."}
    assert props["amount"] == {"type": "number", "description": "How much."}
    assert props["memo"] == {"type": ["string", "null"], "default": None, "description": "Note."}


def test_annotation_wins_over_docstring_type() -> None:
    source = '''
    class Env:
        def f(self, x: str):
            """Do it.

            Args:
                x (int): The thing.
            """
    '''
    assert _params(source, "f")["properties"]["x"] == {"type": "string", "description": "The thing."}


def test_summary_stops_at_section_header_without_blank_line() -> None:
    source = '''
    class Env:
        def f(self, x: int):
            """Do the thing.
            Args:
                x: A number.
            """
    '''
    tool = _tools(source)["f"]
    assert tool["description"] == "Do the thing."
    assert tool["parameters"]["properties"]["x"]["description"] == "A number."


# --- errors and safety ------------------------------------------------------


def test_syntax_error_names_the_line() -> None:
    source = "class Env:\n    def ok(self): pass\n\n    def broken(self:\n        pass\n"
    with pytest.raises(SchemaError, match=r"syntax error at line \d+"):
        extract_tools(source, "Env")
    with pytest.raises(SchemaError, match="syntax error at line 3: "):
        extract_tools("x = 1\ny = 2\nz = = 3\n", "Env")


def test_missing_class_raises() -> None:
    with pytest.raises(SchemaError, match="class 'Foo' is not defined"):
        extract_tools("class Bar: pass\n", "Foo")


def test_class_must_be_at_module_top_level() -> None:
    source = "def factory():\n    class Foo:\n        def f(self): pass\n    return Foo\n"
    with pytest.raises(SchemaError, match="class 'Foo' is not defined"):
        extract_tools(source, "Foo")


def test_extraction_never_executes_code(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    source = f"""
    open({str(marker)!r}, "w").write("module")
    raise SystemExit(3)

    class Env:
        open({str(marker)!r}, "w").write("class body")

        def f(self, x: int = open({str(marker)!r}, "w").write("default")) -> None:
            pass
    """
    tools = _tools(source)
    assert tools["f"]["parameters"]["properties"]["x"] == {"type": "integer"}
    assert tools["f"]["parameters"]["required"] == []
    assert not marker.exists()


def test_null_bytes_raise_schema_error() -> None:
    with pytest.raises(SchemaError):
        extract_tools("class Env:\n    x = '\0'\n", "Env")


def test_pathological_sources_finish_quickly() -> None:
    # Each level reuses the previous one twice: naive expansion would be 2**60.
    aliases = "\n".join(f"A{i} = Tuple[A{i - 1}, A{i - 1}]" for i in range(1, 60))
    typed_dicts = "\n".join(
        f"class L{i}(T{i - 1}): pass\nclass R{i}(T{i - 1}): pass\nclass T{i}(L{i}, R{i}):\n    f{i}: int"
        for i in range(1, 60)
    )
    classes = "\n".join(
        f"class CL{i}(C{i - 1}): pass\nclass CR{i}(C{i - 1}): pass\nclass C{i}(CL{i}, CR{i}): pass"
        for i in range(1, 60)
    )
    source = (
        f"A0 = int\n{aliases}\nclass T0(TypedDict):\n    f0: int\n{typed_dicts}\n"
        f"class C0:\n    def base(self, t: T59, a: A59): pass\n{classes}\n"
    )
    started = time.monotonic()
    tools = extract_tools(source, "C59")
    assert time.monotonic() - started < 5
    assert [t["function"]["name"] for t in tools] == ["base"]
    t_schema = tools[0]["function"]["parameters"]["properties"]["t"]
    assert t_schema["required"] == [f"f{i}" for i in range(60)]


def test_docstring_oddities_do_not_crash() -> None:
    source = '''
    class Env:
        def f(self, a, b, *args, **kwargs):
            """Summary.

            Arguments:
                a (Callable[[int], str]): First (really): yes.
                *args: Extra.
            Parameters
            ----------
            b, c : float
                Shared text.
            :param   : nothing
            :param: nothing either
            """
    '''
    props = _params(source, "f")["properties"]
    assert props["a"] == {"description": "First (really): yes."}
    assert props["b"] == {"type": "number", "description": "Shared text."}


# --- a realistic environment ------------------------------------------------

ENVSCALER_STYLE = '''
from typing import Any, Dict, List, Optional, TypedDict


class OrderInfo(TypedDict):
    order_id: str
    customer_id: str
    items: List[str]
    status: str
    total: float


class CustomerInfo(TypedDict):
    customer_id: str
    name: str
    email: Optional[str]


class OnlineStoreEnv:
    def __init__(self, init_config: dict):
        """Online store with customers and orders."""
        self.orders: Dict[str, OrderInfo] = {}
        self.customers: Dict[str, CustomerInfo] = {}

    def _check_customer(self, customer_id: str) -> bool:
        return customer_id in self.customers

    def get_order(self, order_id: str) -> dict:
        """
        Retrieve an order by its id.

        Args:
            order_id (str): Unique identifier of the order.

        Returns:
            dict: {
                "success": True,
                "data": OrderInfo
            }
            or {"success": False, "error": str}
        """
        if order_id not in self.orders:
            return {"success": False, "error": "Order not found"}
        return {"success": True, "data": self.orders[order_id]}

    def list_orders(self, customer_id: str, status: Optional[str] = None, limit: int = 20) -> dict:
        """
        List the orders of a customer, newest first.

        Args:
            customer_id (str): The customer whose orders to list.
            status (Optional[str]): Only orders in this status
                (e.g. "shipped").
            limit (int): Maximum number of orders to return.

        Returns:
            dict: {"success": True, "data": List[OrderInfo]}
        """
        return {"success": True, "data": []}

    def create_order(self, customer: CustomerInfo, items: List[str]) -> Dict[str, Any]:
        """
        Create a new order.

        Args:
            customer: The ordering customer.
            items: Item ids.

        Returns:
            dict: {"success": True, "message": str}
        """
        return {"success": True, "message": "created"}
'''


def test_realistic_envscaler_style_class() -> None:
    tools = extract_tools(ENVSCALER_STYLE, "OnlineStoreEnv")
    assert [t["function"]["name"] for t in tools] == ["get_order", "list_orders", "create_order"]
    by_name = {t["function"]["name"]: t["function"] for t in tools}

    get_order = by_name["get_order"]
    assert get_order["description"] == "Retrieve an order by its id."
    assert get_order["parameters"] == {
        "type": "object",
        "properties": {
            "order_id": {"type": "string", "description": "Unique identifier of the order."}
        },
        "required": ["order_id"],
        "additionalProperties": False,
    }

    list_orders = by_name["list_orders"]
    assert list_orders["description"] == "List the orders of a customer, newest first."
    assert list_orders["parameters"]["required"] == ["customer_id"]
    props = list_orders["parameters"]["properties"]
    assert props["status"] == {
        "type": ["string", "null"],
        "default": None,
        "description": 'Only orders in this status (e.g. "shipped").',
    }
    assert props["limit"] == {
        "type": "integer",
        "default": 20,
        "description": "Maximum number of orders to return.",
    }

    customer = by_name["create_order"]["parameters"]["properties"]["customer"]
    assert customer == {
        "type": "object",
        "properties": {
            "customer_id": {"type": "string"},
            "name": {"type": "string"},
            "email": {"type": ["string", "null"]},
        },
        "required": ["customer_id", "name", "email"],
        "description": "The ordering customer.",
    }


def test_results_are_independent_copies() -> None:
    first = extract_tools(ENVSCALER_STYLE, "OnlineStoreEnv")
    first[0]["function"]["parameters"]["properties"]["order_id"]["type"] = "mutated"
    second = extract_tools(ENVSCALER_STYLE, "OnlineStoreEnv")
    assert second[0]["function"]["parameters"]["properties"]["order_id"]["type"] == "string"
