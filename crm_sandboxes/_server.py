"""Shared plumbing for the CRM simulators: threaded HTTP server, faults, counters, control API."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
import uuid
from collections import Counter, deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

__all__ = ["Reply", "SandboxServer"]

log = logging.getLogger(__name__)


@dataclass
class Reply:
    """An HTTP answer: JSON-serialisable body (or raw bytes), status and extra headers."""

    status: int
    body: object = None
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class _Scripted:
    remaining: int
    reply: Reply
    path_contains: str | None


@dataclass
class Request:
    """A parsed incoming request handed to the simulators."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        """The body parsed as JSON (None if empty)."""
        return json.loads(self.body) if self.body else None

    def q(self, name: str, default: str | None = None) -> str | None:
        """First value of a query parameter."""
        vals = self.query.get(name)
        return vals[0] if vals else default

    def header(self, name: str) -> str | None:
        """Case-insensitive header lookup."""
        low = name.lower()
        for k, v in self.headers.items():
            if k.lower() == low:
                return v
        return None


class _Drop(Exception):
    """Close the connection without answering."""


def correlation_id() -> str:
    """A random id shaped like the CRMs' correlation ids."""
    return str(uuid.uuid4())


class SandboxServer:
    """Base simulator: subclass implements `_api(request) -> Reply` and `_reset_state()`.

    Usable in-process (`start()` on port 0, `.url`, `.stop()`, or as a context manager) or
    standalone (`serve_forever()`). All state is guarded by `self._lock`.
    """

    kind = "base"

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._scripted: deque[_Scripted] = deque()
        self._drop_next = 0
        self._latency_s = 0.0
        self._poison: set[str] = set()
        self._calls: Counter[str] = Counter()
        self._stats: Counter[str] = Counter()
        self._reset_state()

    # ------------------------------------------------------------- to be overridden
    def _reset_state(self) -> None:
        raise NotImplementedError

    def _api(self, req: Request) -> Reply:
        raise NotImplementedError

    def _control_extra(self, req: Request, action: str) -> Reply | None:
        """Kind-specific /_sandbox/ endpoints (seed, records, ...)."""
        return None

    # ------------------------------------------------------------- control (in-process)
    def reset(self) -> None:
        """Forget all data, faults and counters."""
        with self._lock:
            self._scripted.clear()
            self._drop_next = 0
            self._latency_s = 0.0
            self._poison.clear()
            self._calls.clear()
            self._stats.clear()
            self._reset_state()

    def inject_failures(
        self,
        n: int,
        status: int = 503,
        body: object = None,
        headers: Mapping[str, str] | None = None,
        path_contains: str | None = None,
    ) -> None:
        """The next `n` API requests (optionally only paths containing a string) get this reply."""
        if body is None:
            body = {"message": "Service Unavailable", "errorCode": "SERVER_UNAVAILABLE"}
        with self._lock:
            self._scripted.append(
                _Scripted(n, Reply(status, body, dict(headers or {})), path_contains)
            )

    def drop_connections(self, n: int) -> None:
        """The next `n` API requests are read and then the connection is closed unanswered."""
        with self._lock:
            self._drop_next += n

    def set_latency(self, seconds: float) -> None:
        """Delay every API answer by `seconds`."""
        with self._lock:
            self._latency_s = max(seconds, 0.0)

    def poison(self, ids: list[str] | set[str] | tuple[str, ...]) -> None:
        """Writes to these record ids always fail permanently."""
        with self._lock:
            self._poison.update(ids)

    def clear_faults(self) -> None:
        """Remove injected failures, drops, latency and poison ids."""
        with self._lock:
            self._scripted.clear()
            self._drop_next = 0
            self._latency_s = 0.0
            self._poison.clear()

    def counters(self) -> dict[str, Any]:
        """{"calls": {endpoint: n}, "total_calls": n, plus simulator stats (lock_errors, ...)}."""
        with self._lock:
            return {
                "calls": dict(self._calls),
                "total_calls": sum(self._calls.values()),
                **dict(self._stats),
            }

    def _count(self, endpoint: str) -> None:
        with self._lock:
            self._calls[endpoint] += 1

    def _stat(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._stats[name] += n

    def _is_poison(self, record_id: str) -> bool:
        with self._lock:
            return record_id in self._poison

    # ------------------------------------------------------------- request pipeline
    def handle(self, req: Request) -> Reply:
        """Control endpoints, then faults, then the simulated API."""
        if req.path.startswith("/_sandbox/"):
            return self._control(req)
        with self._lock:
            drop = self._drop_next > 0
            if drop:
                self._drop_next -= 1
            latency = self._latency_s
            scripted: Reply | None = None
            if not drop:
                for s in self._scripted:
                    if s.remaining > 0 and (s.path_contains is None or s.path_contains in req.path):
                        s.remaining -= 1
                        scripted = s.reply
                        break
                while self._scripted and self._scripted[0].remaining <= 0:
                    self._scripted.popleft()
        if drop:
            self._stat("dropped")
            raise _Drop()
        if latency:
            time.sleep(latency)
        if scripted is not None:
            self._stat("injected")
            return Reply(scripted.status, scripted.body, dict(scripted.headers))
        return self._api(req)

    def _control(self, req: Request) -> Reply:
        action = req.path[len("/_sandbox/") :].strip("/")
        data = req.json() if req.method in ("POST", "PUT", "PATCH") else None
        data = data if isinstance(data, dict) else {}
        if action == "reset" and req.method == "POST":
            self.reset()
            return Reply(200, {"ok": True})
        if action == "counters":
            return Reply(200, self.counters())
        if action == "faults" and req.method == "POST":
            if data.get("clear"):
                self.clear_faults()
            if data.get("fail_next"):
                self.inject_failures(
                    int(data["fail_next"]),
                    int(data.get("status", 503)),
                    data.get("body"),
                    data.get("headers"),
                    data.get("path_contains"),
                )
            if data.get("drop_next"):
                self.drop_connections(int(data["drop_next"]))
            if "latency_ms" in data:
                self.set_latency(float(data["latency_ms"]) / 1000.0)
            if data.get("poison"):
                self.poison([str(x) for x in data["poison"]])
            return Reply(200, {"ok": True})
        if action == "config" and req.method == "POST":
            try:
                self.configure(**data)
            except (TypeError, ValueError) as exc:
                return Reply(400, {"error": str(exc)})
            return Reply(200, {"ok": True})
        extra = self._control_extra(req, action)
        return extra if extra is not None else Reply(404, {"error": "unknown control action"})

    def configure(self, **settings: Any) -> None:
        """Change simulator knobs (names are the public attributes of the subclass)."""
        with self._lock:
            for k, v in settings.items():
                if k.startswith("_") or not hasattr(self, k) or callable(getattr(self, k)):
                    raise ValueError(f"unknown setting {k!r}")
                setattr(self, k, v)

    # ------------------------------------------------------------- lifecycle
    def _make_server(self, host: str, port: int) -> ThreadingHTTPServer:
        return _Server((host, port), _make_handler(self))

    def start(self, host: str = "127.0.0.1", port: int = 0) -> Self:
        """Serve in a background thread; returns self (see `.url`)."""
        self._httpd = self._make_server(host, port)
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"{self.kind}-sandbox",
            daemon=True,
        )
        self._thread.start()
        return self

    def serve_forever(self, host: str, port: int) -> None:
        """Serve in the calling thread until interrupted."""
        self._httpd = self._make_server(host, port)
        log.info("%s sandbox listening on %s", self.kind, self.url)
        try:
            self._httpd.serve_forever()
        finally:
            self._httpd.server_close()

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:54321."""
        if self._httpd is None:
            raise RuntimeError("sandbox not started")
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def stop(self) -> None:
        """Stop serving and close the listening socket."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> Self:
        if self._httpd is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # bursts of parallel clients must queue, not be reset

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._open: set[socket.socket] = set()
        self._open_lock = threading.Lock()
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        """Close, after ending the wait of connections kept alive by clients that never
        closed them: without this a stop waited up to the handlers' 30 s read timeout.
        Only the read side is shut, so a request being handled still gets its answer."""
        with self._open_lock:
            idle = list(self._open)
        for sock in idle:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RD)
        super().server_close()


def _make_handler(sandbox: SandboxServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        timeout = 30
        server_version = "CrmSandbox/1.0"
        # http.server writes an answer's head and its body apart: with Nagle's algorithm on,
        # the body waited for the client's delayed ACK of the head, 40 ms on Linux, on every
        # call over a kept-alive connection (44 ms for any HubSpot batch read or write,
        # whatever its size). The simulator sends both in one write (_answer), with Nagle off.
        disable_nagle_algorithm = True
        _headers_buffer: list[bytes]  # http.server's own, which send_header appends to

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("%s sandbox: " + format, sandbox.kind, *args)

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            parts = urlsplit(self.path)
            req = Request(
                method=self.command,
                path=parts.path,
                query=parse_qs(parts.query, keep_blank_values=True),
                headers={k: v for k, v in self.headers.items()},
                body=body,
            )
            try:
                reply = sandbox.handle(req)
            except _Drop:
                self.close_connection = True
                return
            except Exception:
                log.exception("%s sandbox handler failed", sandbox.kind)
                reply = Reply(500, [{"message": "internal sandbox error", "errorCode": "UNKNOWN"}])
            if isinstance(reply.body, bytes):
                payload = reply.body
                ctype = "application/octet-stream"
            elif reply.body is None:
                payload = b""
                ctype = "application/json"
            else:
                payload = json.dumps(reply.body).encode()
                ctype = "application/json;charset=UTF-8"
            try:
                self._answer(reply.status, {"Content-Type": ctype, **reply.headers}, payload)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client gave up (timeout) before we answered

        def _answer(self, status: int, headers: dict[str, str], payload: bytes) -> None:
            """Status line, headers and body in one write (nothing is left buffered to fail
            later when the client has gone)."""
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(payload)))
            # what end_headers would write (an answer to HTTP/0.9 has no head at all)
            buffered = getattr(self, "_headers_buffer", None)
            head = b"".join(buffered) + b"\r\n" if buffered else b""
            self._headers_buffer = []
            self.wfile.write(head + payload)

        do_GET = do_POST = do_PATCH = do_PUT = do_DELETE = _serve

    return Handler
