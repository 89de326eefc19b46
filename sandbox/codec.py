"""State codec: Python state <-> tagged JSON, and the plain JSON view clients see.

Encoded state is JSON in which values JSON cannot hold are tagged objects
``{"$ef": kind, "v": ...}``. Instances of classes from the environment's own
code are stored as their class name plus their encoded ``__dict__``; anything
else that is not JSON falls back to pickle, which only sandbox code decodes.

``view_encoded`` turns encoded state into the client's JSON view without ever
unpickling, so the service can call it safely. Standard library only.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import enum
import json
import math
import pickle
from collections.abc import Callable
from typing import Any

TAG = "$ef"
MAX_DEPTH = 200
BIG_INT_BITS = 4000  # about 1200 decimal digits, well under the 4300-digit conversion limit


class CodecError(Exception):
    """A value cannot be encoded; ``path`` is a JSON pointer to it."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(f"{message} at {path or '/'}")
        self.path = path


def _pointer(path: str, key: Any) -> str:
    return f"{path}/{str(key).replace('~', '~0').replace('/', '~1')}"


def _tagged(kind: str, value: Any, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {TAG: kind, "v": value}
    out.update(extra)
    return out


class Encoder:
    """Encode values; ``env_module`` names the module whose classes are stored by name."""

    def __init__(self, env_module: str | None = None) -> None:
        self.env_module = env_module
        self._active: set[int] = set()

    def encode(self, value: Any, path: str = "") -> Any:
        kind = type(value)
        if value is None or kind is bool or kind is str:
            return value
        if kind is int:
            # JSON text cannot carry ints past Python's digit limit; hex has none.
            return value if value.bit_length() < BIG_INT_BITS else _tagged("int", format(value, "x"))
        if kind is float:
            return value if math.isfinite(value) else _tagged("float", repr(value))
        if len(self._active) > MAX_DEPTH:
            raise CodecError("state nests too deeply", path)
        marker = id(value)
        if marker in self._active:
            raise CodecError("state contains a reference cycle", path)
        self._active.add(marker)
        try:
            return self._encode_container(value, kind, path)
        finally:
            self._active.discard(marker)

    def _encode_container(self, value: Any, kind: type, path: str) -> Any:
        if kind is list:
            return [self.encode(v, _pointer(path, i)) for i, v in enumerate(value)]
        if kind is dict:
            if all(type(k) is str for k in value) and TAG not in value:
                return {k: self.encode(v, _pointer(path, k)) for k, v in value.items()}
            return _tagged(
                "dict",
                [[self.encode(k, path), self.encode(v, _pointer(path, k))] for k, v in value.items()],
            )
        if kind is tuple:
            return _tagged("tuple", [self.encode(v, _pointer(path, i)) for i, v in enumerate(value)])
        if kind is set or kind is frozenset:
            items = [self.encode(v, path) for v in value]
            items.sort(key=lambda item: json.dumps(item, sort_keys=True))
            return _tagged(kind.__name__, items)
        if kind is dt.datetime:
            return _tagged("datetime", value.isoformat())
        if kind is dt.date:
            return _tagged("date", value.isoformat())
        if kind is dt.time:
            return _tagged("time", value.isoformat())
        if kind is dt.timedelta:
            return _tagged("timedelta", [value.days, value.seconds, value.microseconds])
        if kind is decimal.Decimal:
            return _tagged("decimal", str(value))
        if kind is bytes:
            return _tagged("bytes", base64.b64encode(value).decode("ascii"))
        if self._is_env_class(kind):
            if isinstance(value, enum.Enum):
                return _tagged("enum", value.name, cls=kind.__qualname__, view=view(value))
            if hasattr(value, "__dict__") and not hasattr(kind, "__slots__"):
                return _tagged("object", self.encode(vars(value), path), cls=kind.__qualname__)
        try:
            blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise CodecError(f"{kind.__name__} value cannot be serialized ({exc})", path) from exc
        return _tagged("pickle", base64.b64encode(blob).decode("ascii"), view=view(value))

    def _is_env_class(self, kind: type) -> bool:
        return self.env_module is not None and kind.__module__ == self.env_module


def decode(value: Any, resolve: Callable[[str], Any] | None = None) -> Any:
    """Inverse of ``Encoder.encode``. Unpickles: call only inside the sandbox."""
    if isinstance(value, list):
        return [decode(v, resolve) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get(TAG)
    if kind is None:
        return {k: decode(v, resolve) for k, v in value.items()}
    raw = value["v"]
    if kind == "dict":
        return {decode(k, resolve): decode(v, resolve) for k, v in raw}
    if kind == "tuple":
        return tuple(decode(v, resolve) for v in raw)
    if kind == "set":
        return {decode(v, resolve) for v in raw}
    if kind == "frozenset":
        return frozenset(decode(v, resolve) for v in raw)
    if kind == "float":
        return float(raw)
    if kind == "int":
        return int(raw, 16)
    if kind == "datetime":
        return dt.datetime.fromisoformat(raw)
    if kind == "date":
        return dt.date.fromisoformat(raw)
    if kind == "time":
        return dt.time.fromisoformat(raw)
    if kind == "timedelta":
        return dt.timedelta(days=raw[0], seconds=raw[1], microseconds=raw[2])
    if kind == "decimal":
        return decimal.Decimal(raw)
    if kind == "bytes":
        return base64.b64decode(raw)
    if kind in ("object", "enum"):
        if resolve is None:
            raise ValueError(f"cannot rebuild {value.get('cls')} without the environment's classes")
        cls = resolve(value["cls"])
        if kind == "enum":
            return cls[raw]
        obj = cls.__new__(cls)
        obj.__dict__.update(decode(raw, resolve))
        return obj
    if kind == "pickle":
        return pickle.loads(base64.b64decode(raw))
    raise ValueError(f"unknown tag {kind!r}")


def view(value: Any) -> Any:
    """The JSON view of any Python value (tool results, pickled objects)."""
    return _view(value, set())


def _view(value: Any, active: set[int]) -> Any:
    if isinstance(value, enum.Enum):
        return _view(value.value, active)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return value if value.bit_length() < BIG_INT_BITS else hex(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return _bytes_view(bytes(value))
    if id(value) in active or len(active) > MAX_DEPTH:
        return "<cycle>" if id(value) in active else "<too deep>"
    active.add(id(value))
    try:
        if isinstance(value, dict):
            return {key_text(_view(k, active)): _view(v, active) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_view(v, active) for v in value]
        if isinstance(value, (set, frozenset)):
            return sorted_view(_view(v, active) for v in value)
        if hasattr(value, "__dict__") and not callable(value):
            fields = {key_text(_view(k, active)): _view(v, active) for k, v in vars(value).items()}
            return {"__type__": type(value).__name__, **fields}
    finally:
        active.discard(id(value))
    text = repr(value)
    return text if len(text) <= 1000 else text[:1000] + "..."


def key_text(viewed_key: Any) -> str:
    """JSON object keys are strings: a non-string key is shown as its JSON text."""
    return viewed_key if isinstance(viewed_key, str) else json.dumps(viewed_key, sort_keys=True)


def sorted_view(items: Any) -> list[Any]:
    """Sets have no order; their views are sorted by JSON text so they are stable."""
    return sorted(items, key=lambda item: json.dumps(item, sort_keys=True))


def _bytes_view(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "base64:" + base64.b64encode(raw).decode("ascii")


def view_encoded(value: Any) -> Any:
    """The JSON view of encoded state. Never unpickles: safe in the service."""
    if isinstance(value, list):
        return [view_encoded(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get(TAG)
    if kind is None:
        return {k: view_encoded(v) for k, v in value.items()}
    raw: Any = value.get("v")
    if kind == "dict":
        return {key_text(view_encoded(k)): view_encoded(v) for k, v in raw}
    if kind == "tuple":
        return [view_encoded(v) for v in raw]
    if kind in ("set", "frozenset"):
        return sorted_view(view_encoded(v) for v in raw)
    if kind == "int":
        return hex(int(raw, 16))
    if kind == "timedelta":
        return dt.timedelta(days=raw[0], seconds=raw[1], microseconds=raw[2]).total_seconds()
    if kind == "bytes":
        return _bytes_view(base64.b64decode(raw))
    if kind == "object":
        return {"__type__": value.get("cls", "").rsplit(".", 1)[-1], **view_encoded(raw)}
    if kind in ("enum", "pickle"):
        return value.get("view")
    return raw  # float, datetime, date, time, decimal: already strings


def encode_state(state: dict[str, Any], env_module: str | None = None) -> str:
    """Encode a state dict to compact JSON text. Raises CodecError naming the attribute."""
    encoded = Encoder(env_module).encode(state)
    try:
        return json.dumps(encoded, separators=(",", ":"), ensure_ascii=False)
    except ValueError as exc:  # a backstop: encode() should have tagged anything JSON refuses
        raise CodecError(f"state cannot be written as JSON ({exc})", "") from exc


def diff(before: Any, after: Any, path: str = "") -> dict[str, list[dict[str, Any]]]:
    """What changed between two JSON views, as JSON pointers."""
    out: dict[str, list[dict[str, Any]]] = {"added": [], "removed": [], "changed": []}
    _diff(before, after, path, out)
    return out


def _diff(before: Any, after: Any, path: str, out: dict[str, list[dict[str, Any]]]) -> None:
    if isinstance(before, dict) and isinstance(after, dict):
        for key, value in after.items():
            if key not in before:
                out["added"].append({"path": _pointer(path, key), "value": value})
            else:
                _diff(before[key], value, _pointer(path, key), out)
        for key, value in before.items():
            if key not in after:
                out["removed"].append({"path": _pointer(path, key), "value": value})
        return
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        for i, (old, new) in enumerate(zip(before, after, strict=True)):
            _diff(old, new, _pointer(path, i), out)
        return
    # Compare with types: 1 == True and 1 == 1.0 in Python, but not in JSON.
    if type(before) is type(after) and before == after:
        return
    out["changed"].append({"path": path, "old": before, "new": after})
