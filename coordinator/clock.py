"""The coordinator's wall clock: ``now()``, epoch seconds, everything it stamps or compares.

Every wall-clock time the coordinator writes to the metadata database or compares with
one there (janitor leases and runs, GC's unreferenced stamps and grace, write leases,
retention's cut-off, consumer sessions and fetch leases, topic and producer stamps)
comes from ``now()``. Intervals measured inside one process use ``time.monotonic()``
and are not the clock's business.

A test seam: ``LAKELOG_CLOCK_SKEW_MS`` (read once, at import; default 0) offsets the
clock by that many milliseconds, + or -, as an unsynchronised host would be. The chaos
checker restarts a coordinator with a skew now and then (``tests/chaos/faults.py``).

What skew lakelog tolerates: coordinators on one database compare each other's
stamps, so what matters is the difference between two coordinators' clocks, D (agents
stamp only what they hand over: LogAppendTime and record timestamps, Idempotency-Key
expiry). Within the bound below nothing goes wrong; D shifts a few deadlines by D:

- janitor leases (``coordinator.janitors.leases``): the holder renews every TTL/3, so a
  rival whose clock runs D ahead sees the lease expire D early; the lease stays
  exclusive while D < 2/3 TTL (minus a renewal's latency): TTL 60 s by default, 10 s
  in the chaos run (D < ~6 s);
- garbage collection: an object stamped unreferenced by one coordinator and deleted by
  another waits GC grace minus D, so GC grace must exceed the longest read or flush in
  flight plus D (30 s and a few seconds in the chaos run); write leases likewise, and
  orphans, whose age is the object store's modification time (the store's clock, so
  there D is this coordinator's offset from the store);
- consumer sessions and REST fetch leases: a member stamped by one and expired by the
  other loses D of its session timeout: a spurious rebalance when D approaches it (the
  chaos consumers' 6 s: D < 3 s keeps them stable), never a duplicate (positions are
  compare-and-set);
- retention: records go D early (or late): a retention promise off by D, nothing else;
- LogAppendTime is the agent's clock (``index.log``), not skewed here.

So: D well under every one of lease TTL x 2/3, GC grace minus the longest read, and a
consumer session timeout / 2; NTP keeps real hosts within milliseconds. The chaos run
skews one coordinator by 1-3 s (+ or -) at a time, the other at 0.
"""

from __future__ import annotations

import os
import time


def _skew_s() -> float:
    raw = os.environ.get("LAKELOG_CLOCK_SKEW_MS", "").strip()
    return int(raw) / 1000.0 if raw else 0.0


#: This process's offset from the host clock, seconds (``LAKELOG_CLOCK_SKEW_MS``).
SKEW_S = _skew_s()


def now() -> float:
    """The coordinator's wall clock, epoch seconds (the host clock plus ``SKEW_S``)."""
    return time.time() + SKEW_S
