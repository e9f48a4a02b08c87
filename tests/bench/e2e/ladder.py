"""The largest cluster this machine holds, measured, and a capacity model past it (issue 48
items 2 and 4): ``python tests/bench/run_ladder.py`` (tests/bench/e2e/README.md).

The ladder sets up one cluster per size, smallest first, each as ``BENCH_BIG`` sets up
its cluster (``main.one_cluster(big=True)``: nodes and inventories written once, no
Lease heartbeats, KWOK's node Lease scaled with the nodes, no faults), and runs
``main.big_runs`` there: kube-scheduler (raised QPS) on a whole-GPU burst with the
operator stopped, then the operator on the same burst and on a fractional one, each
``--repeats`` times, the operator restarted with its last burst bound (to first bind),
its RSS; the CPU of every process per placed pod (the API server's and etcd's among
them) and the cluster at rest before any scheduler. It stops after the first size where
a burst does not end with every pod bound and nothing over-committed: the size before
is the largest this machine holds. Both schedulers share one starved control plane, so
their ratio is one of two schedulers on one server, not of two schedulers alone.

If the target size (15,000) was not held, the ladder sets it up once more and measures
what does run there (``light_runs``): the operator's start to /readyz, a slow arrival
rate (``--rate`` pods per second for ``--seconds``) for kube-scheduler and the operator,
restart to first bind with those pods bound, RSS.

The capacity model (``capacity.py``) is fitted on every size held but ``--hold-out``,
and checked on those.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from e2e import capacity, main, procs, report, runs, spread, workloads

LADDER_RESULTS = Path(".bench/ladder.json")


def held(cluster: report.Cluster) -> bool:
    """Whether every burst of the cluster ended with every pod bound, nothing over-committed."""
    bursts = [r for r in cluster.results if r.kind in ("burst", "steady")]
    return bool(bursts) and all(
        r.completed and r.placed == r.pods and r.check_ok for r in cluster.results
    )


async def light_runs(session: main.Session, bench: runs.Bench) -> dict[str, Any]:
    """What runs at a size where bursts do not (see the module docstring)."""
    args = session.args
    rate, seconds = float(args.rate), float(args.seconds)
    count = min(int(rate * seconds), len(bench.cards))
    await session.kube_scheduler_run("ks-slow", *main.RAISED_QPS, count, rate=rate)
    ready_s = await session.start_operator()
    session.measures["operator_ready_s"] = ready_s
    await session.warm_up()
    session.footprint.with_nodes_mib = await session.settled_rss()
    assert session.operator is not None
    session.measures["rest_cores.operator"] = await main.idle_cores(session.operator.pid)
    slow = workloads.Workload(
        "slow", f"fractional pods arriving at {rate:g}/s", count, workloads.fractional()
    )
    result = await runs.run(
        bench, "slow", session.operator_scheduler(), slow, "steady", rate=rate, keep=True
    )
    await session.stop_operator()
    restart_ready_s, first_bind_s, pid = await main.start_to_first_bind(session, bench, 600)
    session.footprint.pods, session.footprint.with_pods_mib = result.placed, procs.rss_mib(pid)
    facts = {
        "operator start to /readyz (first start)": f"{ready_s:.1f} s",
        f"slow arrivals ({rate:g}/s for {seconds:.0f} s)": (
            f"{result.placed:,}/{result.pods:,} bound, p50/p99 {_s(result.watch_p50_s)}"
            f"/{_s(result.watch_p99_s)} s"
        ),
        f"restart with {result.placed:,} bound pods: start to /readyz": f"{restart_ready_s:.1f} s",
        "restart: start to first bind": (
            f"{first_bind_s:.1f} s" if first_bind_s is not None else "no bind"
        ),
        "operator RSS after the restart": f"{session.footprint.with_pods_mib:.0f} MiB",
    }
    await bench.clean(main.PROBE_NAMESPACE)
    await bench.clean(bench.namespace("slow"))
    return facts


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def slow_table(cluster: report.Cluster) -> list[str]:
    """The slow arrivals of both schedulers at the target size: bound, latency, CPU per
    placed pod of the API server, etcd and the scheduler."""
    out = [
        "| run | bound | p50 / p99 s (watch) | CPU ms per placed pod: API server, etcd, "
        "scheduler | cores busy |",
        "|---|---|---|---|---|",
    ]
    for r in cluster.results:
        if r.kind != "steady":
            continue
        cpu_ms = r.extra.get("cpu_ms") or {}
        shares = ", ".join(_s(cpu_ms.get(p)) for p in ("kube-apiserver", "etcd", "scheduler"))
        out.append(
            f"| {r.name} ({r.scheduler}) | {r.placed:,}/{r.pods:,} | {_s(r.watch_p50_s)} / "
            f"{_s(r.watch_p99_s)} | {shares} | {_s(cpu_ms.get('cores'))} |"
        )
    return out


def _median(values: list[float]) -> float | None:
    return sorted(values)[len(values) // 2] if values else None


def _runs(cluster: report.Cluster, name: str) -> list[runs.Result]:
    return [r for r in cluster.results if r.name == name]


def _text(figure: spread.Spread | None) -> str:
    return "-" if figure is None else figure.text(1)


def _cpu(cluster: report.Cluster, name: str, process: str) -> str:
    values = [
        float(r.extra["cpu_ms"][process])
        for r in _runs(cluster, name)
        if isinstance(r.extra.get("cpu_ms"), dict) and process in r.extra["cpu_ms"]
    ]
    value = _median(values)
    return "-" if value is None else f"{value:.2f}"


def ladder_table(clusters: list[report.Cluster]) -> list[str]:
    """One row per size: the cluster at rest, both schedulers' whole-GPU bursts (median of
    the repeats) with the API server's and etcd's CPU per pod in each, the outcome."""
    out = [
        "| nodes | setup s | at rest: cores (API server, etcd, KWOK) | kube-scheduler pods/s "
        "(API server, etcd ms/pod) | operator pods/s (API server, etcd ms/pod) | ÷ | "
        "fractional pods/s | every pod bound | over-commit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in clusters:
        m = c.measures
        rest = ", ".join(
            f"{m.get(f'rest_cores.{p}', 0.0):.2f}" for p in ("kube-apiserver", "etcd", "kwok")
        )
        ks, op = spread.rate(c.results, "ks-raised"), spread.rate(c.results, "whole")
        paired = spread.ratio(c.results, "whole", "ks-raised")
        ratio = "-" if paired is None else paired.text()
        bound = all(r.completed and r.placed == r.pods for r in c.results)
        checked = all(r.check_ok for r in c.results)
        out.append(
            f"| {c.nodes:,} | {c.setup_s:.0f} | {rest} | {_text(ks)} "
            f"({_cpu(c, 'ks-raised', 'kube-apiserver')}, {_cpu(c, 'ks-raised', 'etcd')}) | "
            f"{_text(op)} ({_cpu(c, 'whole', 'kube-apiserver')}, {_cpu(c, 'whole', 'etcd')}) | "
            f"{ratio} | {_text(spread.rate(c.results, 'fractional'))} | "
            f"{'yes' if bound else 'NO'} | {'none' if checked else 'FOUND'} |"
        )
    return out


def section(
    clusters: list[report.Cluster],
    light: report.Cluster | None,
    notes: list[str],
    facts: dict[str, Any],
    held_out: list[int],
) -> list[str]:
    """The two sections of docs/benchmarks.md the ladder writes."""
    largest = max((c.nodes for c in clusters if held(c)), default=None)
    out = [
        "## The largest cluster measured",
        "",
        f"Command: `{facts.get('command', '')}` at {facts.get('operator commit', '?')}, "
        f"{facts.get('when', '')}; {facts.get('machine', '')}; "
        f"{main.LOAD_FACT}: {facts.get(main.LOAD_FACT, '?')}.",
        "",
        f"Largest size with every pod of every burst bound and nothing over-committed: "
        f"**{largest:,} nodes**."
        if largest
        else "No size held.",
        "",
        *ladder_table(clusters),
    ]
    out += [f"- {line}" for line in notes]
    for c in clusters:
        out += ["", f"### {c.nodes:,} nodes", ""]
        out += [f"- {k}: {v}" for k, v in c.facts.items()]
    if light is not None:
        out += ["", f"### {light.nodes:,} nodes: what runs there", "", *slow_table(light), ""]
        out += [f"- {k}: {v}" for k, v in light.facts.items()]
    measured = [c for c in clusters if held(c)]
    if len({c.nodes for c in measured if c.nodes not in held_out}) >= 2:
        memory_mib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
        model = capacity.build(
            measured, held_out, cores=float(os.cpu_count() or 2), memory_mib=memory_mib
        )
        out += ["", "## Capacity model", "", *capacity.section(model)]
    return out


def save(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1, default=str))


def load(path: Path) -> tuple[list[report.Cluster], report.Cluster | None, dict[str, Any]]:
    saved = json.loads(path.read_text())

    def cluster(raw: dict[str, Any]) -> report.Cluster:
        results = [runs.Result(**r) for r in raw.pop("results")]
        rss = [tuple(point) for point in raw.pop("rss")]
        return report.Cluster(**raw, results=results, rss=rss)

    clusters = [cluster(raw) for raw in saved["clusters"]]
    light = cluster(saved["light"]) if saved.get("light") else None
    return clusters, light, saved


async def climb(args: argparse.Namespace) -> int:
    """Run the ladder (see the module docstring); 0 if the smallest size held."""
    facts = main.machine_facts()
    sizes = sorted(int(n) for n in args.sizes.split(","))
    facts["command"] = (
        f"BENCH_LADDER={','.join(map(str, sizes))} BENCH_LADDER_HOLD_OUT={args.hold_out} "
        f"BENCH_REPEATS={args.repeats} BENCH_BIG_BURST={args.big_burst} "
        f"BENCH_LADDER_TARGET={args.target} BENCH_LADDER_RATE={args.rate:g} "
        f"BENCH_LADDER_SECONDS={args.seconds:g} python tests/bench/run_ladder.py"
    )
    clusters: list[report.Cluster] = []
    notes: list[str] = []
    light: report.Cluster | None = None

    def keep() -> None:
        payload = {
            "facts": facts,
            "notes": notes,
            "clusters": [asdict(c) for c in clusters],
            "light": asdict(light) if light is not None else None,
        }
        save(args.results, payload)

    for nodes in sizes:
        started = time.monotonic()
        try:
            cluster = await main.one_cluster(args, nodes, full=False, big=True)
        except Exception as exc:  # the size did not run to its end: the ladder stops
            notes.append(
                f"{nodes:,} nodes did not run to the end after {time.monotonic() - started:.0f} s: "
                f"{type(exc).__name__}: {exc}"
            )
            keep()
            break
        clusters.append(cluster)
        keep()
        if not held(cluster):
            notes.append(f"{nodes:,} nodes: a burst did not end with every pod bound")
            break
    if args.target and not any(c.nodes >= args.target and held(c) for c in clusters):
        try:
            light = await main.one_cluster(
                args, args.target, full=False, big=True, big_part=light_runs
            )
        except Exception as exc:
            notes.append(f"{args.target:,} nodes (slow arrivals) did not run: {exc}")
        keep()
    write(args, clusters, light, notes, facts)
    return 0 if clusters and held(clusters[0]) else 1


def write(
    args: argparse.Namespace,
    clusters: list[report.Cluster],
    light: report.Cluster | None,
    notes: list[str],
    facts: dict[str, Any],
) -> None:
    held_out = [int(n) for n in str(args.hold_out).split(",") if n]
    lines = section(clusters, light, notes, facts, held_out)
    print("\n".join(lines), flush=True)
    if args.docs is not None:
        report.write_block(args.docs, report.LADDER_BEGIN, report.LADDER_END, lines)
        print(f"[ladder] wrote {args.docs}", flush=True)


def render_saved(args: argparse.Namespace) -> int:
    clusters, light, saved = load(args.results)
    write(args, clusters, light, list(saved.get("notes", [])), saved["facts"])
    return 0


def options() -> argparse.Namespace:
    """``main.options()`` (the big cluster's settings) plus the ladder's own."""
    args = main.options()
    env = os.environ.get
    args.sizes = env("BENCH_LADDER", "1000,2000,4000,8000,12000,15000")
    args.hold_out = env("BENCH_LADDER_HOLD_OUT", "1000,8000")
    args.target = int(env("BENCH_LADDER_TARGET", "15000"))
    args.rate = float(env("BENCH_LADDER_RATE", "5"))
    args.seconds = float(env("BENCH_LADDER_SECONDS", "120"))
    # The cluster at rest is a slope of the model: read it over longer than a burst's.
    args.rest_seconds = float(env("BENCH_LADDER_REST_S", "30"))
    if args.results == Path(".bench/e2e.json"):
        args.results = LADDER_RESULTS
    return args
