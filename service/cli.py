"""The ``envfoundry`` command."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

# Light at import: a process the service spawns (the state-view pool) imports this module again
# as its ``__main__``, and the settings would bring the whole web stack with them (1.6 s).
if TYPE_CHECKING:
    from service.catalog.importers.envscaler import ImportReport
    from service.server.settings import Settings


def _settings(args: argparse.Namespace) -> Settings:
    from service.server.settings import Settings

    overrides = {k: v for k, v in {
        "catalogs": args.catalog or None,
        "redis_url": args.redis,
        "host": args.host,
        "port": args.port,
        "workers": args.workers,
        "sandbox": getattr(args, "sandbox", None),
    }.items() if v is not None}
    return Settings(**overrides)


def cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn

    from service.api.auth import KeyFileError, KeyRing
    from service.observability import configure_logging
    from service.server.app import create_app, load_catalog
    from service.server.connections import bounded_protocol, bounded_websockets

    settings = _settings(args)
    log_config = configure_logging(settings.log_format)
    try:
        keys = KeyRing.load(settings.api_keys, settings.api_keys_file)
    except KeyFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not keys.enabled:
        if not _loopback(settings.host):
            print(f"error: refusing to listen on {settings.host} without API keys: anyone who reaches the port could "
                  "submit code. Set ENVFOUNDRY_API_KEYS or ENVFOUNDRY_API_KEYS_FILE (envfoundry keys new prints a "
                  "key), or listen on 127.0.0.1.", file=sys.stderr)
            return 2
        print("no API keys configured: listening on loopback only; every client has every scope", flush=True)
    _raise_descriptor_limit(settings)
    catalog = load_catalog(settings)  # before binding the port: a missing folder is a plain error
    print(f"envfoundry serving on http://{settings.host}:{settings.port} "
          f"(store: {'redis' if settings.redis_url else 'memory'}, sandbox: {settings.sandbox} x{settings.workers})",
          flush=True)
    print(f"console: http://{settings.host}:{settings.port}/ui/", flush=True)
    app = create_app(settings, catalog)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info", log_config=log_config,
                access_log=False, http=bounded_protocol(settings.connection_bounds(), app.state.sockets),
                ws=bounded_websockets(settings.websocket_close_timeout), timeout_keep_alive=settings.keep_alive_timeout)
    return 0


def _raise_descriptor_limit(settings: Settings) -> None:
    """Lift this process's soft descriptor limit to what it may hold: a socket per connection and
    three descriptors per live session it calls straight (``sandbox.lane``), which with the default
    residents pass the soft limit of 1,024 most systems start a service with."""
    import resource

    wanted = settings.max_connections + 3 * settings.workers * settings.limits().residents + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    raised = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
    if raised < wanted:
        print(f"warning: {raised} open files allowed (hard limit), {wanted} wanted for "
              f"{settings.max_connections} connections and {settings.workers} x {settings.limits().residents} live "
              "sessions: lower ENVFOUNDRY_RESIDENTS or raise the limit", file=sys.stderr, flush=True)


def cmd_lock(args: argparse.Namespace) -> int:
    from service.catalog.manifest import LOCK_FILE, lock
    from service.catalog.model import CatalogError

    status = 0
    for folder in map(Path, args.dirs):
        try:
            written = lock(folder)
        except CatalogError as exc:
            print(f"PROBLEM {exc.message}", file=sys.stderr)
            status = 1
            continue
        print(f"{folder / LOCK_FILE}: {len(written['environments'])} environments, {len(written['scenarios'])} "
              f"scenarios, digest {written['digest']}")
    return status


def cmd_validate(args: argparse.Namespace) -> int:
    from service.engine.validate import validate_catalog
    from service.server.app import make_pool
    from service.server.settings import Settings

    settings = Settings(workers=args.workers or 2)

    packages = settings.packages()  # ENVFOUNDRY_ALLOWED_REQUIREMENTS and the wheelhouse, as for serve
    if packages.layers is not None:
        packages.layers.prepare()

    async def run() -> int:
        pool = make_pool(settings)
        await pool.start()
        try:
            report = await validate_catalog([Path(p) for p in args.dirs], pool, packages)
        finally:
            await pool.close()
        for note in report.notes:
            print(f"NOTE {note}")
        for line in provenance_lines([Path(p) for p in args.dirs]):
            print(line)
        for problem in report.problems:
            print(f"PROBLEM {problem}")
        print(f"{report.environments} environments, {report.scenarios} scenarios, {len(report.problems)} problems")
        return 0 if report.ok else 1

    logging.basicConfig(level=logging.WARNING)
    return asyncio.run(run())


def provenance_lines(folders: list[Path]) -> list[str]:
    """What synthesis recorded about each package: its assessment and its scenarios' validation history."""
    import json

    lines: list[str] = []
    for root in folders:
        manifests = [root / "env.json"] if (root / "env.json").is_file() else sorted(root.glob("*/env.json"))
        for manifest_path in manifests:
            try:
                manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue  # the validation itself reports unreadable packages
            assessment = (manifest.get("provenance") or {}).get("assessment")
            if isinstance(assessment, dict):
                lines.append(f"PROVENANCE {manifest.get('env_id')}: {assessment.get('rounds')} rounds, verdicts "
                             f"{assessment.get('counts')} (before repair {assessment.get('first_counts')}), "
                             f"repaired {assessment.get('repaired', [])}, removed {assessment.get('removed', [])}")
            scenarios = manifest_path.with_name("scenarios.jsonl")
            for raw in scenarios.read_text(encoding="utf-8").splitlines() if scenarios.is_file() else []:
                try:
                    record = json.loads(raw)
                except ValueError:
                    continue
                history = record.get("provenance") if isinstance(record, dict) else None
                if isinstance(history, dict) and history.get("validations", 1) > 1:
                    diagnoses = [h["diagnosis"].get("diagnosis") for h in history.get("history", [])
                                 if isinstance(h.get("diagnosis"), dict)]
                    lines.append(f"PROVENANCE {record.get('scenario_id')}: {history['validations']} validations over "
                                 f"{history.get('drafts', 1)} drafts, diagnoses {diagnoses}")
    return lines


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def cmd_keys_new(args: argparse.Namespace) -> int:
    import re

    from service.api.auth import new_key

    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", args.tenant):
        print("error: --tenant: 1 to 64 letters, digits, '_', '.' or '-'", file=sys.stderr)
        return 2
    key, line = new_key(args.tenant, sorted(set(args.scope or ["run"])))
    print(f"key (give it to the client; it is not stored anywhere): {key}")
    print(f"line (add it to ENVFOUNDRY_API_KEYS_FILE or ENVFOUNDRY_API_KEYS): {line}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    from service.catalog.importers.envscaler import import_envscaler

    report = import_envscaler(Path(args.envs), Path(args.scenarios) if args.scenarios else None, Path(args.out))
    return _print_import(report, args.out)


def _print_import(report: ImportReport, out: str) -> int:
    for reason in report.skipped:
        print(f"SKIPPED {reason}")
    for note in report.notes:
        print(f"NOTE {note}")
    print(f"wrote {report.environments} environments and {report.scenarios} scenarios to {out}")
    return 0


def cmd_import_taubench(args: argparse.Namespace) -> int:
    from service.catalog.importers.taubench import import_taubench

    return _print_import(import_taubench(Path(args.checkout), Path(args.out)), args.out)


def cmd_import_bfcl(args: argparse.Namespace) -> int:
    from service.catalog.importers.bfcl import CATEGORIES, import_bfcl

    categories = tuple(args.category or CATEGORIES)
    return _print_import(import_bfcl(Path(args.out), Path(args.source) if args.source else None, categories), args.out)


def cmd_export(args: argparse.Namespace) -> int:
    from service.catalog.collection import Catalog
    from service.catalog.importers.envscaler import export_envscaler

    catalog = Catalog()
    for folder in args.dirs:
        catalog.load_dir(Path(folder))
    export_envscaler(catalog, Path(args.envs_out), Path(args.scenarios_out))
    print(f"exported {len(catalog.environments)} environments and {len(catalog.scenarios)} scenarios")
    return 0


def openapi_text() -> str:
    """The committed contract: the app's OpenAPI document, stably formatted."""
    import json

    from service.server.app import create_app
    from service.server.settings import Settings

    return json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"


def cmd_openapi(args: argparse.Namespace) -> int:
    text = openapi_text()
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(prog="envfoundry", description="Serve stateful tool environments to LLM agents.")
    sub = root.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve catalogs over HTTP (the bundled one by default)")
    serve.add_argument("--catalog", action="append", metavar="DIR", help="catalog folder (repeatable)")
    serve.add_argument("--redis", metavar="URL", help="Redis URL for sessions (default: REDIS_URL, else memory)")
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--workers", type=int, help="sandbox workers")
    serve.add_argument("--sandbox", choices=["process", "docker"], help="sandbox backend (default: process)")
    serve.set_defaults(run=cmd_serve)

    catalog = sub.add_parser("catalog", help="check and convert catalogs").add_subparsers(dest="action", required=True)
    validate = catalog.add_parser("validate", help="load packages and replay every reference solution in the sandbox")
    validate.add_argument("dirs", nargs="+", metavar="DIR")
    validate.add_argument("--workers", type=int)
    validate.set_defaults(run=cmd_validate)

    locking = catalog.add_parser("lock", help="write each catalog folder's manifest (envfoundry.lock.json): the "
                                              "version of every environment and scenario in it")
    locking.add_argument("dirs", nargs="+", metavar="DIR")
    locking.set_defaults(run=cmd_lock)

    imp = catalog.add_parser("import-envscaler", help="convert EnvScaler's released JSON into packages")
    imp.add_argument("envs", metavar="ENVS.json")
    imp.add_argument("scenarios", nargs="?", metavar="SCENARIOS.json")
    imp.add_argument("--out", required=True, metavar="DIR")
    imp.set_defaults(run=cmd_import)

    tau = catalog.add_parser("import-taubench", help="convert a tau-bench checkout (retail, airline) into packages")
    tau.add_argument("checkout", metavar="PATH", help="a clone of github.com/sierra-research/tau-bench")
    tau.add_argument("--out", required=True, metavar="DIR")
    tau.set_defaults(run=cmd_import_taubench)

    bfcl = catalog.add_parser("import-bfcl", help="convert the installed bfcl-eval's multi-turn categories into packages")
    bfcl.add_argument("--out", required=True, metavar="DIR")
    bfcl.add_argument("--source", metavar="DIR", help="a bfcl_eval package folder (default: the installed one)")
    bfcl.add_argument("--category", action="append", choices=["multi_turn_base", "multi_turn_long_context",
                                                              "multi_turn_miss_func", "multi_turn_miss_param"],
                      help="repeatable; default: all four (base and long_context also all at once, as a split "
                           "'<category>_all_at_once')")
    bfcl.set_defaults(run=cmd_import_bfcl)

    exp = catalog.add_parser("export-envscaler", help="write packages back as EnvScaler's JSON shapes")
    exp.add_argument("dirs", nargs="+", metavar="DIR")
    exp.add_argument("--envs-out", required=True, metavar="ENVS.json")
    exp.add_argument("--scenarios-out", required=True, metavar="SCENARIOS.json")
    exp.set_defaults(run=cmd_export)
    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="action", required=True)
    new = keys.add_parser("new", help="print a fresh API key and the hashed line that grants it")
    new.add_argument("--tenant", required=True, help="the tenant the key acts for (letters, digits, _ . -)")
    new.add_argument("--scope", action="append", choices=["run", "admin"], help="repeatable; default: run")
    new.set_defaults(run=cmd_keys_new)
    from synthesis.cli import add_parser as add_synth_parser

    add_synth_parser(sub)

    # rollout, rescore and export live in the client package; main() hands their arguments over unparsed.
    for name, text in CLIENT_COMMANDS.items():
        sub.add_parser(name, help=text, add_help=False)

    spec = sub.add_parser("openapi", help="print the OpenAPI document (openapi/openapi.json is this output)")
    spec.add_argument("--out", metavar="FILE")
    spec.set_defaults(run=cmd_openapi)
    return root


CLIENT_COMMANDS = {
    "rollout": "run an agent (any OpenAI-compatible endpoint) on scenarios; write trajectories as JSONL",
    "rescore": "score rollout JSONL again against the scenarios' checks as they are now (replayed, no model)",
    "export": "turn rollout JSONL into fine-tuning data (export sft)",
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in CLIENT_COMMANDS:
        try:
            from envfoundry_client.cli import main as client_main
        except ImportError:
            print(f"error: '{argv[0]}' comes with the client package: pip install clients/python", file=sys.stderr)
            return 2

        return client_main(argv, prog="envfoundry")
    args = parser().parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the CLI reports our errors plainly instead of a traceback
        from pydantic import ValidationError

        from service.catalog.model import CatalogError

        if isinstance(exc, CatalogError):
            print(f"error: {exc.path + ': ' if exc.path else ''}{exc.message}", file=sys.stderr)
            return 1
        if isinstance(exc, ValidationError):
            for problem in exc.errors():
                where = ".".join(str(part) for part in problem["loc"])
                print(f"error: setting {where}: {problem['msg']}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
