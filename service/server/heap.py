"""Give the API process's memory back to the system when sessions end, and keep the collector off
what start-up made.

States of several MB pass through the API process (encoded, stored in the memory store, shown as
views). glibc serves large blocks from mapped memory at first, but after the first such block is
freed it raises its threshold to that size, so later states of that size land in the heap, and
a heap rarely shrinks: twelve 15 MB sessions left the process ~350 MB larger after they were
deleted. A fixed threshold keeps every block of a MiB or more in a mapping of its own, which the
system gets back the moment it is freed. Elsewhere than glibc this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger("envfoundry.heap")

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
MAPPED_FROM = 1 << 20  # bytes: blocks this large get a mapping of their own
TRIM_FROM = 8 << 20  # bytes free at the heap's top before it is returned


def release_large_blocks() -> bool:
    """Fix glibc's thresholds for this process; False where there is no glibc ``mallopt``."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    done = bool(mallopt(M_MMAP_THRESHOLD, MAPPED_FROM)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_FROM))
    if not done:
        log.warning("could not set the allocator's thresholds: large states may keep the process's memory")
    return done


def freeze_what_startup_made() -> None:
    """Keep what exists once the app has started (modules, models and their schemas, the catalog)
    out of every later garbage collection: about 130,000 objects the collector would otherwise
    walk again in each full collection, and parsing a large body triggers several. A 3.6 MB
    init_config parsed in 252 ms with them in the heap and 98 ms without (as in a small process).
    Garbage cycles are collected first, so that none is kept for good."""
    gc.collect()
    gc.freeze()
