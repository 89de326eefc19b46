"""Waiting for a descriptor with ``poll``, never ``select``.

``select`` takes descriptor numbers below 1,024 only (``FD_SETSIZE``), and a worker holding a
few hundred live sessions (three descriptors each) has more: a wait on one of them then fails
with "filedescriptor out of range". Standard library only.
"""

from __future__ import annotations

import math
import select
from typing import Protocol

# poll takes its timeout as a C int of milliseconds (about 24 days): a longer wait is cut to it, and
# every caller waits in a loop up to its own deadline.
LONGEST_MS = 2**31 - 1


class HasFileno(Protocol):
    def fileno(self) -> int: ...


def ready(fd: int | HasFileno, wait: float, *, write: bool = False) -> bool:
    """Whether ``fd`` can be read (or written) within ``wait`` seconds; as with ``select``, a
    descriptor whose other end is closed, or in error, counts as ready (the read or write says
    what happened)."""
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(min(math.ceil(max(wait, 0.0) * 1000), LONGEST_MS)))
