"""``rollout`` and ``export sft``: the commands of the client package.

Reachable as ``envfoundry rollout|export`` (the server's CLI hands them over) and, where only the
client is installed, as ``envfoundry-client rollout|export`` or ``python -m envfoundry_client``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from envfoundry_client.errors import EnvfoundryError


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_parsers(sub: Any) -> None:
    """Add ``rollout``, ``rescore`` and ``export`` to an argparse subparsers object."""
    ro = sub.add_parser("rollout", help="run an agent (any OpenAI-compatible endpoint) on scenarios; write JSONL",
                        description="Run an agent on scenarios and write one trajectory per line.")
    ro.add_argument("--server", default=os.environ.get("ENVFOUNDRY_URL", "http://127.0.0.1:8000"),
                    help="envfoundry service URL (default: ENVFOUNDRY_URL or http://127.0.0.1:8000)")
    ro.add_argument("--api-key", help="envfoundry API key (default: ENVFOUNDRY_API_KEY)")
    ro.add_argument("--llm-base-url", required=True, help="the agent LLM's OpenAI-compatible base URL (…/v1)")
    ro.add_argument("--model", required=True, help="the agent LLM's model name")
    ro.add_argument("--llm-api-key", help="the agent LLM's key (default: OPENAI_API_KEY)")
    ro.add_argument("--scenario", action="append", default=[], metavar="ID", help="a scenario (repeatable)")
    ro.add_argument("--env", action="append", default=[], metavar="ENV_ID",
                    help="every scenario of an environment (repeatable); default: all scenarios")
    ro.add_argument("--split", metavar="NAME",
                    help="only scenarios of this split, e.g. test (tau-bench) or multi_turn_base (BFCL)")
    ro.add_argument("--tag", action="append", default=[], metavar="TAG",
                    help="only scenarios carrying this tag, e.g. retail (repeatable: all of them)")
    ro.add_argument("--prefix", default="", metavar="TEXT",
                    help="only scenarios whose id starts with TEXT, e.g. taubench-retail-test-")
    ro.add_argument("--mode", choices=["task", "conversation"], default="task")
    ro.add_argument("--tool-format", choices=["native", "prompt"], default="native",
                    help="native function calling, or tools in the system prompt and <tool_call> blocks in text")
    ro.add_argument("--samples", type=_positive, default=1, help="episodes per scenario, made as one group")
    ro.add_argument("--concurrency", type=_positive, default=4, help="episodes at once")
    ro.add_argument("--max-steps", type=_positive, default=30, help="agent turns per episode")
    ro.add_argument("--temperature", type=float)
    ro.add_argument("--max-tokens", type=_positive)
    ro.add_argument("--keep-sessions", action="store_true", help="do not delete sessions after scoring")
    ro.add_argument("--out", required=True, metavar="OUT.jsonl")
    ro.set_defaults(run=cmd_rollout)

    rs = sub.add_parser("rescore", help="score rollout JSONL again against the scenarios' checks as they are now",
                        description="Replay each line's tool calls on the versions it recorded and score the state "
                                    "with the scenario's latest checks (or the pinned ones), without the model.")
    rs.add_argument("input", metavar="IN.jsonl")
    rs.add_argument("--server", default=os.environ.get("ENVFOUNDRY_URL", "http://127.0.0.1:8000"))
    rs.add_argument("--api-key", help="envfoundry API key (default: ENVFOUNDRY_API_KEY)")
    rs.add_argument("--checks", choices=["latest", "pinned"], default="latest",
                    help="the scenario's latest checks, or those of the version the line was scored with")
    rs.add_argument("--concurrency", type=_positive, default=4)
    rs.add_argument("--out", required=True, metavar="OUT.jsonl")
    rs.set_defaults(run=cmd_rescore)

    ex = sub.add_parser("export", help="turn rollout JSONL into training data").add_subparsers(dest="kind",
                                                                                              required=True)
    sft = ex.add_parser("sft", help="supervised fine-tuning data, filtered by reward and well-formedness")
    sft.add_argument("input", metavar="IN.jsonl")
    sft.add_argument("--out", required=True, metavar="OUT.jsonl")
    sft.add_argument("--format", choices=["openai", "sharegpt"], default="openai")
    sft.add_argument("--min-reward", type=float, metavar="R", help="keep episodes whose reward is at least R")
    sft.set_defaults(run=cmd_export_sft)


def cmd_rollout(args: argparse.Namespace) -> int:
    from envfoundry_client.chat import ChatLLM
    from envfoundry_client.client import AsyncClient
    from envfoundry_client.report import Progress, benchmark_lines, failed_outside_agent, failures, summarize, table
    from envfoundry_client.rollout import RolloutOptions, rollout, select

    options = RolloutOptions(mode=args.mode, tool_format=args.tool_format, samples=args.samples,
                             concurrency=args.concurrency, max_steps=args.max_steps,
                             keep_sessions=args.keep_sessions)

    async def run() -> list[dict[str, Any]]:
        llm = ChatLLM(args.llm_base_url, args.model, api_key=args.llm_api_key or os.environ.get("OPENAI_API_KEY"),
                      temperature=args.temperature, max_tokens=args.max_tokens)
        try:
            async with AsyncClient(args.server, api_key=args.api_key) as ef:
                chosen = await select(ef, args.scenario, args.env, split=args.split, tags=args.tag)
                scenarios = [s for s in chosen if s.startswith(args.prefix)]
                if not scenarios:
                    raise EnvfoundryError("no scenario matches the selection")
                progress = Progress(len(scenarios) * args.samples)
                try:
                    return await rollout(ef, llm, scenarios, options, Path(args.out), on_record=progress.finished,
                                         on_start=progress.started)
                finally:
                    progress.close()
        finally:
            await llm.aclose()

    records = asyncio.run(run())
    print(table(summarize(records)))
    for line in benchmark_lines(records):
        print(line)
    print(f"wrote {len(records)} trajectories to {args.out}")
    problem = failures(records)
    if problem is None:
        return 0
    # A run in which no episode got past the LLM or the service measured nothing: a training
    # script must not take its table of zeros for results.
    everything = all(failed_outside_agent(r) for r in records)
    print(f"{'error' if everything else 'warning'}: {problem}", file=sys.stderr)
    return 1 if everything else 0


def cmd_rescore(args: argparse.Namespace) -> int:
    from envfoundry_client.client import AsyncClient
    from envfoundry_client.rescore import rescore
    from envfoundry_client.sft import read_jsonl

    records = read_jsonl(Path(args.input).read_text(encoding="utf-8"))

    async def run() -> list[dict[str, Any]]:
        async with AsyncClient(args.server, api_key=args.api_key) as ef:
            return await rescore(ef, records, checks=args.checks, concurrency=args.concurrency)

    scored = asyncio.run(run())
    Path(args.out).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in scored), encoding="utf-8")
    failed = [r for r in scored if "error" in r["rescored"]]
    changed = sum(1 for r in scored if "error" not in r["rescored"] and r["reward"] != r["rescored"]["previous_reward"])
    diverged = sum(1 for r in scored if r["rescored"].get("diverged"))
    print(f"rescored {len(scored) - len(failed)} of {len(scored)} lines ({args.checks} checks): {changed} rewards "
          f"changed, {diverged} replays answered otherwise than recorded; wrote {args.out}")
    for record in failed[:5]:
        print(f"error: {record.get('scenario_id')} sample {record.get('sample')}: {record['rescored']['error']}",
              file=sys.stderr)
    return 1 if failed else 0


def cmd_export_sft(args: argparse.Namespace) -> int:
    from envfoundry_client.sft import export, read_jsonl

    records = read_jsonl(Path(args.input).read_text(encoding="utf-8"))
    examples, report = export(records, args.format, args.min_reward)
    Path(args.out).write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples), encoding="utf-8")
    for line in report.lines():
        print(line)
    print(f"wrote {len(examples)} {args.format} examples to {args.out}")
    return 0


def main(argv: list[str] | None = None, prog: str = "envfoundry-client") -> int:
    root = argparse.ArgumentParser(prog=prog, description="Roll out agents and export training data.")
    add_parsers(root.add_subparsers(dest="command", required=True))
    args = root.parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except (EnvfoundryError, OSError) as exc:  # reported plainly: a refused server, a missing file, a bad id
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
