"""A capacity model past the machine (issue 48 item 4): slopes measured on the ladder's
clusters, fitted on some sizes, checked on two it was not fitted on, extrapolated.

What grows with the cluster is taken as a straight line in the node count,
``a + b x nodes``, fitted by least squares on the fitted sizes (a line through two points
with two, a flat line with one); what a bound pod costs is taken as one figure, the
median over the fitted sizes (at small sizes its change with the nodes is within the
noise of a run, and a slope fitted on noise would be extrapolated fourfold):

- per node (lines): cores at rest, by process (kube-apiserver, etcd, KWOK, the operator
  idle): the cluster alone, with KWOK's node Lease scaled with the nodes and no Lease
  heartbeats (the ladder's setting, ``main.kwok_lease_s``); resident memory at rest of
  the API server and etcd, and the operator's with the nodes and no pod bound;
- per bound pod (figures): CPU by process over the operator's whole-GPU bursts (median of
  the repeats): what one more pod placed per second costs each process; watch bytes (all
  the API server sent on watches, to the operator, KWOK and the bench); the API server's
  and the operator's memory growth with the last burst's pods bound (``bound_pods``).

From the lines, at a node count: the cores left to place pods (the machine's cores less
everything at rest), the bind rate that leaves (cores left ÷ CPU per pod), the
operator's own ceiling (one core, one Python thread), and the memory with ten bound pods
per node. What runs out first is the resource whose limit the smallest node count
reaches: the machine's cores at rest, the operator's one core at rest, or the memory.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from e2e.report import Cluster

#: The processes of the model (the CPU table's labels; "scheduler" is the operator).
PROCESSES: Final = ("kube-apiserver", "etcd", "kwok", "operator")
#: The run whose per-pod costs the model reads (the operator's whole-GPU burst).
BURST: Final = "whole"
#: Held-out predictions within this fraction of the measurement pass.
TOLERANCE: Final = 0.25
#: Bound pods per node in the memory predictions (as the restart run's).
PODS_PER_NODE: Final = 10


@dataclass(frozen=True)
class Line:
    """``intercept + slope x nodes``."""

    intercept: float
    slope: float

    def at(self, nodes: float) -> float:
        return self.intercept + self.slope * nodes

    def reaches(self, limit: float) -> float | None:
        """The node count at which the line reaches ``limit`` (None: it never does)."""
        if self.slope <= 0:
            return None if self.intercept < limit else 0.0
        return max(0.0, (limit - self.intercept) / self.slope)


def fit(points: Sequence[tuple[float, float]]) -> Line:
    """Least squares through ``(nodes, value)`` points."""
    if not points:
        raise ValueError("no points to fit")
    if len(points) == 1 or len({x for x, _ in points}) == 1:
        return Line(statistics.fmean(y for _, y in points), 0.0)
    mean_x = statistics.fmean(x for x, _ in points)
    mean_y = statistics.fmean(y for _, y in points)
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread
    return Line(mean_y - slope * mean_x, slope)


def _burst_median(
    cluster: Cluster, read: Callable[[Mapping[str, object]], float | None]
) -> float | None:
    """The median over the operator's whole-GPU bursts of one figure of each run."""
    values = []
    for result in cluster.results:
        if result.name != BURST or not result.placed:
            continue
        value = read(result.extra)
        if value is not None:
            values.append(value)
    return statistics.median(values) if values else None


def _cpu_ms(process: str) -> Callable[[Mapping[str, object]], float | None]:
    label = "scheduler" if process == "operator" else process

    def read(extra: Mapping[str, object]) -> float | None:
        shares = extra.get("cpu_ms")
        if not isinstance(shares, Mapping) or label not in shares:
            return None
        return float(shares[label])

    return read


def _watch_bytes(extra: Mapping[str, object]) -> float | None:
    sent = extra.get("watch_bytes")
    if not isinstance(sent, Mapping) or not sent:
        return None
    return float(sum(float(v) for v in sent.values()))


def _per_pod_rss(cluster: Cluster, process: str) -> float | None:
    """MiB per bound pod: the process's growth from the cluster at rest to the last
    burst's pods bound (the operator's: its fresh process before and after them)."""
    m = cluster.measures
    if process == "operator":
        pods = m.get("operator_rss.pods")
        before, after = m.get("operator_rss.with_nodes_mib"), m.get("operator_rss.with_pods_mib")
    else:
        pods = m.get("bound_pods")
        before, after = m.get(f"rss_mib.{process}"), m.get(f"rss_mib_with_pods.{process}")
    if not pods or before is None or after is None:
        return None
    return (after - before) / pods


def _rest(process: str) -> Callable[[Cluster], float | None]:
    return lambda cluster: cluster.measures.get(f"rest_cores.{process}")


def _per_pod_cpu(process: str) -> Callable[[Cluster], float | None]:
    return lambda cluster: _burst_median(cluster, _cpu_ms(process))


#: Every quantity the model fits: name -> (unit, how to read it off one cluster). Those
#: named in ``PER_POD`` are one figure (the median), the others lines in the nodes.
QUANTITIES: Final[dict[str, tuple[str, Callable[[Cluster], float | None]]]] = {
    **{f"cores at rest: {p}": ("cores", _rest(p)) for p in PROCESSES},
    **{f"CPU per bound pod: {p}": ("ms", _per_pod_cpu(p)) for p in PROCESSES},
    "watch bytes per bound pod": ("bytes", lambda c: _burst_median(c, _watch_bytes)),
    "RSS at rest: kube-apiserver": ("MiB", lambda c: c.measures.get("rss_mib.kube-apiserver")),
    "RSS at rest: etcd": ("MiB", lambda c: c.measures.get("rss_mib.etcd")),
    "RSS with the nodes: operator": (
        "MiB",
        lambda c: c.measures.get("operator_rss.with_nodes_mib"),
    ),
    "RSS per bound pod: kube-apiserver": ("MiB", lambda c: _per_pod_rss(c, "kube-apiserver")),
    "RSS per bound pod: operator": ("MiB", lambda c: _per_pod_rss(c, "operator")),
}


#: The quantities taken as one figure per bound pod, not as a line in the nodes.
PER_POD: Final = frozenset(
    q for q in QUANTITIES if q.startswith(("CPU per bound pod", "RSS per bound pod", "watch"))
)
#: The predictions the model is judged by on the held-out sizes (the sums the table uses).
HEADLINE: Final = ("cores at rest, all", "CPU per bound pod, all", "RSS at rest, all")


@dataclass(frozen=True)
class Check:
    """One quantity at one held-out size: measured, predicted, relative error."""

    quantity: str
    nodes: int
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return abs(self.predicted - self.measured) / abs(self.measured) if self.measured else 0.0

    @property
    def within(self) -> bool:
        return self.error <= TOLERANCE


@dataclass
class Model:
    """The fitted lines, the sizes they were fitted on and the held-out checks."""

    lines: dict[str, Line]
    fitted: list[int]
    held_out: list[int]
    checks: list[Check]
    cores: float
    memory_mib: float

    def at(self, quantity: str, nodes: float) -> float:
        line = self.lines.get(quantity)
        return 0.0 if line is None else max(0.0, line.at(nodes))

    def rest_cores(self, nodes: float) -> float:
        return sum(self.at(f"cores at rest: {p}", nodes) for p in PROCESSES)

    def ms_per_pod(self, nodes: float) -> float:
        return sum(self.at(f"CPU per bound pod: {p}", nodes) for p in PROCESSES)

    def bind_rate(self, nodes: float) -> float:
        """Pods per second the cores left after the cluster at rest can place."""
        left, cost = self.cores - self.rest_cores(nodes), self.ms_per_pod(nodes)
        return max(0.0, left) * 1000 / cost if cost > 0 else 0.0

    def memory(self, nodes: float, pods: float) -> dict[str, float]:
        """MiB by process with ``pods`` bound pods."""
        return {
            "kube-apiserver": self.at("RSS at rest: kube-apiserver", nodes)
            + pods * self.at("RSS per bound pod: kube-apiserver", nodes),
            "etcd": self.at("RSS at rest: etcd", nodes),
            "operator": self.at("RSS with the nodes: operator", nodes)
            + pods * self.at("RSS per bound pod: operator", nodes),
        }

    def limits(self) -> dict[str, float | None]:
        """Per resource, the node count at which it runs out (None: never, on the lines)."""
        total_rest = _sum_lines(self.lines, [f"cores at rest: {p}" for p in PROCESSES])
        memory = _sum_lines(
            self.lines,
            ["RSS at rest: kube-apiserver", "RSS at rest: etcd", "RSS with the nodes: operator"],
        )
        per_pod = _sum_lines(
            self.lines, ["RSS per bound pod: kube-apiserver", "RSS per bound pod: operator"]
        )
        with_pods = Line(
            memory.intercept + PODS_PER_NODE * per_pod.intercept,
            memory.slope + PODS_PER_NODE * per_pod.slope,
        )
        operator = self.lines.get("cores at rest: operator", Line(0.0, 0.0))
        return {
            f"the machine's {self.cores:g} cores, at rest": total_rest.reaches(self.cores),
            "the operator's one core, at rest": operator.reaches(1.0),
            f"memory ({self.memory_mib / 1024:.0f} GiB) with {PODS_PER_NODE} bound pods a node": (
                with_pods.reaches(self.memory_mib)
            ),
        }


#: The headline sums: the quantities each adds up.
_SUMS: Final = {
    "cores at rest, all": tuple(f"cores at rest: {p}" for p in PROCESSES),
    "CPU per bound pod, all": tuple(f"CPU per bound pod: {p}" for p in PROCESSES),
    "RSS at rest, all": (
        "RSS at rest: kube-apiserver",
        "RSS at rest: etcd",
        "RSS with the nodes: operator",
    ),
}


def _sum_lines(lines: Mapping[str, Line], names: Iterable[str]) -> Line:
    chosen = [lines[n] for n in names if n in lines]
    return Line(sum(line.intercept for line in chosen), sum(line.slope for line in chosen))


def build(
    clusters: Sequence[Cluster],
    held_out: Sequence[int],
    cores: float = 2.0,
    memory_mib: float = 24 * 1024,
) -> Model:
    """Fit every quantity on the clusters not held out; check it on those held out."""
    fitted = [c for c in clusters if c.nodes not in held_out]
    kept = [c for c in clusters if c.nodes in held_out]
    if not fitted:
        raise ValueError("every size is held out: nothing to fit on")
    lines: dict[str, Line] = {}
    checks: list[Check] = []
    for quantity, (_unit, read) in QUANTITIES.items():
        points = [(c.nodes, v) for c in fitted if (v := read(c)) is not None]
        if not points:
            continue
        if quantity in PER_POD:
            line = lines[quantity] = Line(statistics.median(v for _, v in points), 0.0)
        else:
            line = lines[quantity] = fit(points)
        for cluster in kept:
            measured = read(cluster)
            if measured is not None:
                checks.append(Check(quantity, cluster.nodes, measured, line.at(cluster.nodes)))
    for total, parts in _SUMS.items():
        for cluster in kept:
            values = [QUANTITIES[p][1](cluster) for p in parts if p in lines]
            if values and all(v is not None for v in values):
                predicted = sum(lines[p].at(cluster.nodes) for p in parts if p in lines)
                measured = sum(v for v in values if v is not None)
                checks.append(Check(total, cluster.nodes, measured, predicted))
    return Model(
        lines,
        sorted(c.nodes for c in fitted),
        sorted(c.nodes for c in kept),
        checks,
        cores,
        memory_mib,
    )


def _n(value: float) -> str:
    return f"{value:,.0f}"


def section(model: Model, sizes: Sequence[int] = (15_000, 65_000)) -> list[str]:
    """The report's capacity-model section (markdown lines)."""
    out = [
        f"Fitted on {', '.join(_n(n) for n in model.fitted)} nodes; held out "
        f"{', '.join(_n(n) for n in model.held_out) or 'none'}. A line `a + b x nodes` per "
        "quantity (tests/bench/e2e/capacity.py says how each is read).",
        "",
        "| quantity | a | b per 1,000 nodes |",
        "|---|---|---|",
    ]
    for quantity, line in model.lines.items():
        unit = QUANTITIES[quantity][0]
        slope = "(per pod)" if quantity in PER_POD else f"{1000 * line.slope:.3g}"
        out.append(f"| {quantity} ({unit}) | {line.intercept:.3g} | {slope} |")
    if model.checks:
        passed = sum(c.within for c in model.checks)
        headline = [c for c in model.checks if c.quantity in HEADLINE]
        good = sum(c.within for c in headline)
        out += [
            "",
            f"Held-out sizes: the headline sums ({', '.join(HEADLINE)}) {good} of "
            f"{len(headline)} within {100 * TOLERANCE:.0f} %; every quantity {passed} of "
            f"{len(model.checks)}.",
            "",
            "| quantity | nodes | measured | predicted | error |",
            "|---|---|---|---|---|",
        ]
        for c in model.checks:
            mark = "" if c.within else " (over)"
            out.append(
                f"| {c.quantity} | {_n(c.nodes)} | {c.measured:.3g} | {c.predicted:.3g} | "
                f"{100 * c.error:.0f} %{mark} |"
            )
    out += ["", "| at | " + " | ".join(f"{_n(n)} nodes" for n in sizes) + " |"]
    out.append("|---|" + "---|" * len(sizes))
    rows: list[tuple[str, Callable[[int], str]]] = [
        ("cores at rest, all", lambda n: f"{model.rest_cores(n):.2f}"),
        *(
            (f"cores at rest: {p}", lambda n, p=p: f"{model.at(f'cores at rest: {p}', n):.2f}")
            for p in PROCESSES
        ),
        ("CPU per bound pod, all (ms)", lambda n: f"{model.ms_per_pod(n):.2f}"),
        ("pods/s the cores left can bind", lambda n: f"{model.bind_rate(n):.0f}"),
        (
            "the operator's own ceiling (pods/s, one core)",
            lambda n: _ceiling(model.at("CPU per bound pod: operator", n)),
        ),
        (
            f"memory with {PODS_PER_NODE} bound pods a node (GiB)",
            lambda n: f"{sum(model.memory(n, PODS_PER_NODE * n).values()) / 1024:.1f}",
        ),
    ]
    for label, cell in rows:
        out.append(f"| {label} | " + " | ".join(cell(n) for n in sizes) + " |")
    limits = sorted(
        ((n, what) for what, n in model.limits().items() if n is not None), key=lambda kv: kv[0]
    )
    if limits:
        first_n, first = limits[0]
        rest = "; ".join(f"{what} at about {_n(n)}" for n, what in limits[1:])
        out += [
            "",
            f"What runs out first: {first}, at about {_n(first_n)} nodes"
            + (f" (then {rest})." if rest else "."),
        ]
    return out


def _ceiling(ms: float) -> str:
    return f"{1000 / ms:.0f}" if ms > 0 else "-"
