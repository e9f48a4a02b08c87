"""The DRA part's load runs (issue 35): claims for an NVLink pair of shares, steady
arrivals, and the preemption slot.

- ``PAIR``: the shape of the throughput and steady runs. Two shares (10 GiB, 25 % each) on
  two cards with the same ``nvlinkIsland``, asked for by a ``matchAttribute`` constraint:
  the request upstream's DRA allocator is slowest at (271 -> 121 pods/s in upstream's own
  runs), and the one that shows whether an allocator keeps pairs on one link.
- ``steady``: claims (each with its pod) arriving at a fixed rate, one claim and one pod
  per arrival, timed from the claim's creation request to the bench seeing the pod bound.
- ``preemption``: nodes filled with low-priority pods whose claims take whole cards, then
  high-priority pods whose claims fit only where a victim leaves; create-to-bound of the
  preemptors and, when the operator exports it, its preemption decision time
  (``DECISION_METRIC``). Until DRA preemption is built the preemptors wait, and the run
  says so; the figures fill in when it is.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from e2e import counting
from e2e.api import Api, ApiError, gather_limited
from e2e.tracking import Tracker
from vgpu_operator.devices import dra

RESOURCE: Final = "/apis/resource.k8s.io/v1"
#: The NVLink island's attribute by its qualified name, as a constraint must name it.
LINK_ATTRIBUTE: Final = f"{dra.DRIVER}/{dra.ATTR_NVLINK_ISLAND}"
#: The operator's histogram of one DRA preemption decision (victims chosen), seconds.
#: The preemption work is to export it under this name; none yet: the slot stays empty.
DECISION_METRIC: Final = "vgpu_operator_dra_preemption_decision_seconds"
HIGH_PRIORITY: Final = "bench-dra-high"


def pair_spec(memory_gib: int = 10, cores: int = 25) -> dict[str, Any]:
    """A claim for two shares on two cards of one NVLink island."""
    exactly = {
        "deviceClassName": dra.SHARED_CLASS,
        "count": 2,
        "capacity": {"requests": {"memory": f"{memory_gib}Gi", "cores": str(cores)}},
    }
    return {
        "devices": {
            "requests": [{"name": "gpu", "exactly": exactly}],
            "constraints": [{"requests": ["gpu"], "matchAttribute": LINK_ATTRIBUTE}],
        }
    }


def whole_card_spec(memory_gib: int) -> dict[str, Any]:
    """A claim for all of one card's memory (the preemption run's shape)."""
    exactly = {
        "deviceClassName": dra.SHARED_CLASS,
        "count": 1,
        "capacity": {"requests": {"memory": f"{memory_gib}Gi", "cores": "100"}},
    }
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def spread(values: Sequence[float | None]) -> dict[str, float] | None:
    """Median, min, max and (max - min) ÷ median of repeated figures."""
    real = sorted(v for v in values if v is not None)
    if not real:
        return None
    middle = len(real) // 2
    median = real[middle] if len(real) % 2 else (real[middle - 1] + real[middle]) / 2
    return {
        "median": median,
        "min": real[0],
        "max": real[-1],
        "spread": (real[-1] - real[0]) / median if median else 0.0,
    }


def spread_text(found: Mapping[str, float] | None, digits: int = 1, runs: int = 0) -> str:
    if not found:
        return "-"
    if runs == 1:
        return f"{found['median']:.{digits}f} (one run)"
    text = f"{found['median']:.{digits}f} ({found['min']:.{digits}f}-{found['max']:.{digits}f}"
    return text + f", {100 * found['spread']:.0f} %" + (f", {runs} runs)" if runs else ")")


async def steady(
    api: Api,
    namespace: str,
    pod_body: Any,
    pool: str,
    ours: bool,
    rate: float,
    count: int,
) -> dict[str, Any]:
    """``count`` claims arriving at ``rate`` per second, each with its pod; p50/p99 from
    the claim's creation request to the pod seen bound. ``pod_body``: dra.pod_body."""
    await api.ensure_namespace(namespace)
    tracker = Tracker(api, namespace)
    tracker.start()
    await asyncio.sleep(0.5)
    start = time.time()
    asked: dict[str, float] = {}

    async def arrive(i: int) -> None:
        await asyncio.sleep(max(0.0, start + i / rate - time.time()))
        asked[f"s{i}"] = time.time()
        await api.create(
            f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
            {"metadata": {"name": f"s{i}"}, "spec": pair_spec()},
        )
        body = pod_body(f"s{i}", pool, ours, {"resourceClaimName": f"s{i}"})
        await api.create(f"/api/v1/namespaces/{namespace}/pods", body)

    await gather_limited(64, [arrive(i) for i in range(count)])
    arrived_s = time.time() - start
    done = await tracker.wait(lambda: len(tracker.bound) >= count, 300)
    await tracker.stop()
    latencies = [tracker.bound[n] - asked[n] for n in tracker.bound if n in asked]
    return {
        "rate": rate,
        "pods": count,
        "placed": len(tracker.bound),
        "complete": done,
        "arrived_per_s": round(count / arrived_s, 1) if arrived_s > 0 else None,
        "p50_s": _round(counting.percentile(latencies, 0.5)),
        "p99_s": _round(counting.percentile(latencies, 0.99)),
    }


def on_one_link(claims: Sequence[Mapping[str, Any]]) -> tuple[int, int]:
    """(allocated two-device claims whose cards share an NVLink island, allocated
    two-device claims): the constraint honoured. The bench's cards are named ...-<index>
    and pair 0+1, 2+3, ... (``dra.make_nodes``)."""
    linked = pairs = 0
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        results = (allocation.get("devices") or {}).get("results") or []
        if len(results) != 2:
            continue
        pairs += 1
        islands = {(r.get("pool"), int(str(r["device"]).rsplit("-", 1)[1]) // 2) for r in results}
        linked += len(islands) == 1
    return linked, pairs


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def preemption(
    api: Api,
    namespace: str,
    pod_body: Any,
    pool: str,
    cards: int,
    card_gib: int,
    metrics_url: str,
    http_get: Any,
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Fill ``cards`` cards of the pool's nodes with low-priority whole-card claims, then
    ask for a quarter as many high-priority ones (the engine's pods): how long each
    preemptor waits for its bind, and the operator's decision time if it exports it."""
    await api.ensure_namespace(namespace)
    body = {
        "apiVersion": "scheduling.k8s.io/v1",
        "kind": "PriorityClass",
        "metadata": {"name": HIGH_PRIORITY},
        "value": 1000,
    }
    try:
        await api.create("/apis/scheduling.k8s.io/v1/priorityclasses", body)
    except ApiError as exc:
        if exc.status != 409:
            raise
    tracker = Tracker(api, namespace)
    tracker.start()

    async def make(name: str, high: bool) -> None:
        await api.create(
            f"{RESOURCE}/namespaces/{namespace}/resourceclaims",
            {"metadata": {"name": name}, "spec": whole_card_spec(card_gib)},
        )
        pod = pod_body(name, pool, True, {"resourceClaimName": name})
        if high:
            pod["spec"]["priorityClassName"] = HIGH_PRIORITY
        await api.create(f"/api/v1/namespaces/{namespace}/pods", pod)

    await gather_limited(32, [make(f"low{i}", False) for i in range(cards)])
    filled = await tracker.wait(lambda: len(tracker.bound) >= cards, 120)
    before = await asyncio.to_thread(http_get, metrics_url, 30.0)
    high = max(1, cards // 4)
    start = time.time()
    await gather_limited(32, [make(f"high{i}", True) for i in range(high)])
    names = {f"high{i}" for i in range(high)}
    preempted = await tracker.wait(lambda: names <= tracker.bound.keys(), timeout_s)
    await tracker.stop()
    after = await asyncio.to_thread(http_get, metrics_url, 30.0)
    waits = [tracker.bound[n] - start for n in names if n in tracker.bound]
    out: dict[str, Any] = {
        "filled": filled,
        "low": cards,
        "high": high,
        "bound": len(waits),
        "complete": preempted,
        "timeout_s": timeout_s,
        "create_to_bound_p50_s": _round(counting.percentile(waits, 0.5)),
        "create_to_bound_p99_s": _round(counting.percentile(waits, 0.99)),
        "decision_p50_s": None,
        "decision_p99_s": None,
    }
    if before and after:
        first = counting.histogram(before, DECISION_METRIC)
        last = counting.histogram(after, DECISION_METRIC)
        out["decision_p50_s"] = counting.histogram_quantile(last, first, 0.5)
        out["decision_p99_s"] = counting.histogram_quantile(last, first, 0.99)
    return out
