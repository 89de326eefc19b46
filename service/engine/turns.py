"""Episodes in turns: scripted user turns, tools that arrive mid-episode, checks at every turn.

A turn-based scenario carries ``turns`` (``service.catalog.model.Turn``): each a user message, the tools
that become available from that turn on, and checks run when the agent ends the turn. A session
of one shows the first turn's message and the tools available then; the agent ends a turn
(REST ``POST /v1/sessions/{id}/turns``, MCP ``end_turn``, OpenEnv's ``end_turn`` action), which
runs that turn's checks on the state and on the turn's responses, keeps their results, and answers
the next user message with the tools that arrive with it. After the last turn the session is done.
A tool that has not arrived yet is an ``unknown_tool`` call, as BFCL treats a function it has not
offered.

Where the turn is kept: the end of a turn is a step of the trajectory (kind ``turn``, holding its
checks' results), so the turn a session is in is the number of such steps among its first
``step`` steps. It lives in the store with the rest of the session (any replica, any restart), a
fork copies it with the steps, and a fork at a past step is in the turn of that step. A replica
keeps a cache of (session, step) -> turns ended, which cannot go stale: a session's first ``step``
records never change.

Scoring (``score``): each turn's checks as they ran when it ended; the turn in progress is checked
on the current state (so a score at any step says where the episode stands); later turns have not
been reached and fail. The episode's reward is BFCL's: 1.0 when every turn passed, else 0.0
(``aggregation`` "all_turns"); ``partial_credit`` is the fraction of turns passed.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sandbox.errors import SandboxError
from service.catalog.model import Environment, Scenario, Turn
from service.catalog.registry import env_code
from service.engine import failures, idempotency
from service.errors import InvalidRequest, LimitExceeded, NotFound, NotTurnBased, TurnsEnded, Unavailable
from service.stores.store import Snapshot

if TYPE_CHECKING:
    from service.engine.sessions import Sessions

TURN = "turn"  # the kind of the trajectory record that ends a turn
AGGREGATION = "all_turns"
KNOWN_SESSIONS = 65536  # sessions whose (step, turns ended) this replica keeps
# The global a turn's check reads the turn's responses from (see ``responses``).
RESPONSES = "turn_responses"
LOCK_SLACK = 15.0


@dataclass(frozen=True)
class Position:
    """Where a session of a turn-based scenario is: ``turn`` is the turn in progress (its index),
    ``count`` the scenario's turns; ``done`` once the last has ended."""

    turn: int
    count: int

    @property
    def done(self) -> bool:
        return self.turn >= self.count


def arriving(scenario: Scenario) -> dict[str, int]:
    """Each tool that arrives after the first turn, with the turn it arrives at (its first mention)."""
    found: dict[str, int] = {}
    for index, turn in enumerate(scenario.turns):
        for name in turn.tools:
            found.setdefault(name, index)
    return {name: index for name, index in found.items() if index > 0}


def tools_at(env: Environment, scenario: Scenario | None, turn: int) -> list[dict[str, Any]]:
    """The tool schemas available in ``turn`` (all of them after the last turn)."""
    if scenario is None or not scenario.turns:
        return env.tools
    later = {name for name, index in arriving(scenario).items() if index > turn}
    return [t for t in env.tools if t["function"]["name"] not in later]


def new_tools(env: Environment, scenario: Scenario, turn: int) -> list[dict[str, Any]]:
    """The tool schemas that arrive exactly at ``turn``."""
    names = {name for name, index in arriving(scenario).items() if index == turn}
    return [t for t in env.tools if t["function"]["name"] in names]


def is_turn(record: dict[str, Any]) -> bool:
    return record.get("kind") == TURN


def _ends_turn(text: str) -> bool:
    # Most records are calls: a cheap look first, parsed only when it may be a turn's end.
    return '"turn"' in text and json.loads(text).get("kind") == TURN


def responses(records: list[dict[str, Any]], turn: int, content: str | None) -> dict[str, Any]:
    """What a turn's checks read as ``turn_responses``: the turn's index, its calls (name,
    arguments, ok, result, error; failed ones too) and the agent's closing message, if any."""
    calls = [{k: r.get(k) for k in ("name", "arguments", "ok", "result", "error")}
             for r in records if r.get("kind", "call") == "call"]
    return {"turn": turn, "calls": calls, "message": content}


def with_responses(source: str, turn_responses: dict[str, Any]) -> str:
    """A check's source with ``turn_responses`` defined after it (so its own line numbers stay)."""
    text = json.dumps(turn_responses, ensure_ascii=False)
    return f"{source}\n\n{RESPONSES} = __import__('json').loads({text!r})\n"


def since_last_turn(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records after the last turn's end: the turn in progress so far."""
    for index in range(len(records) - 1, -1, -1):
        if is_turn(records[index]):
            return records[index + 1:]
    return records


class Turns:
    """Turns of the sessions of one engine (``Sessions.turns``)."""

    def __init__(self, engine: Sessions) -> None:
        self.engine = engine
        self._known: OrderedDict[str, tuple[int, int]] = OrderedDict()  # session -> (step, turns ended by then)
        # Told the id of a session whose tools changed when a turn ended here (MCP's listen streams, in
        # this replica: ``service.api.mcp``).
        self.tools_changed: list[Callable[[str], None]] = []

    async def scenario(self, snap: Snapshot) -> Scenario | None:
        """The session's scenario when it is turn-based."""
        if snap.meta.scenario_id is None:
            return None
        try:
            scenario = await self.engine.scenario_of(snap)
        except NotFound:
            return None
        return scenario if scenario is not None and scenario.turns else None

    async def ended(self, snap: Snapshot) -> int:
        """How many turns the session had ended by its step (read from the store's trajectory,
        only the records this replica has not counted before)."""
        session_id, step = snap.meta.session_id, snap.meta.step
        if snap.trajectory and len(snap.trajectory) >= step:
            count = sum(1 for text in snap.trajectory[:step] if _ends_turn(text))
        else:
            start, count = self._known.get(session_id, (0, 0))
            if start > step:
                start, count = 0, 0
            if start < step:
                page = await self.engine.stored(self.engine.store.trajectory_page(session_id, start, step - start))
                if page is None:
                    raise NotFound(f"session '{session_id}' not found (it may have expired)")
                count += sum(1 for text in page[0] if _ends_turn(text))
        self._known[session_id] = (step, count)
        self._known.move_to_end(session_id)
        while len(self._known) > KNOWN_SESSIONS:
            self._known.popitem(last=False)
        return count

    async def position(self, snap: Snapshot) -> Position | None:
        scenario = await self.scenario(snap)
        if scenario is None:
            return None
        return Position(await self.ended(snap), len(scenario.turns))

    async def unavailable(self, snap: Snapshot, env: Environment, name: str) -> str | None:
        """Why ``name`` cannot be called yet (the message of an ``unknown_tool`` failure), or None."""
        scenario = await self.scenario(snap)
        if scenario is None:
            return None
        arrives = arriving(scenario).get(name)
        if arrives is None:
            return None
        turn = await self.ended(snap)
        if turn >= arrives:
            return None
        names = ", ".join(sorted(t["function"]["name"] for t in tools_at(env, scenario, turn)))
        return f"unknown tool '{name}'; available tools: {names}"

    async def tools(self, snap: Snapshot, env: Environment) -> list[dict[str, Any]]:
        """The tools the session offers now."""
        scenario = await self.scenario(snap)
        if scenario is None:
            return env.tools
        return tools_at(env, scenario, await self.ended(snap))

    async def view(self, snap: Snapshot, env: Environment) -> dict[str, Any] | None:
        """Where a turn-based session is: the turn in progress, the count, its user message and its tools."""
        scenario = await self.scenario(snap)
        if scenario is None:
            return None
        turn = await self.ended(snap)
        return _view(env, scenario, turn)

    # -- ending a turn ----------------------------------------------------------------------
    async def end(self, session_id: str, content: str | None, *, key: str | None = None,
                  tenant: str = "") -> tuple[dict[str, Any], bool]:
        """End the turn in progress: run its checks, commit the turn's end as a step, answer the next turn.

        Returns the answer and whether it replays an earlier request with the same ``key``.

        Raises:
            NotTurnBased: the session's scenario has no turns. TurnsEnded: every turn has ended.
            NotFound, SessionBusy, LimitExceeded, Unavailable: as for a call.
        """
        engine = self.engine
        engine.calls.forget_warm(session_id)
        fingerprint = idempotency.fingerprint("turn", {"content": content})
        lease = engine.limits.score_budget + LOCK_SLACK
        async with engine.writing(), failures.step_failures(), engine.store.lock(session_id, engine.lock_wait, lease):
            snap = await engine.snapshot(session_id, trajectory=True, tenant=tenant)
            env = await engine.environment_of(snap)
            scenario = await self.scenario(snap)
            if scenario is None:
                raise not_turn_based(session_id)
            replay = await engine.calls.replay(session_id, key, fingerprint)
            if replay is not None:
                return self._answer(replay.record, env, scenario), True
            records = [json.loads(text) for text in snap.trajectory]
            turn = sum(1 for r in records if is_turn(r))
            if turn >= len(scenario.turns):
                raise TurnsEnded(f"all {len(scenario.turns)} turns of session '{session_id}' have ended; "
                                 "score the session")
            engine.calls.check_steps(snap)
            checks = await self._checks(env, snap, scenario.turns[turn],
                                        responses(since_last_turn(records), turn, content), tenant)
            done = turn + 1 == len(scenario.turns)
            record = {"step": snap.meta.step + 1, "kind": TURN, "turn": turn, "content": content,
                      "checks": checks, "done": done}
            await engine.calls.commit(snap, None, record, key=key, fingerprint=fingerprint, done=done)
        answer = self._answer(record, env, scenario)
        if answer["new_tools"]:
            for tell in self.tools_changed:
                tell(session_id)
        return answer, False

    @staticmethod
    def _answer(record: dict[str, Any], env: Environment, scenario: Scenario) -> dict[str, Any]:
        ended = int(record["turn"])
        following = _view(env, scenario, ended + 1)
        return {"step": record["step"], "ended_turn": ended, "turn": following["turn"],
                "turns": following["turns"], "done": following["done"], "user_message": following["user_message"],
                "new_tools": [] if following["done"] else new_tools(env, scenario, ended + 1)}

    async def _checks(self, env: Environment, snap: Snapshot, turn: Turn, turn_responses: dict[str, Any],
                      tenant: str) -> list[dict[str, Any]]:
        if not turn.checklist:
            return []
        engine = self.engine
        budget = engine.limits.score_budget
        sources = [with_responses(c.check, turn_responses) for c in turn.checklist]
        try:
            async with engine.sandbox_slot(tenant):
                results = await asyncio.wait_for(engine.pool.score(env_code(env), snap.state, snap.initial, sources),
                                                 budget)
        except TimeoutError:
            raise LimitExceeded(f"the turn's checks took longer than the score budget of {budget:g} s",
                                limit="score_budget", value=budget) from None
        except SandboxError as exc:
            raise Unavailable(f"the turn's checks failed in the sandbox: {exc.message}") from exc
        return [{"item": c.item, "passed": r["passed"], "error": r["error"]}
                for c, r in zip(turn.checklist, results, strict=True)]

    # -- scoring ----------------------------------------------------------------------------
    async def score(self, session_id: str, scenario: Scenario, tenant: str) -> dict[str, Any]:
        """Each turn's checks and the episode's reward under ``AGGREGATION`` (see the module's doc)."""
        snap = await self.engine.snapshot(session_id, tenant=tenant, trajectory=True)
        env = await self.engine.environment_of(snap)
        records = [json.loads(text) for text in snap.trajectory]
        ended = [r for r in records if is_turn(r)]
        turns: list[dict[str, Any]] = []
        for index, turn in enumerate(scenario.turns):
            if index < len(ended):
                status, checks = "ended", list(ended[index].get("checks") or [])
            elif index == len(ended):
                status = "in_progress"
                checks = await self._checks(env, snap, turn, responses(since_last_turn(records), index, None), tenant)
            else:
                status = "not_reached"
                checks = [{"item": c.item, "passed": False, "error": "this turn has not been reached"}
                          for c in turn.checklist]
            turns.append({"turn": index, "status": status, "passed": all(c["passed"] for c in checks),
                          "checks": checks})
        flat = [c for t in turns for c in t["checks"]]
        passed_turns = sum(1 for t in turns if t["passed"])
        return {"reward": 1.0 if passed_turns == len(turns) else 0.0,
                "passed": sum(1 for c in flat if c["passed"]), "total": len(flat), "checks": flat,
                "aggregation": AGGREGATION, "turns": turns, "turns_passed": passed_turns,
                "partial_credit": passed_turns / len(turns)}


def not_turn_based(session_id: str) -> NotTurnBased:
    return NotTurnBased(f"session '{session_id}' is not of a turn-based scenario: it has no turns")


def view_at(env: Environment, scenario: Scenario, turn: int) -> dict[str, Any]:
    """Turn ``turn`` of a turn-based scenario as clients see it (its message and tools)."""
    return _view(env, scenario, turn)


def _view(env: Environment, scenario: Scenario, turn: int) -> dict[str, Any]:
    count = len(scenario.turns)
    done = turn >= count
    return {"turn": None if done else turn, "turns": count, "done": done,
            "user_message": None if done else scenario.turns[turn].message,
            "tools": tools_at(env, scenario, turn)}


def check_mode(scenario: Scenario | None, mode: str) -> None:
    """Raises InvalidRequest: a turn-based scenario asked for in conversation mode (its user turns are scripted)."""
    if scenario is not None and scenario.turns and mode == "conversation":
        raise InvalidRequest("a turn-based scenario's user turns are scripted: create its sessions in mode 'task' "
                             "and end each turn with POST /v1/sessions/{id}/turns", field="mode")
