"""``lakelog agent --workers N``: N agent processes on one port.

Each worker is a whole agent (its own event loop, batcher, read cache and
coordinator client) that binds the HTTP port, and the Kafka port if any, with
``SO_REUSEPORT``: the kernel spreads new connections over the workers. Agents
keep no state of their own (DESIGN.md), so any worker can serve any request; an
acked record was committed before its ack, so a worker that dies loses nothing
acked (its in-flight requests fail and their clients retry).

All workers share one agent id and so one broker id: Kafka clients see one broker
at the one advertised address. The supervisor (this process) starts the workers,
restarts one that exits, and on SIGTERM/SIGINT stops them all (each flushes what it
buffered, as a single agent does).

uvicorn's own ``--workers`` needs the app as an import string and shares one socket;
here each worker builds its app from the same Settings object and binds its own
socket, which the Kafka listener needs too.
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import socket
import threading
import time
from multiprocessing.process import BaseProcess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.settings import Settings

log = logging.getLogger(__name__)

#: A worker that exits sooner than this after its start counts as failing to start.
_MIN_UPTIME_S = 5.0
#: Consecutive failed starts of one worker after which the supervisor gives up.
_MAX_FAILED_STARTS = 3


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port) that other processes may bind as well."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except BaseException:
        sock.close()
        raise
    return sock


def serve_worker(settings: Settings, index: int) -> None:
    """One worker (the target of each child process): the agent on a shared port."""
    import uvicorn

    from service.app import create_app
    from service.http_server import uvicorn_options

    logging.basicConfig(
        level=settings.log_level.upper(),
        format=f"%(asctime)s %(levelname)s worker-{index} %(name)s %(message)s",
    )
    logging.getLogger("httpx").setLevel(max(logging.WARNING, logging.getLogger().level))
    sock = reuse_port_socket(settings.host, settings.port)
    config = uvicorn.Config(
        create_app(settings),
        log_level=settings.log_level,
        access_log=settings.access_log,
        proxy_headers=False,  # the app applies them, trusting settings.forwarded_allow_ips
        **uvicorn_options(settings),
    )
    uvicorn.Server(config).run(sockets=[sock])


class Supervisor:
    """Starts ``settings.workers`` workers, restarts those that exit, stops them all."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._ctx = multiprocessing.get_context("spawn")
        self._procs: dict[int, BaseProcess] = {}
        self._started: dict[int, float] = {}
        self._failed_starts: dict[int, int] = {}
        self.stopping = threading.Event()

    def pids(self) -> list[int]:
        return [p.pid for p in self._procs.values() if p.pid is not None]

    def _start(self, index: int) -> None:
        proc = self._ctx.Process(
            target=serve_worker, args=(self.settings, index), name=f"lakelog-worker-{index}"
        )
        proc.start()
        self._procs[index] = proc
        self._started[index] = time.monotonic()
        log.info("worker %d started (pid %s)", index, proc.pid)

    def run(self) -> int:
        """Supervise until SIGTERM/SIGINT; returns the exit code (1: workers kept failing)."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)
        for i in range(self.settings.workers):
            self._start(i)
        code = 0
        while not self.stopping.wait(0.2):
            for i, proc in list(self._procs.items()):
                if proc.is_alive():
                    if time.monotonic() - self._started[i] > _MIN_UPTIME_S:
                        self._failed_starts[i] = 0
                    continue
                uptime = time.monotonic() - self._started[i]
                log.warning(
                    "worker %d (pid %s) exited with code %s after %.1f s; starting another",
                    i,
                    proc.pid,
                    proc.exitcode,
                    uptime,
                )
                if uptime < _MIN_UPTIME_S:
                    self._failed_starts[i] = self._failed_starts.get(i, 0) + 1
                    if self._failed_starts[i] >= _MAX_FAILED_STARTS:
                        log.error("worker %d keeps failing to start; stopping", i)
                        self.stopping.set()
                        code = 1
                        break
                self._start(i)
        self.stop()
        return code

    def _on_signal(self, signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping the workers", signum)
        self.stopping.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every worker (each flushes its buffer and closes), then wait; kill
        those still running after ``timeout_s``."""
        for proc in self._procs.values():
            if proc.is_alive():
                proc.terminate()
        deadline = time.monotonic() + timeout_s
        for proc in self._procs.values():
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                log.warning("worker pid %s did not stop in time; killing it", proc.pid)
                proc.kill()
                proc.join(5)


def run_workers(settings: Settings) -> int:
    """Run ``settings.workers`` agent workers on one port until told to stop."""
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # Fail at once, in the supervisor, when the port is taken by a process that did not
    # set SO_REUSEPORT (the workers would each fail the same way).
    reuse_port_socket(settings.host, settings.port).close()
    return Supervisor(settings).run()
