"""One measured run: create a workload's pods, follow them until each is bound (or waits
with a reason), and read what it cost; then recount the whole cluster and clean up."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp

from e2e import checks, counting, cpu, procs
from e2e.api import Api, ApiError, Json, gather_limited
from e2e.fleet import BenchNode
from e2e.tracking import Tracker
from e2e.workloads import Workload
from vgpu_operator import timestamps
from vgpu_operator.testing.controlplane import ControlPlane

#: Between creating pods that must exist before the clock starts and starting it (the
#: backlog's release, the ceiling's first Binding): the API server and every watcher are
#: done with the creations, the same for both sides of the ratio.
SETTLE_S: Final = 1.0


@dataclass
class Scheduler:
    """Whoever places a run's pods: the operator, kube-scheduler or the ceiling client."""

    label: str
    user: str  # its identity in the audit log
    pid: Callable[[], int | None] = lambda: None
    metrics_url: Callable[[], str | None] = lambda: None


@dataclass
class Result:
    name: str
    scheduler: str
    kind: str  # burst, steady, ceiling, restart, fault
    what: str
    pods: int = 0
    placed: int = 0
    reasoned: int = 0
    create_s: float = 0.0
    duration_s: float = 0.0
    pods_per_s: float = 0.0
    watch_p50_s: float | None = None
    watch_p99_s: float | None = None
    stamp_p50_s: float | None = None
    stamp_p99_s: float | None = None
    hist_p50_s: float | None = None
    hist_p99_s: float | None = None
    writes_per_pod: float | None = None
    writes: dict[str, float] = field(default_factory=dict)
    all_writes_per_pod: float | None = None
    cpu_ms_per_pod: float | None = None
    peak_rss_mib: float | None = None
    completed: bool = True
    check: str = ""
    check_ok: bool = True
    bound_at: list[float] = field(default_factory=list)  # seconds after the start
    latencies_s: list[float] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Bench:
    """Everything a run needs, shared by all runs of one bench."""

    cp: ControlPlane
    api: Api
    nodes: list[BenchNode]
    cards: dict[str, tuple[str, int, int, int]]
    gpus_per_node: dict[str, int]
    workdir: Path
    audit: counting.AuditLog
    rss: procs.Sampler | None = None
    results: list[Result] = field(default_factory=list)
    #: Which repeat of the runs is under way (None: runs that are not repeated).
    repeat: int | None = None

    def namespace(self, name: str) -> str:
        """The run's namespace: one per repeat. KWOK, behind on a loaded machine, still
        deletes pods it saw marked for deletion after the bench has removed them; a
        later run that reused their names in the same namespace would lose its pods."""
        return f"bench-{name}" if self.repeat is None else f"bench-{name}-r{self.repeat}"

    def keep(self, result: Result) -> None:
        """Add a finished run to the results, marked with the repeat under way."""
        if self.repeat is not None:
            result.extra["repeat"] = self.repeat
        self.results.append(result)

    async def snapshot(self, scheduler: Scheduler, *, before: bool) -> dict[str, Any]:
        """The API server's and the scheduler's metrics and the scheduler's CPU seconds.
        Its CPU is read after the scrape before a run and ahead of it after, so that the
        cost of rendering its metrics stays out of the run's figure."""
        pid = scheduler.pid()
        shot: dict[str, Any] = {"apiserver": await self.api.text("/metrics"), "pid": pid}
        if not before:
            shot["cpu"] = procs.cpu_seconds(pid) if pid else None
        url = scheduler.metrics_url()
        shot["operator"] = await asyncio.to_thread(procs.http_get, url, 60.0) if url else None
        if before:
            shot["cpu"] = procs.cpu_seconds(pid) if pid else None
        return shot

    def cpu_sample(self, scheduler: Scheduler | None = None) -> dict[str, float]:
        """CPU seconds so far of the control plane's processes, the bench (the ceiling's
        client and every watch of the bench) and the scheduler, and of the machine."""
        pids: dict[str, int | None] = {**self.cp.pids, "bench": os.getpid()}
        if scheduler is not None:
            pids["scheduler"] = scheduler.pid()
        return cpu.sample(pids)

    async def recount(self) -> checks.Check:
        pods = await self.api.list_all("/api/v1/pods")
        return checks.recount(pods, self.cards, self.gpus_per_node)

    async def clean(self, namespace: str) -> None:
        """Delete the run's pods and wait until they are gone. A delete of thousands of
        pods may outlive its request (the server goes on deleting): ask again until none
        is left."""
        for _ in range(600):
            with contextlib.suppress(ApiError, aiohttp.ClientError, asyncio.TimeoutError):
                await self.api.delete_pods(namespace)
            left = await self.api.request("GET", f"/api/v1/namespaces/{namespace}/pods?limit=1")
            if not left.get("items"):
                break
            await asyncio.sleep(1.0)
        # Let the schedulers see the deletions before the next run starts.
        await asyncio.sleep(2.0)


async def run(
    bench: Bench,
    name: str,
    scheduler: Scheduler,
    workload: Workload,
    kind: str = "burst",
    *,
    rate: float | None = None,
    timeout_s: float = 600.0,
    during: Callable[[Tracker], Coroutine[Any, Any, dict[str, Any]]] | None = None,
    keep: bool = False,
) -> Result:
    """Create ``workload``'s pods (as fast as possible, or at ``rate`` per second) and
    follow them to the end; ``during`` runs beside (a fault) and returns extra figures."""
    namespace = bench.namespace(name)
    api = bench.api
    await api.ensure_namespace(namespace)
    tracker = Tracker(api, namespace)
    tracker.start()
    await asyncio.sleep(0.5)
    before = await bench.snapshot(scheduler, before=True)
    bench.audit.skip_to_end()
    start = time.time()
    cpu_before = bench.cpu_sample(scheduler)
    pending_fault = asyncio.create_task(during(tracker)) if during is not None else None

    async def create(index: int) -> None:
        if rate:
            await asyncio.sleep(max(0.0, start + index / rate - time.time()))
        body = workload.make(namespace, index)
        # From the moment the pod is asked for, as a user would count.
        asked = time.time()
        for attempt in range(60):
            try:
                await api.create(f"/api/v1/namespaces/{namespace}/pods", body)
                break
            except ApiError as exc:
                if exc.status == 409:  # an earlier try got through after all
                    break
                if attempt == 59:
                    raise
                await asyncio.sleep(0.5)
            except Exception:  # the API server may be restarting (faults): try again
                if attempt == 59:
                    raise
                await asyncio.sleep(0.5)
        tracker.created[body["metadata"]["name"]] = asked

    await gather_limited(64 if rate else 32, [create(i) for i in range(workload.count)])
    create_s = time.time() - start
    fit = {
        workload.make(namespace, i)["metadata"]["name"]
        for i in range(workload.count)
        if not workload.unfit(i)
    }
    unfit = {
        workload.make(namespace, i)["metadata"]["name"]
        for i in range(workload.count)
        if workload.unfit(i)
    }

    def done() -> bool:
        return fit <= tracker.bound.keys() and unfit <= tracker.waiting.keys()

    completed = await tracker.wait(done, timeout_s)
    cpu_after = bench.cpu_sample(scheduler)
    extra = await pending_fault if pending_fault is not None else {}
    await asyncio.sleep(1.0)  # the audit log and metrics catch up
    after = await bench.snapshot(scheduler, before=False)
    await tracker.stop()
    result = _result(
        bench, name, scheduler, workload, kind, start, create_s, tracker, before, after
    )
    result.completed = completed
    result.extra["cpu_ms"] = cpu.per_pod(cpu_before, cpu_after, result.placed)
    result.extra.update(extra)
    if rate:
        result.extra["rate"] = rate
    pods = await api.list_all(f"/api/v1/namespaces/{namespace}/pods")
    stamps = [_stamp_latency(pod) for pod in pods]
    result.stamp_p50_s = counting.percentile([s for s in stamps if s is not None], 0.5)
    result.stamp_p99_s = counting.percentile([s for s in stamps if s is not None], 0.99)
    check = await bench.recount()
    result.check, result.check_ok = check.summary(), check.ok
    if not keep:
        await bench.clean(namespace)
    bench.keep(result)
    print(_line(result), flush=True)
    return result


async def backlog(
    bench: Bench,
    name: str,
    scheduler: Scheduler,
    workload: Workload,
    release: Callable[[], Coroutine[Any, Any, None]],
    *,
    timeout_s: float = 600.0,
) -> Result:
    """The scheduler's side of the binding ceiling: ``workload``'s pods are all created
    first, for a scheduler name nobody serves yet, and then ``release`` makes the
    scheduler take them up at once. pods/s and latencies count from the release, so the
    figure is deciding and binding pods that already exist, as the ceiling binds them."""
    namespace = bench.namespace(name)
    api = bench.api
    await api.ensure_namespace(namespace)
    tracker = Tracker(api, namespace)
    tracker.start()
    created_at = time.time()

    async def create(index: int) -> None:
        await api.create(f"/api/v1/namespaces/{namespace}/pods", workload.make(namespace, index))

    await gather_limited(32, [create(i) for i in range(workload.count)])
    create_s = time.time() - created_at
    await asyncio.sleep(SETTLE_S)  # the scheduler has seen every pod (and left them alone)
    before = await bench.snapshot(scheduler, before=True)
    bench.audit.skip_to_end()
    start = time.time()
    cpu_before = bench.cpu_sample(scheduler)
    await release()
    names = [workload.make(namespace, i)["metadata"]["name"] for i in range(workload.count)]
    for pod_name in names:
        tracker.created[pod_name] = start
    completed = await tracker.wait(lambda: set(names) <= tracker.bound.keys(), timeout_s)
    cpu_after = bench.cpu_sample(scheduler)
    await asyncio.sleep(1.0)  # the audit log and metrics catch up
    after = await bench.snapshot(scheduler, before=False)
    await tracker.stop()
    result = _result(
        bench, name, scheduler, workload, "backlog", start, create_s, tracker, before, after
    )
    result.completed = completed
    result.extra["cpu_ms"] = cpu.per_pod(cpu_before, cpu_after, result.placed)
    # The operator's histogram counts from each pod's creation, before the release.
    result.hist_p50_s = result.hist_p99_s = None
    check = await bench.recount()
    result.check, result.check_ok = check.summary(), check.ok
    await bench.clean(namespace)
    bench.keep(result)
    print(_line(result), flush=True)
    return result


def _result(
    bench: Bench,
    name: str,
    scheduler: Scheduler,
    workload: Workload,
    kind: str,
    start: float,
    create_s: float,
    tracker: Tracker,
    before: dict[str, Any],
    after: dict[str, Any],
) -> Result:
    placed = len(tracker.bound)
    end = max(tracker.bound.values(), default=start)
    latencies = [
        tracker.bound[n] - tracker.created[n] for n in tracker.bound if n in tracker.created
    ]
    result = Result(
        name=name,
        scheduler=scheduler.label,
        kind=kind,
        what=workload.what,
        pods=workload.count,
        placed=placed,
        reasoned=len(tracker.waiting),
        create_s=create_s,
        duration_s=end - start,
        pods_per_s=placed / (end - start) if end > start else 0.0,
        watch_p50_s=counting.percentile(latencies, 0.5),
        watch_p99_s=counting.percentile(latencies, 0.99),
        bound_at=sorted(t - start for t in tracker.bound.values()),
        latencies_s=latencies,
    )
    writes = bench.audit.writes([bench.namespace(name)])
    mine = {what: n for (user, what), n in writes.items() if user == scheduler.user}
    if placed:
        result.writes = {what: n / placed for what, n in sorted(mine.items())}
        result.writes_per_pod = sum(mine.values()) / placed
        every = counting.diff(
            counting.apiserver_writes(after["apiserver"]),
            counting.apiserver_writes(before["apiserver"]),
        )
        result.all_writes_per_pod = sum(every.values()) / placed
        result.extra["all_writes"] = {k: v / placed for k, v in sorted(every.items())}
        sent = counting.diff(
            counting.watch_bytes(after["apiserver"]), counting.watch_bytes(before["apiserver"])
        )
        # What every watcher (schedulers, KWOK, the bench) was sent per placed pod.
        result.extra["watch_bytes"] = {k: v / placed for k, v in sorted(sent.items())}
    # A process restarted during the run (faults) has no CPU figure of its own for it.
    same = before["pid"] == after["pid"]
    if same and before["cpu"] is not None and after["cpu"] is not None and placed:
        result.cpu_ms_per_pod = 1000 * (after["cpu"] - before["cpu"]) / placed
    if before["operator"] and after["operator"]:
        metric = "vgpu_operator_pod_create_to_bound_seconds"
        first = counting.histogram(before["operator"], metric)
        last = counting.histogram(after["operator"], metric)
        result.hist_p50_s = counting.histogram_quantile(last, first, 0.5)
        result.hist_p99_s = counting.histogram_quantile(last, first, 0.99)
    if same and bench.rss is not None and scheduler.pid() == bench.rss.pid:
        window = [rss for when, _cpu, rss in bench.rss.samples if start <= when <= end + 1]
        result.peak_rss_mib = max(window, default=None)
    return result


def _stamp_latency(pod: Json) -> float | None:
    """creationTimestamp to the PodScheduled condition's lastTransitionTime (whole seconds)."""
    if not (pod.get("spec") or {}).get("nodeName"):
        return None
    condition = checks.scheduled_condition(pod)
    created = timestamps.unix_time((pod.get("metadata") or {}).get("creationTimestamp"))
    scheduled = timestamps.unix_time((condition or {}).get("lastTransitionTime"))
    if created is None or scheduled is None:
        return None
    return scheduled - created


def _line(result: Result) -> str:
    def s(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    return (
        f"[bench {time.strftime('%H:%M:%S')}] {result.name:<18} {result.scheduler:<24} "
        f"{result.placed}/{result.pods} placed "
        f"in {result.duration_s:.1f}s = {result.pods_per_s:.1f} pods/s; p50/p99 "
        f"{s(result.watch_p50_s)}/{s(result.watch_p99_s)} s; writes/pod "
        f"{s(result.writes_per_pod)}; cpu ms/pod {s(result.cpu_ms_per_pod)}; "
        f"{'ok' if result.check_ok else 'CHECK FAILED'}: {result.check}"
    )
