"""What one tenant's environment code can do to a worker's /tmp and to the answers it sends, it
does to itself only: on both backends, whether its calls go through the worker or straight from
the service (a lent process), another session sharing the worker finds /tmp as it should be, and
its calls are answered, by the same worker."""

from __future__ import annotations

from typing import Any

import pytest

from sandbox.pool.calls import EnvCode
from sandbox.pool.requests import WorkerPool
from tests.sandbox.calls import session_call

pytestmark = pytest.mark.anyio

CODE = '''
import os
import select
import stat
import struct


class Tenant:
    def __init__(self, config=None):
        self.calls = 0

    def touch(self) -> int:
        self.calls += 1
        return self.calls

    def chmod_tmp(self, mode: int) -> str:
        try:
            os.chmod("/tmp", mode)
        except OSError as exc:
            return type(exc).__name__
        return "changed"

    def write(self, path: str, text: str) -> bool:
        with open(path, "w") as out:
            out.write(text)
        return True

    def read(self, path: str) -> str:
        with open(path) as source:
            return source.read()

    def listing(self) -> list:
        # (what environment code made: a checkout under /tmp that confinement put back is root's)
        return sorted(n for n in os.listdir("/tmp") if os.lstat(f"/tmp/{n}").st_uid == os.getuid())

    def nest(self, depth: int, lock: bool) -> int:
        """Folders ``depth`` deep with a note at the bottom, each closed behind it."""
        top = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY)
        fd = top
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            if fd != top:
                os.close(fd)
            fd = inner
        note = os.open("note", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(note, b"left at the bottom")
        os.close(note)
        os.close(fd)
        if lock:
            os.chmod("d", 0, dir_fd=top)
        os.close(top)
        return depth

    def links(self, count: int) -> int:
        """Hard links to one file until /tmp refuses more."""
        with open("/tmp/f", "w"):
            pass
        made = 0
        try:
            for n in range(count):
                os.link("/tmp/f", f"/tmp/l{n}")
                made += 1
        except OSError:
            pass
        return made

    def forge(self, lists: int) -> str:
        """Send an answer of its own on the answer pipe, then end before the real one."""
        body = (b'{"ok":true,"error":null,"state":null,"diff":{"added":[],"removed":[],"changed":[]},'
                b'"result":[' + b"[]," * (lists - 1) + b"[]]}")
        for fd in range(3, 256):
            try:
                mode = os.fstat(fd).st_mode
            except OSError:
                continue
            if stat.S_ISFIFO(mode) and os.get_blocking(fd) in (True, False):
                try:
                    os.write(fd, b"")
                except OSError:
                    continue
                data = memoryview(struct.pack(">Q", len(body)) + body)
                while data:
                    try:
                        data = data[os.write(fd, data):]
                    except BlockingIOError:
                        select.select([], [fd], [])
                    except OSError:
                        break
                else:
                    os._exit(0)
        return "no answer pipe found"
'''
TENANT = EnvCode("tmp-attacks", "tmp_attacks", "Tenant", CODE)


class Session:
    def __init__(self, pool: WorkerPool, name: str, state: str) -> None:
        self.pool, self.name, self.state, self.step = pool, name, state, 0

    @classmethod
    async def start(cls, pool: WorkerPool, name: str) -> Session:
        return cls(pool, name, await pool.init_state(TENANT, {}, name))

    async def call(self, tool: str, **arguments: Any) -> Any:
        async def stored() -> str:
            return self.state

        outcome = await session_call(self.pool, TENANT, self.name, self.step, stored, tool, arguments)
        if outcome.ok:
            self.step += 1
            if outcome.state is not None:
                self.state = outcome.state
        else:
            self.pool.forget(self.name)
        return outcome


async def _pair(pool: WorkerPool) -> tuple[Session, Session]:
    attacker, victim = await Session.start(pool, "attacker"), await Session.start(pool, "victim")
    for session in (attacker, victim):  # kept live (and lent, where the worker lends)
        assert (await session.call("touch")).ok
    return attacker, victim


async def _victim_is_fine(victim: Session) -> None:
    wrote = await victim.call("write", path="/tmp/settings.json", text="{}")
    assert wrote.ok, wrote.error
    assert (await victim.call("listing")).result == []  # its own file is gone after its call
    assert (await victim.call("touch")).ok


@pytest.mark.parametrize("mode", [0, 0o555])
async def test_environment_code_cannot_change_tmp_itself(pool_factory: Any, mode: int) -> None:
    async with pool_factory(size=1) as pool:
        attacker, victim = await _pair(pool)
        for _ in range(3):
            changed = await attacker.call("chmod_tmp", mode=mode)
            assert changed.ok and changed.result == "PermissionError"
        assert (await attacker.call("write", path="/tmp/settings.json", text='{"evil": true}')).ok
        seen = await victim.call("read", path="/tmp/settings.json")
        assert not seen.ok and "No such file" in seen.error["message"]
        await _victim_is_fine(victim)
        assert pool.replaced == 0


@pytest.mark.parametrize("lock", [False, True])
async def test_folders_thousands_deep_are_emptied_without_a_trace(pool_factory: Any, lock: bool) -> None:
    async with pool_factory(size=1) as pool:
        attacker, victim = await _pair(pool)
        nested = await attacker.call("nest", depth=3000, lock=lock)
        assert nested.ok and nested.result == 3000, nested.error
        assert (await victim.call("listing")).result == []
        assert (await attacker.call("listing")).result == []
        await _victim_is_fine(victim)
        assert pool.replaced == 0


async def test_hard_links_are_bounded_by_the_tmp_inode_limit(pool_factory: Any) -> None:
    async with pool_factory(size=1, tmp_inodes=2000) as pool:
        attacker, victim = await _pair(pool)
        for _ in range(3):
            made = await attacker.call("links", count=600_000)
            assert made.ok and 0 < made.result < 2000
        assert (await victim.call("listing")).result == []
        await _victim_is_fine(victim)
        assert pool.replaced == 0


async def test_a_forged_oversized_answer_fails_that_call_only(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        attacker, victim = await _pair(pool)
        forged = await attacker.call("forge", lists=700_000)  # 2.1 MB of empty lists, under the answer cap
        assert not forged.ok and forged.error["type"] == "sandbox_error"
        assert "byte limit" in forged.error["message"]
        await _victim_is_fine(victim)
        assert (await attacker.call("touch")).ok  # rebuilt from what is stored
        assert pool.replaced == 0
