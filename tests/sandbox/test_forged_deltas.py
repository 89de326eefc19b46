"""A delta is what a sandbox process says a call changed: one it forges (wrong shape, unparsable,
over the state limit) is a sandbox error and never reaches the store; an honest one passes."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.pool.calls import EnvCode, Stored
from sandbox.state.deltas import Base, compose
from tests.sandbox.calls import session_call

pytestmark = pytest.mark.anyio

FORGER = '''
import json
import os
import struct


def answer(data):
    """Write the answer to whichever pipe takes it (a resident also holds its request's read end)."""
    for fd in range(3, 256):
        try:
            if os.fstat(fd).st_mode & 0o170000 == 0o010000:
                os.write(fd, data)
                return
        except OSError:
            continue
    raise RuntimeError("no answer pipe")


class Forger:
    def __init__(self, config=None):
        self.items = {"a": 1, "b": 2}

    def bump(self, key: str) -> int:
        """Change one entry honestly."""
        self.items[key] += 1
        return self.items[key]

    def forge(self, kind: str) -> None:
        """Answer with a forged delta instead of running."""
        empty = {"added": [], "removed": [], "changed": []}
        delta = {"shape": {"set": ["x"], "unset": "y"}, "big": {"set": {'["items","a"]': "=" + "1" * 70000}, "unset": []},
                 "json": {"set": {'["items","a"]': "={not json"}, "unset": []},
                 "path": {"set": {'["items","a","deeper"]': "=1"}, "unset": []}}[kind]
        text = json.dumps({"ok": True, "result": None, "error": None, "state": None, "diff": empty,
                           "delta": delta})
        data = text.encode()
        answer(struct.pack(">Q", len(data)) + data)
        os._exit(0)
'''

FORGE = EnvCode("forger", "forger", "Forger", FORGER)


class Session:
    def __init__(self, pool: Any, sid: str, state: str) -> None:
        self.pool, self.sid, self.stored, self.step = pool, sid, Stored(state, {}), 0

    async def load(self) -> Stored:
        return self.stored

    async def call(self, name: str, **arguments: Any) -> Any:
        outcome = await session_call(self.pool, FORGE, self.sid, self.step, self.load, name, arguments, deltas=True)
        if outcome.ok:
            self.step += 1
        return outcome


@pytest.mark.parametrize("kind", ["shape", "big", "json", "path"])
async def test_a_forged_delta_is_a_sandbox_error_and_the_honest_one_passes(pool_factory: Any, kind: str) -> None:
    async with pool_factory(size=1, state_bytes=65536) as pool:
        state = await pool.init_state(FORGE, {})
        session = Session(pool, "s-forge", state)
        honest = await session.call("bump", key="a")
        assert honest.ok and honest.state is None and honest.delta == {"set": {'["items","a"]': "=2"}, "unset": []}
        forged = await session.call("forge", kind=kind)
        assert not forged.ok and forged.error["type"] == "sandbox_error" and forged.delta is None, forged
        # another session, and this one rebuilt from what was stored, carry on
        other = Session(pool, "s-other", state)
        assert (await other.call("bump", key="b")).ok
        fields = {'["items","a"]': "=2"}
        session.stored = Stored(compose(Base(state), fields), fields)
        again = await session.call("bump", key="a")
        assert again.ok and again.delta == {"set": {'["items","a"]': "=3"}, "unset": []}
        assert pool.replaced == 0
