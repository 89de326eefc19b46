"""Acting on a scenario repair that blames the environment: the tool it names is repaired, or the environment dropped.

A checker can miss a tool bug the assessment never provoked; a scenario's
replay then exposes it, and the scenario repair answers ``environment``,
naming the tool. That tool goes back through tool repair with the scenario's
evidence (the replayed calls and results, the failing checks, the final state,
the diagnosis). A rewrite is accepted when the class loads and the scenario
that exposed the bug validates with it. The repaired code is appended to the
environment's assessment record (``repaired_after_scenarios`` in its summary,
which the package's provenance publishes); with no accepted rewrite after
``repair.tool_attempts``, the assessment record drops the environment
(``tool_unrepaired``), so publishing leaves it out. Either way nothing the
diagnosis named ships unrepaired.

Slots of one environment run concurrently: repairs of an environment are
serialised, and a slot whose environment another slot repaired meanwhile just
validates again with the new code.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import defaultdict
from collections.abc import Awaitable, Callable
from typing import Any

from service.catalog.model import Environment
from synthesis.errors import Dropped
from synthesis.repair.tool_repair import rewrite
from synthesis.run.context import Context
from synthesis.run.report import DROPPED

Verify = Callable[[Environment], Awaitable[str | None]]  # None: the scenario validates with this environment


def revision(env: Environment) -> str:
    """Names the code a scenario was validated against: a repaired environment's scenarios are checked again."""
    return hashlib.sha256(env.code.encode()).hexdigest()[:16]


class EnvironmentRepair:
    def __init__(self, ctx: Context, envs: dict[str, Environment], *, stage: str) -> None:
        self.ctx = ctx
        self.envs = envs  # shared with the stage: a repair replaces the entry, later slots see it
        self.stage = stage
        self.repaired: dict[str, list[dict[str, Any]]] = defaultdict(list)  # env_id -> what was repaired, by whom
        self.dropped: dict[str, str] = {}  # env_id -> why
        self._locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)

    def current(self, env_id: str) -> Environment:
        """The environment as it stands now.

        Raises:
            Dropped: an earlier repair failed and dropped it (``environment_dropped``).
        """
        if env_id in self.dropped:
            raise Dropped("environment_dropped", self.dropped[env_id])
        return self.envs[env_id]

    async def blame(self, env: Environment, tool: str, key: str, evidence: dict[str, Any], verify: Verify) -> Environment:
        """The environment with ``tool`` repaired (``env`` being what scenario ``key`` was validated against).

        Raises:
            Dropped: no rewrite fixed it; the environment is dropped (``environment_dropped``).
        """
        env_id = env.env_id
        async with self._locks[env_id]:
            now = self.current(env_id)
            if now is not env:
                return now  # repaired by another slot meanwhile: validate with that first
            slot = key.rsplit("-", 1)[1]
            fixed, attempts = await rewrite(self.ctx, env, tool, [evidence], item=f"{tool}-{slot}", verify=verify,
                                            stage=self.stage)  # fmt: skip
            done = {"tool": tool, "scenario": key, "reason": evidence.get("diagnosis", ""), "attempts": attempts}
            assessments = self.ctx.workspace.assessments
            record = assessments.load()[env_id]
            summary = dict(record.get("assessment") or {})
            summary["repaired_after_scenarios"] = [*(summary.get("repaired_after_scenarios") or []), done]
            if fixed is None:
                detail = f"{tool}: scenario {key} found it wrong ({done['reason']}); {len(attempts)} rewrites did not fix it"
                summary["failing"] = [*(summary.get("failing") or []), detail]  # a rerun of `assess` keeps it dropped
                assessments.append({**record, "assessment": summary, "status": DROPPED, "reason": "tool_unrepaired",
                                    "detail": detail})  # fmt: skip
                self.dropped[env_id] = detail
                self.ctx.note(self.stage, f"{env_id}: dropped: {detail}")
                raise Dropped("environment_dropped", detail)
            assessments.append({**record, "assessment": summary, "code": fixed.code})
            self.envs[env_id] = fixed
            self.repaired[env_id].append(done)
            self.ctx.note(self.stage, f"{env_id}: repaired {tool} from the evidence of scenario {key}")
            return fixed

    def notes(self) -> list[str]:
        """One line per environment a repair touched, for the stage's report."""
        lines = [f"{env_id}: repaired {', '.join(d['tool'] for d in done)} after scenarios "
                 f"{', '.join(d['scenario'] for d in done)} found them wrong" for env_id, done in sorted(self.repaired.items())]  # fmt: skip
        lines += [f"{env_id}: environment dropped: {why}" for env_id, why in sorted(self.dropped.items())]
        return lines
