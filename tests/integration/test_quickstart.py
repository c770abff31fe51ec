"""A newcomer's first minutes: ``lakelog serve`` in an empty directory, then curl-like calls.

The server is started as the README's quick start runs it (``lakelog serve``, here
``python -m service.cli serve`` so the test does not depend on the console script
being installed), with nothing but a port: SQLite and ``file://./data`` in the
current directory, which is a fresh empty one.
"""

from __future__ import annotations

import base64
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.procs import Proc, free_port, wait_http

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def serve(tmp_path: Path, cwd: Path, *flags: str) -> tuple[Proc, str]:
    """``lakelog serve`` on a free port in ``cwd``; (process, base URL) once it answers."""
    cwd.mkdir()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "service.cli", "serve", "--port", str(port)]
    proc = Proc(
        [*command, "--host", "127.0.0.1", *flags],
        tmp_path / "serve.log",
        env={"PYTHONPATH": str(REPO)},  # stands in for `pip install lakelog`
        cwd=cwd,
    )
    try:
        wait_http(f"{base}/health", proc=proc.popen)
    except BaseException:
        proc.stop()
        raise
    return proc, base


def test_serve_create_topic_and_produce_round_trip(tmp_path: Path) -> None:
    cwd = tmp_path / "newcomer"
    proc, base = serve(tmp_path, cwd)
    try:
        cluster_id = httpx.get(f"{base}/v3/clusters").json()["data"][0]["cluster_id"]
        r = httpx.post(
            f"{base}/v3/clusters/{cluster_id}/topics",
            json={"topic_name": "hello", "partitions_count": 2},
        )
        assert r.status_code == 201, r.text
        # curl -X POST -H "Content-Type: application/vnd.kafka.json.v2+json" \
        #      --data '{"records":[{"value":{"greeting":"hi"}}]}' localhost:8082/topics/hello
        r = httpx.post(
            f"{base}/topics/hello",
            content=b'{"records":[{"value":{"greeting":"hi"}},{"key":"k","value":"v"}]}',
            headers={"Content-Type": "application/vnd.kafka.json.v2+json"},
        )
        assert r.status_code == 200, r.text
        offsets = r.json()["offsets"]
        assert [o["error_code"] for o in offsets] == [None, None]
        r = httpx.post(
            f"{base}/topics/hello/partitions/1",
            json={"records": [{"value": base64.b64encode(b"raw bytes").decode()}]},
        )
        assert r.status_code == 200, r.text
        assert r.json()["offsets"][0]["partition"] == 1
        r = httpx.post(
            f"{base}/v3/clusters/{cluster_id}/topics/hello/records",
            json={"partition_id": 0, "value": {"type": "STRING", "data": "from v3"}},
        )
        assert r.status_code == 200
        report = r.json()
        assert (report["error_code"], report["partition_id"]) == (200, 0)
        # The data lives where the newcomer started the server, and the partition's
        # end offset counts every record produced to it.
        assert (cwd / "data").is_dir()
        assert any((cwd / "data").rglob("*.seg"))
        r = httpx.get(f"{base}/topics/hello/partitions/0/offsets")
        assert r.status_code == 200
        produced_to_0 = 1 + sum(1 for o in offsets if o["partition"] == 0)
        assert r.json()["end_offset"] == produced_to_0
    finally:
        proc.stop()
    assert "Traceback" not in proc.output()


def test_serve_runs_the_janitors_old_data_goes_and_its_objects_are_collected(
    tmp_path: Path,
) -> None:
    """``lakelog serve`` runs retention and garbage collection on its own (the default
    ``--janitors all``; the same flags as ``lakelog coordinator`` shorten their schedules):
    with ``retention.ms=1000`` the records produced go, log-start reaches the end, and
    the segment objects that held them are deleted from ./data; nothing else is asked."""
    cwd = tmp_path / "retention"
    intervals = ["--janitor-interval", "retention=0.5", "--janitor-interval", "gc=0.5"]
    proc, base = serve(tmp_path, cwd, "--gc-grace-s", "1", *intervals)
    try:
        cluster_id = httpx.get(f"{base}/v3/clusters").json()["data"][0]["cluster_id"]
        r = httpx.post(
            f"{base}/v3/clusters/{cluster_id}/topics",
            json={
                "topic_name": "short",
                "partitions_count": 1,
                "configs": [{"name": "retention.ms", "value": "1000"}],
            },
        )
        assert r.status_code == 201, r.text
        for i in range(3):
            r = httpx.post(
                f"{base}/topics/short",
                json={"records": [{"value": base64.b64encode(b"old %d" % i).decode()}]},
            )
            assert r.status_code == 200, r.text
        segments = set((cwd / "data").rglob("*.seg"))
        assert len(segments) == 3

        def offsets() -> dict[str, int]:
            r = httpx.get(f"{base}/topics/short/partitions/0/offsets")
            assert r.status_code == 200, r.text
            body: dict[str, int] = r.json()
            return body

        deadline = time.monotonic() + 60
        while offsets()["beginning_offset"] < 3 or segments & set((cwd / "data").rglob("*.seg")):
            assert time.monotonic() < deadline, (offsets(), proc.output()[-3000:])
            time.sleep(0.2)
        assert offsets() == {"beginning_offset": 3, "end_offset": 3}
        metrics = httpx.get(f"{base}/metrics").text
        assert 'lakelog_janitor_runs_total{janitor="retention",outcome="ok"}' in metrics
        assert 'lakelog_janitor_runs_total{janitor="gc",outcome="ok"}' in metrics
    finally:
        proc.stop()
    assert "Traceback" not in proc.output()
