"""A content-addressed on-disk cache of LLM responses.

The key is the SHA-256 of the request body that matters to the answer
(endpoint, model, messages or inputs, sampling parameters) in canonical JSON.
The base URL and the API key are left out on purpose: the same model behind a
different address gives the same cached answer, and no secret reaches the disk.
A rerun of the same requests is therefore reproducible and free.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any


def request_key(request: dict[str, Any]) -> str:
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class ResponseCache:
    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def _path(self, key: str) -> Path:
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        """The stored response, or None (absent, or a file torn by a crash, which is then ignored)."""
        try:
            entry = json.loads(self._path(key).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        response = entry.get("response") if isinstance(entry, dict) else None
        return response if isinstance(response, dict) else None

    def put(self, key: str, request: dict[str, Any], response: dict[str, Any]) -> None:
        """Store atomically: a reader sees the whole entry or none of it."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        body = json.dumps({"request": request, "response": response}, ensure_ascii=False)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(body)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def drop(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def __len__(self) -> int:
        return sum(1 for _ in self.folder.glob("*/*.json")) if self.folder.is_dir() else 0
