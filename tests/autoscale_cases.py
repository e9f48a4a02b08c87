"""Instance types, NodePools and queues for the autoscaling tests (unit and property)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from builders import GPU, cluster, make_pod

from vgpu_operator.devices import dra, model
from vgpu_operator.scheduling import gangs
from vgpu_operator.scheduling.autoscale import catalogue
from vgpu_operator.scheduling.autoscale.catalogue import (
    InstanceType,
    NodeOption,
    NodePool,
    Offering,
)
from vgpu_operator.scheduling.autoscale.whatif import Unit
from vgpu_operator.scheduling.books import Books
from vgpu_operator.scheduling.dialects.claims import claim_templates
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


def dra_cards(devices: Sequence[model.DeviceInfo], product: str) -> tuple[dra.CardShape, ...]:
    """What the DRA driver publishes of ``devices`` (as ``dra_shapes.card_shapes`` would)."""
    return tuple(
        dra.CardShape(d.id, d.index, product, d.type, d.memory_mib, d.cores, d.count, "hami-core")
        for d in devices
    )


def instance_type(
    name: str, count: int, memory_mib: int, type_: str, price: float, cpu: int = 64
) -> InstanceType:
    devices = cards(count, memory_mib, type_)
    return InstanceType(
        name=name,
        offerings=(Offering(price, "zone-a", "on-demand"),),
        capacity={
            "cpu": Fraction(cpu),
            "memory": Fraction(512 * 2**30),
            "pods": Fraction(110),
            GPU: Fraction(count),
        },
        devices=devices,
        dra_cards=dra_cards(devices, type_),
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
    dra_path: bool = False,
) -> NodePool:
    """A NodePool of ``types``; ``dra_path``: its template labels the nodes for DRA."""
    return NodePool(
        name=name,
        requirements=(
            catalogue.Requirement(
                catalogue.INSTANCE_TYPE_LABEL, "In", tuple(t.name for t in types)
            ),
        ),
        limits=limits or {},
        used=used or {},
        labels={dra.NODE_PATH_LABEL: dra.PATH_DRA} if dra_path else {},
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


# --- pods with claims (the DRA path) -------------------------------------------------------


def dra_books() -> Books:
    """Live books with our DeviceClasses and no node."""
    books = cluster().books
    for device_class in dra.device_classes():
        books.claims.set_device_class(device_class)
    return books


def dra_options(types: Sequence[InstanceType] = TYPES, dra_path: bool = True) -> list[NodeOption]:
    """The options of one NodePool of ``types`` whose nodes are on the DRA path."""
    return catalogue.options([pool(types=types, dra_path=dra_path)], types)


def claim_object(
    name: str, memory_mib: int | None, cores: int | None = None, count: int = 1
) -> dict[str, Any]:
    """A ResourceClaim ``team/name`` of one request ``gpu`` of our shared class."""
    capacity = {}
    if memory_mib is not None:
        capacity[dra.MEMORY] = f"{memory_mib}Mi"
    if cores is not None:
        capacity[dra.CORES] = str(cores)
    exactly: dict[str, Any] = {"deviceClassName": dra.SHARED_CLASS, "count": count}
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    return {
        "apiVersion": dra.API_VERSION,
        "kind": "ResourceClaim",
        "metadata": {"namespace": "team", "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}},
    }


def claim_pod(name: str, claim: str, group: str | None = None) -> dict[str, Any]:
    """A pending pod of ours whose one container uses the claim ``claim``."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "team", "name": name, "uid": f"uid-p-{name}"},
        "spec": {
            "schedulerName": "vgpu-scheduler",
            "containers": [{"name": "c", "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimName": claim}],
        },
        "status": {"phase": "Pending"},
    }
    if group is not None:
        pod["spec"]["schedulingGroup"] = {"podGroupName": group}
    return pod


def claim_unit(
    books: Books,
    name: str,
    memory_mib: int | None = 10000,
    cores: int | None = None,
    count: int = 1,
) -> Unit:
    """A pod alone with its claim (made in ``books``, as the claims feed would)."""
    books.claims.set_claim(claim_object(name, memory_mib, cores, count))
    pod = claim_pod(name, name)
    return Unit(str(pod_key(pod)), (pod,))


def _claim_pod(
    books: Books, name: str, rng: random.Random, group: str | None = None
) -> tuple[dict[str, Any], tuple[dict[str, Any], ...]]:
    """A pod with one claim: a fractional share, a whole card, or several cards. The claim
    is made in ``books`` (as the claims feed would), or, one time in three, left to be made
    from a template (the unit carries it as the claim controller would make it)."""
    kind = rng.choice(("fraction", "fraction", "whole", "multi"))
    if kind == "fraction":
        claim = claim_object(name, rng.choice((4096, 8192, 12288, 20480, 30720)))
    elif kind == "whole":
        claim = claim_object(name, rng.choice((24576, 40960, 49152)), cores=100)
    else:
        claim = claim_object(name, rng.choice((8192, 20480)), count=rng.choice((2, 3, 4)))
    pod = claim_pod(name, name, group)
    if rng.random() < 1 / 3:
        template = {
            "metadata": {"namespace": "team", "name": name},
            "spec": {"spec": claim["spec"]},
        }
        pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": name}]
        made = claim_templates.with_template_claims(pod, {f"team/{name}": template})
        assert not isinstance(made, str)
        return made[0], tuple(made[1])
    books.claims.set_claim(claim)
    return pod, ()


def dra_queue(books: Books, rng: random.Random, max_units: int) -> list[Unit]:
    """Up to ``max_units`` units of pods with claims: pods alone and gangs of two or three."""
    units: list[Unit] = []
    for index in range(rng.randint(1, max_units)):
        if rng.random() < 0.2:
            name = f"g{index}"
            made = [_claim_pod(books, f"{name}-{m}", rng, name) for m in range(rng.randint(2, 3))]
            spec = gangs.GroupSpec(f"team/{name}", True, len(made))
            claims = tuple(c for _, cs in made for c in cs)
            units.append(Unit(f"team/{name}", tuple(p for p, _ in made), spec, claims=claims))
        else:
            pod, claims = _claim_pod(books, f"p{index}", rng)
            units.append(Unit(str(pod_key(pod)), (pod,), claims=claims))
    return units
