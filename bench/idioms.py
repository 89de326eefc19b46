"""What the way a tool is written costs: the same read and write in the idioms classes use, as
ratios to the subscript form, through the API.

    .venv/bin/python bench/idioms.py [--repeat 40] [--redis redis://127.0.0.1:6379/0]

Serves one environment class (`envfoundry serve`, pinned to CPU 1, 2 workers, the memory store
unless ``--redis``) whose accounts are built by ``__init__``: 12,000 of them (1.6 MB), and 16 (2 KB).
Its tools come in pairs, a read (return one account) and a write (set its note), each written in
one idiom: a subscript (``self.accounts[id]["note"] = x``, the form the proofs of
``sandbox.state.readonly`` and ``sandbox.state.footprint`` first knew), ``.get`` with a local
alias, the same with a default ``{}``, a helper method of one ``return``, a helper that checks and raises, a membership test then
an alias, and a loop over ``.values()`` that filters on the id; one more write appends to a list
of the account made by ``setdefault``, against the same append through a subscript. Each tool
is called on one session per size, the tools in turn, ``--repeat`` times; the client is
sequential, so these are latencies.

It prints the p50 of each tool, its ratio to the subscript tool of the same kind (read or
write), and the target of issue 36 (an ordinary idiom costs at most 1.3x the subscript) met or
missed. The loop is O(n) by nature: it is judged against the same loop run plainly in this
process (pinned to the server's CPU): what the served loop costs beyond the served subscript,
over what the plain loop costs (a write in such a loop names no entry a proof can tell from the
arguments: what serving adds is the watch comparing the whole of ``accounts``). Last, the state
each session ends with is checked equal to the state of the class run plainly with the same calls.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.servers import launch_service, timed  # noqa: E402
from sandbox.state.view import view  # noqa: E402
from sandbox.worker.resident import instantiate  # noqa: E402
from service.catalog.admission import build_environment  # noqa: E402
from service.catalog.folders import write_package  # noqa: E402
from service.catalog.model import CheckItem, Scenario, ToolCall  # noqa: E402

CODE = '''
class Bank:
    """Accounts, each a record under its id."""

    def __init__(self, config=None):
        size = (config or {}).get("size", 16)
        self.accounts = {f"A{i:05d}": {"id": f"A{i:05d}", "owner": f"user_{i % 997}", "balance": i % 5000,
                                       "currency": "USD", "note": "", "history": [], "tags": ["retail"]}
                         for i in range(size)}

    def read_subscript(self, account_id: str) -> dict:
        """Look an account up.

        Args:
            account_id: its id
        """
        return self.accounts[account_id]

    def write_subscript(self, account_id: str, note: str) -> dict:
        """Set an account's note.

        Args:
            account_id: its id
            note: the note
        """
        self.accounts[account_id]["note"] = note
        return {"success": True}

    def read_get(self, account_id: str) -> dict:
        """Look an account up.

        Args:
            account_id: its id
        """
        account = self.accounts.get(account_id)
        if account is None:
            return {"error": "no such account"}
        return account

    def write_get(self, account_id: str, note: str) -> dict:
        """Set an account's note.

        Args:
            account_id: its id
            note: the note
        """
        account = self.accounts.get(account_id)
        if account is None:
            return {"success": False, "error": "no such account"}
        account["note"] = note
        return {"success": True}

    def read_default(self, account_id: str) -> dict:
        """Look an account up.

        Args:
            account_id: its id
        """
        account = self.accounts.get(account_id, {})
        if not account:
            return {"error": "no such account"}
        return account

    def write_default(self, account_id: str, note: str) -> dict:
        """Set an account's note.

        Args:
            account_id: its id
            note: the note
        """
        account = self.accounts.get(account_id, {})
        if not account:
            return {"success": False, "error": "no such account"}
        account["note"] = note
        return {"success": True}

    def _find(self, account_id):
        return self.accounts.get(account_id)

    def read_helper(self, account_id: str) -> dict:
        """Look an account up.

        Args:
            account_id: its id
        """
        account = self._find(account_id)
        if not account:
            return {"error": "no such account"}
        return account

    def write_helper(self, account_id: str, note: str) -> dict:
        """Set an account's note.

        Args:
            account_id: its id
            note: the note
        """
        account = self._find(account_id)
        if not account:
            return {"success": False, "error": "no such account"}
        account["note"] = note
        return {"success": True}

    def _require(self, account_id):
        if account_id not in self.accounts:
            raise KeyError(f"no account {account_id}")
        return self.accounts[account_id]

    def read_checked(self, account_id: str) -> dict:
        """Look an account up.

        Args:
            account_id: its id
        """
        return self._require(account_id)

    def write_checked(self, account_id: str, note: str) -> dict:
        """Set an account's note.

        Args:
            account_id: its id
            note: the note
        """
        account = self._require(account_id)
        account["note"] = note
        return {"success": True}

    def read_member(self, account_id: str) -> dict:
        """Look an account up.

        Args:
            account_id: its id
        """
        if account_id not in self.accounts:
            return {"error": "no such account"}
        account = self.accounts[account_id]
        return account

    def write_member(self, account_id: str, note: str) -> dict:
        """Set an account's note.

        Args:
            account_id: its id
            note: the note
        """
        if account_id not in self.accounts:
            return {"success": False, "error": "no such account"}
        account = self.accounts[account_id]
        account["note"] = note
        return {"success": True}

    def read_loop(self, account_id: str) -> dict:
        """Look an account up.

        Args:
            account_id: its id
        """
        for account in self.accounts.values():
            if account["id"] == account_id:
                return account
        return {"error": "no such account"}

    def write_loop(self, account_id: str, note: str) -> dict:
        """Set an account's note.

        Args:
            account_id: its id
            note: the note
        """
        for account in self.accounts.values():
            if account["id"] == account_id:
                account["note"] = note
                return {"success": True}
        return {"success": False, "error": "no such account"}

    def append_subscript(self, account_id: str, note: str) -> dict:
        """Add a note to an account's history.

        Args:
            account_id: its id
            note: the note
        """
        self.accounts[account_id]["history"].append(note)
        return {"success": True}

    def append_setdefault(self, account_id: str, note: str) -> dict:
        """Add a note to an account's history.

        Args:
            account_id: its id
            note: the note
        """
        account = self.accounts.get(account_id)
        if account is None:
            return {"success": False, "error": "no such account"}
        account.setdefault("history", []).append(note)
        return {"success": True}
'''
SIZES = {"12,000": 12000, "16": 16}
IDIOMS = ("subscript", "get", "default", "helper", "checked", "member", "loop")
KINDS = ("read", "write")
EXTRA = ("append_subscript", "append_setdefault")  # (a write; the second judged against the first)
TARGET = 1.3  # issue 36: an ordinary idiom costs at most this multiple of the subscript form
SHORTEST = 0.05  # ms: a plain loop shorter than this is lost in the noise of a served call


def tools() -> list[str]:
    return [f"{kind}_{idiom}" for kind in KINDS for idiom in IDIOMS] + list(EXTRA)


def catalog(out: Path) -> Path:
    env = build_environment(env_id="bench_bank", class_name="Bank", code=CODE, summary="Accounts in many idioms.")
    done = "def check_func(final_state):\n    return True"
    scenarios = [Scenario(scenario_id=f"bank-{size}", env_id="bench_bank", task="Any.", init_config={"size": size},
                          checklist=[CheckItem("any", done)],
                          reference_solution=[ToolCall("read_subscript", {"account_id": "A00001"})])
                 for size in SIZES.values()]
    write_package(env, scenarios, out)
    return out


def middle(size: int) -> str:
    """The account every call names: halfway, so that the loop's cost is that of half the accounts."""
    return f"A{size // 2:05d}"


def arguments(name: str, size: int, n: int) -> dict[str, Any]:
    if name.startswith("read_"):
        return {"account_id": middle(size)}
    return {"account_id": middle(size), "note": f"note {n} of {name}"}  # (a new note: every write changes it)


def measure(client: httpx.Client, size: int, repeat: int) -> tuple[dict[str, float], list[tuple[str, dict[str, Any]]],
                                                                   dict[str, Any]]:
    """Each tool's p50 (ms) on one session at ``size``, the calls made, and the state it ends with."""
    def call(name: str, args: dict[str, Any]) -> None:
        answer = client.post(f"/v1/sessions/{sid}/calls", json={"name": name, "arguments": args})
        assert answer.status_code == 200 and answer.json()["ok"], answer.text[:500]

    answer = client.post("/v1/sessions", json={"scenario_id": f"bank-{size}"})
    assert answer.status_code == 201, answer.text[:500]
    sid = answer.json()["session_id"]
    samples: dict[str, list[float]] = {name: [] for name in tools()}
    made: list[tuple[str, dict[str, Any]]] = []
    for n in range(repeat):
        for name in tools():  # in turn, so that a slow moment of the machine falls on all of them
            args = arguments(name, size, n)
            samples[name] += timed(functools.partial(call, name, args), 1)
            made.append((name, args))
    state = client.get(f"/v1/sessions/{sid}/state").json()["state"]
    client.delete(f"/v1/sessions/{sid}")
    return {name: statistics.median(found) * 1000 for name, found in samples.items()}, made, state


def plainly(size: int, calls: list[tuple[str, dict[str, Any]]], repeat: int,
            cpu: int) -> tuple[dict[str, Any], dict[str, float]]:
    """The class run plainly in this process: the state after ``calls``, and the p50 (ms) of each
    loop tool alone, timed on the server's CPU."""
    module = types.ModuleType("bench_bank_plain")
    exec(compile(CODE, "<bench bank>", "exec"), module.__dict__)
    bank = instantiate(module.Bank, {"size": size})  # (as a worker does: the config's entries become attributes)
    for name, args in calls:
        getattr(bank, name)(**args)
    state = view(vars(bank), bank)
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        loops = {name: statistics.median(timed(functools.partial(getattr(bank, name), **arguments(name, size, 0)),
                                               repeat)) * 1000 for name in ("read_loop", "write_loop")}
    finally:
        os.sched_setaffinity(0, before)
    return state, loops


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=40)
    parser.add_argument("--redis", default=None)
    args = parser.parse_args()
    cpu = 1
    with tempfile.TemporaryDirectory() as tmp:
        folder = catalog(Path(tmp) / "catalog")
        server = launch_service("idioms", folder, cpu, Path(tmp), workers=2, redis_url=args.redis, sandbox="process")
        try:
            server.wait_ready()
            with httpx.Client(base_url=server.url, timeout=120) as client:
                rows = {label: measure(client, size, args.repeat) for label, size in SIZES.items()}
        finally:
            server.stop()
    store = "redis" if args.redis else "memory"
    print(f"p50 ms over {args.repeat} calls each, {store} store, one server on CPU {cpu} (2 workers)")
    for label, size in SIZES.items():
        figures, calls, state = rows[label]
        plain, loops = plainly(size, calls, args.repeat, cpu)
        print(report(label, figures, loops))
        print(f"  state after {len(calls)} calls {'equals' if state == plain else 'DIFFERS FROM'} the class run plainly")


def report(label: str, figures: dict[str, float], loops: dict[str, float]) -> str:
    lines = [f"{label} accounts built by __init__", f"{'idiom':>12} {'read':>8} {'/ subscr':>9} {'write':>8} {'/ subscr':>9}"]
    for idiom in IDIOMS:
        read, write = figures[f"read_{idiom}"], figures[f"write_{idiom}"]
        lines.append(f"{idiom:>12} {read:>8.2f} {read / figures['read_subscript']:>8.2f}x "
                     f"{write:>8.2f} {write / figures['write_subscript']:>8.2f}x")
    append, setdefault = figures["append_subscript"], figures["append_setdefault"]
    lines.append(f"{'append':>12} {'':>8} {'':>9} {append:>8.2f} {1:>8.2f}x")
    lines.append(f"{'setdefault':>12} {'':>8} {'':>9} {setdefault:>8.2f} {setdefault / append:>8.2f}x")
    lines.append("  targets (an ordinary idiom at most 1.3x the subscript form, of the same kind):")
    ordinary = [idiom for idiom in IDIOMS if idiom not in ("subscript", "loop")]
    missed = [f"{kind}_{idiom} {figures[f'{kind}_{idiom}'] / figures[f'{kind}_subscript']:.2f}x"
              for kind in KINDS for idiom in ordinary
              if figures[f"{kind}_{idiom}"] > TARGET * figures[f"{kind}_subscript"]]
    if setdefault > TARGET * append:
        missed.append(f"append_setdefault {setdefault / append:.2f}x")
    lines.append("    .get, its default, helpers, membership, setdefault: " + ("met" if not missed else "MISSED: " + ", ".join(missed)))
    for kind in KINDS:  # the loop: what serving adds to it, over the loop run plainly
        name = f"{kind}_loop"
        beyond = figures[name] - figures[f"{kind}_subscript"]
        judged = f"{beyond / loops[name]:.1f}x" if loops[name] >= SHORTEST else "too short to judge"
        lines.append(f"    {name}: {beyond:.2f} ms beyond the subscript call, the loop plainly {loops[name]:.3f} ms: "
                     f"{judged}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
