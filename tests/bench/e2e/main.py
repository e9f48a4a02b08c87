"""The end-to-end bench, start to finish: ``python tests/bench/run_e2e.py`` (``make bench``).

Environment (each also a flag): BENCH_NODES (1000), BENCH_SCALE (1.0: pod counts are
multiplied by it), BENCH_5000 (0: also the 5,000-node run), BENCH_BIG (0: also a run at
that many nodes, 15000 for issue 24's), BENCH_BACKLOG (5000: the standing backlog of
unfittable pods), BENCH_FAULTS (1), BENCH_OPERATOR_ARGS (extra ``vgpu-operator run``
flags, e.g. the bind gate's), BENCH_REPEATS (3) and BENCH_BURST (the repeated runs and
their size), BENCH_BIG_BURST, BENCH_BIG_HEARTBEAT_S and BENCH_BIG_KWOK_LEASE_S (the big
cluster on a small machine), BENCH_DRA_NODES, BENCH_DRA_PODS, BENCH_DRA_RATE and
BENCH_DRA_CHURN (the DRA part); tests/bench/e2e/README.md says what each does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import yaml

from e2e import (
    ceiling,
    counting,
    cpu,
    dra,
    faults,
    fleet,
    gate,
    memory,
    procs,
    report,
    runs,
    workloads,
)
from e2e.api import Api, ApiError, gather_limited
from e2e.tracking import Tracker
from vgpu_operator import names
from vgpu_operator.control.feed import DEFAULT_CONFIG_KEY
from vgpu_operator.control.options import DEFAULT_CONFIG_MAP
from vgpu_operator.demo.nodes import install_crd
from vgpu_operator.testing.controlplane import ClientCredentials, ControlPlane, find_tool

OPERATOR_NAMESPACE = "vgpu-operator"
#: The scheduler name of a backlog's pods until the operator is told to serve it.
HELD_SCHEDULER = "vgpu-bench-held"
RAISED_QPS = (1000, 2000)
#: Where the pod waits whose bind times a restarted operator.
PROBE_NAMESPACE = "bench-probe"
PARTS = frozenset({"baselines", "operator", "restart", "faults", "gate", "dra"})
#: Operator runs no aim's ratio uses: run once, not ``--repeats`` times.
RUN_ONCE = frozenset({"multi", "selected"})


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def options() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--nodes",
        type=int,
        default=_env_int("BENCH_NODES", 1000),
        help="nodes of the main cluster (0: none, e.g. for --big alone)",
    )
    parser.add_argument("--scale", type=float, default=float(os.environ.get("BENCH_SCALE", 1.0)))
    parser.add_argument("--with-5000", type=int, default=_env_int("BENCH_5000", 0))
    parser.add_argument(
        "--big",
        type=int,
        default=_env_int("BENCH_BIG", 0),
        help="also a cluster of this many nodes (0: none): kube-scheduler and the operator "
        "on one whole-GPU burst, the operator's peak RSS and a restart to its first bind",
    )
    parser.add_argument(
        "--backlog",
        type=int,
        default=_env_int("BENCH_BACKLOG", 5000),
        help="unfittable pods left waiting beside a fractional burst (0: no such run)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=_env_int("BENCH_REPEATS", 3),
        help="runs of each burst, backlog and ceiling whose ratio an aim uses (median and "
        "spread reported)",
    )
    parser.add_argument(
        "--burst",
        type=int,
        default=_env_int("BENCH_BURST", 0),
        help="pods per whole-GPU or fractional burst, backlog and ceiling (0: 8000 x scale, "
        "at most one per card): long enough that a repeat differs by under 10 %%",
    )
    parser.add_argument(
        "--big-burst",
        type=int,
        default=_env_int("BENCH_BIG_BURST", 2000),
        help="pods per burst in the --big cluster (fewer: a 2-core machine)",
    )
    parser.add_argument(
        "--big-heartbeat",
        type=float,
        default=float(os.environ.get("BENCH_BIG_HEARTBEAT_S", 0)),
        help="--heartbeat for the --big cluster (0: no Lease renewals, which at 15,000 nodes "
        "are 500 writes/s; the operator then runs with --inventory-timeout=0)",
    )
    parser.add_argument(
        "--dra-nodes",
        type=int,
        default=_env_int("BENCH_DRA_NODES", 500),
        help="the DRA part's throughput and steady nodes",
    )
    parser.add_argument(
        "--dra-pods",
        type=int,
        default=_env_int("BENCH_DRA_PODS", 0),
        help="pods per DRA throughput run (0: 2000 x scale)",
    )
    parser.add_argument(
        "--dra-rate",
        type=float,
        default=float(os.environ.get("BENCH_DRA_RATE", 50)),
        help="claims per second of the DRA steady run (30 s x scale of them)",
    )
    parser.add_argument(
        "--dra-churn",
        type=int,
        default=_env_int("BENCH_DRA_CHURN", 1),
        help="0: leave out the DRA churn (placement quality; the longest DRA run)",
    )
    parser.add_argument(
        "--big-kwok-lease",
        type=int,
        default=_env_int("BENCH_BIG_KWOK_LEASE_S", 0),
        help="KWOK's node Lease duration in the --big cluster (the longer, the fewer "
        "renewals); 0: 40 s per 1,000 nodes",
    )
    parser.add_argument("--faults", type=int, default=_env_int("BENCH_FAULTS", 1))
    parser.add_argument("--operator-args", default=os.environ.get("BENCH_OPERATOR_ARGS", ""))
    parser.add_argument(
        "--heartbeat",
        type=float,
        default=float(os.environ.get("BENCH_HEARTBEAT_S", 30.0)),
        help="seconds between renewals of each node's Lease, the heartbeat (the agent's 30); "
        "0: none, and the operator runs with --inventory-timeout=0",
    )
    parser.add_argument(
        "--only",
        default=os.environ.get("BENCH_ONLY", ""),
        help="comma list of parts to run: baselines, operator, restart, faults, gate, dra",
    )
    parser.add_argument("--docs", type=Path, default=None, help="write docs/benchmarks.md here")
    parser.add_argument(
        "--render-only",
        action="store_true",
        help="run nothing: write --docs again from the saved --results",
    )
    parser.add_argument("--results", type=Path, default=Path(".bench/e2e.json"))
    return parser.parse_args()


def _scaled(count: int, scale: float, at_least: int = 10) -> int:
    return max(at_least, round(count * scale))


def _burst(args: argparse.Namespace, bench: runs.Bench) -> int:
    """Pods per burst of the repeated runs: ``--burst``, or 8,000 x scale, at most one
    per card (a whole-GPU burst fills the cluster at most once)."""
    wanted = getattr(args, "burst", 0) or _scaled(8000, args.scale)
    return min(wanted, len(bench.cards))


def _repeats(args: argparse.Namespace) -> range:
    return range(max(1, getattr(args, "repeats", 1)))


class Session:
    """One cluster: the control plane, nodes, the operator and the runs on them."""

    def __init__(
        self, cp: ControlPlane, args: argparse.Namespace, nodes: int, workdir: Path
    ) -> None:
        self.cp = cp
        self.args = args
        self.node_count = nodes
        self.workdir = workdir  # logs, configs and the audit log; kept after a failure
        self.creds = {
            user: cp.create_client_credentials(user, ("system:masters",))
            for user in ("bench", "vgpu-operator", "kube-scheduler", "bench-ceiling")
        }
        self.operator: procs.Child | None = None
        self.operator_port = 0
        self.operator_kubeconfig = self.creds["vgpu-operator"].kubeconfig_path
        self.gate_args: list[str] = []  # gate.py turns the allocation gate on
        self.rss_samples: list[tuple[float, float, float]] = []
        self.sampler: procs.Sampler | None = None
        self.bench: runs.Bench | None = None
        #: Seconds between Lease renewals (0: none, and no inventory timeout).
        self.heartbeat: float = getattr(args, "heartbeat", 30.0)
        self.footprint = memory.Footprint(nodes)
        self.warm_ups = 0
        #: Figures as numbers for the capacity model (``report.Cluster.measures``).
        self.measures: dict[str, float] = {}

    # -- the operator ---------------------------------------------------------------------

    def operator_scheduler(self) -> runs.Scheduler:
        return runs.Scheduler(
            label="vgpu-operator",
            user="vgpu-operator",
            pid=lambda: self.operator.pid if self.operator and self.operator.alive else None,
            metrics_url=lambda: (
                f"http://127.0.0.1:{self.operator_port}/metrics" if self.operator else None
            ),
        )

    async def start_operator(self) -> float:
        """Start the operator; seconds until it answers /readyz."""
        extra = [*shlex.split(self.args.operator_args), *self.gate_args]
        if not self.heartbeat:
            extra.insert(0, "--inventory-timeout=0")  # nothing moves the heartbeats
        child, port = procs.operator(
            self.operator_kubeconfig, self.workdir, OPERATOR_NAMESPACE, extra
        )
        child.start()
        self.operator, self.operator_port = child, port
        ready = await child.wait_http(f"http://127.0.0.1:{port}/readyz", 300)
        self.sampler = procs.Sampler(child.pid)
        self.sampler.start()
        assert self.bench is not None
        self.bench.rss = self.sampler
        return ready

    async def warm_up(self) -> None:
        """Place one pod and wait for it: /readyz comes before the operator has read the
        cluster, and the first run should measure placing, not starting (the restart
        run measures that)."""
        assert self.bench is not None
        namespace = "bench-warmup"
        await self.bench.api.ensure_namespace(namespace)
        tracker = Tracker(self.bench.api, namespace)
        tracker.start()
        # A new name each time: KWOK may still delete the last one's name (runs.Bench.namespace).
        self.warm_ups += 1
        probe = workloads.fractional(1024, 1)(namespace, self.warm_ups)
        await self.bench.api.create(f"/api/v1/namespaces/{namespace}/pods", probe)
        await tracker.wait(lambda: bool(tracker.bound), 300)
        await tracker.stop()
        await self.bench.clean(namespace)

    async def settled_rss(self) -> float:
        """The running operator's RSS (MiB) once it has been idle ``memory.SETTLE_S``."""
        assert self.operator is not None
        await asyncio.sleep(memory.SETTLE_S)
        return procs.rss_mib(self.operator.pid)

    async def empty_rss(self) -> None:
        """Start the operator before the cluster has nodes, read its RSS, stop it."""
        extra = [*shlex.split(self.args.operator_args), "--inventory-timeout=0"]
        child, port = procs.operator(
            self.operator_kubeconfig, self.workdir, OPERATOR_NAMESPACE, extra
        )
        child.start()
        try:
            await child.wait_http(f"http://127.0.0.1:{port}/readyz", 300)
            await asyncio.sleep(memory.SETTLE_S)
            self.footprint.empty_mib = procs.rss_mib(child.pid)
        finally:
            await asyncio.to_thread(child.stop)

    async def serve(self, scheduler_name: str) -> None:
        """Set the scheduler name the operator serves, through its device-config
        ConfigMap (which it follows without a restart)."""
        assert self.bench is not None
        api = self.bench.api
        text = f"scheduler:\n  schedulerName: {scheduler_name}\n"
        path = f"/api/v1/namespaces/{OPERATOR_NAMESPACE}/configmaps"
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": DEFAULT_CONFIG_MAP, "namespace": OPERATOR_NAMESPACE},
            "data": {DEFAULT_CONFIG_KEY: text},
        }
        try:
            await api.create(path, body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            await api.merge_patch(f"{path}/{DEFAULT_CONFIG_MAP}", {"data": body["data"]})

    async def stop_operator(self) -> None:
        if self.sampler is not None:
            await self.sampler.stop()
            self.rss_samples.extend(self.sampler.samples)
            self.sampler = None
        if self.operator is not None:
            await asyncio.to_thread(self.operator.stop)
            self.operator = None

    # -- kube-scheduler -------------------------------------------------------------------

    async def kube_scheduler_run(
        self,
        name: str,
        qps: int,
        burst: int,
        count: int,
        rate: float | None = None,
        workload: workloads.Workload | None = None,
    ) -> runs.Result:
        assert self.bench is not None
        binary = find_tool("kube-scheduler")
        child, _port = procs.kube_scheduler(
            binary, self.creds["kube-scheduler"].kubeconfig_path, self.workdir, qps, burst
        )
        child.start()
        try:
            await asyncio.sleep(5.0)  # its informers sync; nothing to place yet
            child.check()
            scheduler = runs.Scheduler(
                label=f"kube-scheduler (QPS {qps}, burst {burst})",
                user="kube-scheduler",
                pid=lambda: child.pid if child.alive else None,
            )
            workload = workload or workloads.Workload(
                name,
                "whole-GPU pods via nvidia.com/gpu",
                count,
                workloads.whole(workloads.KUBE_SCHEDULER),
            )
            if rate:
                return await runs.run(self.bench, name, scheduler, workload, "steady", rate=rate)
            return await runs.run(self.bench, name, scheduler, workload)
        finally:
            await asyncio.to_thread(child.stop)


async def setup(
    session: Session, *, measure_empty: bool = False
) -> tuple[runs.Bench, asyncio.Event, asyncio.Task[None], float]:
    cp = session.cp
    api = Api.for_plane(cp, session.creds["bench"])
    await asyncio.to_thread(install_crd, cp)
    await api.ensure_namespace(OPERATOR_NAMESPACE)
    if measure_empty:
        await session.empty_rss()  # before the nodes: the RSS per 1,000 nodes' base
    started = time.time()
    nodes = await asyncio.to_thread(fleet.plan, session.node_count)
    await fleet.create(api, nodes)
    setup_s = time.time() - started
    stop = asyncio.Event()
    interval = session.heartbeat
    beats = asyncio.get_running_loop().create_task(
        fleet.heartbeats(api, nodes, stop, interval) if interval else _until(stop)
    )
    bench = runs.Bench(
        cp=cp,
        api=api,
        nodes=nodes,
        cards=fleet.card_limits(nodes),
        gpus_per_node={n.name: len(n.cards) for n in nodes},
        workdir=session.workdir,
        audit=counting.AuditLog(session.workdir / "audit.log"),
    )
    session.bench = bench
    print(
        f"[bench] {len(nodes)} nodes, {len(bench.cards)} cards ready in {setup_s:.0f}s", flush=True
    )
    return bench, stop, beats, setup_s


async def _until(stop: asyncio.Event) -> None:
    await stop.wait()


def control_plane(bench_dir: Path, kwok_node_lease_s: int = 40) -> ControlPlane:
    """The tests' control plane, with a write-only audit log for counting writes per user.
    ``kwok_node_lease_s``: how long KWOK's node Leases last (renewed every quarter of it)."""
    policy = bench_dir / "audit-policy.yaml"
    policy.write_text(counting.AUDIT_POLICY)
    return ControlPlane(
        kwok=True,
        base_dir=bench_dir,
        kwok_node_lease_s=kwok_node_lease_s,
        extra_apiserver_args=(
            f"--audit-policy-file={policy}",
            "--audit-log-format=json",
            "--audit-log-maxsize=0",
            f"--audit-log-path={bench_dir / 'audit.log'}",
        ),
    )


async def baselines(session: Session, bench: runs.Bench, scale: float) -> None:
    count = _burst(session.args, bench)
    # kube-scheduler as installed is no aim's ratio: once, at the base size (at QPS 50
    # a burst of thousands would take minutes).
    await session.kube_scheduler_run("ks-default", 50, 100, min(_scaled(2000, scale), count))
    make, unfit = workloads.mixed_unfit(10, whole_gpus=True, scheduler=workloads.KUBE_SCHEDULER)
    for repeat in _repeats(session.args):
        bench.repeat = repeat
        binder = Api.for_plane(session.cp, session.creds["bench-ceiling"], connections=64)
        try:
            await ceiling.ceiling(bench, binder, count)
        finally:
            await binder.close()
        await session.kube_scheduler_run("ks-raised", *RAISED_QPS, count)
        # The same whole-GPU burst with one pod in ten asking for more cards than any
        # node has: what unschedulable pods cost kube-scheduler (its queueing hints set
        # them aside).
        mixed = workloads.Workload(
            "ks-unfit", "whole-GPU pods, 1 in 10 unfittable", count, make, unfit
        )
        await session.kube_scheduler_run("ks-unfit", *RAISED_QPS, count, workload=mixed)
    bench.repeat = None
    # The same arrivals as the operator's steady 100/s run (whole-GPU pods here): what
    # this cluster lets a scheduler hold.
    steady = min(_scaled(100 * 30, scale, at_least=500), len(bench.cards))
    await session.kube_scheduler_run("ks-steady-100", *RAISED_QPS, steady, rate=100)


async def watched_ceiling(session: Session, bench: runs.Bench, scale: float) -> None:
    """The ceiling again with the operator running: it leaves the pods alone, but every
    Binding and status update reaches its watches, as a scheduler's must."""
    count = _burst(session.args, bench)
    for repeat in _repeats(session.args):
        bench.repeat = repeat
        binder = Api.for_plane(session.cp, session.creds["bench-ceiling"], connections=64)
        try:
            op = session.operator_scheduler()
            await ceiling.ceiling(bench, binder, count, name="ceiling-watched", watcher=op)
        finally:
            await binder.close()
    bench.repeat = None


async def operator_runs(session: Session, bench: runs.Bench, scale: float) -> None:
    op = session.operator_scheduler()
    cards = len(bench.cards)
    models = sorted(fleet.models(bench.nodes))
    # One card per node: each UUID-selected pod has its card to itself.
    uuids = [node.cards[0]["uuid"] for node in bench.nodes]
    make_unfit, is_unfit = workloads.mixed_unfit(10)
    make_whole_unfit, is_whole_unfit = workloads.mixed_unfit(10, whole_gpus=True)
    whole_count = _burst(session.args, bench)
    # The fractional bursts are the same size (4-5 of them fit on every card).
    frac_count = getattr(session.args, "burst", 0) or _scaled(8000, scale)
    plan = [
        workloads.Workload("whole", "whole-GPU pods", whole_count, workloads.whole()),
        workloads.Workload(
            "whole-unfit",
            "whole-GPU pods, 1 in 10 unfittable",
            whole_count,
            make_whole_unfit,
            is_whole_unfit,
        ),
        workloads.Workload(
            "fractional",
            "fractional pods (8 GiB, 20 cores)",
            frac_count,
            workloads.fractional(),
        ),
        workloads.Workload(
            "multi",
            "4-GPU topology-aware pods",
            min(_scaled(500, scale), cards // 4),
            workloads.multi(4),
        ),
        workloads.Workload(
            "selected",
            "type- and UUID-selected pods",
            _scaled(800, scale),
            workloads.selected(models, uuids),
        ),
        workloads.Workload(
            "unfit",
            "fractional pods, 1 in 10 unfittable",
            frac_count,
            make_unfit,
            is_unfit,
        ),
    ]
    for repeat in _repeats(session.args):
        for workload in plan:
            once = workload.name in RUN_ONCE
            if once and repeat:
                continue
            # Runs no aim's ratio uses are not repeated (nor numbered).
            bench.repeat = None if once else repeat
            await runs.run(bench, workload.name, op, workload)
            if workload.name == "whole":
                await whole_backlog(session, bench, workload.count)
                await split_pair(session, bench, workload.count)
        if session.args.backlog:
            fractional = next(w for w in plan if w.name == "fractional")
            await beside_backlog(session, bench, fractional, session.args.backlog)
    bench.repeat = None
    for rate in (50, 100, 200):
        count = _scaled(rate * 30, scale, at_least=rate * 5)
        workload = workloads.Workload(
            f"steady-{rate}",
            f"fractional pods arriving at {rate}/s",
            count,
            workloads.fractional(2048, 5),
        )
        await runs.run(bench, workload.name, op, workload, "steady", rate=rate)


async def whole_backlog(
    session: Session, bench: runs.Bench, count: int, name: str = "whole-backlog"
) -> None:
    """The whole-GPU burst again, with every pod waiting before the operator takes them
    up (it serves their scheduler name from the release on), as the ceiling's pods are."""
    backlog = workloads.Workload(
        name,
        "whole-GPU pods already waiting",
        count,
        workloads.whole(HELD_SCHEDULER),
    )

    async def release() -> None:
        await session.serve(HELD_SCHEDULER)

    try:
        await runs.backlog(bench, backlog.name, session.operator_scheduler(), backlog, release)
    finally:
        await session.serve(names.SCHEDULER_NAME)
        await session.warm_up()  # placed once the operator serves its own name again


async def beside_backlog(
    session: Session, bench: runs.Bench, burst: workloads.Workload, backlog: int
) -> None:
    """The fractional burst again, with ``backlog`` unfittable pods waiting the whole time
    (each already told why it waits): what a standing backlog costs the pods that fit."""
    namespace = "bench-standing"
    api = bench.api
    await api.ensure_namespace(namespace)
    tracker = Tracker(api, namespace)
    tracker.start()
    started = time.time()

    async def create(index: int) -> None:
        body = workloads.unfittable(namespace, index)
        await api.create(f"/api/v1/namespaces/{namespace}/pods", body)

    await gather_limited(32, [create(i) for i in range(backlog)])
    told = await tracker.wait(lambda: len(tracker.waiting) >= backlog, 600)
    await tracker.stop()
    settled_s = time.time() - started
    print(
        f"[bench] {backlog} unfittable pods waiting, {len(tracker.waiting)} told why, "
        f"in {settled_s:.0f} s",
        flush=True,
    )
    try:
        beside = workloads.Workload(
            "fractional-beside-backlog",
            f"fractional pods beside {backlog:,} unfittable ones",
            burst.count,
            burst.make,
        )
        result = await runs.run(bench, beside.name, session.operator_scheduler(), beside)
        result.extra["backlog"] = backlog
        result.extra["backlog_told"] = told
    finally:
        await bench.clean(namespace)


async def split_pair(session: Session, bench: runs.Bench, count: int) -> None:
    """The ceiling and the backlog again, with the control plane (API server, etcd,
    KWOK) on one half of the CPUs and the operator and the bench on the other: what the
    ratio is when the scheduler does not take its CPU from the API server's."""
    assert session.operator is not None
    plane = list(session.cp.pids.values())
    with cpu.split_cores(plane, [os.getpid(), session.operator.pid]) as split:
        if split is None:
            print("[bench] one CPU: no split-core pair", flush=True)
            return
        binder = Api.for_plane(session.cp, session.creds["bench-ceiling"], connections=64)
        try:
            result = await ceiling.ceiling(bench, binder, count, name="ceiling-split")
        finally:
            await binder.close()
        where = (
            f"with the control plane on {_cpus(split[0])} and the operator and the "
            f"bench on {_cpus(split[1])}"
        )
        result.kind, result.extra["cpus"] = "split", where
        await whole_backlog(session, bench, count, name="whole-backlog-split")
        bench.results[-1].kind = "split"
        bench.results[-1].extra["cpus"] = where


def _cpus(cpus: set[int]) -> str:
    listed = ", ".join(str(c) for c in sorted(cpus))
    return f"CPU {listed}" if len(cpus) == 1 else f"CPUs {listed}"


async def restart_with_residents(session: Session, bench: runs.Bench, count: int) -> dict[str, Any]:
    """Stop the operator, leave ``count`` bound pods and one new pod, start it again."""
    await session.stop_operator()
    started = time.time()
    namespace = await ceiling.residents(bench, count)
    created_s = time.time() - started
    ready_s, first_bind_s, pid = await start_to_first_bind(session, bench, 300)
    rss = procs.rss_mib(pid)
    session.footprint.pods, session.footprint.with_pods_mib = count, rss
    facts = {
        "bound pods already present": f"{count:,} (created in {created_s:.0f} s)",
        "operator start to /readyz": f"{ready_s:.1f} s",
        "operator start to first bind": f"{first_bind_s:.1f} s" if first_bind_s else "no bind",
        f"RSS with {count:,} pods": f"{rss:.0f} MiB (peak {procs.peak_rss_mib(pid):.0f} MiB)",
    }
    check = await bench.recount()
    facts["recount"] = check.summary()
    print(f"[bench] restart: {facts}", flush=True)
    await bench.clean(PROBE_NAMESPACE)
    await bench.clean(namespace)
    return facts


async def start_to_first_bind(
    session: Session, bench: runs.Bench, timeout_s: float
) -> tuple[float, float | None, int]:
    """Start the operator with one new pod waiting (in ``PROBE_NAMESPACE``): seconds from
    its start to /readyz, to that pod's bind (None if not bound in ``timeout_s``), and its
    pid, ``memory.SETTLE_S`` after the bind."""
    await bench.api.ensure_namespace(PROBE_NAMESPACE)
    tracker = Tracker(bench.api, PROBE_NAMESPACE)
    tracker.start()
    probe = workloads.fractional(4096, 10)(PROBE_NAMESPACE, 0)
    await bench.api.create(f"/api/v1/namespaces/{PROBE_NAMESPACE}/pods", probe)
    ready_s = await session.start_operator()
    assert session.operator is not None
    bound = await tracker.wait(lambda: bool(tracker.bound), timeout_s)
    await tracker.stop()
    first_bind_s = (max(tracker.bound.values()) - session.operator.started_at) if bound else None
    await asyncio.sleep(memory.SETTLE_S)
    return ready_s, first_bind_s, session.operator.pid


async def fault_runs(session: Session, bench: runs.Bench, scale: float) -> None:
    count = min(_scaled(1000, scale), len(bench.cards))
    op = session.operator_scheduler()

    def burst(name: str) -> workloads.Workload:
        return workloads.Workload(name, name, count, workloads.whole())

    async def restart_operator() -> dict[str, Any]:
        await session.stop_operator()
        await session.start_operator()
        return {}

    await runs.run(
        bench,
        "fault-operator",
        op,
        burst("operator restart"),
        "fault",
        during=faults.fault(count, restart_operator),
    )

    async def restart_apiserver() -> dict[str, Any]:
        await asyncio.to_thread(session.cp.restart_apiserver)
        return {}

    await runs.run(
        bench,
        "fault-apiserver",
        op,
        burst("API server restart"),
        "fault",
        during=faults.fault(count, restart_apiserver),
    )
    # The network faults: the operator reaches the API server through toxiproxy.
    binary = find_tool("toxiproxy")
    proxy_child, api_port = procs.toxiproxy(binary, session.workdir)
    proxy_child.start()
    try:
        await proxy_child.wait_http(f"http://127.0.0.1:{api_port}/version", 30)
        listen = procs.free_port()
        upstream = session.cp.server.removeprefix("https://")
        await asyncio.to_thread(
            faults.toxiproxy_call,
            api_port,
            "POST",
            "/proxies",
            {"name": "apiserver", "listen": f"127.0.0.1:{listen}", "upstream": upstream},
        )
        session.operator_kubeconfig = _kubeconfig_via(
            session.creds["vgpu-operator"], listen, session.workdir
        )
        await session.stop_operator()
        await session.start_operator()
        toxics = [
            (
                "fault-latency",
                "latency 200 ms for 10 s",
                faults.proxy_toxic(
                    api_port,
                    "apiserver",
                    {
                        "name": "lat",
                        "type": "latency",
                        "attributes": {"latency": 200, "jitter": 50},
                    },
                    10,
                ),
            ),
            (
                "fault-reset",
                "connections reset for 5 s",
                faults.proxy_toxic(
                    api_port,
                    "apiserver",
                    {"name": "reset", "type": "reset_peer", "attributes": {"timeout": 0}},
                    5,
                ),
            ),
            ("fault-partition", "partition for 15 s", faults.partition(api_port, "apiserver", 15)),
        ]
        for name, what, inject in toxics:
            await runs.run(
                bench, name, op, burst(what), "fault", during=faults.fault(count, inject)
            )
    finally:
        session.operator_kubeconfig = session.creds["vgpu-operator"].kubeconfig_path
        await session.stop_operator()
        await asyncio.to_thread(proxy_child.stop)


def _kubeconfig_via(creds: ClientCredentials, port: int, workdir: Path) -> Path:
    config = yaml.safe_load(creds.kubeconfig_path.read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{port}"
    path = workdir / "operator-via-proxy.kubeconfig"
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


async def at_rest(
    bench: runs.Bench, seconds: float = 15.0, measures: dict[str, float] | None = None
) -> str:
    """The CPU the cluster takes with nothing placed, by process, and the API server's
    writes per second then, by request (KWOK's node leases, the Lease heartbeats): what
    bounds a larger cluster on the same machine. ``measures`` receives the cores by
    process (``rest_cores.<process>``), the writes per second and the control plane's
    RSS (``rss_mib.<process>``)."""
    first = counting.apiserver_writes(await bench.api.text("/metrics"))
    before = bench.cpu_sample()
    started = time.monotonic()
    await asyncio.sleep(seconds)
    after = bench.cpu_sample()
    line = cpu.at_rest(before, after)
    wall = time.monotonic() - started
    writes = counting.diff(counting.apiserver_writes(await bench.api.text("/metrics")), first)
    top = sorted(writes.items(), key=lambda kv: -kv[1])[:3]
    rates = ", ".join(f"{what} {n / wall:.0f}/s" for what, n in top)
    if measures is not None:
        measures.update({f"rest_cores.{k}": v for k, v in cpu.cores(before, after).items()})
        measures["rest_writes_per_s"] = sum(writes.values()) / wall
        for name, pid in bench.cp.pids.items():
            measures[f"rss_mib.{name}"] = procs.rss_mib(pid)
    return f"{line}; API writes {rates or 'none'}"


async def idle_cores(pid: int, seconds: float = 15.0) -> float:
    """Cores one process used over ``seconds`` with nothing being placed."""
    before, started = procs.cpu_seconds(pid), time.monotonic()
    await asyncio.sleep(seconds)
    return (procs.cpu_seconds(pid) - before) / (time.monotonic() - started)


async def big_runs(session: Session, bench: runs.Bench) -> dict[str, Any]:
    """The large cluster, sized for a small machine (``--big-burst`` pods per burst, no
    faults): kube-scheduler (raised QPS) and the operator on the same whole-GPU burst,
    each ``--repeats`` times, kube-scheduler first with the operator stopped; the
    operator's fractional burst; then the operator restarted with its last whole-GPU
    burst bound, timed to its first bind; its peak RSS throughout."""
    args = session.args
    count = min(getattr(args, "big_burst", 2000), len(bench.cards))
    for repeat in _repeats(args):
        bench.repeat = repeat
        await session.kube_scheduler_run("ks-raised", *RAISED_QPS, count)
    bench.repeat = None
    ready_s = await session.start_operator()
    await session.warm_up()
    session.footprint.with_nodes_mib = await session.settled_rss()
    assert session.operator is not None
    session.measures["rest_cores.operator"] = await idle_cores(session.operator.pid)
    session.measures["operator_ready_s"] = ready_s
    op = session.operator_scheduler()
    fractional = workloads.Workload(
        "fractional", "fractional pods (8 GiB, 20 cores)", count, workloads.fractional()
    )
    whole = workloads.Workload("whole", "whole-GPU pods", count, workloads.whole())
    last = max(_repeats(args))
    result: runs.Result | None = None
    for repeat in _repeats(args):
        bench.repeat = repeat
        await runs.run(bench, "fractional", op, fractional)
    for repeat in _repeats(args):
        bench.repeat = repeat
        # The last one stays bound: the restart reads it.
        result = await runs.run(bench, "whole", op, whole, keep=repeat == last)
    kept = bench.namespace("whole")
    bench.repeat = None
    assert session.operator is not None
    assert result is not None
    operator_peak = procs.peak_rss_mib(session.operator.pid)
    # The control plane holding the last burst's pods (the model's RSS per bound pod).
    for name, pid in bench.cp.pids.items():
        session.measures[f"rss_mib_with_pods.{name}"] = procs.rss_mib(pid)
    session.measures["bound_pods"] = result.placed
    facts: dict[str, Any] = {
        "pods per burst": f"{count:,} ({len(list(_repeats(args)))} runs of each)",
        "operator start to /readyz (first start)": f"{ready_s:.1f} s",
        "operator peak RSS during the bursts": f"{_f0(result.peak_rss_mib)} MiB (sampled)",
        "operator peak RSS, first process (VmHWM)": f"{operator_peak:.0f} MiB",
    }
    await session.stop_operator()
    restart_ready_s, first_bind_s, pid = await start_to_first_bind(session, bench, 600)
    rss = procs.rss_mib(pid)
    session.measures["restart_ready_s"] = restart_ready_s
    if first_bind_s is not None:
        session.measures["restart_first_bind_s"] = first_bind_s
    session.footprint.pods, session.footprint.with_pods_mib = result.placed, rss
    facts.update(
        {
            f"restart with {result.placed:,} bound pods: start to /readyz": (
                f"{restart_ready_s:.1f} s"
            ),
            "restart: start to first bind": (
                f"{first_bind_s:.1f} s" if first_bind_s is not None else "no bind"
            ),
            "operator RSS after the restart": (
                f"{rss:.0f} MiB (peak {procs.peak_rss_mib(pid):.0f} MiB)"
            ),
        }
    )
    check = await bench.recount()
    facts["recount"] = check.summary()
    complete = all(r.completed and r.placed == r.pods for r in bench.results)
    overcommit = [r.name for r in bench.results if not r.check_ok] + ([] if check.ok else ["end"])
    facts["every pod bound"] = "yes" if complete else "NO"
    facts["over-commit"] = "none" if not overcommit else f"FOUND in {', '.join(overcommit)}"
    print(f"[bench] {session.node_count} nodes: {facts}", flush=True)
    await bench.clean(PROBE_NAMESPACE)
    await bench.clean(kept)
    return facts


def _f0(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def kwok_lease_s(args: argparse.Namespace, nodes: int) -> int:
    """KWOK's node Lease duration for the big cluster: ``--big-kwok-lease``, or (0) 40 s
    per 1,000 nodes. Measured at 2,000 nodes at rest: 193 lease writes/s with 40 s, 27/s
    with 80 s; linearly, 40 s at 15,000 nodes would be about 1,450/s."""
    chosen = int(getattr(args, "big_kwok_lease", 0))
    return chosen or max(40, round(40 * nodes / 1000))


#: What a big cluster runs once it is set up (``big_runs``; the ladder's light runs).
BigRuns = Callable[[Session, runs.Bench], Awaitable[dict[str, Any]]]


async def one_cluster(
    args: argparse.Namespace,
    nodes: int,
    *,
    full: bool,
    big: bool = False,
    big_part: BigRuns | None = None,
) -> report.Cluster:
    scale = args.scale
    bench_dir = Path(tempfile.mkdtemp(prefix=f"vgpu-bench-{nodes}-"))
    print(f"[bench] logs, configs and the audit log: {bench_dir}", flush=True)
    lease_s = kwok_lease_s(args, nodes) if big else 40
    cp = control_plane(bench_dir, lease_s)
    with cp:
        session = Session(cp, args, nodes, bench_dir)
        if big:
            session.heartbeat = args.big_heartbeat
        bench, stop, beats, setup_s = await setup(session, measure_empty=True)
        parts = set(filter(None, args.only.split(","))) or PARTS
        facts: dict[str, Any] = {}
        # Before any scheduler runs: what the cluster alone costs the machine.
        rest_s = float(getattr(args, "rest_seconds", 15.0))
        rest = await at_rest(bench, rest_s, measures=session.measures)
        try:
            if big:
                facts = await (big_part or big_runs)(session, bench)
                parts = set()
            if "baselines" in parts:
                await baselines(session, bench, scale)
            if not big:
                await session.start_operator()
                await session.warm_up()
                session.footprint.with_nodes_mib = await session.settled_rss()
            op = session.operator_scheduler()
            if "baselines" in parts:
                await watched_ceiling(session, bench, scale)
            if full and "operator" in parts:
                await operator_runs(session, bench, scale)
            elif "operator" in parts:
                count = min(_scaled(2000, scale), len(bench.cards))
                whole = workloads.Workload("whole", "whole-GPU pods", count, workloads.whole())
                await runs.run(bench, "whole", op, whole)
            if full and "restart" in parts:
                # Ten bound pods per node whatever the scale: the restart aim is about them.
                facts = await restart_with_residents(session, bench, 10 * nodes)
            if full and "faults" in parts and args.faults:
                await fault_runs(session, bench, scale)
            if full and "gate" in parts:
                await gate.gate_runs(session, bench)
        finally:
            await session.stop_operator()
            stop.set()
            beats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beats
            await bench.api.close()
        facts["the machine at rest with the nodes (no operator, no scheduler)"] = rest
        facts.update(session.footprint.facts())
        if big:
            facts["KWOK's node Lease"] = (
                f"{lease_s} s (`--node-lease-duration-seconds`; 40 s in the other clusters): "
                "its renewals are the `PUT leases` of the line at rest"
            )
        if big and not session.heartbeat:
            facts["heartbeats"] = "none (no Lease renewals; operator --inventory-timeout=0)"
        session.measures.update(session.footprint.numbers())
        cluster = report.Cluster(
            nodes=nodes,
            cards=len(bench.cards),
            models=fleet.models(bench.nodes),
            setup_s=setup_s,
            results=bench.results,
            rss=session.rss_samples,
            facts=facts,
            measures=session.measures,
        )
    if all(r.check_ok for r in cluster.results):
        shutil.rmtree(bench_dir, ignore_errors=True)
    return cluster


#: The facts' key of the machine's load before the bench: the plots carry it.
LOAD_FACT = "other load at the start"


def machine_load(seconds: float = 3.0) -> str:
    """How busy the machine was before the bench started anything: cores busy over a few
    seconds, and the load average. Figures from a machine other work shares are not a
    quiet machine's, and say so."""
    before = procs.machine_busy_seconds()
    time.sleep(seconds)
    busy = (procs.machine_busy_seconds() - before) / seconds
    with contextlib.suppress(OSError), open("/proc/loadavg") as fh:
        average = fh.read().split()[0]
        return f"{busy:.1f} of {os.cpu_count()} cores busy, load average {average}"
    return f"{busy:.1f} of {os.cpu_count()} cores busy"


def machine_facts() -> dict[str, Any]:
    def version(tool: str, flag: str = "--version") -> str:
        with contextlib.suppress(Exception):
            out = subprocess.run(
                [str(find_tool(tool)), flag], capture_output=True, text=True, timeout=10
            )
            return (out.stdout or out.stderr).splitlines()[0].strip()
        return "?"

    cpu = "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        cpu = next(
            (line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "?"
        )
    memory = "?"
    with contextlib.suppress(OSError), open("/proc/meminfo") as fh:
        memory = f"{int(fh.readline().split()[1]) / 2**20:.0f} GiB"
    return {
        "machine": f"{os.cpu_count()} cores ({cpu}), {memory} memory, {platform.platform()}",
        LOAD_FACT: machine_load(),
        "python": platform.python_version(),
        "kube-apiserver": version("kube-apiserver"),
        "kube-scheduler": version("kube-scheduler"),
        "etcd": version("etcd"),
        "kwok": version("kwok"),
        "toxiproxy": version("toxiproxy", "-version"),
        "operator commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        or "?",
        "when": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


async def amain(args: argparse.Namespace) -> int:
    facts = machine_facts()
    facts["command"] = (
        f"BENCH_NODES={args.nodes} BENCH_SCALE={args.scale} BENCH_5000={args.with_5000} "
        f"BENCH_BIG={args.big} BENCH_BIG_BURST={args.big_burst} "
        f"BENCH_BIG_HEARTBEAT_S={args.big_heartbeat:g} "
        f"BENCH_BIG_KWOK_LEASE_S={args.big_kwok_lease} BENCH_REPEATS={args.repeats} "
        f"BENCH_BURST={args.burst} BENCH_BACKLOG={args.backlog} "
        f"BENCH_FAULTS={args.faults} BENCH_HEARTBEAT_S={args.heartbeat:g} "
        "python tests/bench/run_e2e.py"
    )
    if args.operator_args:
        facts["operator flags"] = args.operator_args
    parts = set(filter(None, args.only.split(","))) or PARTS
    sizes = [(args.nodes, True, False)] if args.nodes else []
    sizes += [(5000, False, False)] if args.with_5000 else []
    if args.big:
        sizes.append((args.big, False, True))
    if not parts - {"dra"}:
        sizes = []
    clusters: list[report.Cluster] = []
    for nodes, full, big in sizes:
        clusters.append(await one_cluster(args, nodes, full=full, big=big))
        # Written after each cluster: a later one that fails leaves the earlier figures.
        save(args, clusters, facts)
    if "dra" in parts:
        # Its own cluster (DRA nodes, kube-controller-manager), in the same run.
        plan = dra.Plan(
            scale=args.scale,
            repeats=max(1, args.repeats),
            nodes=args.dra_nodes,
            pods=args.dra_pods,
            steady_rate=args.dra_rate,
            churn=bool(args.dra_churn),
        )
        save(args, clusters, facts, await dra.run(plan))
    failed = [r.name for c in clusters for r in c.results if not r.check_ok]
    if failed:
        print(f"[bench] correctness check FAILED in: {', '.join(failed)}", flush=True)
        return 1
    return 0


def save(
    args: argparse.Namespace,
    clusters: list[report.Cluster],
    facts: dict[str, Any],
    dra_results: dict[str, Any] | None = None,
) -> None:
    args.results.parent.mkdir(parents=True, exist_ok=True)
    saved: dict[str, Any] = {"facts": facts, "clusters": [asdict(c) for c in clusters]}
    if dra_results is not None:
        saved["dra"] = dra_results
    args.results.write_text(json.dumps(saved, indent=1, default=str))
    if args.docs is not None:
        report.write(args.docs, clusters, facts, dra.section(dra_results or {}))
        print(f"[bench] wrote {args.docs}", flush=True)


def render_saved(args: argparse.Namespace) -> int:
    """docs/benchmarks.md again from a saved results file (after changing the report)."""
    saved = json.loads(args.results.read_text())
    clusters = []
    for raw in saved["clusters"]:
        results = [runs.Result(**r) for r in raw.pop("results")]
        rss = [tuple(point) for point in raw.pop("rss")]
        clusters.append(report.Cluster(**raw, results=results, rss=rss))
    save(args, clusters, saved["facts"], saved.get("dra"))
    return 0


def main() -> int:
    args = options()
    if args.render_only:
        return render_saved(args)
    return asyncio.run(amain(args))


async def small(cp: ControlPlane, workdir: Path, nodes: int = 20) -> list[runs.Result]:
    """A small correctness-only version (``make test``): about 200 pods of every kind on
    ``nodes`` nodes through the operator; the results, each with its recount."""
    args = argparse.Namespace(operator_args="")
    session = Session(cp, args, nodes, workdir)
    bench, stop, beats, _setup_s = await setup(session)
    try:
        await session.start_operator()
        op = session.operator_scheduler()
        models = sorted(fleet.models(bench.nodes))
        uuids = [fleet.first_card(bench.nodes, machine) for machine, _ in fleet.MACHINES]
        make_unfit, is_unfit = workloads.mixed_unfit(10)
        # The UUID-selected pods go first: a whole-GPU pod could take their card.
        plan = [
            workloads.Workload("selected", "type/UUID", 40, workloads.selected(models, uuids)),
            workloads.Workload("whole", "whole-GPU", 40, workloads.whole()),
            workloads.Workload("fractional", "fractional", 70, workloads.fractional()),
            workloads.Workload("multi", "4-GPU topology-aware", 10, workloads.multi(4)),
            workloads.Workload("unfit", "1 in 10 unfit", 40, make_unfit, is_unfit),
        ]
        # Pods waiting before the operator takes them up (deleted afterwards).
        await whole_backlog(session, bench, 20)
        for workload in plan:
            # Kept: the later runs are placed beside the earlier ones, and recounted with them.
            await runs.run(bench, workload.name, op, workload, timeout_s=120, keep=True)
    finally:
        await session.stop_operator()
        stop.set()
        beats.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await beats
        await bench.api.close()
    return bench.results
