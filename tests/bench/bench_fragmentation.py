"""Latency of one decision under the ``fragmentation`` policy at 1,000 nodes (issue 37).

The clusters and the timing of ``bench_scheduling`` (half-loaded nodes of 8 cards; each
decision rolled back before the next, which changes the node it was on: the next
decision measures that node again, as after a Binding), with the pods asking for the
``fragmentation`` node and GPU policies. Aim: p99 at most 1 ms at 1,000 nodes. Run
standalone (``PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_fragmentation.py``) or
through ``make bench``; reports, asserts nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

from bench_scheduling import (  # noqa: E402
    AFTER_A_CHANGE,
    RUNS,
    SAME,
    _pending,
    _row,
    build_cluster,
    time_case,
)

from vgpu_operator import names  # noqa: E402

AIM_P99_MS = {1_000: 1.0}
SIZES = (1_000,)
_FRAG = {
    names.NODE_SCHEDULER_POLICY: "fragmentation",
    names.GPU_SCHEDULER_POLICY: "fragmentation",
}
CASES = (
    ("1 GPU 8 GiB 20 cores", _pending("frag-one", 1, 8192, 20, **_FRAG), SAME),
    (
        "1 GPU 8 GiB 20 cores, after a change",
        _pending("frag-one-c", 1, 8192, 20, **_FRAG),
        AFTER_A_CHANGE,
    ),
    ("2 GPUs 8 GiB 20 cores", _pending("frag-two", 2, 8192, 20, **_FRAG), SAME),
    ("8 GPUs 30 GiB 20 cores", _pending("frag-eight", 8, 30000, 20, **_FRAG), SAME),
)


def run(sizes: tuple[int, ...] = SIZES) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for nodes in sizes:
        state = build_cluster(nodes)
        for name, pod, between in CASES:
            timings, cpu = time_case(state, pod, RUNS, True, between)
            case = f"fragmentation {nodes} nodes: {name}"
            rows.append(_row(case, timings, AIM_P99_MS.get(nodes), cpu))
    return rows


if __name__ == "__main__":
    for row in run():
        print(row, file=sys.stdout)
