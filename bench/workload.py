"""What the speed bench runs: the shop environment, its two initial states and the calls made on them.

The same class, states and calls serve the bare baseline, envfoundry and the in-process
measurement of the original method's step, so every figure compares like with like.
"""

from __future__ import annotations

import copy
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

ENV_DIR = Path(__file__).resolve().parent / "shop"
ENV_ID = "bench_shop"
CLASS_NAME = "ShopDesk"
SIZES = {"4k": 4_000, "400k": 400_000}  # target size of the JSON state in bytes
READ = {"name": "get_user_details", "arguments": {"user_id": "U0002"}}
# Writes alternate between these two so every call really changes the state and its size stays put.
WRITES = [
    {"name": "update_order_status", "arguments": {"order_id": "O0002", "status": "shipped"}},
    {"name": "update_order_status", "arguments": {"order_id": "O0002", "status": "processing"}},
]


def scenario_id(size: str) -> str:
    return f"bench-shop-{size}"


def make_state(target_bytes: int) -> dict[str, Any]:
    """A users/orders/products state whose JSON is just over ``target_bytes``; deterministic."""
    scale = 1
    while True:
        state = _state(scale)
        if len(json.dumps(state)) >= target_bytes:
            return state
        scale += 1 if scale < 10 else scale // 10


def _state(scale: int) -> dict[str, Any]:
    users, products, orders = 2 * scale, 2 * scale, 3 * scale
    product = {f"P{i:04d}": {"product_id": f"P{i:04d}", "name": f"Product {i}", "price": round(5 + i * 1.25, 2),
                             "stock": 10 + i % 7} for i in range(1, products + 1)}
    order = {f"O{i:04d}": {"order_id": f"O{i:04d}", "user_id": f"U{1 + i % users:04d}",
                           "product_id": f"P{1 + i % products:04d}", "quantity": 1 + i % 3,
                           "status": "processing" if i % 4 else "shipped"} for i in range(1, orders + 1)}
    user = {f"U{i:04d}": {"user_id": f"U{i:04d}", "name": f"User {i}", "email": f"user{i}@example.com",
                          "tier": "gold" if i % 5 == 0 else "basic",
                          "order_ids": sorted(o for o, v in order.items() if v["user_id"] == f"U{i:04d}")}
            for i in range(1, users + 1)}
    return {"users": user, "products": product, "orders": order}


def write_catalog(folder: Path) -> Path:
    """A catalog with the shop environment and one scenario per state size; returns the catalog folder."""
    package = folder / ENV_ID
    package.mkdir(parents=True)
    for name in ("env.py", "env.json"):
        shutil.copy(ENV_DIR / name, package / name)
    with (package / "scenarios.jsonl").open("w") as out:
        for size, target in SIZES.items():
            out.write(json.dumps({"scenario_id": scenario_id(size), "env_id": ENV_ID,
                                  "task": f"Serve the shop desk ({size} state).", "init_config": make_state(target),
                                  "checklist": []}) + "\n")
    return folder


def load_class() -> type:
    """The environment class, compiled the way the original method does it: ``exec`` of its source."""
    namespace: dict[str, Any] = {}
    exec(compile((ENV_DIR / "env.py").read_text(), str(ENV_DIR / "env.py"), "exec"), namespace)  # noqa: S102
    return namespace[CLASS_NAME]  # type: ignore[no-any-return]


def instantiate(cls: type, init_config: dict[str, Any]) -> Any:
    """The original's instantiation: ``cls(init_config)``, else ``cls()``, then ``setattr`` per key."""
    config = copy.deepcopy(init_config)
    try:
        env = cls(config)
    except TypeError:
        env = cls()
    for key, value in config.items():
        setattr(env, key, value)
    return env


def in_process_step_ms(cls: type, state: dict[str, Any], call: dict[str, Any], seconds: float) -> float:
    """Median cost of the original's in-process step: the tool call plus ``deepcopy`` of the state."""
    env = instantiate(cls, state)
    method = getattr(env, call["name"])
    samples: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(samples) < 5:
        start = time.perf_counter()
        method(**call["arguments"])
        copy.deepcopy(vars(env))
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000
