"""On-disk cache of LLM replies keyed by a hash of the request, so a rerun of a judged eval costs nothing.

One JSON file per request (`<dir>/<hash[:2]>/<hash>.json`, written to a temporary name and renamed, so a
crash never leaves a half-written entry). The key covers everything that changes the reply (provider,
model, base URL, messages, system prompt, temperature, max_tokens) and never the API key, which is not
part of the request and is never written anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path


def request_key(request: dict) -> str:
    """sha256 of the request's canonical JSON (sorted keys, no whitespace): the same request, the same key."""
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


class ReplyCache:
    """Reply text per request key; `get` returns None for a miss or an unreadable entry."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def _path(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, key: str) -> str | None:
        path = self._path(key)
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        reply = entry.get("reply") if isinstance(entry, dict) else None
        return reply if isinstance(reply, str) else None

    def put(self, key: str, reply: str, request: dict) -> None:
        """Store the reply with its request (for inspection); atomic per entry."""
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:8]}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"request": request, "reply": reply}, f, ensure_ascii=False)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def __len__(self) -> int:
        return sum(1 for _ in self.directory.glob("*/*.json")) if self.directory.is_dir() else 0
