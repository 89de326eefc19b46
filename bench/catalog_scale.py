"""Catalog scale: the bundled catalog alone against it plus imported benchmark catalogs, in one run.

    python -m bench.catalog_scale DIR [DIR ...]      # e.g. the output of import-bfcl and import-taubench
    python -m bench.catalog_scale --synthetic N [N ...]   # generated catalogs of N scenarios each

Starts one server per side (memory store, one worker) and prints, for each, the scenario count,
the time to become ready, and the median of 20 requests to list environments, list the scenarios
of the largest environment, and read one scenario, with the ratio of the large side to the
bundled one.

``--synthetic`` writes catalogs of N labelled scenarios (10 environments, 3 splits, 7 tags) and
prints, per size, the median latency of: the first page of GET /v1/scenarios, a page from the
middle of the listing (by cursor), the first page of a split, of a tag within one environment,
one environment's scenarios in one page of 1000, and the time to page through everything 1000 at
a time, and the first pages again after the tenant adds ADDED scenarios over the API; then the
ratio of each size to the first. A page's cost should not follow the catalog's
size; paging through everything should (it reads every scenario).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

import httpx

from bench.servers import ROOT, free_port, timed, wait_ready

BUNDLED = ROOT / "catalog"


SHELF = """class Shelf:
    def __init__(self, items=None):
        self.items = dict(items or {})

    def put(self, name: str) -> dict:
        \"\"\"Put an item on the shelf.\"\"\"
        self.items[name] = True
        return {"success": True}
"""
SPLITS = ("test", "train", "dev")
ADDED = 300  # scenarios the (anonymous) tenant adds over the API on top of each catalog


def synthetic_catalog(root: Path, count: int) -> Path:
    """``count`` scenarios over 10 environments, each in a split and with two tags, as a catalog folder."""
    for env in range(10):
        folder = root / f"synthetic_{env}"
        folder.mkdir(parents=True)
        (folder / "env.py").write_text(SHELF)
        (folder / "env.json").write_text(json.dumps({"env_id": folder.name, "class_name": "Shelf"}))
        lines = [json.dumps({"scenario_id": f"syn-{i:06d}", "env_id": folder.name, "split": SPLITS[i % 3],
                             "tags": ["synthetic", f"t{i % 7}"], "init_config": {"items": {f"i{i}": True}},
                             "task": f"Put item {i} on the shelf, then check that it is there. " * 3})
                 for i in range(env, count, 10)]
        (folder / "scenarios.jsonl").write_text("\n".join(lines) + "\n")
    return root


def start(catalogs: list[Path]) -> tuple[subprocess.Popen[bytes], str, float]:
    port = free_port()
    args = [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", "1"]
    for folder in catalogs:
        args += ["--catalog", str(folder)]
    began = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/healthz", proc, timeout=300)
    except BaseException:
        proc.kill()
        raise
    return proc, url, time.perf_counter() - began


def measure(catalogs: list[Path]) -> dict[str, float]:
    proc, url, ready = start(catalogs)
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            envs = http.get("/v1/environments").json()["environments"]
            largest = max(envs, key=lambda e: e["scenario_count"])["env_id"]
            listed = http.get(f"/v1/environments/{largest}/scenarios").json()["scenarios"]
            one = listed[-1]["scenario_id"]
            return {
                "scenarios": sum(e["scenario_count"] for e in envs),
                "ready_s": ready,
                "list_environments_ms": median(timed(lambda: http.get("/v1/environments"), 20)) * 1000,
                "list_largest_env_scenarios_ms":
                    median(timed(lambda: http.get(f"/v1/environments/{largest}/scenarios"), 20)) * 1000,
                "largest_env_scenarios": len(listed),
                "get_scenario_ms": median(timed(lambda: http.get(f"/v1/scenarios/{one}"), 20)) * 1000,
            }
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def ms(fn: Callable[[], object], n: int = 50) -> float:
    return median(timed(fn, n)) * 1000


def measure_listing(catalog: Path) -> dict[str, float]:
    proc, url, ready = start([catalog])
    try:
        with httpx.Client(base_url=url, timeout=120) as http:
            def get(path: str, **params: Any) -> dict[str, Any]:
                response = http.get(path, params={k: v for k, v in params.items() if v is not None})
                response.raise_for_status()
                return response.json()  # type: ignore[no-any-return]

            total = get("/v1/scenarios", limit=1)["total"]
            timed(lambda: get("/v1/scenarios", split="train"), 50)  # warm the process up before timing it
            cursor = None
            for _ in range(total // 2 // 1000):  # to the middle, 1000 at a time
                cursor = get("/v1/scenarios", limit=1000, cursor=cursor)["next_cursor"]

            def everything() -> None:
                after = None
                while True:
                    after = get("/v1/scenarios", limit=1000, cursor=after)["next_cursor"]
                    if after is None:
                        return

            found = {
                "scenarios": total,
                "ready_s": ready,
                "first_page_ms": ms(lambda: get("/v1/scenarios")),
                "middle_page_ms": ms(lambda: get("/v1/scenarios", cursor=cursor)),
                "split_page_ms": ms(lambda: get("/v1/scenarios", split="dev")),
                "env_and_tag_page_ms": ms(lambda: get("/v1/scenarios", env="synthetic_3", tag="t5")),
                "env_1000_ms": ms(lambda: get("/v1/environments/synthetic_3/scenarios", limit=1000)),
                "list_environments_ms": ms(lambda: get("/v1/environments")),
                "page_through_all_ms": ms(everything, 5),
            }
            # Scenarios added over the API are merged in from the store on each request.
            for i in range(ADDED):
                http.post("/v1/scenarios", json={"scenario_id": f"add-{i:05d}", "env_id": "synthetic_0", "task": "t",
                                                 "split": "dev"}).raise_for_status()
            found["first_page_with_added_ms"] = ms(lambda: get("/v1/scenarios"))
            found["split_page_with_added_ms"] = ms(lambda: get("/v1/scenarios", split="dev"))
            return found
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def synthetic(sizes: list[int]) -> int:
    results = []
    with tempfile.TemporaryDirectory(prefix="catalog-scale-") as tmp:
        for size in sizes:
            results.append(measure_listing(synthetic_catalog(Path(tmp) / str(size), size)))
    print(f"{'':24}" + "".join(f"{r['scenarios']:>12.0f}" for r in results)
          + "".join(f"{'x' + str(int(r['scenarios'])):>12}" for r in results[1:]))
    for key in results[0]:
        if key == "scenarios":
            continue
        cells = "".join(f"{r[key]:12.2f}" for r in results)
        ratios = "".join(f"{r[key] / results[0][key]:12.2f}" for r in results[1:])
        print(f"{key:24}{cells}{ratios}")
    return 0


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    if argv[0] == "--synthetic":
        return synthetic([int(n) for n in argv[1:]] or [1000, 10000])
    base = measure([BUNDLED])
    large = measure([BUNDLED, *map(Path, argv)])
    print(f"{'':32}{'bundled':>12}{'with imports':>16}{'ratio':>10}")
    for key in base:
        ratio = large[key] / base[key] if base[key] else float("nan")
        print(f"{key:32}{base[key]:12.2f}{large[key]:16.2f}{ratio:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
