"""Runs inside .venv-verifiers (scripts/peer-venvs): verifiers' ``vf-eval`` entry point, several runs in one process.

    python verifiers_peer.py RUNS_JSON      RUNS_JSON: [{"name": ..., "argv": [...]}, ...]

Each run is what ``vf-eval ARGV...`` does (``verifiers.v1.cli.eval.main.main``), one after the
other in this process, because importing verifiers takes seconds. Prints one line per run,
``RUN <json>`` (vf-eval prints its traces too): its name and how it ended (``exit`` 0, a
``SystemExit`` code, or the exception that ended it), for the test to judge with the run's
traces.jsonl.
"""

from __future__ import annotations

import json
import sys

from verifiers.v1.cli.eval.main import main


def evaluate(name: str, argv: list[str]) -> dict[str, object]:
    try:
        main(argv)
    except SystemExit as stop:
        return {"name": name, "exit": stop.code if isinstance(stop.code, int) else 1, "message": str(stop.code)}
    except Exception as exc:  # what vf-eval would print as its traceback's last line
        return {"name": name, "exit": 1, "error": type(exc).__name__, "message": str(exc)}
    return {"name": name, "exit": 0}


if __name__ == "__main__":
    for run in json.loads(sys.argv[1]):
        print("RUN", json.dumps(evaluate(run["name"], run["argv"])), flush=True)
