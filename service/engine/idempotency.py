"""Idempotent requests: a retry carrying the same ``Idempotency-Key`` gets the first answer.

Tool calls and messages remember their key inside the step's own commit (see
``SessionStore.commit``), so the step and the key exist together or not at all.
Requests that create sessions (create, fork) claim their key first; the claim
turns into the stored answer on success and is released on failure.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

from service.errors import IdempotencyKeyReused, SessionBusy
from service.stores.store import SessionStore

HEADER = "Idempotency-Key"
REPLAYED = "Idempotent-Replayed"
KEY_PATTERN = r"^[\x21-\x7e]{1,255}$"


def fingerprint(route: str, body: Any) -> str:
    """What makes two requests the same: the route and the body, canonically encoded."""
    canonical = json.dumps([route, body], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


def check_same(stored_fingerprint: str, current: str, key: str) -> None:
    if stored_fingerprint != current:
        raise IdempotencyKeyReused(f"Idempotency-Key '{key}' was used before with a different request",
                                   field=HEADER)


async def once(store: SessionStore, scope: str, key: str, fingerprint: str, lease: float,
               run: Callable[[], Awaitable[dict[str, Any]]]) -> tuple[dict[str, Any], bool]:
    """Run ``run`` once per (scope, key); return its answer and whether it was replayed.

    Raises:
        IdempotencyKeyReused: the key came with a different request before.
        SessionBusy: the first request with this key is still running.
    """
    name = f"{scope}:{key}"
    claimed = await store.claim_request(name, json.dumps({"fingerprint": fingerprint}), lease)
    if claimed is not None:
        prior = json.loads(claimed) if claimed else {}
        check_same(prior.get("fingerprint", ""), fingerprint, key)
        if "answer" not in prior:
            raise SessionBusy(f"a request with Idempotency-Key '{key}' is still running; retry it later")
        return prior["answer"], True
    try:
        answer = await run()
    except BaseException:
        await store.release_request(name)
        raise
    await store.finish_request(name, json.dumps({"fingerprint": fingerprint, "answer": answer}))
    return answer, False
