"""Home Assistant's own API, as tools/ha-check uses it: REST, WebSocket, onboarding, config flows.

The standard library only (tools/ha-check runs it with the repo's .venv, which has no HTTP
or WebSocket client): a WebSocket is a few lines over a socket.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import time
import urllib.error
import urllib.parse
import urllib.request


class HomeAssistant:
    """One Home Assistant at http://127.0.0.1:`port`, onboarded by `onboard()`."""

    def __init__(self, port: int):
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.token: str | None = None

    def request(self, method: str, path: str, body=None, form: dict | None = None, raw: bool = False,
                timeout: float = 60):
        """(status, JSON answer, or bytes with `raw`); an HTTP error's status and body too."""
        data, headers = None, {}
        if form is not None:
            data, headers["Content-Type"] = urllib.parse.urlencode(form).encode(), "application/x-www-form-urlencoded"
        elif body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as answer:
                status, content = answer.status, answer.read()
        except urllib.error.HTTPError as e:
            status, content = e.code, e.read()
        if raw:
            return status, content
        return status, (json.loads(content) if content[:1] in (b"{", b"[") else content.decode(errors="replace"))

    def ok(self, method: str, path: str, body=None, **kwargs):
        """The answer to a request that must succeed (AssertionError with what it said)."""
        status, answer = self.request(method, path, body, **kwargs)
        if status >= 300:
            raise AssertionError(f"{method} {path} {json.dumps(body)[:300]}: HTTP {status}: {str(answer)[:500]}")
        return answer

    def up(self) -> bool:
        try:
            return self.request("GET", "/api/onboarding", timeout=2)[0] in (200, 401)
        except OSError:
            return False

    def onboard(self) -> None:
        """The owner made by the onboarding API, then a token (/auth/token) for everything else."""
        client_id = self.base + "/"
        status, answer = self.request("POST", "/api/onboarding/users", {
            "client_id": client_id, "name": "Owner", "username": "owner", "password": "ha-check-password",
            "language": "en"})
        if status != 200:
            raise AssertionError(f"onboarding: HTTP {status}: {answer}")
        tokens = self.ok("POST", "/auth/token", form={"grant_type": "authorization_code",
                                                     "code": answer["auth_code"], "client_id": client_id})
        self.token = tokens["access_token"]
        self.refresh_token, self.client_id = tokens["refresh_token"], client_id

    def login_again(self) -> None:
        """A new access token from the refresh token (after a restart, or past the 30 min)."""
        self.token = None
        tokens = self.ok("POST", "/auth/token", form={"grant_type": "refresh_token",
                                                     "refresh_token": self.refresh_token,
                                                     "client_id": self.client_id})
        self.token = tokens["access_token"]

    def config_flow(self, handler: str, *steps: dict) -> dict:
        """A config flow through the REST API: each step's input in turn; the last answer."""
        answer = self.ok("POST", "/api/config/config_entries/flow", {"handler": handler,
                                                                     "show_advanced_options": False})
        for step in steps:
            if answer.get("type") in ("create_entry", "abort"):
                break
            answer = self.ok("POST", f"/api/config/config_entries/flow/{answer['flow_id']}", step)
        return answer

    def state(self, entity_id: str) -> dict | None:
        status, answer = self.request("GET", f"/api/states/{entity_id}")
        return answer if status == 200 else None

    def service(self, domain: str, name: str, data: dict) -> None:
        self.ok("POST", f"/api/services/{domain}/{name}", data)

    def ws(self) -> "WebSocket":
        return WebSocket(self.port, self.token)


class WebSocket:
    """Home Assistant's WebSocket API: authenticated at once; `call` sends a command and
    returns its result; `events` gives what a subscription sends."""

    def __init__(self, port: int, token: str):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET /api/websocket HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
                           f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise AssertionError(f"WebSocket handshake: {head!r}")
            head += chunk
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise AssertionError(f"WebSocket handshake: {head!r}")
        self.next_id = 1
        assert self.receive()["type"] == "auth_required"
        self.send({"type": "auth", "access_token": token})
        answer = self.receive()
        if answer["type"] != "auth_ok":
            raise AssertionError(f"WebSocket auth: {answer}")

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("Home Assistant closed the WebSocket")
            data += chunk
        return data

    def send(self, message: dict) -> None:
        payload, mask = json.dumps(message).encode(), os.urandom(4)
        n = len(payload)
        head = struct.pack("!B", 0x81) + (struct.pack("!B", 0x80 | n) if n < 126 else
                                           struct.pack("!BH", 0x80 | 126, n) if n < 65536 else
                                           struct.pack("!BQ", 0x80 | 127, n))
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def receive(self) -> dict:
        """The next text message (a fragmented one joined; pings answered)."""
        message = b""
        while True:
            first, second = self._exactly(2)
            n = second & 0x7F
            if n == 126:
                n = struct.unpack("!H", self._exactly(2))[0]
            elif n == 127:
                n = struct.unpack("!Q", self._exactly(8))[0]
            payload = self._exactly(n)
            opcode = first & 0x0F
            if opcode == 0x9:  # ping
                self.sock.sendall(b"\x8a" + bytes([0x80 | len(payload)]) + b"\0\0\0\0" + payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("Home Assistant closed the WebSocket")
            message += payload
            if first & 0x80:
                return json.loads(message)

    def call(self, command: str, **fields):
        """A command's result (AssertionError with Home Assistant's error)."""
        rid, self.next_id = self.next_id, self.next_id + 1
        self.send({"id": rid, "type": command, **fields})
        while True:
            answer = self.receive()
            if answer.get("id") == rid and answer.get("type") == "result":
                if not answer["success"]:
                    raise AssertionError(f"{command} {fields}: {answer['error']}")
                return answer["result"]

    def subscribe(self, command: str, **fields) -> int:
        """A subscription's id; its events come from `events`."""
        rid = self.next_id
        self.call(command, **fields)
        return rid

    def events(self, rid: int, until, timeout: float = 60) -> list[dict]:
        """The subscription's events until `until(event)` is true (included)."""
        got, deadline = [], time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.1, deadline - time.monotonic()))
            answer = self.receive()
            if answer.get("id") == rid and answer.get("type") == "event":
                got.append(answer["event"])
                if until(answer["event"]):
                    return got
        raise AssertionError(f"subscription {rid}: not done within {timeout:g} s: {got[-5:]}")

    def close(self) -> None:
        self.sock.close()
