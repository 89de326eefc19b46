"""Sessions this process holds open for trainers, closed however the process ends.

A trainer (TRL's factory instances, a verifiers rollout) opens a session per rollout and is not
always there to close it: a run ends with an exception, Ctrl-C, or a scheduler's SIGTERM in the
middle of a batch. Each such session is recorded here while it is open, and what is still
recorded is deleted

- at interpreter exit (``atexit``: a normal end, an exception that ends the program, and Ctrl-C,
  whose KeyboardInterrupt ends the program the same way);
- on SIGTERM and SIGHUP, before the handler that was there before runs (or, when that was the
  default, before the signal is delivered again with its default action, so the exit status is
  still the signal's).

SIGKILL cannot be caught: the service's ``ENVFOUNDRY_SESSION_TTL`` (idle seconds) reaps what a
killed process left.

Deleting uses a client of its own with a short time budget: a signal can arrive while the main
thread is inside the trainer's client, and a service that is down must not hold the exit for long.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
from types import FrameType
from typing import Any

from envfoundry_client.exchange import Config, Retry

CLOSE_SECONDS = 10.0  # at most this long to delete what is left, however many sessions
SIGNALS = ("SIGTERM", "SIGHUP")

# session id -> the configuration of the client that opened it. Plain dict operations only (no
# lock): a signal handler runs in the main thread between two bytecodes, possibly while another
# call here holds a lock, and would wait for it forever.
_held: dict[str, Config] = {}
_installed: set[str] = set()
_previous: dict[int, Any] = {}


def hold(config: Config, session_id: str) -> None:
    """Record an open session, to be deleted at exit or on a terminating signal unless released first."""
    install()
    _held[session_id] = config


def release(session_id: str) -> None:
    """The session is closed (or handed on): nothing to do for it at exit."""
    _held.pop(session_id, None)


def held() -> list[str]:
    """The sessions recorded now."""
    return list(_held)


def close_all(deadline: float = CLOSE_SECONDS) -> int:
    """Delete every recorded session; returns how many were deleted (or already gone)."""
    from envfoundry_client.client import Client
    from envfoundry_client.errors import EnvfoundryError, NotFound

    done = 0
    ends = time.monotonic() + deadline
    clients: dict[tuple[str, tuple[tuple[str, str], ...]], Client] = {}
    try:
        for session_id, config in list(_held.items()):
            left = ends - time.monotonic()
            if left <= 0:
                break
            key = (config.base_url, tuple(sorted(config.headers.items())))
            if key not in clients:
                clients[key] = Client(config.base_url, headers=config.headers, timeout=min(5.0, left),
                                      retry=Retry(seconds=min(3.0, left)))
            try:
                clients[key].delete_session(session_id)
                done += 1
            except NotFound:
                done += 1  # expired or deleted elsewhere: nothing is left
            except (EnvfoundryError, RuntimeError):
                pass  # the service is down: the session's idle TTL reaps it
            _held.pop(session_id, None)
    finally:
        for client in clients.values():
            client.close()
    return done


def install() -> None:
    """Register the exit hook and the signal handlers (once; signals only from the main thread)."""
    if "atexit" not in _installed:
        atexit.register(close_all)
        _installed.add("atexit")
    if threading.current_thread() is not threading.main_thread():
        return  # signal.signal works in the main thread only: the next hold() from it installs them
    for name in SIGNALS:
        number = getattr(signal, name, None)
        if number is None or name in _installed:
            continue
        with contextlib.suppress(ValueError, OSError):  # an embedded interpreter may refuse
            if signal.getsignal(number) == signal.SIG_IGN:
                continue  # ignored (nohup): the process goes on, and so do its sessions
            _previous[number] = signal.signal(number, _on_signal)
            _installed.add(name)


def _on_signal(number: int, frame: FrameType | None) -> None:
    close_all()
    previous = _previous.get(number, signal.SIG_DFL)
    if callable(previous):
        previous(number, frame)
    else:
        # deliver it again with its default action: the process ends as the signal says
        signal.signal(number, signal.SIG_DFL)
        os.kill(os.getpid(), number)
