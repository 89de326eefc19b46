"""A pool of sandbox workers and the typed requests the service makes of them.

A backend only knows how to start one worker (a process, a container) and
hand back a ``Channel``; the pool owns everything else: handshakes, loading
environment classes once per worker, guard timeouts, replacing broken
workers and recycling old ones, so every backend behaves the same.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import signal
import socket
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sandbox import lane
from sandbox.errors import RequestFailed, SandboxBusy, WorkerLost
from sandbox.wire import answers, frames, protocol
from sandbox.wire.limits import Limits
from sandbox.worker.forks import decode_answer

log = logging.getLogger("envfoundry.sandbox")

# The worker enforces call timeouts itself; this margin only catches a worker that hangs.
GUARD_MARGIN = 5.0
# Memory a worker may use beyond the per-call limit and its live sessions (itself, its
# environment hosts, the fork's copy).
WORKER_MEMORY_OVERHEAD_MB = 128


def worker_memory_mb(limits: Limits) -> int:
    """The size of one worker's memory cgroup or container: one call at its limit, the machinery,
    and ``resident_memory_mb`` for live sessions. The worker measures what the group holds after
    every request and ends the least recently used live sessions while less than one call's limit
    is left, so a call never meets a full group because of other sessions."""
    return limits.memory_mb + WORKER_MEMORY_OVERHEAD_MB + limits.resident_memory_mb
# A request for a session whose worker is busy waits this long for it before taking another free
# worker (where the session's state must then be decoded again).
STEAL_AFTER = 0.05
# A call its session's lent process could serve waits longer: elsewhere it rebuilds that process
# (a fork and a decode, milliseconds of CPU), which under load only adds to the queue it left.
LANE_STEAL_AFTER = 1.0
# A lent process's answer up to this size is decoded and checked on the event loop; a larger one
# by the process's worker (see ``WorkerPool._checked``).
INLINE_ANSWER_BYTES = 64 * 1024
# Requests go to the worker holding their session, so a worker that died idle could go unnoticed:
# idle workers are pinged this often, and a dead one is replaced.
PING_EVERY = 5.0
# Error types a tool call may report (the API contract); anything else becomes sandbox_error.
CALL_ERRORS = answers.CALL_ERRORS
NEED_STATE = "need_state"  # the worker holds no live instance of the session at the step asked
NEED_CONFIG = answers.NEED_CONFIG  # the worker must build a template: send the request again with its config
WITH_CONFIG = "with_config"  # (a request's own mark, never sent: keep its config for the worker that asked)
# How a worker's channel fails when the worker is gone (a closed transport raises RuntimeError).
LOST = (protocol.ProtocolError, OSError, EOFError, asyncio.IncompleteReadError, RuntimeError)
# A worker measures its memory (and lets live sessions go to keep room for a call) after each
# request it serves; calls made straight reach it no more often than this, so it is pinged then.
FIT_EVERY = 1.0
# How often a worker is asked for its memory figures (on a request it serves anyway).
STATS_EVERY = 1.0
# Encoded initial states kept by template (least recently used out first), in characters.
INITIAL_CACHE_BYTES = 64 << 20


@dataclass(frozen=True)
class EnvCode:
    """What a worker needs to compile an environment; ``key`` is the code hash (with the layers).
    ``layers``: the package folders its host puts on ``sys.path`` (under ``Limits.layers_root``)."""

    key: str
    env_id: str
    class_name: str
    code: str
    layers: tuple[str, ...] = ()


class Channel(Protocol):
    """One running worker as seen by the pool."""

    async def send(self, data: bytes) -> None: ...

    async def receive(self) -> bytes: ...

    async def kill(self) -> None: ...


class Backend(Protocol):
    name: str

    async def start(self) -> None:
        """Prepare the backend (e.g. remove what a crashed earlier run left)."""

    async def spawn(self, slot: int, limits: Limits) -> Channel: ...

    async def close(self) -> None: ...


@dataclass
class Worker:
    slot: int
    channel: Channel
    containment: dict[str, Any]
    loaded: set[str] = field(default_factory=set)
    requests: int = 0
    # Where it lends the processes of the sessions it keeps (see ``sandbox.lane``), and its /tmp.
    lend: socket.socket | None = None
    tmp: lane.Tmp | None = None
    unprepared: bool = False  # it has hosts without a ready fork: ask it to make them when idle
    touched: set[str] = field(default_factory=set)  # sessions called straight since its last request
    served: float = 0.0  # when it last served a request (and measured its memory)
    # It asks for a template's config when it must build it (``answers.NEED_CONFIG``): requests
    # naming a template go to it without one. A worker of an older image would build from none.
    asks_config: bool = False


@dataclass
class Ending:
    """What a worker must end before its next request: live sessions, and whole environments."""

    sessions: set[str] = field(default_factory=set)
    envs: set[str] = field(default_factory=set)


@dataclass
class WorkerMemory:
    """What a worker last said of its memory (see ``sandbox.worker.runtime.Runtime.memory``)."""

    live: int = 0
    templates: int = 0  # initial states kept built (see ``init_state``)
    live_bytes: int = 0
    used: int | None = None
    limit: int | None = None
    evicted: int = 0  # live sessions ended for room, over every worker that held the slot


@dataclass
class _Waiter:
    future: asyncio.Future[Worker]
    prefer: int | None  # the slot of the worker holding the request's session live
    since: float
    patience: float = STEAL_AFTER  # how long it waits for that worker before it takes another


@dataclass
class CallOutcome:
    ok: bool
    result: Any
    error: dict[str, str] | None
    state: str | None  # new encoded state, or None when the call changed nothing (or sent a delta)
    diff: dict[str, list[dict[str, Any]]]
    delta: dict[str, Any] | None = None  # the parts it changed, against the session's base (see sandbox.state.deltas)
    rebase: bool = False  # ``state`` is to be the session's new base (its delta had grown)


@dataclass
class Stored:
    """A session's stored state, and its delta when it is kept as a base plus a delta."""

    text: str
    delta: dict[str, str] | None = None
    # When the state is a base plus ``delta`` and the base is a template's initial state: its key,
    # config and digest. A worker holding that template rebuilds the session as a fork of it with
    # the delta applied, instead of decoding ``text``.
    template: str | None = None
    init_config: dict[str, Any] | None = None
    base: str = ""


class WorkerPool:
    def __init__(
        self,
        backend: Backend,
        size: int,
        limits: Limits,
        *,
        max_requests: int = 5000,
        acquire_timeout: float = 60.0,
    ) -> None:
        self.backend = backend
        self.size = size
        self.limits = limits
        self.max_requests = max_requests
        self.acquire_timeout = acquire_timeout
        self.containment: dict[str, Any] = {}
        self.replaced = 0
        self.live_calls = 0  # session calls served by a live instance
        self.rebuilt_calls = 0  # and those that rebuilt it from the stored state
        self._idle: dict[int, Worker] = {}
        self._busy: set[int] = set()
        self._waiters: deque[_Waiter] = deque()
        # Sessions whose instance a worker holds live: slot and the step it is at; and those whose
        # process it lent, to be called straight (see ``sandbox.lane``).
        self._homes: dict[str, tuple[int, int]] = {}
        self._lanes: dict[str, lane.Lane] = {}
        self.lane_calls = 0  # of ``live_calls``, those made straight
        self._housed: Counter[int] = Counter()  # live sessions per slot, to spread new ones
        self._ids = itertools.count(1)
        self._pending: set[asyncio.Task[None]] = set()  # replacements being started
        self._chores: set[asyncio.Future[None]] = set()  # requests the pool makes of idle workers
        self._pinger: asyncio.Task[None] | None = None
        self._recheck: asyncio.TimerHandle | None = None
        self._closed = False
        self._ending: dict[int, Ending] = {}
        self._ender: asyncio.Task[None] | None = None
        self.memory: dict[int, WorkerMemory] = {}
        self._evicted_before: Counter[int] = Counter()  # by workers of the slot that were replaced
        self._stats_at: dict[int, float] = {}
        self._initial: OrderedDict[str, tuple[str, str]] = OrderedDict()  # template -> (digest, state)
        self._initial_bytes = 0

    async def start(self) -> None:
        await self.backend.start()
        spawned = await asyncio.gather(*(self._spawn(slot) for slot in range(self.size)), return_exceptions=True)
        workers = [w for w in spawned if isinstance(w, Worker)]
        failures = [w for w in spawned if isinstance(w, BaseException)]
        if failures:
            for worker in workers:
                await worker.channel.kill()
            await self.backend.close()
            raise failures[0]
        self.containment = workers[0].containment
        for missing, reason in self.containment.get("missing", {}).items():
            log.warning("SANDBOX CONTAINMENT MISSING (%s backend): %s: %s", self.backend.name, missing, reason)
        for worker in workers:
            self._put(worker)
        self._pinger = asyncio.get_running_loop().create_task(self._ping_idle())

    async def _ping_idle(self) -> None:
        while not self._closed:
            await asyncio.sleep(PING_EVERY)
            await self._ping(list(self._idle))

    async def _ping(self, slots: list[int]) -> None:
        """Ping these workers if they are idle (what they must end rides along)."""
        for slot in slots:
            worker = self._idle.pop(slot, None)
            if worker is None:
                continue
            self._busy.add(slot)
            await self._chore(worker, "ping")

    async def _chore(self, worker: Worker, op: str) -> None:
        """Send ``op`` to a worker taken for it, then free it (or replace it if it did not answer)."""
        try:
            await self._roundtrip(worker, {"op": op}, GUARD_MARGIN)
            if op == "prepare":
                worker.unprepared = False  # what it could not make now waits for its next request
        except asyncio.CancelledError:  # the pool is closing: this worker is not idle for it to end
            await worker.channel.kill()
            raise
        except (TimeoutError, *LOST):
            log.warning("sandbox worker %d stopped answering while idle; replacing it", worker.slot)
            self._replace(worker)
        else:
            self._put(worker)

    async def measure(self) -> dict[int, WorkerMemory]:
        """Ask every worker for its memory figures now, each once it is free."""
        for slot in range(self.size):
            worker = await self._acquire(slot, math.inf)
            self._stats_at[worker.slot] = 0.0
            await self._chore(worker, "ping")
        return dict(self.memory)

    # -- ending what was deleted ---------------------------------------------------------
    def end_session(self, session: str) -> None:
        """The session is gone (deleted or expired): its live process ends, on whichever worker
        holds one, at once if that worker is idle, else before its next request."""
        self._unhome(session)
        for slot in range(self.size):
            self._ending.setdefault(slot, Ending()).sessions.add(session)
        self._end_soon()

    def unload(self, key: str) -> None:
        """The environment with code hash ``key`` was deleted: every process of it ends."""
        for slot in range(self.size):
            self._ending.setdefault(slot, Ending()).envs.add(key)
        self._end_soon()

    def _end_soon(self) -> None:
        if self._ender is None or self._ender.done():
            self._ender = asyncio.get_running_loop().create_task(self._ping(list(self._ending)))

    @property
    def idle(self) -> int:
        return len(self._idle)

    async def close(self) -> None:
        self._closed = True
        background = [task for task in (self._pinger, self._ender) if task is not None]
        for task in background:
            task.cancel()
        # a ping in flight ends its worker as it is cancelled: wait for that before the backend goes
        await asyncio.gather(*background, return_exceptions=True)
        pending: list[asyncio.Future[None]] = [*self._pending, *self._chores]
        for chore in pending:
            chore.cancel()
        # (a worker asked to prepare is killed as its task is cancelled)
        await asyncio.gather(*pending, return_exceptions=True)
        while self._idle:
            await self._idle.popitem()[1].channel.kill()
        await self.backend.close()

    # -- handing out workers -------------------------------------------------------------
    def _take(self, prefer: int | None, waited: float, patience: float = STEAL_AFTER) -> Worker | None:
        """An idle worker for a request: ``prefer``'s if it is idle; any other only if the request
        prefers none, its worker is gone, or it has waited ``patience`` for it."""
        if prefer is not None and prefer in self._idle:
            return self._idle.pop(prefer)
        if not self._idle or prefer in self._busy and waited < patience:
            return None
        slot = min(self._idle, key=self._housed.__getitem__)
        return self._idle.pop(slot)

    async def _acquire(self, prefer: int | None, patience: float = STEAL_AFTER) -> Worker:
        worker = self._take(prefer, 0.0, patience)
        if worker is None:
            loop = asyncio.get_running_loop()
            waiter = _Waiter(loop.create_future(), prefer, loop.time(), patience)
            self._waiters.append(waiter)
            if prefer is not None:
                self._serve_later(patience)
            try:
                worker = await asyncio.wait_for(asyncio.shield(waiter.future), self.acquire_timeout)
            except TimeoutError:
                raise SandboxBusy(f"no sandbox worker became free within {self.acquire_timeout:g} s") from None
            finally:
                if waiter in self._waiters:
                    self._waiters.remove(waiter)
                elif not waiter.future.cancelled() and (worker is None or worker is not waiter.future.result()):
                    self._put(waiter.future.result())  # granted as the wait ended: not ours to keep
        self._busy.add(worker.slot)
        return worker

    def _put(self, worker: Worker) -> None:
        """Give a free worker to the first waiter that takes it, else mark it idle; first, though,
        ask it for what is due. Calls made straight never reach the worker: what it must end, the
        forks it has to make, and measuring its memory are asked for as soon as it is free, before
        the calls waiting for it (they would never leave it free long enough)."""
        due = None
        if not self._closed and worker.unprepared:
            worker.unprepared, due = False, "prepare"  # (its answer says so again if it still is)
        elif not self._closed and (self._ending.get(worker.slot)
                                   or worker.touched and time.monotonic() - worker.served >= FIT_EVERY):
            due = "ping"
        if due is not None:
            self._busy.add(worker.slot)
            self._background(self._chore(worker, due))
            return
        self._busy.discard(worker.slot)
        self._idle[worker.slot] = worker
        self._serve_waiters()

    def _background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._chores.add(task)
        task.add_done_callback(self._chores.discard)

    @property
    def starting(self) -> int:
        """Workers being started in place of ones that were replaced."""
        return len(self._pending)

    def _serve_waiters(self) -> None:
        self._recheck = None
        now = asyncio.get_running_loop().time()
        for waiter in list(self._waiters):
            if not self._idle:
                return
            if waiter.future.done():
                continue
            worker = self._take(waiter.prefer, now - waiter.since, waiter.patience)
            if worker is not None:
                self._waiters.remove(waiter)
                # Busy from now, not from when the waiter resumes: a worker neither idle nor busy
                # reads as gone, and the next waiter that prefers it would take another at once.
                self._busy.add(worker.slot)
                waiter.future.set_result(worker)
            else:  # its worker is busy and a free one waits: come back when it may take that one
                self._serve_later(max(waiter.patience - (now - waiter.since), 0.0) + 0.001)

    def _serve_later(self, delay: float) -> None:
        if self._recheck is None:
            self._recheck = asyncio.get_running_loop().call_later(delay, self._serve_waiters)

    def _home(self, session: str, slot: int, version: int, held: lane.Lane | None = None) -> None:
        self._unhome(session)
        self._homes[session] = (slot, version)
        self._housed[slot] += 1
        if held is not None:
            held.version = version
            self._lanes[session] = held
        # Workers drop their least recently used residents; forget about as many here.
        while len(self._homes) > self.size * max(self.limits.residents, 1):
            self._unhome(next(iter(self._homes)))

    def _unhome(self, session: str) -> None:
        home = self._homes.pop(session, None)
        if home is not None:
            self._housed[home[0]] -= 1
        held = self._lanes.pop(session, None)
        if held is not None:
            held.close()
            if home is not None:  # its worker ends the process before its next request
                self._ending.setdefault(home[0], Ending()).sessions.add(session)

    def lends(self, session: str, step: int) -> bool:
        """Whether a call on ``session`` at ``step`` would go straight to its process."""
        home = self._homes.get(session)
        return home is not None and home[1] == step and session in self._lanes

    def forget(self, session: str) -> None:
        """The session's live instance (if a worker holds one) must not serve it again: e.g. the
        step it made was not committed. Its next call brings the stored state."""
        self._unhome(session)

    async def _spawn(self, slot: int) -> Worker:
        channel = await self.backend.spawn(slot, self.limits)
        try:
            hello = protocol.decode_body(await asyncio.wait_for(channel.receive(), self.limits.load_timeout + 20))
        except (TimeoutError, protocol.ProtocolError, OSError, EOFError) as exc:
            await channel.kill()
            raise WorkerLost(f"worker {slot} did not start: {exc!r}") from exc
        worker = Worker(slot=slot, channel=channel, containment=hello.get("containment", {}),
                        asks_config=hello.get("asks_config") is True)
        sock = getattr(channel, "lend", None)
        if hello.get("lends") is True and sock is not None:
            worker.lend = sock
            if hello.get("tmp") is True:  # (sent before the hello, so it is there already)
                fds = lane.take(sock, 1)
                if fds is None:
                    worker.lend = None  # it cannot be called straight: /tmp could not be emptied
                else:
                    worker.tmp = lane.Tmp(fds[0], list(worker.containment.get("preserve") or []),
                                          int(worker.containment.get("uid", -1)))
        return worker

    def _replace(self, worker: Worker) -> None:
        """Kill ``worker`` and start another in its slot in the background."""
        self.replaced += 1
        self._busy.discard(worker.slot)
        self._ending.pop(worker.slot, None)  # a new worker holds nothing
        self._evicted_before[worker.slot] = self.memory.pop(worker.slot, WorkerMemory()).evicted
        for session in [s for s, (slot, _) in self._homes.items() if slot == worker.slot]:
            self._unhome(session)
        self._ending.pop(worker.slot, None)  # (what unhoming them asked of it: a new worker holds nothing)
        if worker.tmp is not None:
            worker.tmp.close()

        async def run() -> None:
            await worker.channel.kill()
            delay = 0.1
            while not self._closed:
                try:
                    replacement = await self._spawn(worker.slot)
                except Exception as exc:  # keep trying: the engine or the host may come back
                    log.error("cannot restart sandbox worker %d: %s", worker.slot, exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
                if replacement.containment.get("missing") != self.containment.get("missing"):
                    log.warning("SANDBOX CONTAINMENT CHANGED for worker %d: %s", worker.slot,
                                replacement.containment.get("missing"))
                self._put(replacement)
                return

        task = asyncio.get_running_loop().create_task(run())
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    @property
    def longest_request(self) -> float:
        """The longest a request can take, waiting for a worker included (for lock leases)."""
        return self.acquire_timeout + self.limits.load_timeout + self.limits.call_timeout + 2 * GUARD_MARGIN

    async def _roundtrip(self, worker: Worker, message: dict[str, Any], guard: float) -> dict[str, Any]:
        message["id"] = next(self._ids)
        # A template's config stays here unless the worker asked for it (``answers.NEED_CONFIG``): a
        # worker holding the template built needs none of it, and a scenario's may be megabytes,
        # which would be encoded here and decoded there for every session and every rebuild.
        if not message.pop(WITH_CONFIG, False) and worker.asks_config and "template" in message:
            message.pop("init_config", None)
        ending = self._ending.pop(worker.slot, None)
        if ending is not None:
            message["ending"] = {"sessions": sorted(ending.sessions), "envs": sorted(ending.envs)}
            worker.loaded -= ending.envs
        now = time.monotonic()
        if now - self._stats_at.get(worker.slot, 0.0) >= STATS_EVERY:
            message["stats"] = True
            self._stats_at[worker.slot] = now
        if worker.touched:
            message["touched"] = sorted(worker.touched)
            worker.touched.clear()
        if worker.lend is None:
            message.pop("lend", None)  # (a worker that may not lend keeps its sessions' processes)
        worker.served = time.monotonic()
        await worker.channel.send(protocol.encode_frame(message))
        async with asyncio.timeout(guard):  # (no task per request, unlike wait_for)
            answer: dict[str, Any] = protocol.decode_body(await worker.channel.receive())
        if answer.get("id") != message["id"]:
            raise protocol.ProtocolError("answer does not match the request")
        self._lent(worker, message, answer)
        reported = answer.pop("memory", None)
        if isinstance(reported, dict):
            self.memory[worker.slot] = WorkerMemory(
                live=int(reported.get("live") or 0), templates=int(reported.get("templates") or 0),
                live_bytes=int(reported.get("live_bytes") or 0),
                used=reported.get("used"), limit=reported.get("limit"),
                evicted=self._evicted_before[worker.slot] + int(reported.get("evicted") or 0))
        return answer

    def _lent(self, worker: Worker, message: dict[str, Any], answer: dict[str, Any]) -> None:
        """What a lending worker's answer says of the processes it lent: those it ended, whether
        it has forks to make, and the descriptors of the one it has just lent (``answer["lane"]``)."""
        if worker.lend is None:
            return
        worker.unprepared = answer.pop("unprepared", None) is True
        if answer.pop("lent", None) is True:
            held = lane.lane(worker.lend)
            if held is None:
                return
            # A process this service may not signal (a container's, when the service is not root)
            # cannot be called straight: the worker serves its calls, and lends no more.
            usable = held.signal(0)
            if not usable:
                worker.lend = None
            if not usable or answer.get("error") is not None:  # (or its answer did not pass the check)
                held.close()
                self._ending.setdefault(worker.slot, Ending()).sessions.add(str(message.get("session")))
            else:
                answer["lane"] = held
        for session in answer.pop("ended", None) or ():
            home = self._homes.get(session) if type(session) is str else None
            if home is not None and home[0] == worker.slot and session in self._lanes:
                self._lanes.pop(session).close()
                self._unhome(session)

    async def request(self, message: dict[str, Any], env: EnvCode | None, timeout: float) -> dict[str, Any]:
        """Send one request to a free worker, loading ``env`` there first if needed.

        Raises:
            RequestFailed: the worker answered with an error.
            WorkerLost: the worker died or hung; it is being replaced.
            SandboxBusy: no worker became free in time.
        """
        answer, _ = await self._request(message, env, timeout, None)
        return answer

    async def _request(self, message: dict[str, Any], env: EnvCode | None, timeout: float,
                       prefer: int | None) -> tuple[dict[str, Any], int]:
        """``request`` on ``prefer``'s worker if it frees up soon enough; also says which worker answered."""
        worker = await self._acquire(prefer)
        healthy = False
        try:
            if env is not None and env.key not in worker.loaded:
                load = {
                    "op": "load", "env": env.key, "env_id": env.env_id, "class_name": env.class_name,
                    "code": env.code, "layers": list(env.layers), "timeout": self.limits.load_timeout,
                }
                loaded = await self._roundtrip(worker, load, self.limits.load_timeout + 4 * GUARD_MARGIN)
                if loaded.get("error"):
                    # Module code runs in its own host process, so the worker itself is unharmed.
                    healthy = loaded.get("unhealthy") is not True
                    raise _failure(loaded["error"])
                worker.loaded.add(env.key)
            # The worker may load the class again first (after an eviction or a crash), and waits on
            # its processes with margins of its own: the guard covers all of that.
            answer = await self._roundtrip(worker, message, timeout + self.limits.load_timeout + 4 * GUARD_MARGIN)
            # A worker that can no longer start processes says so; it answers this one and goes.
            healthy = answer.get("unhealthy") is not True
        except TimeoutError:
            raise WorkerLost("the sandbox worker stopped answering and was replaced") from None
        except LOST as exc:
            raise WorkerLost(f"the sandbox worker was lost ({exc}) and replaced") from None
        finally:
            worker.requests += 1
            if healthy and worker.requests < self.max_requests:
                self._put(worker)
            else:
                self._replace(worker)
        if answer.get("error"):
            raise _failure(answer["error"])
        return answer, worker.slot

    # -- typed requests -------------------------------------------------------------------
    async def validate(self, env: EnvCode) -> dict[str, Any] | None:
        """Compile and instantiate ``env`` with ``{}`` in a throwaway fork; return the error or None."""
        answer = await self.request(
            {"op": "validate", "env_id": env.env_id, "class_name": env.class_name, "code": env.code,
             "layers": list(env.layers), "timeout": self.limits.load_timeout},
            None,
            self.limits.load_timeout,
        )
        if answer.get("ok") is True:
            return None
        failure = answer.get("failure")
        if isinstance(failure, dict) and isinstance(failure.get("kind"), str) and isinstance(failure.get("message"), str):
            return {"kind": failure["kind"], "message": failure["message"]}
        return {"kind": "sandbox_error", "message": "the validation sent an answer of the wrong shape"}

    async def init_state(self, env: EnvCode, init_config: dict[str, Any], session: str | None = None,
                         template: str | None = None, *, deltas: bool = False, stream: str | None = None,
                         seed: int | None = None) -> str:
        """The encoded initial state; with ``session``, the worker keeps the instance live for its calls.

        With ``template`` (a key the caller makes for one initial state: same environment code,
        same ``init_config``, same tenant), each worker builds that instance once and starts later
        sessions as forks of it, and the encoded state it made is kept here by its digest, so a
        session made from it costs neither building nor encoding the state, whatever its size.
        ``stream`` and ``seed``: the session's randomness (see ``sandbox.worker.randomness``).
        """
        if self.limits.rebuild_every_call:  # nothing kept live, nothing forked from a template
            session = template = None
        message = {"op": "init", "env": env.key, "init_config": init_config, "timeout": self.limits.call_timeout,
                   "max_state_bytes": self.limits.state_bytes, **_randomness(stream, seed)}
        cached = self._initial.get(template) if template is not None else None
        if template is not None:  # (sent without its config where the worker asks for it: ``_roundtrip``)
            message["template"] = template
            if cached is not None:
                message["known"] = cached[0]
        if session is not None:
            message.update(session=session, next_version=0)
            if deltas:  # the state is the session's base: its calls answer what they changed
                message["deltas"] = True
            message["lend"] = True
            self._unhome(session)
        try:  # (a copy each time: a request gathers what its worker must hear, for that worker alone)
            answer, slot = await self._request(dict(message), env, self.limits.call_timeout, None)
        except RequestFailed as exc:
            if exc.kind != NEED_CONFIG:
                raise
            answer, slot = await self._request({**message, WITH_CONFIG: True}, env, self.limits.call_timeout, None)
        state, digest = answer.get("state"), answer.get("digest")
        if state is None and cached is not None and digest == cached[0] and template is not None:
            state = cached[1]
            self._initial.move_to_end(template)
        else:
            if not isinstance(state, str):  # (the worker checked its size: ``answers.checked``)
                raise RequestFailed("sandbox_error", "the init process sent an answer of the wrong shape")
            if template is not None and isinstance(digest, str):
                self._keep_initial(template, digest, state)
        if session is not None:
            self._home(session, slot, 0, answer.get("lane"))
        return state

    def _keep_initial(self, template: str, digest: str, state: str) -> None:
        self._initial.pop(template, None)
        self._initial[template] = (digest, state)
        self._initial_bytes = sum(len(text) for _, text in self._initial.values())
        while self._initial_bytes > INITIAL_CACHE_BYTES and len(self._initial) > 1:
            _, (_, dropped) = self._initial.popitem(last=False)
            self._initial_bytes -= len(dropped)

    async def call(self, env: EnvCode, state: str, name: str, arguments: dict[str, Any]) -> CallOutcome:
        """Run one tool call. Tool-level failures come back as an outcome, not an exception."""
        return await self._call(env, self._call_message(env, name, arguments, False), state, None)

    async def session_call(self, env: EnvCode, session: str, step: int,
                           load_state: Callable[[], Awaitable[str | Stored]], name: str, arguments: dict[str, Any],
                           *, deltas: bool = False, stream: str | None = None, seed: int | None = None) -> CallOutcome:
        """A call on ``session`` at ``step``: straight to its process when this service holds it at
        that step (see ``sandbox.lane``), else on the worker holding it live at that step if there
        is one (the state is then never read), else with the stored state from ``load_state``. The
        caller must ``forget`` the session if the step the call makes is not committed. With
        ``deltas`` the caller stores a changed tree state as a base plus a delta: the outcome may
        carry the ``delta`` instead of the state. ``stream`` and ``seed``: the session's randomness,
        for a rebuild (see ``sandbox.worker.randomness``)."""
        message = self._call_message(env, name, arguments, deltas, stream, seed)
        if self.limits.rebuild_every_call:
            return await self._rebuilt_call(message, env, await load_state())
        home = self._homes.get(session)
        held = self._lanes.get(session)
        if home is not None and home[1] == step and held is not None:
            outcome = await self._on_lane(session, step, home[0], held, message)
            if outcome is not None:
                self.live_calls += 1
                self.lane_calls += 1
                return outcome
            home = None  # its process is gone: the stored state rebuilds it
        state = None if home is not None and home[1] == step else await load_state()
        outcome = await self._call(env, message, state, (session, step, home[0] if home else None))
        if outcome.error is not None and outcome.error.get("type") == NEED_STATE:
            state = await load_state()
            outcome = await self._call(env, self._call_message(env, name, arguments, deltas, stream, seed), state,
                                       (session, step, None))
        if state is None:
            self.live_calls += 1
        else:
            self.rebuilt_calls += 1
        return outcome

    async def _rebuilt_call(self, message: frames.Call, env: EnvCode, state: str | Stored) -> CallOutcome:
        """A session call with ``rebuild_every_call``: its instance rebuilt from the stored state by a
        fork of the environment's host, not of a template, and not kept after the call."""
        if isinstance(state, Stored) and state.template is not None:
            state = Stored(state.text, state.delta)
        outcome = await self._call(env, message, state, None)
        self.rebuilt_calls += 1
        return outcome

    def _call_message(self, env: EnvCode, name: str, arguments: dict[str, Any], deltas: bool,
                      stream: str | None = None, seed: int | None = None) -> frames.Call:
        message: frames.Call = {"op": "call", "env": env.key, "name": name, "arguments": arguments,
                                **self.limits.call_fields(), **_randomness(stream, seed)}  # type: ignore[typeddict-item]
        if deltas:
            message["deltas"] = True
        return message

    async def _on_lane(self, session: str, step: int, slot: int, held: lane.Lane,
                       message: frames.Call) -> CallOutcome | None:
        """The call straight to the session's process, holding its worker meanwhile; None if that
        process can no longer serve it (the caller rebuilds it from the stored state)."""
        worker = await self._acquire(slot, LANE_STEAL_AFTER)
        healthy = True
        try:
            if worker.slot != slot or self._lanes.get(session) is not held or held.version != step:
                return None  # another worker was free first, or the process moved on while we waited
            worker.touched.add(session)
            cap = answers.answer_cap(message)
            started = asyncio.get_running_loop().time()
            try:
                body, how = await lane.call(held, message, self.limits.call_timeout, cap)
            except BaseException:  # cancelled: its process is ended (see ``lane.call``)
                self._unhome(session)
                raise
            if how == "done" and body is not None:
                try:
                    checked = await self._checked(worker, body, message)
                except (TimeoutError, *LOST) as exc:
                    healthy = False
                    self._unhome(session)
                    return _outcome({"error": answers.error(answers.ToolError.SANDBOX_ERROR,
                                                            f"the sandbox worker was lost ({exc!r}) and replaced")})
                healthy = checked.pop("unhealthy", None) is not True  # (a worker that checked it may say so)
                if answers.untouched(checked):
                    self._homes[session] = (slot, step + 1)
                    held.version = step + 1
                else:  # its instance may have changed unanswered (the process exits by itself too)
                    held.signal(signal.SIGKILL)
                    self._unhome(session)
                return _outcome(checked)
            self._lanes.pop(session, None)  # (first: the worker ends it now, not as an ending)
            held.close()
            self._unhome(session)
            left = self.limits.call_timeout - (asyncio.get_running_loop().time() - started)
            try:
                collect: frames.Collect = {"op": "collect", "session": session, "outcome": how,  # type: ignore[typeddict-item]
                                           "timeout": self.limits.call_timeout, "cap": cap, "wait": max(left, 0.0)}
                collected = await self._roundtrip(worker, dict(collect), self.limits.call_timeout + 2 * GUARD_MARGIN)
            except (TimeoutError, *LOST) as exc:
                healthy = False
                return _outcome({"error": answers.error(answers.ToolError.SANDBOX_ERROR,
                                                        f"the sandbox worker was lost ({exc!r}) and replaced")})
            healthy = collected.get("unhealthy") is not True
            if collected.get("gone") is True:
                return None  # the worker had ended it before the call reached it: rebuilt from the store
            return _outcome(collected if isinstance(collected.get("error"), dict) else answers.malformed())
        finally:
            # (shielded: a cancelled call must not hand the worker on while its /tmp is being emptied)
            await asyncio.shield(self._release(worker, healthy))

    async def _checked(self, worker: Worker, body: bytes, message: frames.Call) -> dict[str, Any]:
        """A lent process's answer, decoded and checked: here when it is small, else by its worker,
        in its own process (untrusted JSON can take seconds to decode and walk, and this event
        loop serves every session)."""
        if len(body) <= INLINE_ANSWER_BYTES:
            return answers.checked("call", decode_answer(body), message)
        limits = {k: v for k, v in message.items() if k.startswith("max_") or k == "deltas"}
        check: dict[str, Any] = {"op": "check", "answer": body, **limits}  # (a ``frames.Check``)
        return await self._roundtrip(worker, check, self.limits.call_timeout + 2 * GUARD_MARGIN)

    async def _release(self, worker: Worker, healthy: bool) -> None:
        """Hand ``worker`` on after a call straight to one of its processes: its /tmp emptied first
        (off the event loop when the call left anything there), or the worker replaced if that
        cannot be done."""
        tmp = worker.tmp
        if healthy and tmp is not None and not tmp.untouched():
            healthy = await asyncio.to_thread(tmp.empty)
        if healthy:
            self._put(worker)
        else:
            self._replace(worker)

    async def _call(self, env: EnvCode, message: frames.Call, state: str | Stored | None,
                    session: tuple[str, int, int | None] | None) -> CallOutcome:
        if isinstance(state, Stored):
            message["state"] = state.text
            if state.delta is not None:
                message["delta"] = state.delta
                if state.template is not None and state.base:
                    # (its config only where the worker must build the template: see ``_roundtrip``)
                    message["template"], message["known"] = state.template, state.base
                    message["init_config"] = state.init_config or {}
        elif state is not None:
            message["state"] = state
        prefer = None
        if session is not None:
            sid, step, prefer = session
            message["session"], message["version"], message["next_version"] = sid, step, step + 1
            message["lend"] = True
            self._unhome(sid)  # until the worker says it kept the instance
        try:
            try:
                answer, slot = await self._request(dict(message), env, self.limits.call_timeout, prefer)
            except RequestFailed as exc:
                if exc.kind != NEED_CONFIG or "template" not in message:
                    raise
                answer, slot = await self._request({**message, WITH_CONFIG: True}, env,
                                                   self.limits.call_timeout, prefer)
        except RequestFailed as exc:
            if exc.kind in CALL_ERRORS or exc.kind == NEED_STATE:
                return _outcome({"error": {"type": exc.kind, "message": exc.message}})
            # e.g. the class failed to load in this worker: not the agent's doing
            return _outcome({"error": {"type": "sandbox_error", "message": f"{exc.kind}: {exc.message}"}})
        except WorkerLost as exc:
            return _outcome({"error": {"type": "sandbox_error", "message": exc.message}})
        # (the worker checked the answer of the process that ran environment code: ``answers.checked``)
        if session is not None:
            self._home(session[0], slot, session[1] + 1, answer.get("lane"))
        return _outcome(answer)

    async def score(self, env: EnvCode, state: str, initial: str, checks: list[str]) -> list[dict[str, Any]]:
        if not checks:
            return []
        answer = await self.request(
            {"op": "score", "env": env.key, "state": state, "initial": initial, "checks": checks,
             "timeout": self.limits.check_timeout},
            env,
            self.limits.check_timeout * len(checks),
        )
        results = answer.get("checks")
        if not (isinstance(results, list) and len(results) == len(checks) and all(
                isinstance(r, dict) and isinstance(r.get("passed"), bool) and (r.get("error") is None or isinstance(
                    r.get("error"), str)) for r in results)):
            raise RequestFailed("sandbox_error", "scoring sent an answer of the wrong shape")
        return [{"passed": r["passed"], "error": r.get("error")} for r in results]


def _randomness(stream: str | None, seed: int | None) -> dict[str, Any]:
    """The request fields naming a session's randomness (``frames.Init``)."""
    fields: dict[str, Any] = {}
    if stream is not None:
        fields["random"] = stream
    if seed is not None:
        fields["seed"] = seed
    return fields


def _failure(reported: Any) -> RequestFailed:
    """An error a worker reported; malformed ones (environment code can forge answers) become sandbox errors."""
    if isinstance(reported, dict) and isinstance(reported.get("type"), str) and isinstance(reported.get("message"), str):
        return RequestFailed(reported["type"], reported["message"][:2000])
    return RequestFailed("sandbox_error", "the sandbox sent a malformed error")


def _outcome(answer: dict[str, Any]) -> CallOutcome:
    """A checked answer (``answers.checked``) as the outcome of the call."""
    failure = answer.get("error")
    if failure is not None:
        return CallOutcome(False, None, {"type": failure["type"], "message": failure["message"]}, None, _no_diff())
    return CallOutcome(True, answer.get("result"), None, answer.get("state"), answer["diff"], answer.get("delta"),
                       answer.get("rebase") is True)


def _no_diff() -> dict[str, list[dict[str, Any]]]:
    return {"added": [], "removed": [], "changed": []}
