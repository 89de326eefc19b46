"""The pool's workers: started, handed out one request at a time, replaced when they break.

A request for a session goes to the worker holding that session live (its *home*), if it frees
up soon enough; a worker that died idle is found by pinging idle workers. What a worker must end
(sessions and environments the service deleted), the forks it has to make, and measuring its
memory ride along with its next request, or are asked for as soon as it is free.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from collections import Counter, deque
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from sandbox import lane
from sandbox.errors import SandboxBusy, WorkerLost
from sandbox.pool.calls import EnvCode, request_failed
from sandbox.pool.worker import GUARD_MARGIN, LOST, Backend, Ending, Worker, WorkerMemory, resident_share, spawn
from sandbox.wire import protocol
from sandbox.wire.limits import MAX_LODGED, Limits

log = logging.getLogger("envfoundry.sandbox")

# A request for a session whose worker is busy waits this long for it before taking another free
# worker (where the session's state must then be decoded again).
STEAL_AFTER = 0.05
# Requests go to the worker holding their session, so a worker that died idle could go unnoticed:
# idle workers are pinged this often, and a dead one is replaced.
PING_EVERY = 5.0
WITH_CONFIG = "with_config"  # (a request's own mark, never sent: keep its config for the worker that asked)
# A worker measures its memory (and lets live sessions go to keep room for a call) after each
# request it serves; calls made straight reach it no more often than this, so it is pinged then.
FIT_EVERY = 1.0
# How often a worker is asked for its memory figures (on a request it serves anyway).
STATS_EVERY = 1.0


@dataclass
class _Waiter:
    future: asyncio.Future[Worker]
    prefer: int | None  # the slot of the worker holding the request's session live
    since: float
    patience: float = STEAL_AFTER  # how long it waits for that worker before it takes another


class Workers:
    """The workers of a pool by slot, and the sessions each holds live. Raw requests only: the
    typed ones the service makes are ``sandbox.pool.requests.WorkerPool``'s."""

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
        self.limits = resident_share(limits, size)
        self.max_requests = max_requests
        self.acquire_timeout = acquire_timeout
        self.containment: dict[str, Any] = {}
        self.replaced = 0
        self._idle: dict[int, Worker] = {}
        self._busy: set[int] = set()
        self._waiters: deque[_Waiter] = deque()
        # Sessions whose instance a worker holds live: slot and the step it is at; and those whose
        # process it lent, to be called straight (see ``sandbox.lane``).
        self._homes: dict[str, tuple[int, int]] = {}
        self._lanes: dict[str, lane.Lane] = {}
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

    async def start(self) -> None:
        await self.backend.start()
        spawned = await asyncio.gather(*(spawn(self.backend, slot, self.limits) for slot in range(self.size)),
                                       return_exceptions=True)
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
        # Workers drop their least recently used residents and lodged sessions; forget about as many here.
        while len(self._homes) > self.size * (max(self.limits.residents, 1) + MAX_LODGED):
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

    def live_at(self, session: str, step: int) -> bool:
        """Whether a call on ``session`` at ``step`` would be served by a live instance (straight to
        its process, or by the worker holding it), needing no stored state unless that instance is
        gone by then."""
        home = self._homes.get(session)
        return home is not None and home[1] == step

    def forget(self, session: str) -> None:
        """The session's live instance (if a worker holds one) must not serve it again: e.g. the
        step it made was not committed. Its next call brings the stored state."""
        self._unhome(session)

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
                    replacement = await spawn(self.backend, worker.slot, self.limits)
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
                    raise request_failed(loaded["error"])
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
            # Past its request count a worker is recycled once it holds no live session: ending it
            # earlier would send every session it holds back to the store to be rebuilt (thousands,
            # in an RL batch whose calls all pass through it).
            if healthy and (worker.requests < self.max_requests or self._housed[worker.slot] > 0):
                self._put(worker)
            else:
                self._replace(worker)
        if answer.get("error"):
            raise request_failed(answer["error"])
        return answer, worker.slot
