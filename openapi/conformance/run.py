#!/usr/bin/env python3
"""Replay the conformance cases against a live envfoundry server (standard library only).

    python3 openapi/conformance/run.py --base-url http://127.0.0.1:8000

Prints one line per case and closes with "conformance: N passed, N failed"; exits 1 on any
failure. The matching rules are in README.md beside this file.
"""

from __future__ import annotations

import argparse
import http.client
import json
import re
import secrets
import select
import socket
import sys
import urllib.parse
from pathlib import Path
from typing import Any

CASES = Path(__file__).resolve().parent / "cases.json"
PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")
TYPES = ("string", "number", "integer", "boolean", "null", "object", "array")


class Mismatch(Exception):
    pass


def substitute(value: Any, captured: dict[str, Any]) -> Any:
    """Fill ``{{name}}`` placeholders; a string that is only a placeholder takes the captured value whole."""
    if isinstance(value, str):
        whole = PLACEHOLDER.fullmatch(value)
        if whole:
            return captured[whole.group(1)]
        return PLACEHOLDER.sub(lambda m: str(captured[m.group(1)]), value)
    if isinstance(value, list):
        return [substitute(v, captured) for v in value]
    if isinstance(value, dict):
        return {k: substitute(v, captured) for k, v in value.items()}
    return value


def type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "integer" if float(value).is_integer() else "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def match(expected: Any, actual: Any, where: str = "body") -> None:
    """Raise Mismatch naming the first place where ``actual`` does not meet ``expected``."""
    if isinstance(expected, dict) and len(expected) == 1 and next(iter(expected)).startswith("$"):
        return _matcher(next(iter(expected)), next(iter(expected.values())), actual, where)
    if isinstance(expected, dict):
        if not isinstance(actual, dict):
            raise Mismatch(f"{where}: expected an object, got {json.dumps(actual)[:200]}")
        for key, value in expected.items():
            if value == {"$absent": True}:
                if key in actual:
                    raise Mismatch(f"{where}.{key}: expected absent, got {json.dumps(actual[key])[:200]}")
            elif key not in actual:
                raise Mismatch(f"{where}.{key}: missing")
            else:
                match(value, actual[key], f"{where}.{key}")
        return None
    if isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            raise Mismatch(f"{where}: expected an array of {len(expected)}, got {json.dumps(actual)[:200]}")
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            match(e, a, f"{where}.{i}")
        return None
    if type_of(expected) != type_of(actual) and {type_of(expected), type_of(actual)} != {"integer", "number"} \
            or expected != actual:
        raise Mismatch(f"{where}: expected {json.dumps(expected)}, got {json.dumps(actual)[:200]}")
    return None


def _matcher(name: str, arg: Any, actual: Any, where: str) -> None:
    if name == "$present":
        return None
    if name == "$type":
        got = type_of(actual)
        if not (got == arg or (arg == "number" and got == "integer")):
            raise Mismatch(f"{where}: expected type {arg}, got {json.dumps(actual)[:200]}")
        return None
    if name == "$length":
        if not isinstance(actual, list) or len(actual) != arg:
            raise Mismatch(f"{where}: expected an array of {arg}, got {json.dumps(actual)[:200]}")
        return None
    if name == "$contains" and isinstance(arg, str):
        if not isinstance(actual, str) or arg not in actual:
            raise Mismatch(f"{where}: expected a string containing {json.dumps(arg)}, got {json.dumps(actual)[:200]}")
        return None
    if name == "$contains" and isinstance(arg, list):
        if not isinstance(actual, list):
            raise Mismatch(f"{where}: expected an array, got {json.dumps(actual)[:200]}")
        for wanted in arg:
            if not any(_matches(wanted, item) for item in actual):
                raise Mismatch(f"{where}: no element matches {json.dumps(wanted)}")
        return None
    raise Mismatch(f"{where}: unknown matcher {name}")


def _matches(expected: Any, actual: Any) -> bool:
    try:
        match(expected, actual)
    except Mismatch:
        return False
    return True


def capture(path: str, response: dict[str, Any]) -> Any:
    """Follow a dotted path such as ``body.steps.0.step`` into the response."""
    value: Any = response
    for part in path.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def send(base_url: str, request: dict[str, Any], headers: dict[str, str], timeout: float) -> dict[str, Any]:
    headers = {**headers, **request.get("headers", {})}
    body = b""
    if "json" in request:
        body = json.dumps(request["json"]).encode()
        headers.setdefault("content-type", "application/json")
    elif "body" in request:
        body = request["body"].encode()
    elif "body_repeat" in request:
        r = request["body_repeat"]
        body = (r["prefix"] + r["separator"].join([r["item"]] * r["count"]) + r["suffix"]).encode()
    elif "body_size" in request:
        body = b" " * request["body_size"]
        # Sent only if the server asks for it: one that refuses by the declared length answers at once.
        headers["expect"] = "100-continue"
    url = urllib.parse.urlsplit(base_url.rstrip("/") + request["path"])
    connection_class = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
    conn = connection_class(url.netloc, timeout=timeout)
    try:
        conn.putrequest(request["method"], url.path + (f"?{url.query}" if url.query else ""),
                        skip_accept_encoding=True)
        for name, value in headers.items():
            conn.putheader(name, value)
        if body or request["method"] in ("POST", "PUT", "PATCH"):
            conn.putheader("content-length", str(len(body)))
        conn.endheaders()
        if headers.get("expect") != "100-continue" or _continue(conn, timeout):
            conn.send(body)
        reply = conn.getresponse()
        text = reply.read().decode("utf-8")
        return {"status": reply.status, "content_type": reply.getheader("content-type", ""),
                "headers": {name.lower(): value for name, value in reply.getheaders()},
                "body": json.loads(text) if text else None}
    finally:
        conn.close()


def _continue(conn: http.client.HTTPConnection, timeout: float) -> bool:
    """Wait for the interim 100 Continue (consumed here) or a final answer (left for getresponse)."""
    assert conn.sock is not None
    readable, _, _ = select.select([conn.sock], [], [], min(timeout, 5.0))
    if not readable:
        return True  # the server ignores Expect: send the body as if it had asked
    head = conn.sock.recv(12, socket.MSG_PEEK)
    if not head.startswith(b"HTTP/1.1 100") and not head.startswith(b"HTTP/1.0 100"):
        return False
    interim = b""
    while not interim.endswith(b"\r\n\r\n"):
        interim += conn.sock.recv(1)
    return True


def check(expect: dict[str, Any], response: dict[str, Any]) -> None:
    if response["status"] != expect["status"]:
        raise Mismatch(f"status: expected {expect['status']}, got {response['status']}: "
                       f"{json.dumps(response['body'])[:300]}")
    if "content_type" in expect and response["content_type"].split(";")[0].strip() != expect["content_type"]:
        raise Mismatch(f"content-type: expected {expect['content_type']}, got {response['content_type']}")
    if "headers" in expect:
        match(expect["headers"], response["headers"], "headers")
    if "body" in expect:
        match(expect["body"], response["body"])


def run(base_url: str, cases: list[dict[str, Any]], headers: dict[str, str], timeout: float = 60.0) -> int:
    captured: dict[str, Any] = {"run_id": secrets.token_hex(8)}
    failed = 0
    for case in cases:
        try:
            request = substitute(case["request"], captured)
            expect = substitute(case["expect"], captured)
            response = send(base_url, request, headers, timeout)
            check(expect, response)
            for name, path in case.get("capture", {}).items():
                captured[name] = capture(path, response)
        except KeyError as exc:
            failed += 1
            print(f"not ok - {case['name']}: nothing captured or found for {exc}")
        except (Mismatch, OSError, ValueError, http.client.HTTPException) as exc:
            failed += 1
            print(f"not ok - {case['name']}: {exc}")
        else:
            print(f"ok - {case['name']}")
    print(f"conformance: {len(cases) - failed} passed, {failed} failed")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", required=True, help="e.g. http://127.0.0.1:8000")
    parser.add_argument("--cases", type=Path, default=CASES)
    parser.add_argument("--header", action="append", default=[], metavar="NAME: VALUE",
                        help="sent with every request, e.g. 'authorization: Bearer TOKEN' (repeatable)")
    args = parser.parse_args(argv)
    headers = dict(h.split(":", 1) for h in args.header)
    headers = {k.strip().lower(): v.strip() for k, v in headers.items()}
    cases = json.loads(args.cases.read_text(encoding="utf-8"))["cases"]
    return run(args.base_url, cases, headers)


if __name__ == "__main__":
    sys.exit(main())
