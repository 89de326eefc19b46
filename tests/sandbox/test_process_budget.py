"""A worker's process cap counts everything it runs: many environments, their templates and live
sessions fit on one worker without it running out of processes (and being replaced with every
live session on it)."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.pool.calls import EnvCode
from tests.sandbox.calls import session_call

pytestmark = pytest.mark.anyio

CODE = '''
class Counter{n}:
    def __init__(self, config=None):
        self.count = (config or {{}}).get("start", 0)

    def bump(self) -> int:
        self.count += 1
        return self.count
'''


def environment(n: int) -> EnvCode:
    return EnvCode(f"budget-{n}", f"budget_{n}", f"Counter{n}", CODE.format(n=n))


async def test_one_worker_serves_32_environments_with_templates_and_live_sessions(pool_factory: Any) -> None:
    async with pool_factory(size=1, residents=3) as pool:
        for round_ in range(2):  # the second round finds hosts and templates evicted and starts them again
            for n in range(32):
                env = environment(n)
                session = f"s{round_}-{n}"
                state = await pool.init_state(env, {"start": n}, session=session, template=f"t-{n}")

                async def stored(state: str = state) -> str:
                    return state

                outcome = await session_call(pool, env, session, 0, stored, "bump", {})
                assert outcome.ok, outcome.error
                assert outcome.result == n + 1
        assert pool.replaced == 0
