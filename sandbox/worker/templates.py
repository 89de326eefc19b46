"""Scenarios' initial states kept built in a worker: *templates*, forked from for new sessions.

A template is a fork of an environment's host that ran ``__init__`` with a scenario's config
once; a session of that scenario then starts as a fork of it, with its instance built already.
A cold session whose state is kept against a template's initial state is rebuilt the same way,
with its delta applied. A template rests and wakes with its host and ends with it.

Standard library only.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

from sandbox.wire import answers
from sandbox.wire.limits import DEFAULTS
from sandbox.worker import channel, processes
from sandbox.worker.budget import MAX_TEMPLATES
from sandbox.worker.forks import DEFAULT_TIMEOUT, Failure
from sandbox.worker.hosts import Host, Hosts
from sandbox.worker.zygote import HOST_GUARD, HOST_MESSAGE_BYTES

# A cold session whose state is kept against a template's initial state is rebuilt as a fork of
# that template, with its delta applied, when the worker holds the template; it builds the
# template first only for a state at least this large (decoding a small one is quicker).
TEMPLATE_REBUILD_BYTES = 256 * 1024
# Template keys whose ``__init__`` drew randomness, remembered so that none is built again: each
# session of one builds its own instance (sessions of one template would share its draws).
MAX_DRAWING = 4096


class Templates:
    def __init__(self, hosts: Hosts) -> None:
        self.hosts = hosts
        self.drawing: dict[str, None] = {}  # template keys never to build (see ``MAX_DRAWING``), oldest first

    def template(self, host: Host, request: dict[str, Any]) -> Host | None:
        """The template host of ``request``'s ``template`` (built now if this worker has none), or
        None when the request names none or the instance cannot be built ahead (the caller then
        forks the environment's host, and the init reports what went wrong).

        Raises:
            Failure: (``answers.NEED_CONFIG``) the template must be built, and the request left
                its config out.
        """
        name = request.get("template")
        if type(name) is not str or not name:
            return None
        key = f"{request['env']}:{name}"
        # (the service leaves the config out while it expects the template built: see answers.NEED_CONFIG)
        omitted = "init_config" not in request
        if key in self.drawing:
            if omitted and request.get("op") == "init":  # each session builds its own instance
                raise Failure(answers.NEED_CONFIG, "this template's sessions build their own instances")
            return None
        templates = self.hosts.templates
        template = templates.pop(key, None)
        if template is not None and template.sock.fileno() >= 0:
            template.used = time.monotonic()
            templates[key] = template  # most recently used last
            return template
        if request.get("op") != "init" and "state" in request and len(request["state"]) < TEMPLATE_REBUILD_BYTES:
            return None  # a small state decodes faster than a template builds (without it, the template must)
        if omitted:
            raise Failure(answers.NEED_CONFIG, "the template is not built in this worker")
        while len(templates) >= MAX_TEMPLATES:
            self.hosts.end_template(next(iter(templates)))
        template = self._build(host, request)
        if template is not None and template.drew:
            self.hosts.end_template_process(template, wait=True)
            self.drawing[key] = None
            while len(self.drawing) > MAX_DRAWING:
                del self.drawing[next(iter(self.drawing))]
            return None
        if template is not None:
            templates[key] = template
        return template

    def _build(self, host: Host, request: dict[str, Any]) -> Host | None:
        timeout = float(request.get("timeout", DEFAULT_TIMEOUT))
        message = {"op": "template", "init_config": request.get("init_config") or {}, "timeout": timeout,
                   "max_state_bytes": request.get("max_state_bytes", DEFAULTS.state_bytes)}
        template: Host | None = None
        self.hosts.wake(host)
        try:
            self.hosts.empty_tmp()
            channel.send(host.sock, message)
            answer = channel.receive(host.sock, time.monotonic() + HOST_GUARD, HOST_MESSAGE_BYTES)
            offered = answer.get("pid") if answer else None
            fds = channel.receive_fds(host.sock, 1, time.monotonic() + HOST_GUARD) if type(offered) is int else None
            if fds is None or type(offered) is not int or offered <= 0:
                for fd in fds or ():
                    processes.close(fd)
                self.hosts.rest(host)
                self.hosts.drop(host)  # a host that cannot answer this cannot serve anything
                return None
            template = Host(offered, socket.socket(fileno=fds[0]), parent=host, env=request["env"])
            template.pidfd = os.pidfd_open(offered)  # pinned before the check: the host runs module code
            if processes.parent_of(offered) != host.pid:
                raise OSError(f"the host named {offered}, which is not its child")
            built = channel.receive(template.sock, time.monotonic() + timeout + HOST_GUARD, HOST_MESSAGE_BYTES)
            if built is None or built.get("ok") is not True:
                raise OSError("the scenario's instance could not be built ahead")
            template.drew = built.get("draws") is True
            template.digest = str(built.get("digest") or "")
        except OSError:
            if template is not None:
                self.hosts.end_template_process(template)
            template = None
        finally:
            self.hosts.empty_tmp()
            self.hosts.rest(host)
        return template


def from_template(request: dict[str, Any]) -> bool:
    """A call bringing a state kept against a template's initial state (see ``sandbox.pool.calls.Stored``),
    its stored text or not (``resident.withheld``)."""
    return request["op"] == "call" and isinstance(request.get("delta"), dict) and type(request.get("known")) is str
