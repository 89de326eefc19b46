"""``envfoundry synth``: run the synthesis pipeline from the command line.

Wired into ``service.cli`` with ``add_parser(sub)``; also runnable alone as
``python -m synthesis.cli synth all --config FILE --out DIR``.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from synthesis.errors import ConfigError
from synthesis.run.config import api_key, load_config

# The pipeline (and through it the sandbox and the service) is imported only when a stage runs,
# so registering the command costs every other ``envfoundry`` command nothing. Same as pipeline.STAGES.
STAGES = ("themes", "skeletons", "assess", "scenarios")


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``synth themes|skeletons|assess|scenarios|all``; each sets ``run`` to a handler returning an exit code."""
    synth = sub.add_parser("synth", help="make environments and scenarios with an OpenAI-compatible LLM")
    stages = synth.add_subparsers(dest="stage", required=True)
    helps = {
        "themes": "judge corpus tasks and deduplicate the environments they need",
        "skeletons": "plan and write each environment's class",
        "assess": "test each environment with a testing and a checking agent, in the sandbox",
        "scenarios": "generate and validate scenarios, then publish the catalog",
        "all": "every stage in order (resumes an interrupted run)",
    }
    for name in (*STAGES, "all"):
        cmd = stages.add_parser(name, help=helps[name])
        cmd.add_argument("--config", required=True, type=Path, metavar="FILE", help="TOML or JSON run configuration")
        cmd.add_argument("--out", required=True, type=Path, metavar="DIR", help="output catalog folder")
        cmd.add_argument("--corpus", type=Path, metavar="FILE", help="JSONL of tasks (overrides the config)")
        cmd.add_argument("--max-envs", type=int, metavar="N", help="environments taken past theme mining")
        cmd.add_argument("--scenarios-per-env", type=int, metavar="N")
        cmd.add_argument("--concurrency", type=int, metavar="N", help="items and LLM requests at once")
        cmd.add_argument("--no-cache", action="store_true", help="neither read nor write the response cache")
        cmd.set_defaults(run=cmd_synth, stages=STAGES if name == "all" else (name,))
    variants = stages.add_parser("variants", help="derive turn-based variants of validated scenarios: a tool that "
                                                  "arrives in a later turn, or a value the user gives only when asked")
    variants.add_argument("--kind", required=True, choices=("missing-tool", "missing-param"))
    variants.add_argument("--config", required=True, type=Path, metavar="FILE", help="TOML or JSON run configuration")
    variants.add_argument("--catalog", type=Path, metavar="DIR",
                          help="the catalog whose scenarios to vary (default: the bundled one)")
    variants.add_argument("--out", required=True, type=Path, metavar="DIR", help="catalog folder to write variants to")
    variants.add_argument("--scenario", action="append", default=[], metavar="ID",
                          help="only this scenario (repeatable); default: every scenario of the catalog")
    variants.add_argument("--concurrency", type=int, metavar="N", help="scenarios and LLM requests at once")
    variants.add_argument("--no-cache", action="store_true", help="neither read nor write the response cache")
    variants.set_defaults(run=cmd_variants)


EXIT_OK, EXIT_CATALOG, EXIT_INPUT, EXIT_BARREN, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


def cmd_synth(args: argparse.Namespace) -> int:
    """0: done (and a published catalog validates); 1: the published catalog has problems;
    2: unusable configuration, or a stage's input is missing (its earlier stage has not run or kept nothing);
    3: a stage had items and kept none (every one failed or was dropped), so the run stopped there,
    or the endpoint can serve no request (key refused, model unknown, server unreachable);
    130: interrupted (Ctrl-C), after saying what the run spent and how to resume.

    Some items failing while others are kept does not change the exit code:
    they are listed in the summary and retried by the next run.
    """
    try:
        config = load_config(args.config).with_run(
            max_envs=args.max_envs, scenarios_per_env=args.scenarios_per_env, concurrency=args.concurrency
        )
        if args.corpus is not None:
            config = config.model_copy(update={"corpus": args.corpus.resolve()})
        key = api_key(config)
        from synthesis.run.pipeline import run

        result = asyncio.run(run(config, args.out, tuple(args.stages), api_key=key, use_cache=not args.no_cache))
    except ConfigError as exc:
        print(f"error: {exc.path + ': ' if exc.path else ''}{exc.message}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print(f"\ninterrupted: {_spent(args.out)}; finished items are kept: run the same command again to resume",
              file=sys.stderr)  # fmt: skip
        return EXIT_INTERRUPTED
    print(result.table)
    print(f"summary: {args.out / '_work' / 'summary.json'}")
    if result.stopped is not None:
        print(f"error: {result.stopped.message}; the run stopped before sending more", file=sys.stderr)
        return EXIT_BARREN
    barren = result.barren
    if barren is not None:
        print(f"error: {barren.stage}: none of {barren.items} items was kept; the run stopped there", file=sys.stderr)
        return EXIT_BARREN
    return EXIT_OK if result.catalog_ok else EXIT_CATALOG


def cmd_variants(args: argparse.Namespace) -> int:
    """0: variants written; 2: unusable configuration, catalog or scenario id; 3: none validated, or the
    endpoint can serve no request."""
    from synthesis.stages.variants import run_command

    try:
        config = load_config(args.config).with_run(concurrency=args.concurrency)
        return run_command(config, api_key(config), args.kind, args.catalog, args.out, args.scenario,
                           use_cache=not args.no_cache)
    except ConfigError as exc:
        print(f"error: {exc.path + ': ' if exc.path else ''}{exc.message}", file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print("\ninterrupted: variants validated so far are not written; answers are cached, so a rerun is cheap",
              file=sys.stderr)
        return EXIT_INTERRUPTED


def _spent(out: Path) -> str:
    """What the interrupted run's summary says it spent (it is written however the run ends)."""
    import json

    path = out / "_work" / "summary.json"
    try:
        total = json.loads(path.read_text(encoding="utf-8"))["total"]
        tokens = int(total["prompt_tokens"]) + int(total["completion_tokens"])
        return f"this run sent {total['requests']} requests ({tokens} tokens, ${float(total['cost']):.4f}; see {path})"
    except (OSError, ValueError, KeyError, TypeError):
        return f"what this run spent is in {out / '_work' / 'usage.jsonl'}"


def main(argv: list[str] | None = None) -> int:
    root = argparse.ArgumentParser(prog="envfoundry")
    add_parser(root.add_subparsers(dest="command", required=True))
    args = root.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
