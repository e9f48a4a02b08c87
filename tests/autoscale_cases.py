"""Instance types, NodePools and queues for the autoscaling tests (unit and property)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from builders import GPU, make_pod

from vgpu_operator.devices import model
from vgpu_operator.scheduling import gangs
from vgpu_operator.scheduling.autoscale import catalogue
from vgpu_operator.scheduling.autoscale.catalogue import InstanceType, NodePool, Offering
from vgpu_operator.scheduling.autoscale.whatif import Unit
from vgpu_operator.scheduling.pod_key import pod_key

H100 = "NVIDIA H100 80GB HBM3"
L40S = "NVIDIA L40S"
A100 = "NVIDIA A100-SXM4-40GB"


def cards(
    count: int, memory_mib: int, type_: str, numa_split: bool = False
) -> tuple[model.DeviceInfo, ...]:
    return tuple(
        model.DeviceInfo(
            f"card-{i}", i, 10, memory_mib, 100, type_, (i * 2 // count) if numa_split else 0, True
        )
        for i in range(count)
    )


def instance_type(
    name: str, count: int, memory_mib: int, type_: str, price: float, cpu: int = 64
) -> InstanceType:
    return InstanceType(
        name=name,
        offerings=(Offering(price, "zone-a", "on-demand"),),
        capacity={
            "cpu": Fraction(cpu),
            "memory": Fraction(512 * 2**30),
            "pods": Fraction(110),
            GPU: Fraction(count),
        },
        devices=cards(count, memory_mib, type_),
    )


H100X8 = instance_type("gpu-8xh100", 8, 81559, H100, 98.0)
L40SX4 = instance_type("gpu-4xl40s", 4, 46068, L40S, 8.0)
A100X1 = instance_type("gpu-1xa100", 1, 40960, A100, 3.0)
TYPES = (H100X8, L40SX4, A100X1)


def pool(
    name: str = "gpu",
    types: Sequence[InstanceType] = TYPES,
    limits: dict[str, Fraction] | None = None,
    used: dict[str, Fraction] | None = None,
) -> NodePool:
    return NodePool(
        name=name,
        requirements=(
            catalogue.Requirement(
                catalogue.INSTANCE_TYPE_LABEL, "In", tuple(t.name for t in types)
            ),
        ),
        limits=limits or {},
        used=used or {},
    )


def options(types: Sequence[InstanceType] = TYPES, **pool_args: Any) -> list[catalogue.NodeOption]:
    return catalogue.options([pool(types=types, **pool_args)], types)


def share(
    name: str, gpus: int = 1, memory_mib: int = 10000, cores: int | None = None, **annotations: str
) -> Unit:
    builder = make_pod(name, "team").container(gpu=gpus, gpumem=memory_mib, cores=cores)
    for key, value in annotations.items():
        builder.annotate(key, value)
    pod = builder.obj()
    return Unit(f"{pod_key(pod)}", (pod,))


# --- generated queues (the property test) -----------------------------------------------

SMALL = instance_type("p-2x24", 2, 24576, "NVIDIA L4", 1.0, cpu=16)
MID = instance_type("p-4x48", 4, 49152, L40S, 3.5, cpu=32)
BIG = instance_type("p-8x80", 8, 81920, H100, 10.0, cpu=64)
ONE80 = instance_type("p-1x80", 1, 81920, H100, 2.4, cpu=16)
PROPERTY_TYPES = (SMALL, MID, BIG)
#: Without the big machine that holds most queues whole: queues need several nodes.
LARGE_QUEUE_TYPES = (SMALL, MID, ONE80)


def _pod(name: str, rng: random.Random, group: str | None = None) -> dict[str, Any]:
    """A fractional share, a whole card, or a multi-card pod."""
    kind = rng.choice(("fraction", "fraction", "whole", "multi"))
    builder = make_pod(name, "team")
    if kind == "fraction":
        builder.container(gpu=1, gpumem=rng.choice((4096, 8192, 12288, 20480, 30720)))
    elif kind == "whole":
        builder.container(gpu=1, gpumem=rng.choice((24576, 40960, 49152)), cores=100)
    else:
        builder.container(gpu=rng.choice((2, 3, 4)), gpumem=rng.choice((8192, 20480)))
    pod = builder.obj()
    if group is not None:
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def queue(rng: random.Random, max_units: int) -> list[Unit]:
    """Up to ``max_units`` units: pods alone and gangs of two or three."""
    units: list[Unit] = []
    for index in range(rng.randint(1, max_units)):
        if rng.random() < 0.2:
            name = f"g{index}"
            members = tuple(_pod(f"{name}-{m}", rng, name) for m in range(rng.randint(2, 3)))
            spec = gangs.GroupSpec(f"team/{name}", True, len(members))
            units.append(Unit(f"team/{name}", members, spec))
        else:
            pod = _pod(f"p{index}", rng)
            units.append(Unit(str(pod_key(pod)), (pod,)))
    return units
