"""docs/benchmarks.md and its plots, written from one bench's results.

The section between the ``defrag`` markers is kept as it is: tests/bench/bench_defrag.py
writes it (in the same ``make bench``, before this bench).
The section between the ``profile`` markers is kept from the existing file: it holds the
profiles (py-spy) taken by hand, which the bench does not take itself.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e import spread
from e2e.runs import Result

PROFILE_BEGIN = "<!-- profile:begin -->"
PROFILE_END = "<!-- profile:end -->"
#: Written by tests/bench/bench_defrag.py (the engine alone), kept here as it is.
DEFRAG_BEGIN = "<!-- defrag:begin -->"
DEFRAG_END = "<!-- defrag:end -->"
#: Written by tests/bench/run_ladder.py (the largest cluster measured and the capacity
#: model, issue 48), kept here as it is.
LADDER_BEGIN = "<!-- ladder:begin -->"
LADDER_END = "<!-- ladder:end -->"
#: Runs placed as fast as they could be, shown in the throughput table: pods created as
#: fast as the bench could (burst), the ceiling, and pods all waiting before the start
#: (backlog: the scheduler's side of the ceiling).
THROUGHPUT_KINDS = ("burst", "ceiling", "backlog")
NOTES_BEGIN = "<!-- notes:begin -->"
NOTES_END = "<!-- notes:end -->"
NOTES_PLACEHOLDER = """## Reading the figures

(Hand-written notes on the last run: what bounds each number; kept by the bench.)
"""
PROFILE_PLACEHOLDER = """## Profile before and after

(To be filled: py-spy figures of the operator during the whole-GPU burst, before and
after the hot-path work: where the main thread spends its time.)
"""


@dataclass
class Cluster:
    """One cluster's results (1,000 nodes, or the 5,000-node run)."""

    nodes: int
    cards: int
    models: dict[str, int]
    setup_s: float
    results: list[Result]
    rss: list[tuple[float, float, float]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    #: Figures as numbers, for the capacity model (``capacity.py``): cores at rest and
    #: RSS by process, the operator's footprint (see ``Session.measures``).
    measures: dict[str, float] = field(default_factory=dict)


def _f(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    if not ours or not theirs:
        return "-"
    return f"{ours / theirs:.2f}"


def _find(results: Sequence[Result], name: str) -> Result | None:
    """The first run of that name (its repeats: ``spread``)."""
    return next((r for r in results if r.name == name), None)


def _label(r: Result) -> str:
    """The run's name, with its repeat's number when it was repeated."""
    repeat = r.extra.get("repeat")
    return f"{r.name} #{repeat + 1}" if isinstance(repeat, int) else r.name


def _created(r: Result) -> str:
    """How fast the bench created the pods: a scheduler cannot bind faster than this."""
    if r.kind == "backlog":
        return "before"
    if r.kind == "ceiling" or not r.create_s:
        return "-"
    return f"{r.pods / r.create_s:.0f}"


def throughput_table(cluster: Cluster) -> str:
    results = cluster.results
    # Each row against the median of the baseline's repeats.
    ceiling = _pods_per_s(results, "ceiling")
    default = _pods_per_s(results, "ks-default")
    raised = _pods_per_s(results, "ks-raised")
    whole = _find(results, "whole")
    lines = [
        "| run | placed by | pods | created/s | placed | pods/s | ÷ kube-scheduler (raised QPS) | "
        "÷ kube-scheduler (QPS 50) | ÷ ceiling | p50 / p99 s (watch) | p50 / p99 s (timestamps) "
        "| p50 / p99 s (histogram) | writes/pod (own) | CPU ms/pod | peak RSS MiB | check |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if r.kind not in THROUGHPUT_KINDS:
            continue
        lines.append(
            f"| {_label(r)} | {r.scheduler} | {r.pods} | {_created(r)} | {r.placed} | "
            f"{_f(r.pods_per_s)} | "
            f"{_ratio(r.pods_per_s, raised)} | "
            f"{_ratio(r.pods_per_s, default)} | "
            f"{_ratio(r.pods_per_s, ceiling)} | "
            f"{_f(r.watch_p50_s, 2)} / {_f(r.watch_p99_s, 2)} | "
            f"{_f(r.stamp_p50_s, 0)} / {_f(r.stamp_p99_s, 0)} | "
            f"{_f(r.hist_p50_s, 2)} / {_f(r.hist_p99_s, 2)} | {_f(r.writes_per_pod, 2)} | "
            f"{_f(r.cpu_ms_per_pod)} | {_f(r.peak_rss_mib, 0)} | "
            f"{'ok' if r.check_ok else 'FAILED'} |"
        )
    if whole is not None:
        lines.append("")
        ratio = _ratio(_pods_per_s(results, "fractional"), _pods_per_s(results, "whole"))
        lines.append(f"Fractional ÷ whole-GPU (operator): {ratio}.")
    lines += _unfit_ratios(results)
    backlog = _pods_per_s(results, "whole-backlog")
    if backlog is not None and ceiling is not None:
        ratio = _ratio(backlog, ceiling)
        lines.append("")
        lines.append(
            f"Whole-GPU pods already waiting (whole-backlog) ÷ binding ceiling: {ratio} "
            "(both bind pods that exist before the clock starts)."
        )
    watched = _pods_per_s(results, "ceiling-watched")
    if watched is not None and ceiling is not None:
        lines.append("")
        lines.append(
            "The ceiling with the operator running and watching (ceiling-watched) ÷ the "
            f"ceiling alone: {_ratio(watched, ceiling)}; "
            "whole-backlog ÷ ceiling-watched: "
            f"{_ratio(backlog, watched)}."
        )
    return "\n".join(lines)


def _pods_per_s(results: Sequence[Result], name: str) -> float | None:
    """pods/s of that run, the median of its repeats."""
    found = spread.rate(results, name)
    return found.median if found else None


def _unfit_ratios(results: Sequence[Result]) -> list[str]:
    """What pods that cannot fit cost the pods that can (issue 24), each ratio taken in
    the same cluster: bursts with one pod in ten unfittable against the same bursts all
    fittable, and a burst beside a standing backlog of unfittable pods."""
    lines: list[str] = []
    unfit = _ratio(_pods_per_s(results, "unfit"), _pods_per_s(results, "fractional"))
    if unfit != "-":
        lines += [
            "",
            f"Fractional, 1 in 10 unfittable (unfit) ÷ all fittable (fractional): {unfit}.",
        ]
    ours = _ratio(_pods_per_s(results, "whole-unfit"), _pods_per_s(results, "whole"))
    theirs = _ratio(_pods_per_s(results, "ks-unfit"), _pods_per_s(results, "ks-raised"))
    if ours != "-" or theirs != "-":
        versus = _ratio(_pods_per_s(results, "whole-unfit"), _pods_per_s(results, "ks-unfit"))
        lines += [
            "",
            "Whole-GPU, 1 in 10 unfittable ÷ all fittable: the operator "
            f"{ours} (whole-unfit ÷ whole), kube-scheduler {theirs} (ks-unfit ÷ ks-raised); "
            f"whole-unfit ÷ ks-unfit: {versus}.",
        ]
    beside = _find(results, "fractional-beside-backlog")
    if beside is not None:
        ratio = _ratio(beside.pods_per_s, _pods_per_s(results, "fractional"))
        backlog = beside.extra.get("backlog", 0)
        lines += [
            "",
            f"Fractional beside {backlog:,} unfittable pods waiting ÷ fractional alone: {ratio}.",
        ]
    return lines


#: The processes of ``cpu_ms`` in the order shown; "scheduler" is the one placing the pods.
CPU_COLUMNS = ("kube-apiserver", "etcd", "kwok", "scheduler", "bench", "other")


def cpu_table(results: Sequence[Result]) -> str:
    """Per run, the machine's CPU per placed pod, split by process (``e2e.cpu``)."""
    lines = [
        "| run | placed by | pods/s | machine CPU ms/pod | cores busy | "
        + " | ".join(CPU_COLUMNS)
        + " |",
        "|---|---|---|---|---|" + "---|" * len(CPU_COLUMNS),
    ]
    for r in results:
        shares = r.extra.get("cpu_ms")
        if not shares:
            continue
        cells = " | ".join(_f(shares.get(column), 2) for column in CPU_COLUMNS)
        lines.append(
            f"| {_label(r)} | {r.scheduler} | {_f(r.pods_per_s)} | {_f(shares.get('machine'), 2)} "
            f"| {_f(shares.get('cores'), 2)} | {cells} |"
        )
    return "\n".join(lines)


def split_section(cluster: Cluster) -> list[str]:
    """The ceiling pair again with the control plane and the scheduler on separate CPUs."""
    pair = [r for r in cluster.results if r.kind == "split"]
    ceiling = _find(pair, "ceiling-split")
    backlog = _find(pair, "whole-backlog-split")
    if ceiling is None or backlog is None:
        return []
    return [
        "",
        "### The ceiling pair on separate cores",
        "",
        f"The binding ceiling and whole-backlog again, {ceiling.extra.get('cpus', '')}: "
        "the operator's CPU is no longer taken from the API server's.",
        "",
        cpu_table(pair),
        "",
        "whole-backlog-split ÷ ceiling-split: "
        f"{_ratio(_pods_per_s(pair, backlog.name), _pods_per_s(pair, ceiling.name))}.",
    ]


def _table(header: str, rows: Iterable[str]) -> str:
    """A Markdown table: ``header`` (its cells between bars), its rule, the rows."""
    return "\n".join([header, "|" + "---|" * (header.count("|") - 1), *rows])


def steady_table(cluster: Cluster) -> str:
    def row(r: Result) -> str:
        return (
            f"| {r.extra.get('rate')} | {r.scheduler} | {_created(r)} | {r.pods} | {r.placed} | "
            f"{_f(r.pods_per_s)} | "
            f"{_f(r.watch_p50_s, 2)} / {_f(r.watch_p99_s, 2)} | {_f(r.stamp_p50_s, 0)} / "
            f"{_f(r.stamp_p99_s, 0)} | {_f(r.hist_p50_s, 2)} / {_f(r.hist_p99_s, 2)} | "
            f"{_f(r.cpu_ms_per_pod)} | {'ok' if r.check_ok else 'FAILED'} |"
        )

    return _table(
        "| arrivals/s | placed by | arrived/s (bench) | pods | placed | binds/s | p50 / p99 s "
        "(watch) | p50 / p99 s (timestamps) | p50 / p99 s (histogram) | CPU ms/pod | check |",
        (row(r) for r in cluster.results if r.kind == "steady"),
    )


def fault_table(cluster: Cluster) -> str:
    def row(r: Result) -> str:
        return (
            f"| {r.what} | {r.pods} | {r.placed} | {_f(r.extra.get('fault_s'))} | "
            f"{r.extra.get('bound_during', '-')} | {_f(r.extra.get('pause_s'), 2)} | "
            f"{_f(r.extra.get('recover_s'), 2)} | {_f(r.duration_s)} | "
            f"{'ok' if r.check_ok and r.completed else 'FAILED'}: {r.check} |"
        )

    return _table(
        "| fault | pods | placed | fault lasted s | pods bound during it | longest pause in "
        "binding s | first bind after it s | burst took s | check |",
        (row(r) for r in cluster.results if r.kind == "fault"),
    )


def gate_table(cluster: Cluster) -> str:
    def row(r: Result) -> str:
        return (
            f"| {r.extra.get('gate')} | {r.extra.get('nodes')} | {r.pods} | {r.placed} | "
            f"{_f(r.duration_s)} | {_f(r.extra.get('binds_per_node_s'), 2)} | "
            f"{_f(r.watch_p50_s, 2)} / {_f(r.watch_p99_s, 2)} | "
            f"{'ok' if r.check_ok and r.completed else 'FAILED'} |"
        )

    return _table(
        "| allocation gate | nodes | pods | placed | seconds | binds per node per second "
        "| p50 / p99 s (watch) | check |",
        (row(r) for r in cluster.results if r.kind == "gate"),
    )


def writes_table(cluster: Cluster) -> str:
    def row(r: Result) -> str:
        own = ", ".join(f"{k} {v:.2f}" for k, v in r.writes.items())
        every = ", ".join(f"{k} {v:.2f}" for k, v in (r.extra.get("all_writes") or {}).items())
        return f"| {_label(r)} | {r.scheduler} | {own} | {every} |"

    return _table(
        "| run | placed by | own writes per placed pod | every client's writes per placed pod |",
        (row(r) for r in cluster.results if r.kind in THROUGHPUT_KINDS and r.writes),
    )


def plots(clusters: Sequence[Cluster], folder: Path, load: str = "") -> list[str]:
    """throughput.png, latency-cdf.png, rss.png; the file names written. ``load``: the
    machine's other load at the start, put under each title (figures from a shared
    machine are labelled as such)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    main = clusters[0]
    written = []

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in main.results:
        if (
            not r.extra.get("repeat")
            and r.kind in THROUGHPUT_KINDS
            and r.name
            in (
                "ceiling",
                "ks-default",
                "ks-raised",
                "whole",
                "whole-backlog",
                "fractional",
                "multi",
                "unfit",
                "fractional-beside-backlog",
            )
        ):
            ax.plot(r.bound_at, range(1, len(r.bound_at) + 1), label=f"{r.name} ({r.scheduler})")
    ax.set_xlabel("seconds since the first pod was created (backlog, ceiling: since the release)")
    ax.set_ylabel("pods bound")
    ax.set_title(f"Bursts at {main.nodes} nodes: pods bound over time{_subtitle(load)}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder / "throughput.png", dpi=110)
    plt.close(fig)
    written.append("throughput.png")

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in main.results:
        if r.latencies_s and r.kind in ("burst", "steady") and not r.extra.get("repeat"):
            values = sorted(r.latencies_s)
            ys = [(i + 1) / len(values) for i in range(len(values))]
            label = f"steady {r.extra.get('rate')}/s" if r.kind == "steady" else r.name
            ax.plot(values, ys, label=f"{label} ({r.scheduler})")
    ax.set_xscale("log")
    ax.set_xlabel("creation to bound, seconds (bench's watch)")
    ax.set_ylabel("fraction of pods")
    ax.set_title(f"Latency CDF at {main.nodes} nodes{_subtitle(load)}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder / "latency-cdf.png", dpi=110)
    plt.close(fig)
    written.append("latency-cdf.png")

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for cluster in clusters:
        if cluster.rss:
            t0 = cluster.rss[0][0]
            ax.plot(
                [t - t0 for t, _c, _r in cluster.rss],
                [r for _t, _c, r in cluster.rss],
                label=f"{cluster.nodes} nodes",
            )
    ax.set_xlabel("seconds since the operator started (restarts start a new process)")
    ax.set_ylabel("operator RSS, MiB")
    ax.set_title(f"Operator resident memory over the bench{_subtitle(load)}")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(folder / "rss.png", dpi=110)
    plt.close(fig)
    written.append("rss.png")
    return written


def _subtitle(load: str) -> str:
    return f"\n(other load at the start: {load})" if load else ""


def _kept(path: Path, begin: str, end: str, placeholder: str) -> str:
    """The hand-written text between two markers of the existing file, if any."""
    if path.exists():
        match = re.search(re.escape(begin) + r"\n(.*?)" + re.escape(end), path.read_text(), re.S)
        if match:
            return match.group(1)
    return placeholder


#: The DRA part's section (tests/bench/e2e/dra.py), between these markers: a run of that
#: part alone (``BENCH_ONLY=dra``) replaces only it.
DRA_BEGIN = "<!-- dra-part-begin -->"
DRA_END = "<!-- dra-part-end -->"


def dra_block(lines: Sequence[str]) -> list[str]:
    return [DRA_BEGIN, *lines, DRA_END] if lines else []


def write_dra_only(path: Path, lines: Sequence[str]) -> None:
    """Put the DRA part's section into an existing docs/benchmarks.md, leaving the rest."""
    write_block(path, DRA_BEGIN, DRA_END, lines)


def write_block(path: Path, begin: str, end: str, lines: Sequence[str]) -> None:
    """Put ``lines`` between two markers of an existing docs/benchmarks.md (replacing what
    was there, else before the plots), leaving the rest."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    block = "\n".join([begin, *lines, end] if lines else [])
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _old, tail = rest.split(end, 1)
        text = head + block + tail
    elif "\n## Plots" in text:
        head, tail = text.split("\n## Plots", 1)
        text = head + "\n" + block + "\n\n## Plots" + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


def write(
    path: Path,
    clusters: Sequence[Cluster],
    facts: dict[str, Any],
    dra_lines: Sequence[str] = (),
) -> None:
    if not clusters:
        write_dra_only(path, dra_lines)
        return
    folder = path.parent / "benchmarks"
    pictures = plots(clusters, folder, str(facts.get("other load at the start", "")))
    out = [
        "# Benchmarks",
        "",
        "Written by `make bench` (tests/bench/e2e); do not edit by hand except the notes and "
        "profile sections, which the bench keeps. Figures depend on the machine: compare ratios, "
        "which are taken in the same run and cluster.",
        "",
        "## Machine and versions",
        "",
    ]
    for key, value in facts.items():
        out.append(f"- {key}: {value}")
    out += ["", "## Commands", ""]
    out.append(
        "- Every figure below: `make bench` (micro-benchmarks first, then this end-to-end "
        "bench; `BENCH_NODES`, `BENCH_SCALE`, `BENCH_REPEATS`, `BENCH_BURST`, `BENCH_5000=1`, "
        "`BENCH_BIG=15000`, `BENCH_BIG_BURST`, `BENCH_BACKLOG`, `BENCH_FAULTS=0`: "
        "tests/bench/e2e/README.md). The end-to-end part alone: "
        f"`{facts.get('command', '')}`."
    )
    out.append(
        "- pods/s: pods bound ÷ (last bind seen - first pod's creation request), from the "
        "bench's watch. p50/p99 (watch): the bench's creation answer to the first watch event "
        "showing the pod bound. p50/p99 (timestamps): `creationTimestamp` to the `PodScheduled` "
        "condition's `lastTransitionTime` (whole seconds). p50/p99 (histogram): the bucket "
        "bounds of `vgpu_operator_pod_create_to_bound_seconds`, diffed over the run."
    )
    out.append(
        "- writes/pod (own): the scheduler's own create/update/patch/delete requests in the "
        "run's namespace, from the API server's audit log (one identity each), ÷ pods placed. "
        "Every client's: `apiserver_request_total` write verbs, diffed over the run (the "
        "bench's pod creations, KWOK's status updates and the nodes' Lease renewals included)."
    )
    out.append(
        "- CPU ms/pod: utime+stime of the scheduler's process (/proc/<pid>/stat) over the run ÷ "
        "pods placed. Peak RSS: the highest 0.5 s sample of /proc/<pid>/statm in the run."
    )
    out.append(
        "- created/s: pods ÷ the seconds the bench took to create them (32 requests in "
        "flight); no scheduler can place faster than its pods arrive."
    )
    out.append(
        "- Repeats: each run an aim's ratio uses runs `BENCH_REPEATS` times (rows `name #n`); "
        "the ratios in the text and the ÷ columns are taken against the median of the "
        'baseline\'s repeats, and "Repeats and spread" gives each ratio as the median of the '
        "runs paired by repeat with its range. `other load at the start` above is how busy "
        "the machine was before the bench began: above a few tenths of a core, the figures "
        "are a shared machine's, not a quiet one's (the plots say it too)."
    )
    notes = _kept(path, NOTES_BEGIN, NOTES_END, NOTES_PLACEHOLDER)
    out += ["", NOTES_BEGIN, notes.rstrip("\n"), NOTES_END]
    for cluster in clusters:
        out += [
            "",
            f"## {cluster.nodes:,} nodes",
            "",
            f"{cluster.nodes:,} KWOK nodes, {cluster.cards:,} cards "
            f"({', '.join(f'{n:,} {m}' for m, n in cluster.models.items())}); nodes and "
            f"inventories created and Ready in {cluster.setup_s:.0f} s.",
            "",
            "### Bursts, baselines and ratios",
            "",
            throughput_table(cluster),
        ]
        if any(isinstance(r.extra.get("repeat"), int) for r in cluster.results):
            out += [
                "",
                "### Repeats and spread",
                "",
                "Each run an aim's ratio uses, repeated in the same cluster; a ratio pairs the "
                "runs by repeat (`tests/bench/e2e/spread.py`). Trusted: at least three pairs "
                f"whose range is under {100 * spread.TRUSTED_SPREAD:.0f} % of their median.",
                "",
                *spread.table(cluster.results),
            ]
        shared = [r for r in cluster.results if r.kind in THROUGHPUT_KINDS]
        if any(r.extra.get("cpu_ms") for r in shared):
            out += [
                "",
                "### Where the machine's CPU went, per placed pod",
                "",
                "From the run's start (the release, for the ceiling and the backlog: the "
                "first Binding) to its last bind; `other` is the machine's busy time no "
                "process named here accounts for (kernel threads, network, the rest).",
                "",
                cpu_table(shared),
            ]
        out += split_section(cluster)
        if any(r.kind == "steady" for r in cluster.results):
            out += [
                "",
                "### Steady arrivals (operator: fractional pods; kube-scheduler: whole-GPU pods)",
                "",
                steady_table(cluster),
            ]
        if cluster.facts:
            out += ["", "### Restart and memory", ""]
            out += [f"- {k}: {v}" for k, v in cluster.facts.items()]
        if any(r.kind == "fault" for r in cluster.results):
            out += [
                "",
                "### Faults during a burst (operator, whole-GPU pods)",
                "",
                fault_table(cluster),
            ]
        if any(r.kind == "gate" for r in cluster.results):
            out += [
                "",
                "### The allocation gate's cost",
                "",
                "Extra KWOK nodes with the real agent, its device plugin and the kubelet "
                "stand-in (which writes bind-phase success through the plugin's Allocate); "
                "the same burst with `--allocation-gate=off` and `=books`.",
                "",
                gate_table(cluster),
            ]
        out += ["", "### API writes per placed pod, by request", "", writes_table(cluster)]
    if dra_lines:
        out += ["", *dra_block(dra_lines)]
    out += ["", "## Plots", ""]
    out += [f"![{name}](benchmarks/{name})" for name in pictures]
    profile = _kept(path, PROFILE_BEGIN, PROFILE_END, PROFILE_PLACEHOLDER)
    out += ["", PROFILE_BEGIN, profile.rstrip("\n"), PROFILE_END, ""]
    defrag = _kept(path, DEFRAG_BEGIN, DEFRAG_END, "")
    if defrag.strip():
        out += [DEFRAG_BEGIN, defrag.rstrip("\n"), DEFRAG_END, ""]
    ladder = _kept(path, LADDER_BEGIN, LADDER_END, "")
    if ladder.strip():
        out += [LADDER_BEGIN, ladder.rstrip("\n"), LADDER_END, ""]
    path.write_text("\n".join(out))
