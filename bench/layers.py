"""What a package layer costs: building it, finding it after a restart, and finding it again in the
same process, as ratios measured in one run.

    .venv/bin/python bench/layers.py [--requirement pydantic==2.14.4] [--repeat 5]

Fetches the requirement's wheels once (pip download, through pip's configured index) into a
wheelhouse, then builds its layer from that wheelhouse with no index into a fresh folder (the
cost of the first registration), opens the same folder as a restarted service would (a request
index lookup, no pip) and asks again in the same process (memory). Prints the median of each and
the ratios build / restart and build / memory.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service.catalog.packages.layers import Layers  # noqa: E402
from service.catalog.requirements import AllowList  # noqa: E402


async def measure(requirement: str, repeat: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        wheels = Path(scratch) / "wheels"
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--only-binary", ":all:", "--dest",
                        str(wheels), requirement], check=True, timeout=600)
        wheels.chmod(0o755)  # (pip runs as a uid of its own, which must read the wheelhouse)
        pins = AllowList([requirement]).pins([requirement])
        build, restart, memory = [], [], []
        for i in range(repeat):
            root = Path(scratch) / f"layers-{i}"
            layers = Layers(root, wheelhouse=wheels)
            started = time.perf_counter()
            layer = await layers.ensure(pins)
            build.append(time.perf_counter() - started)
            started = time.perf_counter()
            await Layers(root, wheelhouse=wheels).ensure(pins)
            restart.append(time.perf_counter() - started)
            started = time.perf_counter()
            await layers.ensure(pins)
            memory.append(time.perf_counter() - started)
        b, r, m = (statistics.median(x) for x in (build, restart, memory))
        print(f"{requirement}: installs {', '.join(layer.installed)}")
        print(f"build {b * 1000:.0f} ms, after a restart {r * 1000:.2f} ms, in memory {m * 1000:.3f} ms")
        print(f"build / restart {b / r:.0f}x, build / memory {b / m:.0f}x")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requirement", default="pydantic==2.14.4")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    asyncio.run(measure(args.requirement, args.repeat))


if __name__ == "__main__":
    main()
