"""Episodes whose WebSocket dropped without a ``close``: ended after a grace period unless taken up again.

OpenEnv's clients (and TRL through them) often never send ``close``: a run ends, a process exits,
a connection drops. Such an episode used to stay until the session TTL (an hour by default). Now
the replica that held the connection ends it ``ENVFOUNDRY_OPENENV_GRACE`` seconds later, unless
in the meantime

- a connection to this replica holds it again (``reset`` with its ``episode_id``, or a socket
  opened with ``?session_id=``), or
- it took a step (through any replica, REST or MCP included): someone is using it.

A re-attach on another replica that takes no step within the grace is not seen (the store keeps
no record of connections); such a client finds the episode gone at its next step. An episode whose
replica stops during the grace stays until the session TTL, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter

from service.api.openenv import Episodes
from service.errors import ServiceError

log = logging.getLogger("envfoundry.openenv")


class Orphans:
    def __init__(self, grace: float) -> None:
        self.grace = grace
        self._held: Counter[str] = Counter()  # episode -> connections of this replica holding it
        self._waiting: set[asyncio.Task[None]] = set()

    def attach(self, episode_id: str) -> None:
        self._held[episode_id] += 1

    def detach(self, episode_id: str) -> None:
        self._held[episode_id] -= 1
        if self._held[episode_id] <= 0:
            del self._held[episode_id]

    def dropped(self, episodes: Episodes, episode_id: str) -> None:
        """The connection that opened ``episode_id`` ended without closing it: end it after the grace."""
        task = asyncio.get_running_loop().create_task(self._end_later(episodes, episode_id))
        self._waiting.add(task)
        task.add_done_callback(self._waiting.discard)

    async def _end_later(self, episodes: Episodes, episode_id: str) -> None:
        try:
            step = (await episodes.episode(episode_id)).meta.step
            await asyncio.sleep(self.grace)
            if self._held.get(episode_id):
                return  # a connection here took it up again
            if (await episodes.episode(episode_id)).meta.step != step:
                return  # it moved on: someone is using it
            await episodes.end(episode_id)
            log.info("ended episode %s: its connection dropped %.0f s ago and no client took it up",
                     episode_id, self.grace, extra={"session": episode_id})
        except ServiceError:
            pass  # gone already, or the store is unreachable: its TTL ends it
        except Exception:  # a task of its own: nobody else would see what went wrong
            log.exception("could not end the dropped episode %s; its TTL will", episode_id)

    async def close(self) -> None:
        """Stop waiting (the service stops): those episodes stay until their TTL."""
        for task in list(self._waiting):
            task.cancel()
        for task in list(self._waiting):
            with contextlib.suppress(asyncio.CancelledError):
                await task
