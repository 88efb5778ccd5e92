"""The HTTP connection layer of ``serve``: uvicorn's h11 protocol with deadlines and a bound.

uvicorn (0.54) closes an idle keep-alive connection after ``timeout_keep_alive`` and can refuse
requests beyond ``limit_concurrency`` (with a plain-text 503), but it gives a connection no
deadline for its request head or body: a client that sends one header byte a minute, or
declares a 60 kB body and sends none of it, holds its connection (and a file descriptor) for
ever. Enough of them use up the process's open files, and then nobody is answered. This
protocol adds, per connection:

- a **header deadline** (``ServerConfig.header_timeout_s``): from the connection's start, or
  from the first byte of a request after a keep-alive pause, to the end of the request head.
  Past it a connection that sent part of a head gets ``408`` (JSON) and is closed; one that
  sent nothing is closed.
- a **body deadline** (``body_timeout_s``): from the end of the head to the end of the body
  (however slowly it trickles in). Past it: ``408`` (JSON) when no response was started,
  and the connection is closed; the application sees the client as gone.
- a **bound on open connections** (``max_connections``): a connection opened beyond it first
  closes the open connection that has waited longest for a request head (an idle keep-alive
  one, or a slow one: 408 where part of a head came), so that slow clients cannot crowd out
  the others; only where more than ``max_connections`` connections are inside a request is
  there none to close, and then the new request is answered ``503`` (JSON,
  ``Retry-After: 1``) and its connection closed, before the application runs. The listen
  backlog is ``BACKLOG``: asyncio accepts up to that many connections at once before any is
  seen here, so open files stay within the bound + twice the backlog.

and answers malformed requests (bad request line, headers or ``Content-Length``; a head still
incomplete past ``MAX_HEAD_BYTES``, h11's bound) with ``400`` in JSON where uvicorn answers plain
text. WebSocket upgrades are
not served (``ws="none"``): the request is handled as plain HTTP.
"""
from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections import OrderedDict
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol

from retriever.server.config import BACKLOG, ServerConfig

log = logging.getLogger("uvicorn.error")

MAX_HEAD_BYTES = 16 * 1024  # a request head still incomplete past this is refused (h11's default, made explicit)


def json_bytes(payload: dict) -> bytes:
    """JSON as UTF-8 (non-ASCII kept); ASCII with escapes where the text has lone surrogates."""
    try:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(payload, ensure_ascii=True, separators=(",", ":")).encode("ascii")


def raw_response(status: int, reason: str, detail: str, extra: tuple[tuple[str, str], ...] = ()) -> bytes:
    """A whole ``Connection: close`` HTTP/1.1 response with a ``{"detail": ...}`` body, as bytes
    (for the moments when h11's state machine cannot send one: a half-received head)."""
    body = json_bytes({"detail": detail})
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json", f"content-length: {len(body)}", "connection: close"]
    head += [f"{k}: {v}" for k, v in extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode("ascii") + body


class _Connections:
    """A server's open connections by what they do: waiting for a request head (oldest first,
    with the time it began waiting) or inside a request. Closing ones are in neither."""

    def __init__(self) -> None:
        self.waiting: OrderedDict[GuardedH11Protocol, float] = OrderedDict()
        self.busy: set[GuardedH11Protocol] = set()

    @classmethod
    def of(cls, server_state: Any) -> _Connections:
        found = getattr(server_state, "_guarded_connections", None)
        if found is None:
            found = server_state._guarded_connections = cls()
        return found

    def open(self) -> int:
        return len(self.waiting) + len(self.busy)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines and the bound of ``limits`` (a ServerConfig,
    set on the subclass made by :func:`guarded_protocol`)."""

    limits: ServerConfig = ServerConfig()

    def __init__(self, config: Config, server_state: Any, app_state: dict[str, Any], _loop: asyncio.AbstractEventLoop | None = None) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._head_bytes = False  # part of a request head has arrived
        self._registry = _Connections.of(server_state)
        app = self.app

        async def bounded(scope, receive, send) -> None:
            if len(self._registry.busy) > self.limits.max_connections:  # none left to make room from
                await self._refuse_over_limit(send)
                return
            await app(scope, receive, send)

        self.app = bounded

    # ---------------------------------------------------------------- connection events
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._registry.waiting[self] = self.loop.time()
        self._arm_header_deadline()
        if self._registry.open() > self.limits.max_connections:
            self._make_room()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        self._forget()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.conn.their_state is h11.IDLE:  # (part of) a request head
            if self._header_timer is None:  # the first byte of a request after a keep-alive pause
                self._arm_header_deadline()
            self._head_bytes = True
        super().data_received(data)
        self._follow_state()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow_state()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to a request h11 cannot parse, in JSON."""
        body = json_bytes({"detail": "invalid HTTP request (malformed request line, header or Content-Length, "
                                     f"or a head over {MAX_HEAD_BYTES} bytes)"})
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
        try:
            output = self.conn.send(h11.Response(status_code=400, headers=headers, reason=b"Bad Request"))
            output += self.conn.send(h11.Data(data=body))
            output += self.conn.send(h11.EndOfMessage())
        except h11.LocalProtocolError:  # a state h11 will not answer from: the bytes by hand
            output = raw_response(400, "Bad Request", json.loads(body)["detail"])
        self.transport.write(output)
        self.transport.close()

    # ---------------------------------------------------------------- deadlines
    def _follow_state(self) -> None:
        """Header deadline while a head is awaited; body deadline while a body is; none after."""
        state = self.conn.their_state
        if self.transport.is_closing() or state in (h11.CLOSED, h11.ERROR):
            self._forget()
            return
        if state is h11.IDLE:
            self._cancel(body=True)
            if self not in self._registry.waiting:
                self._registry.busy.discard(self)
                self._registry.waiting[self] = self.loop.time()
            return
        self._registry.waiting.pop(self, None)
        self._registry.busy.add(self)
        self._cancel(header=True)
        self._head_bytes = False
        if state is h11.SEND_BODY:
            if self._body_timer is None:
                self._body_timer = self.loop.call_later(self.limits.body_timeout_s, self._body_timeout)
        else:
            self._cancel(body=True)

    def _arm_header_deadline(self) -> None:
        self._cancel(header=True)
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timeout)

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        log.info("closing a connection whose request head took over %g s", self.limits.header_timeout_s)
        self._close_waiting(f"request head not received within {self.limits.header_timeout_s:g} s")

    def _close_waiting(self, why: str) -> None:
        """Close this connection, which waits for a request head: with 408 where part of one came."""
        self._cancel_timers()
        self._forget()
        if self._head_bytes:
            self.transport.write(raw_response(408, "Request Timeout", why))
        self.transport.close()

    def _make_room(self) -> None:
        """Over the bound: close the connection that has waited longest for a request head."""
        for oldest, since in self._registry.waiting.items():  # oldest first
            if oldest is not self:
                log.info("%d connections open, at most %d: closing one that waited %.1f s for a request head",
                         self._registry.open(), self.limits.max_connections, self.loop.time() - since)
                oldest._close_waiting(f"closed to make room: more than {self.limits.max_connections} connections open, "
                                      "and this one had not sent a whole request")
                return

    def _forget(self) -> None:
        self._registry.waiting.pop(self, None)
        self._registry.busy.discard(self)

    def _body_timeout(self) -> None:
        self._body_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.SEND_BODY:
            return
        log.info("closing a connection whose request body took over %g s", self.limits.body_timeout_s)
        self._forget()
        cycle = self.cycle
        if cycle is not None and not cycle.response_started:
            cycle.response_started = True  # the application's own answer, if any, is dropped
            self.transport.write(raw_response(408, "Request Timeout", f"request body not received within {self.limits.body_timeout_s:g} s"))
        if cycle is not None:
            cycle.disconnected = True  # the application reads "http.disconnect"
            cycle.message_event.set()
        self.transport.close()

    def _cancel(self, header: bool = False, body: bool = False) -> None:
        if header and self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if body and self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _cancel_timers(self) -> None:
        self._cancel(header=True, body=True)

    async def _refuse_over_limit(self, send) -> None:
        busy, limit = len(self._registry.busy), self.limits.max_connections
        log.info("503: %d connections inside a request, at most %d", busy, limit)
        body = json_bytes({"detail": f"too many connections: {busy} inside a request, at most {limit} (serve --max-connections); "
                                     "retry later"})
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
            (b"retry-after", b"1"), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def guarded_protocol(limits: ServerConfig) -> type[GuardedH11Protocol]:
    """The protocol class for uvicorn's ``http=`` with ``limits``' deadlines and bound."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


def uvicorn_config(app, limits: ServerConfig, host: str = "127.0.0.1", port: int = 8000, log_level: str = "warning") -> Config:
    """uvicorn's settings for ``app`` within ``limits`` (what ``serve`` runs)."""
    return Config(
        app, host=host, port=port, log_level=log_level, http=guarded_protocol(limits), ws="none",
        timeout_keep_alive=limits.keep_alive_timeout_s, h11_max_incomplete_event_size=MAX_HEAD_BYTES, backlog=BACKLOG,
        limit_concurrency=None,  # the bound is the protocol's, answered in JSON
    )


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port`` (not listening yet; uvicorn listens on it): binding
    first makes a bad address, a port in use or one needing privileges an error before the
    model loads (OSError with the address)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    sock.set_inheritable(True)
    return sock
