"""Run ``python -m service.cli ...`` with cProfile switched by signals (bench/rest_produce.py).

``python bench/tools/profiled_agent.py OUT serve ...`` (not a benchmark: ``make bench`` runs
bench/*.py only): the profiler starts off; SIGUSR1 switches it
on, SIGUSR2 switches it off and writes the stats to OUT. (``python -m cProfile`` writes
nothing here: uvicorn re-raises the SIGTERM it stopped on, which ends the process before
cProfile's dump.) cProfile sees the main thread only: the event loop serving requests. The
garbage collector's passes (per generation: count, CPU seconds) go to OUT.gc.json.
"""

from __future__ import annotations

import cProfile
import gc
import json
import runpy
import signal
import sys
import time
from pathlib import Path
from typing import Any

out = sys.argv.pop(1)
# CPU time of this thread, not wall time: on a shared machine a descheduled thread would
# charge its wait to whatever function it was in.
profiler = cProfile.Profile(time.thread_time)


# The garbage collector's passes while profiled, per generation: count and CPU seconds
# (cProfile charges a pass to whichever function's allocation set it off).
gc_passes = [[0, 0.0], [0, 0.0], [0, 0.0]]
gc_started = 0.0
profiling = False


def on_gc(phase: str, info: dict[str, int]) -> None:
    global gc_started
    if not profiling:
        return
    if phase == "start":
        gc_started = time.thread_time()
    else:
        gen = gc_passes[info["generation"]]
        gen[0] += 1
        gen[1] += time.thread_time() - gc_started


def start(*_: Any) -> None:
    global profiling
    profiling = True
    profiler.enable()


def stop(*_: Any) -> None:
    global profiling
    profiler.disable()
    profiling = False
    profiler.dump_stats(out)
    Path(out + ".gc.json").write_text(
        json.dumps(
            {f"gen{g}": {"passes": n, "cpu_s": round(s, 4)} for g, (n, s) in enumerate(gc_passes)}
        )
    )


gc.callbacks.append(on_gc)


signal.signal(signal.SIGUSR1, start)
signal.signal(signal.SIGUSR2, stop)
sys.argv[0] = "service.cli"
runpy.run_module("service.cli", run_name="__main__", alter_sys=True)
