"""``python -m tests.chaos [run] --minutes M --profile P --seed S [--out DIR]`` runs the
cluster under chaos and checks it; ``python -m tests.chaos check HISTORY`` checks a
history again. Both print a table (each anomaly with the part of the history that
shows it: the operations it names, those of its topic and partition around them, the
faults meanwhile) and, last, one JSON summary line (counts, every anomaly, the seed,
the history's path) and exit 1 on any anomaly.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.chaos.checker import check, excerpt
from tests.chaos.history import read_history

#: Anomalies printed with their excerpt of the history (all are listed).
EXCERPTS = 10


def table(summary: dict[str, Any]) -> str:
    lines = ["operation            ok    fail  info  pending"]
    for op, c in summary["ops"].items():
        lines.append(
            f"{op:<18} {c.get('ok', 0):>5} {c.get('fail', 0):>6} {c.get('info', 0):>5}"
            f" {c.get('pending', 0):>8}"
        )
    lines.append("records: " + ", ".join(f"{k} {v}" for k, v in summary["records"].items()))
    lines.append("faults: " + (", ".join(f"{k} {v}" for k, v in summary["faults"].items()) or "0"))
    lines.append(
        "anomalies: "
        + (", ".join(f"{k} {v}" for k, v in summary["anomaly_counts"].items()) or "none")
    )
    events = list(read_history(Path(summary["history"]))) if summary["anomalies"] else []
    for n, a in enumerate(summary["anomalies"]):
        lines.append(f"  {json.dumps(a)[:400]}")
        if n < EXCERPTS:  # the part of the history that shows it
            lines += [f"      {json.dumps(e)[:300]}" for e in excerpt(events, a)]
    n_faults = sum(summary["faults"].values())
    n_anomalies = sum(summary["anomaly_counts"].values())
    lines.append(
        f"chaos: {summary['operations']} operations, {n_faults} faults, {n_anomalies} anomalies"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["check"]:
        path = Path(argv[1])
        summary: dict[str, Any] = {"history": str(path), **check(read_history(path)).summary()}
    else:
        if argv[:1] == ["run"]:
            argv = argv[1:]
        from tests.chaos.run import PROFILES, Params, run

        parser = argparse.ArgumentParser(prog="python -m tests.chaos")
        parser.add_argument("--minutes", type=float, default=10.0)
        parser.add_argument("--profile", choices=PROFILES, default="postgres")
        parser.add_argument("--seed", type=int, default=None, help="default: the time")
        parser.add_argument("--out", type=Path, default=None, help="default: a new temp dir")
        parser.add_argument(
            "--break",
            dest="breaks",
            action="append",
            default=[],
            help="LAKELOG_CHAOS_BREAK for agents and coordinators: dedupe, stale_cache, no_fencing",
        )
        args = parser.parse_args(argv)
        seed = args.seed if args.seed is not None else int(time.time()) % 100000
        out = args.out or Path(tempfile.mkdtemp(prefix=f"chaos-{seed}-"))
        breaks = {"LAKELOG_CHAOS_BREAK": ",".join(args.breaks)} if args.breaks else {}
        summary = run(Params(seed, args.minutes, args.profile, out, breaks))
    print(table(summary), file=sys.stderr)
    print(json.dumps(summary))
    return 1 if summary["anomaly_counts"] else 0


if __name__ == "__main__":
    sys.exit(main())
