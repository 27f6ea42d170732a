"""The HTTP server: listening, a thread per connection within bounds, TLS, a prompt shutdown."""

from __future__ import annotations

import logging
import selectors
import socket
import ssl
import sys
import threading
from typing import Any
from urllib.parse import urlsplit
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from .connections import Connection, Connections
from .socket_activation import activated_socket
from .web_access import WebAccess, WsgiApp

log = logging.getLogger(__name__)

# Bounds on what clients can hold (connections.py): the TLS handshake, request line and
# headers must arrive within REQUEST_DEADLINE seconds of the accept, however slowly they drip;
# each write of the answer must be taken within SEND_TIMEOUT; at most MAX_CONNECTIONS are
# served at once and MAX_PER_ADDRESS for one client address, and at either cap the oldest
# client still sending its request is cut to make room. The standard library's http.server
# refuses a request line or header over 64 KiB or over 100 headers.
REQUEST_DEADLINE = 5.0
SEND_TIMEOUT = 5.0
MAX_CONNECTIONS = 256
MAX_PER_ADDRESS = 128  # one address never takes more than half; a proxy still gets a burst
LISTEN_BACKLOG = 128  # a burst of scrapes queues instead of waiting for a TCP retry


class _ThreadingServer(WSGIServer):
    request_queue_size = LISTEN_BACKLOG
    access: WebAccess | None = None  # set by serve() when there is a web configuration

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.connections = Connections(MAX_CONNECTIONS, MAX_PER_ADDRESS, REQUEST_DEADLINE)
        # shutdown() writes to one end to wake serve_forever() at once: the standard loop
        # looks for a shutdown only every poll interval (0.5 s), which every SIGTERM waited.
        self._wake, self._waker = socket.socketpair()
        self._stopped = threading.Event()
        super().__init__(*args, **kwargs)  # closes the pair through server_close() on failure

    def serve_forever(self, poll_interval: float = 0.5) -> None:
        """Serve until shutdown(); nothing polls, so `poll_interval` is unused."""
        watchdog = threading.Thread(target=self.connections.watch, name="http-deadlines")
        watchdog.start()
        try:
            with selectors.DefaultSelector() as selector:
                selector.register(self, selectors.EVENT_READ)
                selector.register(self._wake, selectors.EVENT_READ)
                while not any(key.fileobj is self._wake for key, _ in selector.select()):
                    self.handle_request()  # the listening socket is ready: accepts at once
        finally:
            self.connections.stop()
            watchdog.join()
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop serve_forever() and wait for it; call it from another thread."""
        self._waker.send(b"\0")
        self._stopped.wait()

    def server_close(self) -> None:
        super().server_close()
        self._wake.close()
        self._waker.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        error = sys.exception()
        if isinstance(error, OSError):  # a refused handshake, a client gone: theirs, not ours
            log.debug("connection ended", extra={"client": client_address[0], "error": str(error)})
        else:
            log.error("error serving a request", exc_info=error)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Serve it in a thread of its own; the accepting thread never waits for room."""
        connection = self.connections.admit(request, client_address[0])
        if connection is None:
            log.debug(
                "connection refused: every slot is answering", extra={"client": client_address[0]}
            )
            self.shutdown_request(request)
            return
        # A daemon thread: a scrape left hanging by its client never blocks shutdown.
        thread = threading.Thread(
            target=self._serve, args=(request, client_address, connection), daemon=True
        )
        try:
            thread.start()
        except BaseException:
            self.connections.release(connection)
            raise

    def _serve(self, request: Any, client_address: Any, connection: Connection) -> None:
        try:
            _QuietHandler(request, client_address, self, connection)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.connections.release(connection)
            self.shutdown_request(request)


class _IPv6Server(_ThreadingServer):
    address_family = socket.AF_INET6


class _DualStackServer(_IPv6Server):
    """`:9846`: IPv6 and IPv4 on one socket, where the host has both."""

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


class _QuietHandler(WSGIRequestHandler):
    timeout = SEND_TIMEOUT
    server: _ThreadingServer

    def __init__(
        self, request: Any, client_address: Any, server: _ThreadingServer, connection: Connection
    ) -> None:
        self.connection_served = connection
        super().__init__(request, client_address, server)

    def setup(self) -> None:
        # The handshake runs here, in the connection's own thread and within the request's
        # deadline: a client that drips its ClientHello holds up no one else.
        access = self.server.access
        if access is not None and access.tls:
            self.request.settimeout(self.timeout)
            self.request = access.wrap(self.request)
        super().setup()

    def parse_request(self) -> bool:
        parsed = super().parse_request()  # reads the headers
        self.server.connections.answering(self.connection_served)
        return parsed

    def get_environ(self) -> dict[str, Any]:
        environ = super().get_environ()
        if isinstance(self.request, ssl.SSLSocket):
            environ["HTTPS"] = "on"
            environ["wsgi.url_scheme"] = "https"
        return environ

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        # The path without its query: a caller may put what it should not into a probe's
        # target (a password, a host it has no business naming), and logs travel far.
        path = urlsplit(getattr(self, "path", "") or "").path
        log.debug("%s %s %s %s", getattr(self, "command", None) or "-", path or "-", code, size)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)


def serve(
    app: WsgiApp,
    host: str,
    port: int,
    access: WebAccess | None = None,
    systemd_socket: bool = False,
) -> WSGIServer:
    """Bind now (so a taken port fails at start-up), or take the socket that systemd's
    socket activation passed; the caller runs serve_forever().

    With a web configuration, every endpoint is behind it: TLS, users and headers.
    """
    if access is not None:
        app = access.guard(app)
    server = _activated() if systemd_socket else _bound(host, port)
    server.access = access
    server.set_app(app)
    return server


def _bound(host: str, port: int) -> _ThreadingServer:
    server_class: type[_ThreadingServer] = _ThreadingServer
    if host == "" and socket.has_dualstack_ipv6():
        server_class, host = _DualStackServer, "::"
    elif ":" in host:
        server_class = _IPv6Server
    return server_class((host, port), _QuietHandler)


def _activated() -> _ThreadingServer:
    sock = activated_socket()
    server_class = _IPv6Server if sock.family == socket.AF_INET6 else _ThreadingServer
    server = server_class(sock.getsockname(), _QuietHandler, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    # What server_bind() would set, but the name: socket.getfqdn() may wait on a resolver.
    server.server_name, server.server_port = sock.getsockname()[:2]
    server.setup_environ()
    return server
