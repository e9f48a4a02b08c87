"""Pods bound by the bench itself: the binding ceiling, and resident pods already bound.

The ceiling is what the API server allows a plain asyncio client: pre-decided pods bound
through the Binding subresource by one aiohttp session with 64 requests in flight, each
Binding carrying the same allocation annotations the operator's does.
"""

from __future__ import annotations

import asyncio
import time

from e2e import cpu, runs
from e2e.api import Api, gather_limited
from e2e.workloads import NOBODY, pod
from vgpu_operator import names
from vgpu_operator.devices import codec, nvidia
from vgpu_operator.devices.model import ContainerDevice


def _allocation(
    uuid: str, memory_mib: int, cores: int, node: str, phase: codec.BindPhase
) -> dict[str, str]:
    encoded = codec.encode_pod_single_device(
        ((ContainerDevice(uuid, "NVIDIA", memory_mib, cores),),)
    )
    now = codec.encode_vgpu_time(time.time())
    return {
        names.ASSIGNED_NODE: node,
        names.ASSIGNED_TIME: now,
        names.BIND_PHASE: phase.value,
        names.BIND_TIME: now,
        nvidia.TO_ALLOCATE_ANNOTATION: encoded,
        nvidia.ALLOCATED_ANNOTATION: encoded,
    }


async def ceiling(
    bench: runs.Bench,
    binder: Api,
    count: int,
    name: str = "ceiling",
    watcher: runs.Scheduler | None = None,
) -> runs.Result:
    """Create ``count`` pods nobody schedules, then bind them all, one per card.

    ``watcher``: a scheduler running meanwhile (it leaves these pods alone but its
    watches receive every Binding and status update); its CPU is counted apart."""
    namespace = bench.namespace(name)
    api = bench.api
    await api.ensure_namespace(namespace)
    cards = list(bench.cards.items())[:count]
    limits = {"nvidia.com/gpu": "1"}

    async def create(index: int) -> None:
        body = pod(namespace, f"ceil-{index:05d}", scheduler=NOBODY, limits=limits)
        await api.create(f"/api/v1/namespaces/{namespace}/pods", body)

    await gather_limited(32, [create(i) for i in range(len(cards))])
    # As the backlog waits before its release: the creations would otherwise cost the
    # first Bindings' time.
    await asyncio.sleep(runs.SETTLE_S)
    bench.audit.skip_to_end()
    bound_at: list[float] = []
    start = time.time()
    cpu_before = bench.cpu_sample(watcher)

    async def bind(index: int) -> None:
        uuid, (node, memory, _cores, _split) = cards[index]
        pod_name = f"ceil-{index:05d}"
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": pod_name,
                "namespace": namespace,
                "annotations": _allocation(uuid, memory, 0, node, codec.BindPhase.ALLOCATING),
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        await binder.create(f"/api/v1/namespaces/{namespace}/pods/{pod_name}/binding", body)
        bound_at.append(time.time() - start)

    await gather_limited(64, [bind(i) for i in range(len(cards))])
    duration = time.time() - start
    cpu_after = bench.cpu_sample(watcher)
    result = runs.Result(
        name=name,
        scheduler="binding ceiling (aiohttp)"
        + (f", {watcher.label} watching" if watcher is not None else ""),
        kind="ceiling",
        what="pre-decided whole-GPU pods, one Binding each",
        pods=len(cards),
        placed=len(bound_at),
        duration_s=duration,
        pods_per_s=len(bound_at) / duration,
        bound_at=sorted(bound_at),
    )
    result.extra["cpu_ms"] = cpu.per_pod(cpu_before, cpu_after, len(bound_at))
    writes = bench.audit.writes([namespace])
    mine = sum(n for (user, _what), n in writes.items() if user == "bench-ceiling")
    result.writes_per_pod = mine / max(1, len(bound_at))
    check = await bench.recount()
    result.check, result.check_ok = check.summary(), check.ok
    await bench.clean(namespace)
    bench.keep(result)
    print(runs._line(result), flush=True)
    return result


async def residents(bench: runs.Bench, count: int) -> str:
    """``count`` fractional pods already bound (created with their node and allocation,
    as the operator would have left them), spread over every card; their namespace."""
    namespace = "bench-resident"
    api = bench.api
    await api.ensure_namespace(namespace)
    cards = list(bench.cards.items())
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "10"}

    async def create(index: int) -> None:
        uuid, (node, _memory, _cores, _split) = cards[index % len(cards)]
        body = pod(
            namespace,
            f"res-{index:05d}",
            scheduler=names.SCHEDULER_NAME,
            limits=limits,
            # Running pods: their device plugin has answered long ago.
            annotations=_allocation(uuid, 4096, 10, node, codec.BindPhase.SUCCESS),
            node=node,
        )
        await api.create(f"/api/v1/namespaces/{namespace}/pods", body)

    await gather_limited(32, [create(i) for i in range(count)])
    return namespace
