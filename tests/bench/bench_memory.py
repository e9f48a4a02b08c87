"""The engine's memory per 1,000 nodes and per 10,000 bound pods; reports, asserts nothing.

Run standalone (``PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_memory.py [nodes]
[pods]``). One process builds a ``ClusterState`` of ``nodes`` nodes of 8 GPUs
(80 GiB, 10 slots, two models, no pods), then binds ``pods`` pods of one GPU and 4,000 MiB
to them, round robin, as the restart bench does (``docs/benchmarks.md``). After each step
it reports the process's resident set (``/proc/self/statm``) and the bytes Python holds
(``tracemalloc``, in a second pass: tracing slows the build and adds its own memory, so
the resident figures come from the untraced pass). The operator's RSS adds to these the
interpreter, its libraries, the feed's copies of the objects and the HTTP client.
"""

from __future__ import annotations

import gc
import os
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.append(str(HERE))

from bench_scheduling import _node  # noqa: E402

from vgpu_operator import names  # noqa: E402
from vgpu_operator.config import DeviceConfig  # noqa: E402
from vgpu_operator.devices import codec, model, nvidia  # noqa: E402
from vgpu_operator.scheduling.cycle.cluster import ClusterState  # noqa: E402

NODES = 1000
PODS = 10_000
POD_MIB = 4000


def _cards(index: int) -> list[model.DeviceInfo]:
    card_type = ("NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3")[index % 2]
    return [
        model.DeviceInfo(
            id=f"GPU-{index:05d}-{i}",
            index=i,
            count=10,
            memory_mib=81920,
            cores=100,
            type=card_type,
            numa=i // 4,
            health=True,
        )
        for i in range(8)
    ]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _bound_pods(nodes: int, pods: int) -> Iterator[dict[str, Any]]:
    for serial in range(pods):
        index = serial % nodes
        node = f"node-{index:05d}"
        card = f"GPU-{index:05d}-{(serial // nodes) % 8}"
        devices = (((model.ContainerDevice(card, "NVIDIA", POD_MIB, 10)),),)
        yield {
            "metadata": {
                "name": f"bound-{serial}",
                "namespace": "bench",
                "uid": f"uid-{serial}",
                "annotations": {
                    names.ASSIGNED_NODE: node,
                    nvidia.ALLOCATED_ANNOTATION: codec.encode_pod_single_device(devices),
                },
            },
            "spec": {
                "nodeName": node,
                "schedulerName": names.SCHEDULER_NAME,
                "containers": [
                    {
                        "name": "main",
                        "resources": {
                            "limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": POD_MIB},
                            "requests": {"cpu": "1", "memory": "4Gi"},
                        },
                    }
                ],
            },
            "status": {"phase": "Running"},
        }


def _measure(nodes: int, pods: int, traced: bool) -> list[int]:
    """The bytes after each step: nothing, the nodes, the pods."""

    def now() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0] if traced else _rss_bytes()

    if traced:
        tracemalloc.start()
    marks = [now()]
    state = ClusterState(DeviceConfig())
    for index in range(nodes):
        name = f"node-{index:05d}"
        state.set_node(_node(name))
        state.set_inventory(name, _cards(index), {}, heartbeat=0.0)
    marks.append(now())
    # Pods the feed holds as the API gives them: each object is kept, not a shared one.
    for pod in _bound_pods(nodes, pods):
        state.set_pod(pod)
    marks.append(now())
    if traced:
        tracemalloc.stop()
    del state
    return marks


def run(nodes: int = NODES, pods: int = PODS) -> list[dict[str, Any]]:
    rss = _measure(nodes, pods, traced=False)
    held = _measure(nodes, pods, traced=True)
    mib = 1 << 20
    return [
        {
            "case": f"{nodes} nodes of 8 GPUs",
            "rss_mib": round((rss[1] - rss[0]) / mib, 1),
            "python_mib": round((held[1] - held[0]) / mib, 1),
            "per_1000_nodes_mib": round((rss[1] - rss[0]) / mib * 1000 / nodes, 1),
        },
        {
            "case": f"{pods} bound pods on them",
            "rss_mib": round((rss[2] - rss[1]) / mib, 1),
            "python_mib": round((held[2] - held[1]) / mib, 1),
            "per_10000_pods_mib": round((rss[2] - rss[1]) / mib * 10_000 / pods, 1),
        },
        {"case": "process RSS at the end", "rss_mib": round(rss[2] / mib, 1)},
    ]


if __name__ == "__main__":
    arguments = [int(a) for a in sys.argv[1:3]]
    for row in run(*arguments):
        print(row)
