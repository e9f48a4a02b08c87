"""Gang pods per second, kube-scheduler 1.37 (gang plugin, ``GenericWorkload``) against the
operator, on the same whole-GPU gangs and twin groups of identical KWOK nodes; reports,
asserts nothing (the integration test ``test_gangs_side_by_side.py`` checks the outcomes).

Run with the control plane's binaries (``make control-plane-bins``)::

    export VGPU_CONTROL_PLANE_BIN_DIR=$(hack/control-plane/build.sh --print-dir | tail -1)
    PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_gangs_side_by_side.py --nodes 50 --gangs 100

One control plane; per side, ``--nodes`` nodes of 8 ``nvidia.com/gpu`` and ``--gangs``
PodGroups of four members (``minCount`` 4), one whole GPU each, so that every gang fits.
Every PodGroup and pod is written first, with neither scheduler running; then one scheduler
is started and the clock runs from its start to the moment every member is bound (polled
every 50 ms), so each figure includes that scheduler's start (a second or so of list and
sync). The sides run one after the other, never together. On a shared machine the figures
move with the other load; compare them within one run.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

_TESTS = Path(__file__).resolve().parents[1]
if str(_TESTS) not in sys.path:
    sys.path.append(str(_TESTS))

from integration import gang_twin as twin  # noqa: E402  (needs the path above)
from integration import operator_env as env  # noqa: E402

from vgpu_operator.handlers.runtime import OperatorThread  # noqa: E402
from vgpu_operator.testing.controlplane import ControlPlane  # noqa: E402

MEMBERS = 4
GPUS_PER_NODE = 8


def _wait_all_bound(cp: ControlPlane, side: twin.Twin, pods: int, timeout_s: float) -> None:
    """Return once ``pods`` pods of the side's namespace are bound."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if sum(twin.outcome(cp, side.namespace).values()) >= pods:
            return
        time.sleep(0.05)
    raise AssertionError(f"{side.scheduler}: not every member bound after {timeout_s} s")


def _prepare(cp: ControlPlane, side: twin.Twin, nodes: int, gangs: int) -> int:
    twin.make_nodes(cp, side, nodes, GPUS_PER_NODE)
    twin.create_gangs(cp, side, (twin.Gang(f"g{i}", MEMBERS, MEMBERS) for i in range(gangs)))
    return gangs * MEMBERS


def run(nodes: int, gangs: int, timeout_s: float = 300.0) -> dict[str, float]:
    """pods/s of each side."""
    if gangs * MEMBERS > nodes * GPUS_PER_NODE:
        raise ValueError("every gang must fit: more GPUs or fewer gangs")
    figures: dict[str, float] = {}
    with ControlPlane(kwok=True) as cp:
        tag = uuid.uuid4().hex[:6]
        theirs = twin.Twin(f"ks-{tag}", twin.KUBE_SCHEDULER, f"ks-{tag}", inventory=False)
        ours_ns = f"op-{tag}"
        cp.ensure_namespace(ours_ns)
        ours = twin.Twin(ours_ns, env.new_scheduler(cp, ours_ns), ours_ns, inventory=True)
        cp.ensure_namespace(theirs.namespace)

        pods = _prepare(cp, theirs, nodes, gangs)
        start = time.monotonic()
        cp.start_scheduler()
        _wait_all_bound(cp, theirs, pods, timeout_s)
        figures["kube-scheduler"] = pods / (time.monotonic() - start)
        cp.stop_scheduler()

        pods = _prepare(cp, ours, nodes, gangs)
        start = time.monotonic()
        with OperatorThread(env.options(cp, ours_ns)):
            _wait_all_bound(cp, ours, pods, timeout_s)
            figures["operator"] = pods / (time.monotonic() - start)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=20)
    parser.add_argument("--gangs", type=int, default=40)
    args = parser.parse_args()
    figures = run(args.nodes, args.gangs)
    for side, rate in figures.items():
        shape = f"{args.gangs} gangs of {MEMBERS}, {args.nodes} nodes"
        print(f"{side:15s} {rate:8.1f} gang pods/s ({shape})")
    print(f"ratio operator / kube-scheduler: {figures['operator'] / figures['kube-scheduler']:.2f}")


if __name__ == "__main__":
    main()
