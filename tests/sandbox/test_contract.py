"""The sandbox contract, run against every backend: isolation, atomic calls, limits, containment."""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

import anyio
import pytest

from sandbox.errors import RequestFailed
from sandbox.pool.calls import EnvCode
from sandbox.pool.requests import WorkerPool
from sandbox.wire.limits import Limits
from service.catalog.collection import Catalog
from tests.conftest import FIXTURES

pytestmark = pytest.mark.anyio


def _probe() -> EnvCode:
    catalog = Catalog()
    catalog.load_dir(FIXTURES)
    env = catalog.environments["probe"]
    return EnvCode(env.code_hash, env.env_id, env.class_name, env.code)


PROBE = _probe()


def kill_worker(pool: WorkerPool, worker: Any) -> None:
    """Kill a worker from outside, as a crash or an OOM kill would."""
    channel = worker.channel
    if hasattr(channel, "container"):
        channel.container.kill()
    else:
        os.kill(channel.process.pid, 9)


async def _state(pool: WorkerPool, config: dict[str, Any] | None = None) -> str:
    return await pool.init_state(PROBE, config or {"counter": 0})


async def test_calls_return_results_and_new_state(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        state = await _state(pool)
        out = await pool.call(PROBE, state, "increment", {"by": 2})
        assert out.ok and out.result == {"success": True, "data": 2}
        assert json.loads(out.state)["counter"] == 2
        assert out.diff["changed"] == [{"path": "/counter", "old": 0, "new": 2}]


async def test_read_only_call_reports_no_state_change(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool), "get_counter", {})
        assert out.ok and out.result == 0 and out.state is None


async def test_no_leakage_through_class_attributes_globals_or_builtins(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        state = await _state(pool)
        polluted = await pool.call(PROBE, state, "pollute", {"value": "secret-of-session-a"})
        assert polluted.ok
        seen = await pool.call(PROBE, state, "observe", {})
        assert seen.ok
        assert seen.result["shared"] == []
        assert seen.result["loads"] == 1
        assert seen.result["polluted"] is None


async def test_class_is_compiled_once_per_worker(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        state = await _state(pool)
        first = await pool.call(PROBE, state, "observe", {})
        for _ in range(5):
            again = await pool.call(PROBE, state, "observe", {})
            assert again.result["loads"] == 1  # module code did not run again
            assert again.result["worker"] == first.result["worker"]  # same warm worker, no new process


@pytest.mark.parametrize(
    ("tool", "arguments", "error_type", "fragment"),
    [
        ("fail_after_change", {}, "tool_exception", "RuntimeError: broke halfway"),
        ("spin", {}, "timeout", "longer than"),
        ("hog_memory", {}, "resource_limit", "memory"),
        ("exit_process", {}, "tool_exception", "exit status 7"),
        ("segfault", {}, "tool_exception", "SIGSEGV"),
        ("shout", {"megabytes": 5}, "resource_limit", "printed more than"),
        ("big_result", {"megabytes": 5}, "resource_limit", "result"),
        ("store_unserializable", {}, "tool_exception", "cannot be serialized"),
    ],
)
async def test_a_failing_call_is_contained_and_changes_nothing(
    pool_factory: Any, tool: str, arguments: dict[str, Any], error_type: str, fragment: str
) -> None:
    async with pool_factory(size=1) as pool:
        state = await _state(pool, {"counter": 41})
        out = await pool.call(PROBE, state, tool, arguments)
        assert not out.ok
        assert out.error is not None and out.error["type"] == error_type
        assert fragment in out.error["message"]
        assert out.state is None  # all or nothing: the caller keeps the old state
        after = await pool.call(PROBE, state, "increment", {"by": 1})
        assert after.ok and json.loads(after.state)["counter"] == 42


async def test_a_killed_worker_is_replaced(pool_factory: Any) -> None:
    async with pool_factory(size=1) as pool:
        state = await _state(pool)
        worker = await pool._acquire(None)
        kill_worker(pool, worker)
        pool._put(worker)
        lost = await pool.call(PROBE, state, "increment", {})
        # (the pool may find the dead worker first, pinging its idle workers, and replace it: then
        # no call is lost; otherwise the call that finds it is, with a sandbox error)
        assert lost.ok or lost.error["type"] == "sandbox_error"
        out = await pool.call(PROBE, state, "increment", {})
        assert out.ok
        assert pool.replaced == 1


async def test_other_calls_proceed_while_one_hangs(pool_factory: Any) -> None:
    async with pool_factory(size=2, call_timeout=2.0) as pool:
        state = await _state(pool)
        results: dict[str, Any] = {}

        async def hang() -> None:
            results["hang"] = await pool.call(PROBE, state, "spin", {})

        async def quick() -> None:
            await anyio.sleep(0.2)
            results["quick"] = await pool.call(PROBE, state, "increment", {})
            results["quick_done_before_hang"] = "hang" not in results

        async with anyio.create_task_group() as tg:
            tg.start_soon(hang)
            tg.start_soon(quick)
        assert results["quick"].ok and results["quick_done_before_hang"]
        assert results["hang"].error["type"] == "timeout"


async def test_only_loopback_exists(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool), "network_interfaces", {})
        # Environment code cannot even list them (/sys is hidden, sockets are refused); the worker
        # checked from outside the ruleset that it has no interface but a downed loopback.
        assert out.ok and out.result == {"listing": 13, "netlink": 1}, out
        assert "network" in pool.containment["applied"], pool.containment


async def test_network_is_unreachable(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool), "connect", {"host": "127.0.0.1", "port": 6379})
        assert not out.ok and "connected" != out.result
        assert out.error["type"] == "tool_exception"


@pytest.mark.parametrize("path", ["/work/escape.txt", "/etc/escape.txt", "/var/tmp/escape.txt", "/root/escape.txt"])
async def test_no_writes_outside_the_private_temp_dir(pool_factory: Any, path: str) -> None:
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool), "write_file", {"path": path})
        assert not out.ok, f"wrote {path}"
        assert not os.path.exists(path)


async def test_private_temp_dir_is_writable_and_not_the_hosts(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        name = f"/tmp/ef-sandbox-probe-{os.getpid()}"
        out = await pool.call(PROBE, await _state(pool), "write_file", {"path": name})
        assert out.ok
        assert not os.path.exists(name)


async def test_service_environment_is_invisible(pool_factory: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDIS_URL", "redis://secret-host:6379")
    monkeypatch.setenv("ENVFOUNDRY_API_KEY", "sk-secret")
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool), "read_env", {})
        assert out.ok
        assert "REDIS_URL" not in out.result and "ENVFOUNDRY_API_KEY" not in out.result
        for pid in (1, 2, os.getpid()):  # the worker and its zygote in their namespace; the test process
            proc = await pool.call(PROBE, await _state(pool), "read_file", {"path": f"/proc/{pid}/environ"})
            assert not proc.ok or "secret" not in str(proc.result)


async def test_runs_as_an_unprivileged_user(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool), "whoami", {})
        assert out.ok
        if os.geteuid() == 0:
            assert out.result[0] != 0 and out.result[1] != 0
        assert pool.containment["missing"] == {} or os.geteuid() != 0


async def test_processes_are_limited(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool), "fork_bomb", {})
        assert not out.ok and "Resource temporarily unavailable" in out.error["message"]


async def test_unknown_and_private_tools_are_refused(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        state = await _state(pool)
        for name in ("_private_helper", "__init__", "total", "counter", "nope"):
            out = await pool.call(PROBE, state, name, {})
            assert not out.ok and out.error["type"] == "unknown_tool", name


async def test_wrong_argument_names_are_invalid_arguments(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool), "increment", {"step": 1})
        assert not out.ok and out.error["type"] == "invalid_arguments" and "step" in out.error["message"]


async def test_rich_state_round_trips_between_calls(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        stored = await pool.call(PROBE, await _state(pool), "store_rich", {})
        assert stored.ok
        out = await pool.call(PROBE, stored.state, "inspect_rich", {})
        assert out.result == {
            "set": "set", "tuple": "tuple", "when": "datetime", "day": "date", "note": "Note",
            "note_is_env_class": True, "note_text": "hello", "frozenset": "frozenset", "int_key": "int key",
            "equal": True,
        }


@pytest.mark.parametrize(("kind", "expected"), [("set", ["a", "b"]), ("bytes", "base64:/wFyYXc="),
                                                ("object", {"__type__": "Note", "text": "n"})])
async def test_non_json_results_get_a_json_view(pool_factory: Any, kind: str, expected: Any) -> None:
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool), "return_odd", {"kind": kind})
        assert out.ok and out.result == expected


async def test_checks_report_each_failure_with_its_reason(pool_factory: Any) -> None:
    async with pool_factory(check_timeout=1.0) as pool:
        state = await _state(pool, {"counter": 5})
        checks = [
            "def check_func(final_state):\n    return final_state['counter'] == 5",
            "def check_func(final_state):\n    return 1",
            "def check_func(final_state):\n    return final_state['missing']",
            "def other(final_state):\n    return True",
            "def check_func(final_state):\n    while True:\n        pass",
            "def check_func(final_state):\n    import os\n    os._exit(1)",
            "def check_func(final_state):\n    return initial_state['counter'] == 5",
        ]
        results = await pool.score(PROBE, state, state, checks)
        assert [r["passed"] for r in results] == [True, False, False, False, False, False, True]
        assert "expected bool" in results[1]["error"]
        assert "KeyError" in results[2]["error"]
        assert "check_func" in results[3]["error"]
        assert "timeout" in results[4]["error"]
        assert "exit status" in results[5]["error"]


async def test_validate_reports_why_code_is_unusable(pool_factory: Any) -> None:
    cases = {
        "syntax_error": "class A:\n    def f(self)\n        pass\n",
        "missing_class": "class B:\n    pass\n",
        "init_error": "class A:\n    def __init__(self, config=None):\n        raise ValueError('bad init')\n",
        "import_error": "import no_such_module_xyz\nclass A:\n    pass\n",
    }
    async with pool_factory() as pool:
        for kind, code in cases.items():
            failure = await pool.validate(EnvCode(kind, "bad", "A", code))
            assert failure is not None and failure["kind"] == kind, (kind, failure)
        assert await pool.validate(EnvCode("ok", "ok", "A", "class A:\n    pass\n")) is None
        # the pool still works after all that
        assert (await pool.call(PROBE, await _state(pool), "increment", {})).ok


async def test_open_files_are_limited(pool_factory: Any) -> None:
    async with pool_factory(open_files=32) as pool:
        state = await _state(pool)
        assert (await pool.call(PROBE, state, "open_files", {"count": 10})).ok
        out = await pool.call(PROBE, state, "open_files", {"count": 100})
        assert not out.ok and "Too many open files" in out.error["message"]


async def test_state_size_is_limited(pool_factory: Any) -> None:
    async with pool_factory(state_bytes=64 * 1024) as pool:
        state = await _state(pool)
        assert (await pool.call(PROBE, state, "grow", {"kilobytes": 16})).ok
        out = await pool.call(PROBE, state, "grow", {"kilobytes": 100})
        assert not out.ok and out.error["type"] == "resource_limit" and "65536 byte limit" in out.error["message"]


@pytest.mark.parametrize(("memory_mb", "fits"), [(256, False), (1024, True)])
async def test_memory_limit_is_configurable(pool_factory: Any, memory_mb: int, fits: bool) -> None:
    async with pool_factory(memory_mb=memory_mb) as pool:
        out = await pool.call(PROBE, await _state(pool), "allocate", {"megabytes": 400})
        assert out.ok is fits
        if not fits:
            assert out.error["type"] == "resource_limit"


async def test_missing_containment_is_reported_loudly(caplog: pytest.LogCaptureFixture) -> None:
    from sandbox.backends.process import ProcessBackend

    pool = WorkerPool(ProcessBackend(contain=False), 1, Limits())
    with caplog.at_level("WARNING", logger="envfoundry.sandbox"):
        await pool.start()
    try:
        assert pool.containment["applied"] == []
        assert any("SANDBOX CONTAINMENT MISSING" in r.getMessage() for r in caplog.records)
    finally:
        await pool.close()


async def test_a_call_inherits_no_descriptor_but_its_answer_pipe(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool), "open_descriptors", {})
        assert out.ok and len(out.result) == 1, out.result  # the worker's protocol pipes are not among them


async def test_a_call_that_closes_its_pipe_and_runs_on_is_stopped(pool_factory: Any) -> None:
    async with pool_factory(call_timeout=2.0) as pool:
        state = await _state(pool)
        out = await pool.call(PROBE, state, "close_and_sleep", {"seconds": 100})
        assert not out.ok and out.error["type"] == "timeout"
        assert (await pool.call(PROBE, state, "increment", {})).ok
        assert pool.replaced == 0


async def test_async_tools_run_to_completion(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool, {"counter": 1}), "async_increment", {"by": 2})
        assert out.ok and out.result == 3 and json.loads(out.state)["counter"] == 3


async def test_a_class_that_fails_to_load_is_a_sandbox_error_for_the_call(pool_factory: Any) -> None:
    broken = EnvCode("broken-at-load", "broken", "A", "raise RuntimeError('module code failed')\nclass A:\n    pass\n")
    async with pool_factory() as pool:
        out = await pool.call(broken, "{}", "anything", {})
        assert not out.ok and out.error["type"] == "sandbox_error"
        assert "load_error" in out.error["message"] and "module code failed" in out.error["message"]
        assert (await pool.call(PROBE, await _state(pool), "increment", {})).ok
        assert pool.replaced == 0  # module code runs in its own process: the worker is unharmed


SPY = """
import builtins
import resource
import sys

LOG = []
try:
    import sandbox.worker.channel as channel
    import sandbox.wire.protocol as protocol
    original_receive, original_read = channel.receive, protocol.read_frame

    def spy_receive(*args, **kwargs):
        message = original_receive(*args, **kwargs)
        LOG.append(repr(message)[:4000])
        return message

    def spy_read(*args, **kwargs):
        message = original_read(*args, **kwargs)
        LOG.append(repr(message)[:4000])
        return message

    channel.receive, protocol.read_frame = spy_receive, spy_read
    import sandbox.worker.runtime as runtime
    runtime.Runtime.handle = lambda self, request: {"id": request.get("id"), "ok": True, "hijacked": True}
except ImportError:
    pass


class Spy:
    def __init__(self):
        self.n = 0

    def peek(self) -> list:
        return list(LOG)
"""


async def test_module_code_of_one_environment_cannot_observe_or_break_another(pool_factory: Any) -> None:
    spy = EnvCode("spy-env", "spy", "Spy", SPY)
    async with pool_factory(size=1) as pool:
        victim = await _state(pool)
        first = await pool.call(PROBE, victim, "add_item", {"item_id": "pw", "name": "VICTIM-SECRET-1"})
        assert first.ok
        spy_state = await pool.init_state(spy, {})
        assert (await pool.call(spy, spy_state, "peek", {})).ok
        second = await pool.call(PROBE, first.state, "add_item", {"item_id": "pw2", "name": "VICTIM-SECRET-2"})
        assert second.ok and "VICTIM-SECRET-2" in second.state  # the worker still answers for real
        tagged = await pool.call(PROBE, second.state, "tag", {"tag": "x"})
        assert tagged.ok and tagged.result == ["x"]
        assert (await pool.call(PROBE, second.state, "open_files", {"count": 10})).ok
        seen = await pool.call(spy, spy_state, "peek", {})
        assert seen.ok and "VICTIM-SECRET" not in json.dumps(seen.result)


SABOTEUR = """
import builtins
import resource
import sys

builtins.len = lambda value: 0
builtins.sorted = None
resource.setrlimit(resource.RLIMIT_NOFILE, (5, 5))
sys.modules["json"].dumps = lambda *args, **kwargs: "garbage"


class Saboteur:
    def noop(self) -> None:
        return None
"""


async def test_module_code_that_sabotages_its_process_harms_only_its_own_environment(pool_factory: Any) -> None:
    saboteur = EnvCode("saboteur-env", "saboteur", "Saboteur", SABOTEUR)
    async with pool_factory(size=1) as pool:
        state = await _state(pool)
        with pytest.raises(RequestFailed):
            await pool.init_state(saboteur, {})
        tagged = await pool.call(PROBE, state, "tag", {"tag": "x"})  # uses sorted() and json
        assert tagged.ok and tagged.result == ["x"]
        assert (await pool.call(PROBE, state, "open_files", {"count": 20})).ok


async def test_host_processes_are_invisible(pool_factory: Any) -> None:
    async with pool_factory() as pool:
        out = await pool.call(PROBE, await _state(pool), "visible_processes", {})
        assert out.ok and out.result, out
        assert not any("pytest" in line or "uvicorn" in line or "envfoundry serve" in line for line in out.result)
        assert len(out.result) <= 8  # the worker, its environment host and this call
        # and none of them shows its command line (the Landlock ruleset hides /proc)
        assert all(line.endswith(": Permission denied") for line in out.result), out.result


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                        found.append(int(entry))
            except (OSError, IndexError, ValueError):
                continue
    return found


def _descendants(pid: int) -> list[int]:
    found, todo = [], _children(pid)
    while todo:
        child = todo.pop()
        found.append(child)
        todo.extend(_children(child))
    return found


def _is_running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _worker_pid(worker: Any) -> int:
    channel = worker.channel
    if hasattr(channel, "container"):
        channel.container.reload()
        outer = int(channel.container.attrs["State"]["Pid"])  # the container's init
    else:
        outer = channel.process.pid  # the waiter outside the worker's PID namespace
    (inner,) = _children(outer)
    return inner


def _memory_holds(pid: int, needle: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            for line in maps:
                span, perms = line.split()[:2]
                if "r" not in perms or "[v" in line:
                    continue
                low, high = (int(part, 16) for part in span.split("-"))
                try:
                    mem.seek(low)
                    if needle in mem.read(high - low):
                        return True
                except (OSError, OverflowError, ValueError):
                    continue
    except OSError:
        return False
    return False


async def test_session_data_stays_out_of_every_process_that_forks_for_others(pool_factory: Any) -> None:
    """Only the worker (which runs no environment code) ever holds a session's data; the zygote,
    the environment hosts and their ready forks, which later calls are copied from, never do."""
    if os.geteuid() != 0:
        pytest.skip("reading other processes' memory needs root")
    secret = f"SESSION-SECRET-{secrets.token_hex(8)}"
    async with pool_factory(size=1) as pool:
        state = await _state(pool)
        out = await pool.call(PROBE, state, "add_item", {"item_id": "s", "name": secret})
        assert out.ok
        for _ in range(3):  # other sessions keep the environment busy afterwards
            assert (await pool.call(PROBE, await _state(pool), "increment", {})).ok
        worker = await pool._acquire(None)
        pool._put(worker)
        root = _worker_pid(worker)
        others = _descendants(root)
        for _ in range(500):  # the host makes its next ready fork once the call's is ended
            if len(others) >= 3:
                break
            await anyio.sleep(0.01)
            others = _descendants(root)
        assert len(others) >= 3  # the zygote, the probe's host, and its ready fork
        assert _memory_holds(root, secret.encode())  # the scan does find it where it must be
        assert [pid for pid in others if _memory_holds(pid, secret.encode())] == []


@pytest.mark.parametrize("payload", ['{"error": "boom"}', '{"ok": true, "diff": 5}', '{"ok": true, "state": 7}',
                                     '[1, 2]', '{"error": {"type": "tool_exception"}}'])
async def test_a_forged_answer_is_a_sandbox_error(pool_factory: Any, payload: str) -> None:
    async with pool_factory(size=1) as pool:
        state = await _state(pool)
        out = await pool.call(PROBE, state, "forge_answer", {"payload": payload})
        assert not out.ok and out.error["type"] == "sandbox_error" and out.state is None
        assert (await pool.call(PROBE, state, "increment", {})).ok


HOG = """
import os
import time

for _ in range(200):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        os.setsid()
        time.sleep(3600)
        os._exit(0)


class Hog:
    def noop(self) -> None:
        return None
"""


async def test_module_code_that_uses_up_processes_gets_its_worker_replaced(pool_factory: Any) -> None:
    hog = EnvCode("hog-env", "hog", "Hog", HOG)
    # (a budget for 32 live sessions, which the hog's 200 processes pass; the default's 1,024 they would not)
    async with pool_factory(size=1, residents=32) as pool:
        state = await _state(pool)
        with pytest.raises(RequestFailed):
            await pool.init_state(hog, {})
        assert pool.replaced >= 1
        out = await pool.call(PROBE, state, "increment", {})
        assert out.ok, out.error


async def test_a_killed_zygote_gets_its_worker_replaced(pool_factory: Any) -> None:
    """Calls cannot signal the zygote (see test_containment); should it die all the same, the
    worker notices and is replaced."""
    async with pool_factory(size=1) as pool:
        state = await _state(pool)
        worker = await pool._acquire(None)
        zygote = min(_children(_worker_pid(worker)))  # forked before anything else
        os.kill(zygote, 9)
        while _is_running(zygote):  # dead before the next request, which must notice it
            await anyio.sleep(0.01)
        pool._put(worker)
        for _ in range(3):  # at most a call or two meet the broken worker before it is replaced
            if (await pool.call(PROBE, state, "increment", {})).ok:
                break
        assert (await pool.call(PROBE, state, "increment", {})).ok
        assert pool.replaced >= 1


SNOOP = """
import os
import threading
import time

SEEN = []


def watch():
    while True:
        try:
            SEEN.extend(name for name in os.listdir("/tmp") if name not in SEEN)
        except OSError:
            pass
        time.sleep(0.01)


threading.Thread(target=watch, daemon=True).start()


class Snoop:
    def seen(self) -> list:
        return list(SEEN)  # what the watcher had gathered when this call's process was forked
"""


async def test_an_environment_cannot_watch_another_run(pool_factory: Any) -> None:
    snoop = EnvCode("snoop-env", "snoop", "Snoop", SNOOP)
    async with pool_factory(size=1) as pool:
        snoop_state = await pool.init_state(snoop, {})
        state = await _state(pool)
        for i in range(3):
            assert (await pool.call(PROBE, state, "write_and_wait", {"path": f"/tmp/victim-{i}", "seconds": 0.3})).ok
        await pool.call(snoop, snoop_state, "seen", {})
        seen = await pool.call(snoop, snoop_state, "seen", {})  # forked after the victim's calls
        assert seen.ok and not any(name.startswith("victim") for name in seen.result), seen.result


async def test_a_diff_over_its_bound_is_summarised_before_it_reaches_the_service(pool_factory: Any) -> None:
    async with pool_factory(diff_bytes=4096) as pool:
        state = await _state(pool)
        out = await pool.call(PROBE, state, "tag", {"tag": "t" * 10_000})
        assert out.ok and out.state is not None and "t" * 10_000 in out.state  # the state keeps the change
        assert out.diff == {"added": [], "removed": [], "changed": [], "truncated": True,
                            "bytes": out.diff["bytes"]}
        assert out.diff["bytes"] > 10_000
        small = await pool.call(PROBE, state, "increment", {"by": 1})
        assert small.diff["changed"] == [{"path": "/counter", "old": 0, "new": 1}]
