"""Client settings read from the process environment."""

from __future__ import annotations

import os


def seconds_from_environment(name: str, least: float, meaning: str) -> float | None:
    """Seconds from environment variable ``name`` (None when unset or blank), so that a client a
    harness builds (verifiers, TRL) can be tuned without a change to its code.

    Raises:
        ValueError: not a number of seconds, at least ``least`` (``meaning`` says what is allowed).
    """
    value = os.environ.get(name)
    if value is None or not value.strip():
        return None
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds >= least:  # (NaN too)
        raise ValueError(f"{name} is {value!r}: {meaning}")
    return seconds
