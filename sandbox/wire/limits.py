"""Every sandbox limit, defined once: its default, its setting, and where it is enforced.

A field of ``Limits`` may be
- a setting (``ENVFOUNDRY_<SETTING>``; ``service.server.settings`` makes its fields from these),
- a worker flag (the worker enforces it, for every call it starts: ``worker_flags``),
- a per-call field (each call request carries it, and the session's process enforces it:
  ``call_fields``),
or several of these. Adding a limit is adding a field here.

Standard library only: the worker reads its flags with ``worker_arguments``.
"""

from __future__ import annotations

import argparse
import functools
from dataclasses import MISSING, dataclass, field, fields
from typing import Any


def _limit(default: Any, help: str, *, setting: str | None = None, flag: str | None = None,
           call: str | None = None, ge: float | None = None, gt: float | None = None,
           le: float | None = None) -> Any:
    bounds = {k: v for k, v in (("ge", ge), ("gt", gt), ("le", le)) if v is not None}
    return field(default=default, metadata={"help": help, "setting": setting, "flag": flag, "call": call,
                                            "bounds": bounds})


# Sessions one lodge holds live, at most (the least recently used go cold; see
# ``sandbox.worker.lodge``): here so the service's pool knows it without importing the worker.
MAX_LODGED = 20_000

@dataclass(frozen=True)
class Limits:
    """Sandbox limits; the defaults suit LLM-written environments."""

    call_timeout: float = _limit(10.0, "Wall time per tool call, seconds.", setting="call_timeout",
                                 call="timeout", gt=0)
    check_timeout: float = _limit(5.0, "Wall time per check function, seconds.", setting="check_timeout", gt=0)
    load_timeout: float = _limit(10.0, "Wall time for an environment's module code to load, seconds.")
    memory_mb: int = _limit(512, "Address-space limit per call, MiB.", setting="memory_mb", flag="--memory-mb",
                            ge=32)
    open_files: int = _limit(64, "Open files per call.", setting="open_files", flag="--open-files", ge=16)
    processes: int = _limit(0, "Extra processes a call may start.", setting="processes", flag="--processes", ge=0)
    tmp_mb: int = _limit(64, "Size of a worker's private /tmp, MiB.", flag="--tmp-mb")
    # (hard links count too: emptying /tmp after each call takes time that follows this bound)
    tmp_inodes: int = _limit(8192, "Files, folders and links a worker's private /tmp may hold.",
                             flag="--tmp-inodes")
    output_bytes: int = _limit(1 << 20, "Bytes a call may print.", setting="max_output_bytes",
                               flag="--output-bytes")
    result_bytes: int = _limit(1 << 20, "Size of a tool's JSON result.", setting="max_result_bytes",
                               call="max_result_bytes")
    state_bytes: int = _limit(16 << 20, "Size of a session's encoded state.", setting="max_state_bytes",
                              call="max_state_bytes")
    # a larger diff is summarised (the service sets it to a trajectory record's bound)
    diff_bytes: int = _limit(256 * 1024, "Size of a call's diff before it is summarised.", call="max_diff_bytes")
    # A session's own process holds about 3 MB that it shares with nothing: beyond these, a worker
    # keeps sessions live in lodges, many to a process (see ``sandbox.worker.lodge``), whose calls
    # pass through the worker. An RL batch keeps thousands open and calls each rarely.
    residents: int = _limit(512, "Sessions each sandbox worker keeps live in a process of their own, at most; "
                                 "beyond, they live in lodges (0: no session is kept live, every call rebuilds "
                                 "the instance from the stored state).", setting="residents",
                            flag="--residents", ge=0, le=4096)
    # A check of environment code (a correct class gives the same results either way), not a way
    # to serve: every call then decodes the state and starts a process.
    rebuild_every_call: bool = _limit(False, "Rebuild every session call's instance from the stored state: no "
                                             "live sessions (residents 0), no call straight to a session's "
                                             "process, no initial state forked from a template.",
                                      setting="rebuild_every_call")
    # Sized by the machine unless set: a batch's live sessions should go cold under real memory
    # pressure only, and a fixed figure is either too small for a large machine or more than a
    # small one has (see ``sandbox.pool.worker.resident_share``).
    resident_memory_mb: int = _limit(-1, "Memory a sandbox worker's live sessions may hold, as measured from "
                                        "its memory cgroup; past it the least recently used go cold (their "
                                        "next call rebuilds them from the store). -1: half the memory the "
                                        "service may use (the machine's, or its memory cgroup's if less), "
                                        "shared among the workers.", setting="resident_memory_mb", ge=-1)
    # (the service keeps it within the session TTL: a live session never outlives its stored session)
    resident_idle: float = _limit(600.0, "Seconds an unused live session keeps its process.",
                                  flag="--resident-idle")
    # Python randomises str and bytes hashes per process, so a set of strings iterates in another
    # order in every worker: one seed for every worker of every replica keeps a session's set
    # order through rebuilds, as one process would (the sandbox bounds a call's time, which is what
    # randomised hashes defend against).
    hash_seed: int = _limit(0, "PYTHONHASHSEED of every sandbox worker (the same on every replica).",
                            setting="hash_seed", ge=0, le=4294967295)
    # the package layers' folder, readable (read-only) by every worker; empty: none
    layers_root: str = _limit("", "Folder of the package layers environments may use.", flag="--layers-root")

    def worker_flags(self) -> list[str]:
        """The worker's command line for these limits (see ``worker_arguments``)."""
        flags: list[str] = []
        for item in fields(self):
            flag, value = item.metadata["flag"], getattr(self, item.name)
            if flag is not None and value != "":
                flags += [flag, str(value)]
        return flags

    def call_fields(self) -> dict[str, Any]:
        """What each call request carries of these limits, for the session's process to enforce."""
        return {call: getattr(self, name) for call, name in _call_names()}


@functools.cache
def _call_names() -> list[tuple[str, str]]:
    """(the name in a call request, the field) of the limits each call carries (``fields`` looks
    through the class on each use: every call asked)."""
    return [(item.metadata["call"], item.name) for item in fields(Limits) if item.metadata["call"] is not None]


DEFAULTS = Limits()


def settings() -> list[tuple[str, str, Any, str, dict[str, float]]]:
    """(field, setting, default, help, bounds) of every limit that is a setting."""
    return [(item.name, item.metadata["setting"], item.default, item.metadata["help"], item.metadata["bounds"])
            for item in fields(Limits) if item.metadata["setting"] is not None and item.default is not MISSING]


def add_worker_flags(parser: argparse.ArgumentParser) -> None:
    """The worker's flags for the limits it enforces, with their defaults."""
    for item in fields(Limits):
        flag = item.metadata["flag"]
        if flag is not None:
            kind = type(item.default)
            parser.add_argument(flag, dest=item.name, type=kind, default=item.default, help=item.metadata["help"])


def worker_arguments(args: argparse.Namespace) -> Limits:
    """The limits the worker was started with (``add_worker_flags``)."""
    given = {item.name: getattr(args, item.name) for item in fields(Limits) if item.metadata["flag"] is not None}
    return Limits(**given)
