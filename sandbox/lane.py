"""A call from the service straight to a session's live process, with no worker in between.

When a worker keeps a session's process (its *resident*, see ``sandbox.worker.sessions``) and can lend
it, it hands the service the process's request pipe, answer pipe and pidfd over a Unix socket.
The service then does for each call on that session what the worker would: wake the process
(SIGCONT through the pidfd, which pins it: a recycled pid is never signalled), write the request,
read the length-prefixed answer, stop the process again (SIGSTOP), and empty the worker's /tmp,
through a descriptor of it the worker handed over when it started. The pool holds the worker for
the whole call, exactly as for a request it sends the worker, so no other process of that worker
runs meanwhile, and nothing one call leaves in /tmp is there for the next.

Anything unusual (the process ended, timed out, answered too much) goes back to the worker, which
ends the process, reaps it, and says how it ended (``collect``).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
from dataclasses import dataclass

from sandbox.wire import frames, protocol
from sandbox.worker import scratch
from sandbox.worker.forks import Arriving


@dataclass
class Lane:
    """The pipes and pidfd of one lent session process, and the step it is at."""

    pidfd: int
    request_fd: int
    answer_fd: int
    version: int = 0
    busy: bool = False  # a call is on it: closing waits for its end (the numbers must not be reused meanwhile)
    closed: bool = False
    # The event loop watching the answer pipe, from a call that waited for its answer until the pipe
    # is closed or found readable with no call waiting (watching it only while a call waits would
    # register and unregister it on every call), and what a waiting call waits on.
    watcher: asyncio.AbstractEventLoop | None = None
    waiter: asyncio.Future[None] | None = None

    def close(self) -> None:
        self.closed = True
        if self.busy:
            return
        self.unwatch()
        for fd in (self.request_fd, self.answer_fd, self.pidfd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.request_fd = self.answer_fd = self.pidfd = -1

    def watch(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        """A future done once the answer pipe is readable."""
        if self.watcher is not loop:
            self.unwatch()
            loop.add_reader(self.answer_fd, self._readable)
            self.watcher = loop
        self.waiter = loop.create_future()
        return self.waiter

    def unwatch(self) -> None:
        if self.watcher is not None:
            try:
                self.watcher.remove_reader(self.answer_fd)
            except RuntimeError:  # (its loop has closed, and with it what it watched)
                pass
            self.watcher = None

    def _readable(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is None or waiter.done():
            self.unwatch()  # nobody waits: a pipe left readable would wake the loop on every turn
        else:
            waiter.set_result(None)

    def signal(self, sig: int) -> bool:
        try:
            signal.pidfd_send_signal(self.pidfd, sig)
        except OSError:
            return False
        return True


def take(sock: socket.socket, count: int) -> list[int] | None:
    """The ``count`` descriptors the worker sent just before its answer (already in the socket)."""
    try:
        mark, fds, _, _ = socket.recv_fds(sock, len(protocol.LEND_MARK), count)
    except (BlockingIOError, OSError):
        return None
    if mark != protocol.LEND_MARK or len(fds) != count:
        for fd in fds:
            os.close(fd)
        return None
    for fd in fds:
        os.set_blocking(fd, False)
        os.set_inheritable(fd, False)  # nothing the service starts may hold a session's pipes
    return list(fds)


def lane(sock: socket.socket) -> Lane | None:
    fds = take(sock, 3)
    return None if fds is None else Lane(pidfd=fds[2], request_fd=fds[0], answer_fd=fds[1])


DIRENT = 20  # what a tmpfs folder's size counts for each entry (the kernel's BOGO_DIRENT_SIZE)


class Tmp:
    """A worker's private /tmp, emptied by the service after each call it makes straight.

    The service may be root, which the worker is not: it removes only what the worker itself
    could, entries owned by the worker's uid (the uid environment code runs as). The folders a
    container engine or confinement made for mounts under /tmp (package layers, a checkout) are
    root's and stay: removed from outside the worker's mount namespace, a mount point would take
    its mount with it. Whatever a call left there is removed by ``sandbox.worker.scratch``, off the
    event loop (see ``WorkerPool._on_lane``): it may be thousands of entries."""

    def __init__(self, fd: int, preserve: list[str], owner: int) -> None:
        self.fd = fd
        self.owner = owner
        # read-only folders confinement put back inside /tmp (e.g. a checkout there): never emptied
        self.preserve = [p for p in preserve if p.startswith("/tmp/")]
        # The folder's size and times when it was last found with nothing to remove; looked at
        # first only where its size counts its entries (see ``_counts_entries``).
        self._clean: tuple[int, int, int] | None = None
        self._sized = self._counts_entries()

    def _counts_entries(self) -> bool:
        """Whether the folder's size counts its entries, as a tmpfs's does (``DIRENT`` bytes each, its
        own and its parent's included): then, with the same size, no entry was added since. (The
        worker's /tmp is one; any other folder is looked through after every call.)"""
        if self.fd < 0:
            return False
        try:
            with os.scandir(self.fd) as entries:
                count = sum(1 for _ in entries)
            return os.fstat(self.fd).st_size == DIRENT * (count + 2)
        except OSError:
            return False

    def _stamp(self) -> tuple[int, int, int]:
        found = os.fstat(self.fd)
        return found.st_size, found.st_mtime_ns, found.st_ctime_ns

    def _kept(self, name: str) -> bool:
        path = f"/tmp/{name}"
        return any(p == path or p.startswith(path + "/") for p in self.preserve)

    def untouched(self) -> bool:
        """Whether the call left nothing to remove: the folder as it was when last found so (its
        environment code cannot remove or rename root's entries in a sticky folder, so an entry it
        added changes the count), else one look at its entries (cheap enough for the event loop: a
        call rarely writes to /tmp)."""
        if self.fd < 0:
            return True
        try:
            stamp = self._stamp()  # (before the look: an entry added after it changes the stamp)
            if self._sized and stamp == self._clean:
                return True
            with os.scandir(self.fd) as entries:
                clean = not any(_owner(entry) == self.owner and not self._kept(entry.name) for entry in entries)
        except OSError:
            return False
        if clean and self._sized:
            self._clean = stamp
        return clean

    def empty(self) -> bool:
        """Whether /tmp is left as the worker had it (else the worker must be replaced)."""
        if self.fd < 0:
            return True
        return scratch.empty(self.fd, keep=self._kept, owner=self.owner)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _owner(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_uid
    except OSError:
        return -1


async def call(lane: Lane, request: frames.Call, timeout: float, cap: int) -> tuple[bytes | None, str]:
    """Wake the session's process, hand it ``request`` and read its answer; stop it again. Returns
    the answer's frame body, undecoded, and ``"done"``, or None and why not: ``"timeout"``,
    ``"too_big"``, ``"ended"`` (the process is gone or closed its pipe), and the process is then
    killed. The caller decodes and checks the answer (``answers.checked``: where depends on its
    size, see ``WorkerPool._on_lane``), kills a process whose answer says its instance may have
    changed unanswered, and on anything but an answer has the worker collect it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    if lane.closed or not lane.signal(signal.SIGCONT):
        return None, "ended"
    lane.busy = True
    body: bytes | None = None
    try:
        await _write(loop, lane.request_fd, protocol.encode_frame(request), deadline)
        body, outcome = await _read(loop, lane, deadline, cap)
    except TimeoutError:
        outcome = "timeout"
    except (BrokenPipeError, ConnectionError):
        outcome = "ended"
    finally:  # (cancelled too: a process woken for a call nobody waits for must not run on)
        lane.busy = False
        # the worker reaps a process that is not kept and, for a call that did not answer, says how it ended
        lane.signal(signal.SIGSTOP if body is not None else signal.SIGKILL)
        if lane.closed:  # closed while the call was on it
            lane.close()
    return body, outcome


async def _write(loop: asyncio.AbstractEventLoop, fd: int, data: bytes, deadline: float) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            await _writable(loop, fd, deadline)


async def _read(loop: asyncio.AbstractEventLoop, lane: Lane, deadline: float, cap: int) -> tuple[bytes | None, str]:
    arriving = Arriving(cap)  # (counted as they come: never more than ``cap`` bytes are kept)
    while True:
        try:
            chunk = os.read(lane.answer_fd, 1 << 20)
        except BlockingIOError:
            waiter = lane.watch(loop)
            expiry = loop.call_at(deadline, _expire, waiter)  # (a timer alone: cheaper than a timeout scope)
            try:
                await waiter
            finally:
                expiry.cancel()
                lane.waiter = None
            continue
        outcome = arriving.feed(chunk)
        if outcome is not None:
            return (arriving.body() if outcome == "done" else None), outcome


async def _writable(loop: asyncio.AbstractEventLoop, fd: int, deadline: float) -> None:
    """Until ``fd`` is writable (a request larger than the pipe holds); TimeoutError at ``deadline``."""
    waiter = loop.create_future()
    loop.add_writer(fd, _wake, waiter)
    try:
        async with asyncio.timeout_at(deadline):
            await waiter
    finally:
        loop.remove_writer(fd)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
