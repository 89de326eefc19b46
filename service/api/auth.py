"""API keys, tenants and scopes.

A key file holds one key per line, hashed: ``sha256:<hex digest> <tenant> <scope>[,<scope>]``
(``envfoundry keys new`` prints a fresh key and its line). The service keeps only
the digests. Scopes: ``run`` creates and drives sessions and reads the catalog;
``admin`` also registers and deletes environments and scenarios, which means
submitting code. Everything a tenant adds belongs to it: other tenants get 404.

Without any key the service has one anonymous tenant with every scope, and the
command line refuses to listen beyond loopback.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from service.errors import Forbidden, Unauthorized

SCOPES = ("run", "admin")
ANONYMOUS_TENANT = ""
LINE = re.compile(r"^sha256:(?P<digest>[0-9a-f]{64})\s+(?P<tenant>[A-Za-z0-9_.-]{1,64})\s+(?P<scopes>[a-z,]+)$")


@dataclass(frozen=True)
class Principal:
    tenant: str
    scopes: frozenset[str]


ANONYMOUS = Principal(ANONYMOUS_TENANT, frozenset(SCOPES))


class KeyFileError(ValueError):
    """A key line that cannot be read; the message names the line."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key(tenant: str, scopes: list[str]) -> tuple[str, str]:
    """A fresh key and the line that grants it."""
    key = "efk_" + secrets.token_urlsafe(32)
    return key, f"sha256:{digest(key)} {tenant} {','.join(scopes)}"


class KeyRing:
    def __init__(self, principals: dict[str, Principal] | None = None) -> None:
        self._by_digest = dict(principals or {})

    @property
    def enabled(self) -> bool:
        return bool(self._by_digest)

    @classmethod
    def parse(cls, text: str, source: str = "keys") -> KeyRing:
        """Lines as in the module docstring; blank lines and ``#`` comments are skipped.

        Raises:
            KeyFileError: a line is malformed or names an unknown scope.
        """
        principals: dict[str, Principal] = {}
        for number, raw in enumerate(text.replace(";", "\n").splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            match = LINE.match(line)
            if match is None:
                raise KeyFileError(f"{source} line {number}: expected 'sha256:<64 hex digits> <tenant> <scopes>'")
            scopes = frozenset(match["scopes"].split(","))
            unknown = scopes - set(SCOPES)
            if unknown or not scopes:
                raise KeyFileError(f"{source} line {number}: unknown scope {sorted(unknown)}; scopes are {SCOPES}")
            principals[match["digest"]] = Principal(match["tenant"], scopes)
        return cls(principals)

    @classmethod
    def load(cls, inline: str | None, file: Path | None) -> KeyRing:
        text = inline or ""
        if file is not None:
            try:
                text += "\n" + file.read_text(encoding="utf-8")
            except OSError as exc:
                raise KeyFileError(f"cannot read the API key file {file}: {exc.strerror}") from exc
        return cls.parse(text, str(file) if file else "ENVFOUNDRY_API_KEYS")

    def authenticate(self, authorization: str | None, scope: str) -> Principal:
        """The principal of an ``Authorization`` header value, holding ``scope``.

        Raises:
            Unauthorized: no key, or an unknown one.
            Forbidden: the key lacks ``scope``.
        """
        if not self.enabled:
            return ANONYMOUS
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("this service needs an API key: send 'Authorization: Bearer <key>'")
        principal = self._by_digest.get(digest(token.strip()))
        if principal is None:
            raise Unauthorized("the API key is not valid")
        if scope not in principal.scopes:
            raise Forbidden(f"this request needs the '{scope}' scope; the key has {sorted(principal.scopes)}",
                            scope=scope)
        return principal
