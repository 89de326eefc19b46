"""Sessions kept against a template's state, live together in one fork of that template.

A lodge (``sandbox.worker.lodge``) holds a whole instance per session: fine for a 4 KB state, but a
3 MB one takes tens of MB as objects, and a process of its own per session (forked from the
template, sharing its pages) does not fit ten thousand sessions in a machine's memory either. Yet
most sessions of a scenario differ from its initial state by a few entries changed in place (a
delta whose every field is an entry, ``deltas.entries_in_place``). A *template lodge*, a fork of
the scenario's template kept for one tenant, keeps only those fields per session. For a call it
puts the session's entries into the template's instance, exactly as a fork of the template
rebuilding the session does (``LiveSession._from_template``, which checks each entry encodes to
its stored text), runs the call, and puts the template's own entries back: a session then costs
what it changed, and a call what it touches.

Putting back is checked as strictly as building: each entry put back must encode to the
template's text, the attributes must be the template's (names, order, nothing added, no
randomness drawn, the class unchanged). A call that leaves the instance otherwise (it drew
randomness, added an attribute, raised midway through a change the watch cannot vouch for) is
answered, and then the lodge ends: the worker lodges no more sessions of that template, which
keep processes of their own. A session whose delta is no longer entries in place, or names more
than ``MAX_FIELDS`` entries, or whose call answered a whole state, leaves the lodge once answered
(``DROPPED``).

Standard library only.
"""

from __future__ import annotations

import json
from typing import Any

from sandbox.state.deltas import entries_in_place, field
from sandbox.state.parts import Parts
from sandbox.wire.answers import NEED_STATE, error
from sandbox.worker.lodge import FORGOTTEN, Lodging
from sandbox.worker.resident import HIDDEN_FIELD, LiveSession

# The answer's field saying the session left the lodge (its next call brings its stored state),
# and the one giving the size of what the lodge keeps of it.
DROPPED = "dropped"
KEEPS = "lodged_bytes"


# The most entries a session may have changed to be kept in a template lodge: each is decoded in
# and encoded back out for every call (about 0.15 ms each), where a process of its own pays nothing.
MAX_FIELDS = 16


def lodgeable(fields: Any) -> bool:
    """Whether a session with delta ``fields`` can be kept in a template lodge."""
    return isinstance(fields, dict) and len(fields) <= MAX_FIELDS and HIDDEN_FIELD not in fields \
        and entries_in_place(fields) is not None


class TemplateForm:
    """What the template's instance is, part by part: the texts a session's call is checked to
    have left, or put back."""

    def __init__(self, live: LiveSession) -> None:
        parts = live.parts
        assert parts is not None
        self.cls, self.digest, self.text = live.cls, live.digest, live.text
        self.names = list(parts.parts)
        # each attribute's text ('"name":text'), and the entries' of those that are dicts of entries
        self.tops = {name: part.member for name, part in parts.parts.items() if part.entries is None}
        self.entries = {name: {key: entry.member for key, entry in part.entries.items()}
                        for name, part in parts.parts.items() if part.entries is not None}

    @classmethod
    def of(cls, live: LiveSession) -> TemplateForm | None:
        """The form of a template's instance, if its state is watched (else nothing is lodged)."""
        if not live.digest or live.parts is None or not live.parts.watched or live.delta is not None:
            return None
        return cls(live)

    def back(self, fields: dict[str, str]) -> dict[str, str] | None:
        """The delta fields that put the template's own text back at each of ``fields`` (a delta's,
        with its tags): an entry or plain attribute changed in place gets the template's text
        again, an entry added is removed (added ones come last: the order is the template's
        again). None for what cannot be put back so (an entry moved or removed, a whole dict)."""
        back: dict[str, str] = {}
        for name, value in fields.items():
            path = json.loads(name)
            if len(path) == 2 and value[:1] == "+" and path[1] not in self.entries.get(path[0], {path[1]: ""}):
                back[name] = "-"
                continue
            if len(path) == 2:
                member = self.entries.get(path[0], {}).get(path[1])
            else:
                member = self.tops.get(path[0]) if len(path) == 1 else None
            if member is None or value[:1] != "=":
                return None
            back[name] = "=" + member[len(_dumps(path[-1])) + 1:]
        return back

    def differing(self, parts: Parts) -> set[str] | None:
        """The fields whose parts are not the template's (the whole state looked at, after a call
        that failed midway); None when what differs is more than texts in place."""
        if not parts.watched or list(parts.parts) != self.names:
            return None
        found: set[str] = set()
        for name, part in parts.parts.items():
            entries = self.entries.get(name)
            if entries is None:
                if part.entries is not None or part.member != self.tops[name]:
                    found.add(field(name))
                continue
            if part.entries is None or list(part.entries) != list(entries):
                return None
            found.update(field(name, key) for key, entry in part.entries.items() if entry.member != entries[key])
        return found

    def matches(self, live: LiveSession, back: dict[str, str]) -> bool:
        """Whether the instance is the template's again, the parts ``back`` put back being the
        template's text (the others the watch found unchanged)."""
        parts = live.parts
        if type(live.instance) is not self.cls or parts is None or not parts.watched \
                or list(parts.parts) != self.names:
            return False
        for name, value in back.items():
            path = json.loads(name)
            part = parts.parts[path[0]]
            if len(path) == 1:
                if part.entries is not None or part.member != self.tops[path[0]]:
                    return False
                continue
            if part.entries is None or len(part.entries) != len(self.entries[path[0]]):
                return False
            entry = part.entries.get(path[1])
            if value == "-" and entry is not None or value != "-" and (
                    entry is None or entry.member != self.entries[path[0]][path[1]]):
                return False
        return True


class TemplateLodge(Lodging):
    """Many sessions' deltas against the template instance this process was forked with."""

    def __init__(self, live: LiveSession, first: dict[str, Any]) -> None:
        self.live = live
        super().__init__(first)
        self.template = TemplateForm.of(live)
        self.digest = live.digest
        self.sessions: dict[str, dict[str, str]] = {}  # each session's delta fields

    def handle(self, request: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        session = self.served(request)
        if session is None:
            return dict(FORGOTTEN), True
        fields = self.sessions.pop(session, None)
        if "delta" in request:  # rebuilt from what the request brings: whatever was here is older
            fields = request["delta"] if request.get("known") == self.digest else None
        if request.get("op") != "call" or fields is None and "state" not in request:
            return {"error": error(NEED_STATE, "this process keeps no delta of the session against its template"),
                    "stays": True}, True
        if self.template is None or not lodgeable(fields):  # (not what the worker sends here)
            return self.live.handle(request)[0], False  # served as a fork of the template would be, once
        assert isinstance(fields, dict)
        self.live.digest = self.digest  # (as in a fresh fork of the template)
        sent = {**request, "delta": fields, "known": self.digest}
        sent.pop("state", None)  # (the template and the delta make it, checked entry by entry)
        answer, kept = self.live.handle(sent)
        # The session's delta after the call, while the call answered one (not a whole state):
        # then it names every part the call changed, else the whole state is looked at.
        whole = answer.get("state") is not None or answer.get("rebase") is True
        after = self.live.delta_fields() if kept and not whole else None
        if not self.live.revert(self.template, {**fields, **(after or {})}, looked=after is not None):
            return answer, False  # answered; the process ends (see the module's docstring)
        if after is not None and lodgeable(after):
            self.sessions[session] = after
            return {**answer, KEEPS: sum(len(k) + len(v) for k, v in after.items()), "stays": True}, True
        return {**answer, DROPPED: True, "stays": True}, True


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
