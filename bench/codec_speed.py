"""Encode and decode time of the state codec on the bundled environments' states and large states.

    .venv/bin/python bench/codec_speed.py [--codec path/to/encoder.py --codec path/to/decoder.py] [--repeat 30]

``--codec`` loads other versions of ``sandbox/state/encoder.py`` and ``sandbox/state/decoder.py`` (for
example written out with ``git show main:sandbox/state/encoder.py > /tmp/encoder_main.py``), or a
``codec.py`` from before they were split, so two versions are measured on exactly the same states;
what the given files lack comes from the checkout. Prints, per state, its encoded size and the median
time of ``encode_state``, ``decode`` and ``view_encoded``. A state the codec refuses is reported with
its error.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sandbox.worker.resident import instantiate, public_state  # noqa: E402

GRAPH_MODULE = "ef_env_bench_graph"
GRAPH_SOURCE = '''
class Node:
    def __init__(self, name, parent=None, is_dir=True, content=""):
        self.name = name
        self.parent = parent
        self.is_dir = is_dir
        self.content = content
        self.children = {}
'''


def load_codec(paths: list[str]) -> types.SimpleNamespace:
    """``encode_state``, ``CodecError``, ``decode`` and ``view_encoded``, each from the last of the
    files at ``paths`` that defines it, else from the checkout."""
    from sandbox.state import decoder, encoder, view

    codec = types.SimpleNamespace(encode_state=encoder.encode_state, CodecError=encoder.CodecError,
                                  decode=decoder.decode, view_encoded=view.view_encoded)
    for number, path in enumerate(paths):
        spec = importlib.util.spec_from_file_location(f"codec_under_test_{number}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        for name in vars(codec):
            if hasattr(module, name):
                setattr(codec, name, getattr(module, name))
    return codec


def catalog_states() -> list[tuple[str, dict[str, Any], str]]:
    """Every scenario's initial state of the bundled catalog, built in this process."""
    out = []
    for folder in sorted((ROOT / "catalog").iterdir()):
        if not (folder / "env.json").is_file():
            continue  # the catalog's lock file
        meta = json.loads((folder / "env.json").read_text())
        module = types.ModuleType(f"ef_env_bench_{folder.name}")
        sys.modules[module.__name__] = module
        exec(compile((folder / "env.py").read_text(), str(folder / "env.py"), "exec"), module.__dict__)
        cls = getattr(module, meta["class_name"])
        for line in (folder / "scenarios.jsonl").read_text().splitlines():
            scenario = json.loads(line)
            instance = instantiate(cls, scenario["init_config"])
            out.append((scenario["scenario_id"], public_state(instance), module.__name__))
    return out


def store_state(target_bytes: int) -> dict[str, Any]:
    """A users/orders/products state of about ``target_bytes`` as plain JSON-like dicts."""
    users: dict[str, Any] = {}
    products: dict[str, Any] = {}
    orders: dict[str, Any] = {}
    i = 0
    while len(json.dumps({"users": users, "products": products, "orders": orders})) < target_bytes:
        users[f"U{i:05d}"] = {"user_id": f"U{i:05d}", "name": f"User {i}", "email": f"user{i}@example.com",
                              "status": "active", "addresses": [{"city": "Lyon", "zip": f"{69000 + i % 9}"}]}
        products[f"P{i:05d}"] = {"product_id": f"P{i:05d}", "name": f"Product {i}", "price": 9.5 + i % 40,
                                 "stock": i % 17, "tags": ["a", "b"]}
        orders[f"O{i:05d}"] = {"order_id": f"O{i:05d}", "user_id": f"U{i:05d}", "status": "paid",
                               "lines": [{"product_id": f"P{i:05d}", "qty": 1 + i % 3, "price": 9.5 + i % 40}],
                               "total": (9.5 + i % 40) * (1 + i % 3)}
        i += 1
    return {"users": users, "products": products, "orders": orders, "next_id": i}


def file_tree_state(target_bytes: int, graph: bool) -> tuple[dict[str, Any], str]:
    """A file-system tree; with ``graph`` its nodes point to their parent and current_dir aliases one."""
    module = types.ModuleType(GRAPH_MODULE)
    sys.modules[GRAPH_MODULE] = module
    exec(GRAPH_SOURCE, module.__dict__)
    node = module.Node
    root = node("/")
    size, d = 0, 0
    while size < target_bytes:
        folder = node(f"dir{d}", root if graph else None)
        root.children[folder.name] = folder
        for f in range(20):
            leaf = node(f"file{f}.txt", folder if graph else None, False, f"content of file {f} in dir {d} " * 2)
            folder.children[leaf.name] = leaf
        size += 20 * 110 + 60
        d += 1
    if not graph:
        return {"root": root, "current_dir": "/dir0"}, GRAPH_MODULE
    return {"root": root, "current_dir": root.children["dir0"], "history": [root]}, GRAPH_MODULE


def timed(fn: Any, repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def measure(codec: types.SimpleNamespace, name: str, state: dict[str, Any], module: str | None, repeat: int,
            resolve: Any) -> str:
    try:
        text = codec.encode_state(state, module)
    except codec.CodecError as exc:
        return f"{name:28} refused: {exc}"
    enc = timed(lambda: codec.encode_state(state, module), repeat)
    dec = timed(lambda: codec.decode(json.loads(text), resolve), repeat)
    vw = timed(lambda: codec.view_encoded(json.loads(text)), repeat)
    return f"{name:28} {len(text) / 1024:8.1f} KB  encode {enc:8.3f} ms  decode {dec:8.3f} ms  " \
           f"encode+decode {enc + dec:8.3f} ms  view {vw:8.3f} ms"


def resolver(module: str | None) -> Any:
    def resolve(qualname: str) -> Any:
        target: Any = sys.modules[str(module)]
        for part in qualname.split("."):
            target = getattr(target, part)
        return target

    return resolve


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--codec", action="append", default=[], metavar="PATH",
                        help="another encoder.py, decoder.py (or an older codec.py) to measure instead of the "
                             "checkout's; repeat for both")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    codec = load_codec(args.codec)
    for name, state, module in catalog_states():
        print(measure(codec, name, state, module, args.repeat, resolver(module)))
    for size in (4_000, 40_000, 450_000):
        print(measure(codec, f"store {size // 1000} KB", store_state(size), None, args.repeat, None))
    for size in (4_000, 400_000):
        for graph in (False, True):
            state, module = file_tree_state(size, graph)
            label = f"file {'graph' if graph else 'tree'} {size // 1000} KB"
            print(measure(codec, label, state, module, args.repeat, resolver(module)))


if __name__ == "__main__":
    main()
