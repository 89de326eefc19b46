"""One pipelined Redis connection for the scripts every tool call runs.

The general client spends more CPU on each command than Redis spends running it (connection
pool, retry and instrumentation layers: about 0.2 ms of Python per command on the reference
machine, next to a tool call's budget of one millisecond). The call path's two scripts (take the
lock and read the meta; commit and unlock) go through this pipeline instead: the command is packed
by hand, replies are parsed by hiredis, and concurrent callers share one connection, answered
in order; the commands of one turn of the event loop are written together. Failures are raised as the general client's errors, so the store treats both alike.
Everything else keeps using the general client.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import Any
from urllib.parse import unquote, urlsplit

import hiredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError


def pack(*args: str | bytes | int) -> bytes:
    """A command in the Redis protocol (an array of bulk strings). Made as text and encoded once
    while every argument is text (a commit has thirty): a bytes argument is put in as it is."""
    if any(type(arg) is bytes for arg in args):
        out = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg if isinstance(arg, bytes) else str(arg).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(data), data))
        return b"".join(out)
    parts = [f"*{len(args)}\r\n"]
    for arg in args:
        text = str(arg)
        parts.append(f"${len(text) if text.isascii() else len(text.encode())}\r\n{text}\r\n")
    return "".join(parts).encode()


class Pipeline:
    def __init__(self, url: str, timeout: float) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 6379
        self.db = int(parts.path.strip("/") or 0)
        self.username = unquote(parts.username) if parts.username else None
        self.password = unquote(parts.password) if parts.password else None
        self.tls = parts.scheme == "rediss"
        self.timeout = timeout
        self._writer: asyncio.StreamWriter | None = None
        # Each command's caller, and when Redis must have answered it (one timer watches the oldest:
        # a timeout scope per command cost more than the rest of its round trip here).
        self._pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._watchdog: asyncio.TimerHandle | None = None
        # Commands made in one turn of the event loop, and the connection they go out on: they are
        # written together at its end, one system call and one wake-up of Redis for all (calls on
        # many sessions commit together).
        self._outgoing: tuple[asyncio.StreamWriter, list[bytes]] | None = None
        self._opening: asyncio.Lock | None = None

    async def evalsha(self, sha: str, script: str, keys: list[str], args: list[Any]) -> Any:
        try:
            return await self._command(pack("EVALSHA", sha, len(keys), *keys, *args))
        except NoScriptError:  # a restarted or flushed Redis: EVAL also caches the script again
            return await self._command(pack("EVAL", script, len(keys), *keys, *args))

    async def _command(self, packed: bytes) -> Any:
        writer = self._writer if self._writer is not None else await self._open()
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[Any] = loop.create_future()
        due = loop.time() + self.timeout
        self._pending.append((answer, due))
        if self._watchdog is None:
            self._watchdog = loop.call_at(due, self._watch)
        if self._outgoing is None:
            self._outgoing = (writer, [packed])
            loop.call_soon(self._send, writer)
        else:
            self._outgoing[1].append(packed)
        reply = await answer  # (a Redis that does not answer in time fails it: see ``_watch``)
        if isinstance(reply, ResponseError):
            raise NoScriptError(str(reply)) if str(reply).startswith("NOSCRIPT") else reply
        return reply

    def _watch(self) -> None:
        """The oldest command waiting: past its time, the connection is dropped and every command
        on it fails; else watched again at its time."""
        self._watchdog = None
        if not self._pending:
            return
        loop = asyncio.get_running_loop()
        due = self._pending[0][1]
        if due <= loop.time():
            self.reset(RedisTimeoutError(f"redis did not answer within {self.timeout:g} s"))
        else:
            self._watchdog = loop.call_at(due, self._watch)

    def _send(self, writer: asyncio.StreamWriter) -> None:
        """Write the commands made since the last write, together, on ``writer`` if it is still the
        connection (a reset failed their callers)."""
        if self._outgoing is None or self._outgoing[0] is not writer:
            return
        _, commands = self._outgoing
        self._outgoing = None
        writer.write(commands[0] if len(commands) == 1 else b"".join(commands))

    async def _open(self) -> asyncio.StreamWriter:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._writer is not None:
                return self._writer
            try:
                reader, writer = await asyncio.wait_for(asyncio.open_connection(
                    self.host, self.port, ssl=ssl.create_default_context() if self.tls else None), self.timeout)
            except (OSError, TimeoutError) as exc:
                raise RedisConnectionError(f"cannot connect to redis at {self.host}:{self.port}: {exc}") from exc
            parser = hiredis.Reader(replyError=ResponseError, encoding="utf-8")
            greeting = []
            if self.password is not None:
                greeting.append(pack("AUTH", *([self.username] if self.username else []), self.password))
            if self.db:
                greeting.append(pack("SELECT", self.db))
            for command in greeting:
                writer.write(command)
                reply = await self._read_one(reader, parser)
                if isinstance(reply, ResponseError):
                    writer.close()
                    raise RedisConnectionError(f"redis refused the connection: {reply}")
            self._writer = writer
            asyncio.get_running_loop().create_task(self._read(reader, writer, parser))
            return writer

    async def _read_one(self, reader: asyncio.StreamReader, parser: Any) -> Any:
        while (reply := parser.gets()) is False:
            data = await asyncio.wait_for(reader.read(1 << 16), self.timeout)
            if not data:
                raise RedisConnectionError("redis closed the connection")
            parser.feed(data)
        return reply

    async def _read(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, parser: Any) -> None:
        """Hand replies to callers in the order their commands went out."""
        try:
            while True:
                data = await reader.read(1 << 16)
                if not data:
                    break
                parser.feed(data)
                while (reply := parser.gets()) is not False:
                    if self._pending:
                        waiting, _ = self._pending.popleft()
                        if not waiting.done():
                            waiting.set_result(reply)
        except (OSError, asyncio.CancelledError):
            pass
        if self._writer is writer:
            self.reset(RedisConnectionError("redis closed the connection"))

    def reset(self, reason: Exception) -> None:
        """Drop the connection; every command waiting on it fails with ``reason``."""
        writer, self._writer = self._writer, None
        self._outgoing = None
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        if writer is not None:
            writer.close()
        pending, self._pending = self._pending, deque()
        for waiting, _ in pending:
            if not waiting.done():
                waiting.set_exception(reason)

    async def close(self) -> None:
        self.reset(RedisConnectionError("closed"))
