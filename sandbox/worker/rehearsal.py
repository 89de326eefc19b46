"""A session's path run ahead, in the zygote, on a class of the sandbox's own.

CPython 3.11 rewrites a function's bytecode in place the first times it runs (its warm-up count,
then specialisation), and fills caches (``re``'s, ``inspect``'s, the type attribute cache) on
first use. Done in each session's process, those writes land on pages it shares with its host and
template, which the kernel then copies for it: every live session paid for them again. Run once
here, before hosts are forked, they are shared by every process forked after. Nothing of an
environment runs: the class is this module's, and nothing it made is kept.

Standard library only.
"""

from __future__ import annotations

import io
import json
import sys
import types
from typing import Any

from sandbox.state import decoder, encoder, view
from sandbox.state.readonly import ReadOnly
from sandbox.wire import protocol
from sandbox.worker.resident import LiveSession, public_state, resolver

# CPython 3.11 quickens a function after 8 runs and specialises on the runs after; each round here runs
# most functions several times. (More rounds measured no less memory per session, and every worker
# start pays for them: 24 rounds took 70-120 ms.)
ROUNDS = 8
MODULE = "ef_rehearsal"
CODE = '''
class Shop:
    """A shop's orders: each idiom a session's call path meets, on a state of every kind of value."""

    def __init__(self, init_config=None):
        self.orders = {f"O{i}": {"user": f"u{i % 3}", "items": [{"sku": "A1", "price": 9.5, "quantity": i}],
                                 "status": "pending", "note": "", "paid": i % 2 == 0, "refund": None}
                       for i in range(8)}
        self.users = {"u0": {"name": "Ada", "tags": ["a", "b"]}, "u1": {"name": "Bo", "tags": []},
                      "u2": {"name": "Cy", "tags": ["c"]}}
        self.log = []
        self.count = 0

    def get_order(self, order_id: str) -> dict:
        if order_id not in self.orders:
            return {"success": False, "error": "no such order"}
        return {"success": True, "data": self.orders[order_id]}

    def find_order(self, order_id: str) -> dict:
        order = self.orders.get(order_id)
        return {"success": order is not None, "data": order}

    def set_note(self, order_id: str, note: str) -> dict:
        if order_id not in self.orders:
            return {"success": False, "error": "no such order"}
        self.orders[order_id]["note"] = note
        return {"success": True}

    def add_tag(self, user_id: str, tag: str) -> dict:
        user = self.users.get(user_id)
        if user is None:
            return {"success": False}
        user["tags"].append(tag)
        return {"success": True}

    def record(self, text: str) -> int:
        self.log.append({"text": text, "at": self.count})
        self.count += 1
        return self.count
'''
CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("get_order", {"order_id": "O1"}), ("find_order", {"order_id": "O2"}), ("get_order", {"order_id": "X"}),
    ("set_note", {"order_id": "O3", "note": "gift"}), ("add_tag", {"user_id": "u1", "tag": "vip"}),
    ("record", {"text": "seen"}), ("set_note", {"order_id": "O4", "note": ""}), ("nope", {}),
)


def rehearse() -> None:
    """``run``, for the zygote: a rehearsal that fails costs memory later, never a session."""
    try:
        run()
    except Exception:
        pass


def run() -> list[dict[str, Any]]:
    """A session's init, calls (reads, writes, a failing one), a rebuild from the stored state,
    ``ROUNDS`` times over, with and without deltas; the answers of the last round."""
    module = types.ModuleType(MODULE)
    sys.modules[MODULE] = module  # (as a host's module is: the codec names classes through it)
    try:
        exec(compile(CODE, f"<{MODULE}>", "exec"), module.__dict__)
        cls = module.__dict__["Shop"]
        readonly = ReadOnly(module, CODE, cls)
        answers: list[dict[str, Any]] = []
        for round_ in range(ROUNDS):
            answers = _session(module, cls, readonly, deltas=round_ % 2 == 0)
        return answers
    finally:
        sys.modules.pop(MODULE, None)


def _session(module: types.ModuleType, cls: type, readonly: ReadOnly, deltas: bool) -> list[dict[str, Any]]:
    live = LiveSession(module, cls, readonly)
    init = {"op": "init", "init_config": {}, "session": "rehearsal", "next_version": 0, "deltas": deltas}
    answers = [live.handle(init)[0]]
    for step, (name, arguments) in enumerate(CALLS):
        request = {"op": "call", "name": name, "arguments": arguments, "session": "rehearsal", "step": step,
                   "deltas": deltas}
        answers.append(live.handle(protocol.read_frame(io.BytesIO(protocol.encode_frame(request))))[0])
        protocol.encode_frame(answers[-1])
    # a rebuild: the stored state decoded into a new instance, then viewed as GET /state does
    text = encoder.encode_state(public_state(live.instance), MODULE, live.instance)
    again = LiveSession(module, cls, readonly)
    answers.append(again.handle({"op": "call", "name": "get_order", "arguments": {"order_id": "O1"},
                                 "state": text, "session": "rehearsal", "step": 0})[0])
    view.view_encoded(decoder.decode(json.loads(text), resolver(module)))
    return answers
