"""``lakelog agent --workers N``: worker processes sharing one port (SO_REUSEPORT)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.integration.conftest import AckLog, ClusterFactory, create_topic

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def children(pid: int) -> set[int]:
    """The child processes of ``pid`` (Linux /proc)."""
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        out.update(int(p) for p in text)
    return out


def wait_children(pid: int, n: int, *, besides: frozenset[int] = frozenset()) -> set[int]:
    """The worker processes of supervisor ``pid`` once ``n`` run (not counting ``besides``)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        kids = children(pid) - besides
        # spawn's resource tracker is a child too: the workers run spawn_main
        workers = {k for k in kids if _is_worker(k)}
        if len(workers) >= n:
            return workers
        time.sleep(0.1)
    raise AssertionError(f"{n} workers of {pid} not running: {children(pid)}")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _is_worker(pid: int) -> bool:
    return b"multiprocessing.spawn" in _cmdline(pid) and b"spawn_main" in _cmdline(pid)


def test_sigkill_of_one_worker_loses_no_acked_record(cluster_factory: ClusterFactory) -> None:
    """Race: 8 producers post batches (a new connection each, so the kernel spreads
    them over both workers of one agent) while one worker is SIGKILLed. Expected:
    requests in flight on the killed worker fail on the client (a connection error,
    never a 200 without offsets) and others keep being answered; every acked record is
    readable at its acked offset, none twice; offsets stay contiguous; the supervisor
    starts a new worker in its place."""
    cluster = cluster_factory(
        agents=1, agent_args=["--workers", "2"], agent_env={"LAKELOG_LINGER_MS": "20"}
    )
    topic = "workers"
    create_topic(cluster, topic, 4)
    agent = cluster.agents[0]
    supervisor = cluster.agent_procs[0].popen.pid
    workers = wait_children(supervisor, 2)
    assert len(workers) == 2
    stop = threading.Event()
    acks = AckLog()
    failures: list[str] = []

    def producer(worker: int) -> None:
        n = 0
        while not stop.is_set():
            values = [f"w{worker}-n{n}-r{i}".encode() for i in range(10)]
            n += 1
            try:
                with httpx.Client(timeout=20) as client:  # one connection per request
                    acks.post(client, agent, topic, values, keyed=False)
            except httpx.TransportError as e:
                with acks.lock:
                    failures.append(type(e).__name__)

    threads = [threading.Thread(target=producer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    victim = min(workers)
    try:
        before_kill = acks.wait(200)
        os.kill(victim, signal.SIGKILL)
        replaced = wait_children(supervisor, 2, besides=frozenset({victim}))
        with acks.lock:
            at_kill = len(acks.acked)
        time.sleep(1.5)  # both workers (the survivor and the new one) answer meanwhile
    finally:
        stop.set()
        for t in threads:
            t.join(30)
    assert before_kill > 0
    assert victim not in replaced and len(replaced - workers) == 1, (workers, replaced)
    assert len(acks.acked) > at_kill, "the agent kept answering after the kill"
    acks.check(cluster, topic, 4)
