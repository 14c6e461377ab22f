"""uvicorn with a drain phase: SIGTERM stops readiness at once, lets work in flight finish."""

from __future__ import annotations

import errno
import logging
import os
import signal
import socket
import threading
import time
from types import FrameType

import uvicorn
from fastapi import FastAPI

from openai_compat.frame.settings import Settings
from openai_compat.ground.lifecycle import Lifecycle

logger = logging.getLogger("openai_compat")

# After SIGTERM the process is gone within --graceful-timeout plus this: the time to stop the
# engines (their current batch finishes) and exit. A watchdog enforces it.
SHUTDOWN_MARGIN = 5.0


class DrainingServer(uvicorn.Server):
    """On the first SIGTERM/SIGINT: /ready turns 503 and new API work is refused (503), while
    the port stays open for probes; once nothing is in flight (or `graceful_timeout` has
    passed) uvicorn shuts down, the engines stop and the process exits 0. A second signal
    exits at once.

    Unlike uvicorn's own handler this does not re-raise the signal after a clean drain, so a
    drained process exits with status 0 rather than -15.
    """

    def __init__(self, app: FastAPI, settings: Settings) -> None:
        config = uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            log_config=None,  # logging is ours (logs.configure): plain text or JSON
            access_log=False,  # the gateway writes one richer line per request
            # After the drain, uvicorn itself waits at most this long for stragglers.
            timeout_graceful_shutdown=max(1, int(settings.graceful_timeout)),
            lifespan="on",
            proxy_headers=settings.forwarded_allow_ips is not None,
            forwarded_allow_ips=settings.forwarded_allow_ips,
        )
        super().__init__(config)
        self.lifecycle: Lifecycle = app.state.lifecycle
        self.grace = settings.graceful_timeout
        self.drain_deadline: float | None = None
        self.watchdog: threading.Timer | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.watchdog is None:
            self.watchdog = self._start_watchdog()
        name = signal.Signals(sig).name
        if self.drain_deadline is not None:  # the second signal: quit now
            logger.warning(
                "%s again: quitting now (%d request(s) cut off)", name, self.lifecycle.inflight
            )
            self.should_exit = self.force_exit = True
            return
        if self.lifecycle.phase in ("loading", "failed"):  # nothing worth draining: stop now
            if self.should_exit:
                self.force_exit = True
            self.should_exit = True
            self.lifecycle.drain()
            return
        again = "Ctrl-C" if sig == signal.SIGINT else f"send {name}"
        # a person at a terminal is told (a platform's SIGTERM is routine: info)
        logger.log(
            logging.WARNING if sig == signal.SIGINT else logging.INFO,
            "%s received: draining %d request(s) in flight (at most %.0fs); %s again to quit now",
            name,
            self.lifecycle.inflight,
            self.grace,
            again,
        )
        self.lifecycle.drain()
        self.drain_deadline = time.monotonic() + self.grace

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            if self.lifecycle.draining_for == 0:
                logger.info("drained; shutting down")
                self.should_exit = True
            elif time.monotonic() >= self.drain_deadline:
                logger.warning(
                    "graceful timeout: %d request(s) still in flight", self.lifecycle.inflight
                )
                self.should_exit = True
        return await super().on_tick(counter)

    def _start_watchdog(self) -> threading.Timer:
        limit = (self.grace if self.lifecycle.phase == "ready" else 0) + SHUTDOWN_MARGIN

        def expire() -> None:
            logger.error("shutdown took longer than %.0fs; exiting now", limit)
            logging.shutdown()
            os._exit(1)

        timer = threading.Timer(limit, expire)
        timer.daemon = True
        timer.start()
        return timer

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.drain_deadline is not None:
            # uvicorn's wait for open connections gets what is left of the drain deadline,
            # not a second full graceful timeout.
            left = self.drain_deadline - time.monotonic()
            self.config.timeout_graceful_shutdown = max(0.1, left)  # type: ignore[assignment]
        await super().shutdown(sockets)


def _free_port(host: str, family: socket.AddressFamily) -> int:
    """A port the system says is free on `host` now (it picks one for port 0)."""
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


class PortInUse(OSError):
    """The port the server was told to listen on is taken (checked before any model loads)."""


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the models load, so that a taken port is one line
    at once rather than uvicorn's `[Errno 98]` after the whole start-up."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        if exc.errno != errno.EADDRINUSE:  # a bad address, a privileged port...: its own words
            raise PortInUse(
                f"cannot listen on {host}:{port}: {reason} (check --host and --port, or "
                "OPENAI_COMPAT_HOST and OPENAI_COMPAT_PORT)."
            ) from exc
        free = _free_port(host, family)
        raise PortInUse(
            f"cannot listen on {host}:{port}: {reason}. Another server holds it: pick another "
            f"port, e.g. --port {free} (or OPENAI_COMPAT_PORT={free}), free as of now."
        ) from exc
    sock.set_inheritable(True)
    return sock
