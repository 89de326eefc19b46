"""How many processes and descriptors one worker may hold, all it runs counted.

The container backend sizes a worker's container from the same figures (``WORKER_FILES``,
``process_budget``), so they live apart from the code that spends them. Standard library only.
"""

from __future__ import annotations

import resource

from sandbox.worker.forks import WorkerLimits

# Environment hosts kept per worker; the least recently used goes first.
MAX_HOSTS = 16
# Scenarios' initial states kept built per worker (templates), least recently used first.
MAX_TEMPLATES = 8
# Descriptors the worker itself may hold (each host costs one); calls get ``open_files``.
WORKER_FILES = 4 * MAX_HOSTS + 64


def process_budget(residents: int, processes: int) -> int:
    """The most processes one worker may run at once, all it runs counted: itself, the zygote, each host and
    each template with its ready fork and a fork ended but not yet reaped, the live sessions, the
    forks of the calls in flight, and what calls may start (a live session keeps what its calls
    started, stopped with it). Under this uid (or in this container) nothing else runs."""
    per_call = 1 + processes
    return 2 + 3 * (MAX_HOSTS + MAX_TEMPLATES) + residents * per_call + 2 * per_call + 8


def set_limits(limits: WorkerLimits, max_residents: int) -> None:
    """The worker's own limits: no core dumps, descriptors for its hosts and ``max_residents`` live
    sessions (three each), and, where its uid is its own, no more processes than its budget."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    files = max(WORKER_FILES + 3 * max_residents, limits.open_files)
    if hard != resource.RLIM_INFINITY:
        files = min(files, hard)  # a container engine may have set it lower than we can raise
    resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
    if limits.dedicated_uid:
        cap = process_budget(max_residents, limits.processes)
        resource.setrlimit(resource.RLIMIT_NPROC, (cap, cap))
