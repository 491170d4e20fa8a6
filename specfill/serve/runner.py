"""Listening and stopping: the port is bound before the model loads, signals stop the server cleanly.

bind() runs first (a port in use is one error line in a second, not after a minute of loading);
run() serves the app on that socket with uvicorn. Signals (SIGINT / SIGTERM): the first stops
taking requests and cancels the running generation at its next step (the worker checks between
prefill steps and between tokens) and the server waits for the requests in flight to end; a second
stops waiting. Either way the worker thread is joined before the process exits, so no native
thread dies mid-kernel, and the exit status is 0 with no traceback. Requests still open
SHUTDOWN_GRACE_S after the shutdown began (a client stalled mid-body or not reading) are hung up on,
and their handlers end quietly at their next poll: uvicorn would wait 30 s for them after one
signal, and after two leave them to the event loop's teardown, which cancels them (uvicorn logs each
with a CancelledError traceback); after two the app's lifespan then ends as after one.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import signal
import socket
import sys
from typing import Any, Iterator

from specfill.core import ConfigError

from .scheduler import Scheduler

log = logging.getLogger("specfill.serve")
SIGNALS = (signal.SIGINT, signal.SIGTERM)
SHUTDOWN_GRACE_S = 3.0  # how long requests in flight get to end at a shutdown before they are hung up on


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on host:port (IPv4 or IPv6), or ConfigError naming the address."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise ConfigError(f"cannot listen on {host}:{port}: {err.strerror}") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        why = "the port is already in use" if err.errno == errno.EADDRINUSE else err.strerror
        raise ConfigError(f"cannot listen on {host}:{port}: {why}") from None
    sock.set_inheritable(True)
    return sock


def is_loopback(host: str) -> bool:
    """Whether `host` only reaches this machine (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _server_class() -> type:
    """uvicorn.Server with specfill's signal handling (built on first use: uvicorn is optional)."""
    import uvicorn

    class Server(uvicorn.Server):
        """First signal: drain (refuse new requests, cancel the running one at its next step);
        second: force (uvicorn stops waiting for open connections)."""

        scheduler: Scheduler

        def handle_exit(self, sig: int, frame: Any) -> None:  # noqa: ARG002 - uvicorn's signature
            if self.should_exit:
                self.force_exit = True
                print("specfill: stopping now", file=sys.stderr, flush=True)
            else:
                self.should_exit = True
                print(
                    "specfill: stopping: no new requests; the running one is cancelled at its next step "
                    "(signal again to stop at once)",
                    file=sys.stderr,
                    flush=True,
                )
            self.scheduler.close()

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            hang_up = asyncio.get_running_loop().call_later(SHUTDOWN_GRACE_S, self._hang_up)
            try:
                await super().shutdown(sockets)  # one signal: waits for the connections, hung up at the latest
            finally:
                hang_up.cancel()
            if self.force_exit:  # uvicorn skipped waiting for the requests and the lifespan's end
                tasks = set(self.server_state.tasks)
                if tasks and (await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S))[1]:
                    self._hang_up()
                    await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S)
                await self.lifespan.shutdown()

        def _hang_up(self) -> None:
            """Close every open connection at once (a handler sees the hang-up at its next poll)."""
            for connection in list(self.server_state.connections):
                transport = getattr(connection, "transport", None)
                if transport is not None:
                    transport.abort()

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """uvicorn's, minus re-raising the signal afterwards (that would exit with 130 / -15)."""
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in SIGNALS}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    return Server


def run(app: Any, sock: socket.socket, *, log_level: str) -> None:
    """Serve `app` on `sock` until a signal; returns once the worker thread has stopped."""
    import uvicorn

    scheduler: Scheduler = app.state.scheduler
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=30, access_log=False, log_config=None)
    server = _server_class()(config)
    server.scheduler = scheduler
    try:
        server.run(sockets=[sock])
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass
    finally:
        scheduler.stop()
