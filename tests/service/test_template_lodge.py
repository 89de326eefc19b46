"""Sessions of a scenario with a large state, beyond what a full worker gives processes of their own.

A session whose state is over what a lodge takes (a whole copy per session) and that a full worker
cannot give a process of its own is kept, as its delta against its scenario's template, in a fork
of that template (``sandbox/worker/templatelodge.py``): each call puts its entries in, runs, and
puts the template's back. These tests hold that such sessions answer as the class run plainly
(each its own: no session sees another's changes, and a call that fails midway leaves nothing),
stay live there, leave it when their delta is no longer entries in place, and that a call the
lodge cannot undo (one that draws randomness) is answered exactly and ends only the lodging.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from service.catalog.admission import build_environment
from service.catalog.folders import write_package
from service.catalog.model import CheckItem, Scenario
from tests.conftest import SANDBOX_IMAGE, Server, drop_keys, start_server

CODE = '''
import random


class Accounts:
    def __init__(self, init_config=None):
        self.accounts = {}
        self.opened = 0

    def get(self, account_id: str) -> dict:
        """Read one account."""
        return self.accounts[account_id]

    def note(self, account_id: str, text: str) -> dict:
        """Set an account's note (the usual idiom: an alias from ``.get``)."""
        account = self.accounts.get(account_id)
        account["note"] = text
        account["notes"] = account.get("notes", 0) + 1
        return account

    def fail(self, account_id: str) -> None:
        """Change an account, then refuse."""
        self.accounts[account_id]["note"] = "half done"
        self.accounts[account_id]["history"].append(-1)
        raise ValueError("refused midway")

    def open(self, account_id: str) -> dict:
        """Open a new account (an entry added, not changed in place)."""
        self.accounts[account_id] = {"owner": account_id, "balance": 0, "note": "", "history": []}
        self.opened += 1
        return self.accounts[account_id]

    def draw(self) -> int:
        """A random number."""
        return random.randint(0, 10**9)
'''
ACCOUNTS = 2000  # about 300 KB of state: over what a lodge takes, a process of its own each otherwise


def initial() -> dict[str, Any]:
    return {"accounts": {f"A{i:05d}": {"owner": f"owner {i}", "balance": i * 7, "note": "",
                                       "history": list(range(i % 40, i % 40 + 20))} for i in range(ACCOUNTS)},
            "opened": 0}


def plain_run(calls: list[tuple[str, dict[str, Any]]]) -> tuple[list[Any], dict[str, Any]]:
    """The answers and final attributes of the class run plainly (a failed call rolled back)."""
    namespace: dict[str, Any] = {}
    exec(CODE, namespace)
    instance = namespace["Accounts"]({})
    for key, value in initial().items():
        setattr(instance, key, value)
    results: list[Any] = []
    for name, arguments in calls:
        saved = copy.deepcopy(vars(instance))
        try:
            results.append({"ok": True, "result": copy.deepcopy(getattr(instance, name)(**arguments))})
        except ValueError:
            instance.__dict__.clear()
            instance.__dict__.update(saved)
            results.append({"ok": False, "result": None})
    return results, vars(instance)


@pytest.fixture(scope="module", params=["process", "docker"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Server]:
    env_vars = {"ENVFOUNDRY_RESIDENTS": "1", "ENVFOUNDRY_SANDBOX": request.param,
                "ENVFOUNDRY_KEY_PREFIX": f"eftest-tlodge-{request.param}"}
    if request.param == "docker":
        request.getfixturevalue("docker_client")
        env_vars["ENVFOUNDRY_SANDBOX_IMAGE"] = SANDBOX_IMAGE
    folder = tmp_path_factory.mktemp("template-lodge")
    env = build_environment(env_id="accounts_lodged", class_name="Accounts", code=CODE, summary="Accounts.")
    scenario = Scenario(scenario_id="accounts-big", env_id="accounts_lodged", task="Any.", init_config=initial(),
                        checklist=[CheckItem("any", "def check_func(final_state):\n    return True")])
    write_package(env, [scenario], folder / "catalog")
    # One worker with one session process: every other session must be lodged or rebuilt.
    started = start_server(folder, redis_url=redis_url, workers=1, catalogs=(folder / "catalog",), extra_env=env_vars)
    yield started
    started.stop()
    drop_keys(redis_url, env_vars["ENVFOUNDRY_KEY_PREFIX"])


@pytest.fixture()
def http(server: Server) -> Iterator[httpx.Client]:
    with server.client() as client:
        yield client


def counters(http: httpx.Client) -> dict[str, float]:
    text = http.get("/metrics").text
    found = dict(re.findall(r'envfoundry_sandbox_session_calls\{instance="(\w+)"\} (\S+)', text))
    return {kind: float(value) for kind, value in found.items()}


def call(http: httpx.Client, session: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    answer = http.post(f"/v1/sessions/{session}/calls", json={"name": name, "arguments": arguments})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    if not body["ok"]:
        assert body["error"]["type"] == "tool_exception", body["error"]
    return {"ok": body["ok"], "result": body["result"] if body["ok"] else None}


def sessions(http: httpx.Client, count: int) -> list[str]:
    answer = http.post("/v1/sessions", json={"scenario_id": "accounts-big", "n": count})
    assert answer.status_code == 201, answer.text
    return list(answer.json()["session_ids"])


def final_state(http: httpx.Client, session: str) -> dict[str, Any]:
    answer = http.get(f"/v1/sessions/{session}/state")
    assert answer.status_code == 200, answer.text
    return dict(answer.json()["state"])


def test_lodged_sessions_of_a_template_answer_as_the_class_run_plainly(http: httpx.Client) -> None:
    made = sessions(http, 5)
    # Each session its own script, interleaved: what one changes, the next must not see.
    scripts = {session: [("note", {"account_id": f"A{7 * n:05d}", "text": f"first of {n}"}),
                         ("get", {"account_id": f"A{7 * ((n + 1) % 5):05d}"}),
                         ("note", {"account_id": f"A{7 * n:05d}", "text": f"second of {n}"}),
                         ("fail", {"account_id": f"A{11 * n:05d}"}),
                         ("get", {"account_id": f"A{11 * n:05d}"}),
                         ("note", {"account_id": "A01999", "text": f"shared key, session {n}"}),
                         ("get", {"account_id": f"A{7 * n:05d}"})]
               for n, session in enumerate(made)}
    before = counters(http)
    served: dict[str, list[Any]] = {session: [] for session in made}
    for turn in range(len(scripts[made[0]])):
        for session in made:
            name, arguments = scripts[session][turn]
            served[session].append(call(http, session, name, arguments))
    after = counters(http)
    for session in made:
        expected, attributes = plain_run(scripts[session])
        assert served[session] == expected, session
        assert final_state(http, session) == attributes, session
    # All but the one session process were served by the template's lodge, live: no call rebuilt a
    # session but those that failed (a failed call drops its instance, as a process of its own would end).
    assert after.get("lodged", 0) - before.get("lodged", 0) >= 4 * 5
    assert after.get("rebuilt", 0) - before.get("rebuilt", 0) <= 5 + 5 + 2, (before, after)


def test_a_session_whose_change_is_not_in_place_leaves_the_lodge_and_stays_exact(http: httpx.Client) -> None:
    made = sessions(http, 3)
    script = [("note", {"account_id": "A00003", "text": "kept"}), ("open", {"account_id": "B00001"}),
              ("note", {"account_id": "B00001", "text": "new one"}), ("get", {"account_id": "A00003"})]
    served = {session: [call(http, session, name, arguments) for name, arguments in script] for session in made}
    expected, attributes = plain_run(script)
    for session in made:
        assert served[session] == expected
        assert final_state(http, session) == attributes
    # The template itself is as it was: new sessions hold none of it, in the lodge, which went on.
    fresh = sessions(http, 3)
    before = counters(http)
    for session in fresh:
        assert call(http, session, "get", {"account_id": "A00003"})["result"]["note"] == ""
    assert counters(http).get("lodged", 0) >= before.get("lodged", 0) + 2
    assert final_state(http, fresh[0]) == plain_run([])[1]


def test_a_session_that_changed_many_entries_leaves_the_lodge_and_stays_exact(http: httpx.Client) -> None:
    """Each entry a lodged session changed costs each of its calls a decode and an encode: past
    ``MAX_FIELDS`` (16) it is given a process of its own."""
    made = sessions(http, 3)
    script = [("note", {"account_id": f"A{100 + i:05d}", "text": f"note {i}"}) for i in range(20)]
    served = {session: [call(http, session, name, arguments) for name, arguments in script] for session in made}
    expected, attributes = plain_run(script)
    before = counters(http)
    for session in made:
        assert served[session] == expected
        assert call(http, session, "get", {"account_id": "A00119"}) == {"ok": True, "result": attributes["accounts"][
            "A00119"]}
        assert final_state(http, session) == attributes
    assert counters(http).get("lodged", 0) == before.get("lodged", 0)


def test_a_deleted_lodged_session_ends_and_the_others_go_on(http: httpx.Client) -> None:
    made = sessions(http, 2)
    before = counters(http)
    for session in made:
        call(http, session, "note", {"account_id": "A00020", "text": "mine"})
    assert counters(http).get("lodged", 0) > before.get("lodged", 0)
    assert http.delete(f"/v1/sessions/{made[0]}").status_code == 204
    assert http.post(f"/v1/sessions/{made[0]}/calls", json={"name": "get", "arguments": {"account_id": "A00020"}}
                     ).status_code == 404
    assert call(http, made[1], "get", {"account_id": "A00020"})["result"]["note"] == "mine"


def test_a_call_the_lodge_cannot_undo_is_answered_and_ends_only_the_lodging(http: httpx.Client) -> None:
    made = sessions(http, 3)
    for session in made:  # lodged
        call(http, session, "note", {"account_id": "A00010", "text": "before the draw"})
    drawn = call(http, made[1], "draw", {})
    assert drawn["ok"] and isinstance(drawn["result"], int)
    before = counters(http)
    for session in made:  # every session goes on exactly, from its stored state
        assert call(http, session, "get", {"account_id": "A00010"})["result"]["note"] == "before the draw"
        assert call(http, session, "note", {"account_id": "A00011", "text": "after"})["ok"]
    # The worker lodges no more sessions of that template: they are rebuilt in processes of their own.
    assert counters(http).get("lodged", 0) == before.get("lodged", 0)
    again = call(http, made[1], "draw", {})  # the drawn stream goes on where it was
    assert again["ok"] and again["result"] != drawn["result"]
    state = final_state(http, made[0])
    assert state["accounts"]["A00011"]["note"] == "after" and state["accounts"]["A00010"]["notes"] == 1
