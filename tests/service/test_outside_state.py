"""Code that keeps state outside the instance is refused at registration, naming the line and the fix.

A session is stored as its instance's attributes and rebuilt from them whenever its live process
is gone (eviction, another replica, a restart, forks and groups): a counter on the class, a module
global, a class-level dict changed through ``self``... would be lost silently. See
``service.catalog.outside_state``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from service.catalog.admission import build_environment
from service.catalog.collection import Catalog
from service.catalog.folders import bundled_catalog_dir
from service.catalog.model import CatalogError
from tests.in_process import AppServer, start_app
from tests.service.test_api import problem

ORDERS_INIT = "    def __init__(self):\n        self.orders = {}\n\n"

# construct -> (code, the line refused, what the message says)
REFUSED = {
    "module_global": ('''
_next_id = 100


class Shop:
''' + ORDERS_INIT + '''    def place(self, item: str) -> dict:
        global _next_id
        _next_id += 1
        order_id = f"ORD{_next_id}"
        self.orders[order_id] = item
        return {"order_id": order_id}
''', 11, "`_next_id += 1` writes the module-level `_next_id` (declared global); keep it on `self`"),
    "class_counter": ('''
class Order:
    next_id = 1

    def __init__(self, item):
        self.id = Order.next_id
        Order.next_id += 1
        self.item = item


class Shop:
''' + ORDERS_INIT + '''    def place(self, item: str) -> dict:
        order = Order(item)
        self.orders[order.id] = order.item
        return {"order_id": order.id}
''', 7, "`Order.next_id += 1` writes a class attribute; keep the counter on `self`"),
    "class_dict_through_self": ('''
class Shop:
    registry = {}

    def __init__(self):
        self.count = 0

    def register(self, key: str, value: str) -> dict:
        self.registry[key] = value
        self.count += 1
        return {"registered": key}
''', 9, "`self.registry[key] = value` changes the class-level `registry`, shared by every instance and never "
        "stored with one; set `self.registry` in `__init__`"),
    "mutable_default": ('''
class Shop:
''' + ORDERS_INIT + '''    def tag(self, name: str, tags: list = []) -> dict:
        tags.append(name)
        self.orders[name] = list(tags)
        return {"tags": list(tags)}
''', 7, "`tags.append(name)` changes the default value of `tags`, which outlives the call; default `tags` to "
        "`None`"),
    "module_constant": ('''
CATALOG = {"mug": 3}


class Shop:
''' + ORDERS_INIT + '''    def restock(self, item: str, qty: int) -> dict:
        stock = CATALOG
        stock[item] = stock.get(item, 0) + qty
        return {"stock": dict(CATALOG)}
''', 11, "`stock[item] = stock.get(item, 0) + qty` changes the module-level `CATALOG`, which is not part of the "
         "instance's state; copy it onto `self` in `__init__`"),
    "method_replaced": ('''
def sale_price(self) -> dict:
    return {"price": self.base / 2}


class Shop:
    def __init__(self):
        self.base = 10

    def price(self) -> dict:
        return {"price": self.base}

    def start_sale(self) -> dict:
        type(self).price = sale_price
        return {"success": True}
''', 14, "`type(self).price = sale_price` replaces a method of the class at run time; keep a flag or a value on "
         "`self`"),
    "lru_cache": ('''
import functools


class Shop:
    def __init__(self):
        self.stock = {"mug": 3}

    @functools.lru_cache(maxsize=None)
    def total(self) -> int:
        return sum(self.stock.values())

    def add(self, item: str) -> dict:
        self.stock[item] = self.stock.get(item, 0) + 1
        return {"total": self.total()}
''', 9, "`@functools.lru_cache(maxsize=None) on method total` caches results outside the instance"),
    "module_function_a_method_calls": ('''
SEEN = []


def remember(item):
    SEEN.append(item)
    return len(SEEN)


class Shop:
''' + ORDERS_INIT + '''    def place(self, item: str) -> dict:
        return {"n": remember(item)}
''', 6, "`SEEN.append(item)` changes the module-level `SEEN`"),
    "iterator_on_the_module": ('''
import itertools

_ids = itertools.count(1)


class Shop:
''' + ORDERS_INIT + '''    def place(self, item: str) -> dict:
        order_id = next(_ids)
        self.orders[order_id] = item
        return {"order_id": order_id}
''', 12, "`_ids` is an iterator kept at module level: what a call takes from it is not stored with the "
         "instance; keep a counter on `self`"),
}

# Look-alikes of the constructs above that keep everything on the instance.
ACCEPTED = {
    "class_default_shadowed_in_init": '''
class Shop:
    orders = {}
    tags: list = []
    count = 0

    def __init__(self):
        self.orders = {}
        self.tags = []

    def place(self, item: str) -> dict:
        self.orders[item] = True
        self.tags.append(item)
        self.count += 1
        return {"count": self.count}
''',
    "class_and_module_constants_only_read": '''
import copy

RATES = {"standard": 5, "express": 15}
ZONES = ["north", "south"]


class Shop:
    STATUSES = ("open", "closed")
    LIMITS = {"max_items": 3}

    def __init__(self, init_config=None):
        self.rates = copy.deepcopy(RATES)
        self.zones = list(ZONES)
        self.orders = {}

    def quote(self, speed: str) -> dict:
        if speed not in RATES or len(self.orders) >= self.LIMITS["max_items"]:
            return {"success": False}
        self.rates[speed] += 1
        self.zones.append(speed)
        return {"price": RATES[speed], "statuses": list(Shop.STATUSES), "first": type(self).STATUSES[0]}
''',
    "a_local_named_like_a_global": '''
ITEMS = ["mug"]
CONFIG = {"k": 1}


class Shop:
    def __init__(self):
        self.items = []

    def fill(self, ITEMS: list = None) -> dict:
        ITEMS = list(ITEMS or [])
        ITEMS.append("x")
        CONFIG = {}
        CONFIG["k"] = 2
        self.items.extend(ITEMS)
        return {"n": len(self.items), "config": CONFIG}
''',
    "counter_on_self_and_helper_records": '''
from dataclasses import dataclass, field


@dataclass
class Order:
    order_id: int
    lines: list = field(default_factory=list)


class Shop:
    def __init__(self):
        self.next_id = 1
        self.orders = {}

    def place(self, item: str) -> dict:
        order = Order(self.next_id)
        order.lines.append(item)
        self.next_id += 1
        self.orders[order.order_id] = order
        return {"order_id": order.order_id}
''',
}


def _refusal(code: str) -> CatalogError:
    with pytest.raises(CatalogError) as caught:
        build_environment(env_id="shop", class_name="Shop", code=code)
    return caught.value


@pytest.mark.parametrize("construct", sorted(REFUSED))
def test_each_construct_is_refused_naming_the_line_the_construct_and_the_fix(construct: str) -> None:
    code, line, said = REFUSED[construct]
    exc = _refusal(code)
    assert (exc.reason, exc.field) == ("state_outside_instance", "code")
    assert exc.message.startswith(f"line {line}: "), exc.message
    assert said in exc.message, exc.message


@pytest.mark.parametrize("look_alike", sorted(ACCEPTED))
def test_look_alikes_that_keep_state_on_the_instance_are_accepted(look_alike: str) -> None:
    env = build_environment(env_id="shop", class_name="Shop", code=ACCEPTED[look_alike])
    assert env.tools


def test_the_bundled_catalog_is_accepted_whole() -> None:
    catalog = Catalog()
    catalog.load_dir(bundled_catalog_dir())
    assert catalog.problems == []
    assert len(catalog.environments) == len([p for p in bundled_catalog_dir().iterdir() if (p / "env.json").is_file()])


def test_a_refused_package_is_skipped_when_a_catalog_loads_naming_the_line(tmp_path: Path) -> None:
    package = tmp_path / "shop"
    package.mkdir()
    (package / "env.json").write_text('{"env_id": "shop", "class_name": "Shop"}')
    (package / "env.py").write_text(REFUSED["class_counter"][0])
    catalog = Catalog()
    catalog.load_dir(tmp_path)
    assert "shop" not in catalog.environments
    (problem_line,) = catalog.problems
    assert "line 7: `Order.next_id += 1` writes a class attribute" in problem_line


@pytest.fixture(scope="module")
def server() -> Iterator[AppServer]:
    srv = start_app()
    yield srv
    srv.stop()


@pytest.fixture
def client(server: AppServer) -> Iterator[httpx.Client]:
    with server.client() as http:
        yield http


@pytest.mark.parametrize("construct", sorted(REFUSED))
def test_post_environments_answers_422_naming_the_line(client: httpx.Client, construct: str) -> None:
    code, line, said = REFUSED[construct]
    env_id = f"outside-{construct.replace('_', '-')}"
    body = problem(client.post("/v1/environments", json={"env_id": env_id, "class_name": "Shop", "code": code}),
                   422, "invalid-environment")
    assert (body["reason"], body["field"]) == ("state_outside_instance", "code")
    assert body["detail"].startswith(f"state_outside_instance: line {line}: ") and said in body["detail"]
    problem(client.get(f"/v1/environments/{env_id}"), 404, "not-found")


@pytest.mark.parametrize("look_alike", sorted(ACCEPTED))
def test_post_environments_accepts_the_look_alikes(client: httpx.Client, look_alike: str) -> None:
    env_id = f"inside-{look_alike.replace('_', '-')}"
    response = client.post("/v1/environments", json={"env_id": env_id, "class_name": "Shop",
                                                     "code": ACCEPTED[look_alike]})
    assert response.status_code == 201, response.text
