"""Catalog scale: the bundled catalog alone against it plus imported benchmark catalogs, in one run.

    python -m bench.catalog_scale DIR [DIR ...]      # e.g. the output of import-bfcl and import-taubench

Starts one server per side (memory store, one worker) and prints, for each, the scenario count,
the time to become ready, and the median of 20 requests to list environments, list the scenarios
of the largest environment, and read one scenario, with the ratio of the large side to the
bundled one.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from statistics import median

import httpx

from bench.servers import ROOT, free_port, timed, wait_ready

BUNDLED = ROOT / "catalog"


def measure(catalogs: list[Path]) -> dict[str, float]:
    port = free_port()
    args = [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", "1"]
    for folder in catalogs:
        args += ["--catalog", str(folder)]
    start = time.perf_counter()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/healthz", proc, timeout=300)
        ready = time.perf_counter() - start
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


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    base = measure([BUNDLED])
    large = measure([BUNDLED, *map(Path, argv)])
    print(f"{'':32}{'bundled':>12}{'with imports':>16}{'ratio':>10}")
    for key in base:
        ratio = large[key] / base[key] if base[key] else float("nan")
        print(f"{key:32}{base[key]:12.2f}{large[key]:16.2f}{ratio:10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
