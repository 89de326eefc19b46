"""Open OpenEnv WebSockets, by tenant: the caps, the idle timeout, and which one to close for room.

An HTTP request ends; an upgraded WebSocket holds its connection for as long as its client likes.
So the OpenEnv endpoint (``service/api/openenv_routes.py``) takes a place here before it accepts an
upgrade, and gives it back when the socket ends:

- at most ``max_open`` WebSockets at once (below the connection cap: sockets alone cannot take
  every connection) and ``per_tenant`` of one tenant; past either the upgrade is refused before it
  is accepted (503 ``limit: max_websockets``, 429 ``quota: max_websockets_per_tenant``). At the
  server's cap a tenant holding fewer sockets than another takes the place of that one's
  longest-idle socket instead, as the sandbox gate serves the tenant holding fewest first: tenants
  that fill the cap between them cannot lock another out;
- a socket that waits ``idle`` seconds for a message is closed (1001);
- when the server is out of connections, ``make_room`` closes the longest-idle socket of the
  tenant holding the most (1013, "try again later"); ``service/server/connections.py`` calls it.

A socket is idle while its endpoint waits for the next message; one being answered is never cut.
The tenant is the API key's; without keys (everything one anonymous tenant) it is the client's
address, so one client cannot take every socket.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from service.errors import QuotaExceeded, Unavailable

IDLE = 1001  # "going away": the server ends a socket nobody uses
TRY_AGAIN_LATER = 1013
ROOM = "the server needs this connection for another client; try again later"


@dataclass(frozen=True)
class SocketLimits:
    """The caps as configured (their defaults are ``Settings``'s)."""

    max_open: int
    per_tenant: int
    idle: float


class Closing(Exception):
    """The server closes this socket: ``code`` and ``reason`` are the close frame's."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


@dataclass(eq=False)
class Socket:
    """One open WebSocket's place."""

    tenant: str
    closing: Closing | None = None  # set once the server has decided to close it
    deadline: asyncio.Timeout | None = None  # while it waits for a message


class Sockets:
    def __init__(self, limits: SocketLimits) -> None:
        self.limits = limits
        self.open = 0
        self.held: dict[str, dict[Socket, None]] = {}  # tenant -> its sockets
        self.idle: dict[str, dict[Socket, None]] = {}  # tenant -> its sockets waiting for a message, longest first

    def claim(self, tenant: str) -> Socket:
        """A place for one more of ``tenant``'s sockets.

        Raises:
            QuotaExceeded: the tenant holds ``per_tenant`` sockets.
            Unavailable: the server holds ``max_open`` and no tenant holding more has an idle one.
        """
        held = len(self.held.get(tenant, ()))
        if held >= self.limits.per_tenant:
            raise QuotaExceeded(f"this tenant holds {held} WebSockets, the most one tenant may hold; close one "
                                "or try again later", quota="max_websockets_per_tenant",
                                value=self.limits.per_tenant, retry_after=1)
        # (the one whose place is taken must hold at least two more: else the two would swap places forever)
        if self.open >= self.limits.max_open and not self.make_room(above=held + 1):
            raise Unavailable(f"the server holds {self.open} WebSockets, its limit; try again later",
                              limit="max_websockets", value=self.limits.max_open)
        socket = Socket(tenant)
        self.held.setdefault(tenant, {})[socket] = None
        self.open += 1
        return socket

    def release(self, socket: Socket) -> None:
        """Give the place back (again is harmless: a socket closed for room gave it back already)."""
        sockets = self.held.get(socket.tenant)
        if sockets is None or socket not in sockets:
            return
        del sockets[socket]
        if not sockets:
            del self.held[socket.tenant]
        self.open -= 1
        self._busy(socket)

    async def receive(self, socket: Socket, receive: Callable[[], Awaitable[Any]]) -> Any:
        """The socket's next message, from ``receive``.

        Raises:
            Closing: no message came within the idle timeout, or the socket was closed for room.
        """
        if socket.closing is not None:
            raise socket.closing
        try:
            async with asyncio.timeout(self.limits.idle) as deadline:
                socket.deadline = deadline
                self.idle.setdefault(socket.tenant, {})[socket] = None
                message = await receive()
        except TimeoutError:
            raise socket.closing or Closing(IDLE, f"no message for {self.limits.idle:g} s") from None
        finally:
            socket.deadline = None
            self._busy(socket)
        if socket.closing is not None:  # picked just as a message came: the message is dropped
            raise socket.closing
        return message

    def make_room(self, above: int = 0) -> bool:
        """Close the longest-idle socket of the tenant holding the most, if that is more than ``above``;
        False when there is none to close. Its place is free at once; its close handshake is bounded
        by the server's WebSocket close timeout."""
        tenant = max(self.idle, key=lambda t: len(self.held.get(t, ())), default=None)
        if tenant is None or len(self.held.get(tenant, ())) <= above:
            return False
        socket = next(iter(self.idle[tenant]))
        socket.closing = Closing(TRY_AGAIN_LATER, ROOM)
        deadline = socket.deadline
        if deadline is not None and not deadline.expired():  # (expired: its idle timeout is ending it already)
            deadline.reschedule(asyncio.get_running_loop().time())  # its receive ends now
        self.release(socket)
        return True

    def _busy(self, socket: Socket) -> None:
        idle = self.idle.get(socket.tenant)
        if idle is not None:
            idle.pop(socket, None)
            if not idle:
                del self.idle[socket.tenant]
