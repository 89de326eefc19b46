"""The zygote's rehearsal: a session's path, run on the sandbox's own class before any host forks.

It only pays off if it walks the path real sessions take (a watched state, deltas, a rebuild, a
failing call), and it must leave nothing behind that a host or session could meet.
"""

from __future__ import annotations

import sys
import types

from sandbox.state.readonly import ReadOnly
from sandbox.worker import rehearsal


def test_the_rehearsal_runs_every_call_as_a_session_would() -> None:
    answers = rehearsal.run()
    init, *calls, rebuilt = answers
    assert isinstance(init["state"], str) and "orders" in init["state"]
    assert [a["error"]["type"] for a in calls if a.get("error")] == ["unknown_tool"]  # only the tool that is not one
    assert [a["diff"]["changed"][0]["path"] for a in calls if a.get("ok") and a["diff"]["changed"]] == \
        ["/orders/O3/note", "/users/u1/tags", "/log"]
    assert rebuilt["ok"] and rebuilt["result"]["data"]["user"] == "u1"


def test_with_deltas_its_state_is_watched_and_writes_answer_deltas() -> None:
    module = types.ModuleType(rehearsal.MODULE)
    sys.modules[rehearsal.MODULE] = module
    try:
        exec(compile(rehearsal.CODE, "<rehearsal>", "exec"), module.__dict__)
        cls = module.__dict__["Shop"]
        answers = rehearsal._session(module, cls, ReadOnly(module, rehearsal.CODE, cls), deltas=True)
    finally:
        sys.modules.pop(rehearsal.MODULE, None)
    writes = [a for a in answers[1:-1] if a.get("ok") and a["diff"]["changed"]]
    assert writes and all(a.get("delta") for a in writes)  # the watched path, not the whole-state one


def test_it_leaves_no_module_behind_and_never_fails_the_zygote() -> None:
    rehearsal.rehearse()
    assert rehearsal.MODULE not in sys.modules
    broken = rehearsal.CODE
    try:
        rehearsal.CODE = "raise RuntimeError('a rehearsal that fails')"
        rehearsal.rehearse()  # swallowed: the zygote goes on without it
    finally:
        rehearsal.CODE = broken
    assert rehearsal.MODULE not in sys.modules
