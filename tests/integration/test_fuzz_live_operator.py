"""Malformed input thrown at the live operator: it keeps running, says what to change, and
never books a card beyond what its authentic inventory says (issue 10).

Seeded rounds of random input, each against the same running operator on the real API
server: pods with garbage quantities and annotations (created straight for our scheduler,
so the engine, not the webhook, must cope), forged or implausible DeviceInventories, and
garbage Node annotations on the real GPU nodes. After each round every pod has been
decided (bound, or told why it waits), the operator's thread is alive, and a recount of
the bound pods' allocations from the API server fits the cards the test itself reported.
Counts and waits are bounded; the seeds make a failure reproducible.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Iterator
from typing import Any, Final

import pytest
from integration import operator_env as env

from vgpu_operator import names
from vgpu_operator.devices import nvidia
from vgpu_operator.handlers.runtime import OperatorThread
from vgpu_operator.testing.controlplane import ControlPlane

SEEDS: Final = (1, 2, 3)
PODS_PER_ROUND: Final = 8

#: Quantities a careless or hostile user writes, with whether the engine can honour them.
MEMORIES: Final = (
    ("4096", True),
    ("1000", True),
    ("4Gi", False),
    ("16G", False),
    ("2147483648", False),
    ("1e30", False),
    ("-1", False),
    ("1.5", False),
    ("lots", False),
)
COUNTS: Final = (("1", True), ("2", True), ("1.5", False), ("-1", False), ("x", False))
CORES: Final = (("10", True), ("100", True), ("150", True), ("abc", False))
#: Annotations the engine must read, ignore or report, never crash on.
ANNOTATIONS: Final = (
    {},
    {names.DEVICE_SCORING_WEIGHTS: "slot=lots"},
    {names.GPU_SCHEDULER_POLICY: "binpak,,%%"},
    {names.NODE_SCHEDULER_POLICY: "\x00"},
    {nvidia.USE_TYPE_ANNOTATION: "," * 50},
    {nvidia.USE_UUID_ANNOTATION: "GPU-nope"},
    {nvidia.NUMA_BIND_ANNOTATION: "maybe"},
)
#: Node annotations that must be reported and ignored.
NODE_ANNOTATIONS: Final = (
    {nvidia.REGISTER_ANNOTATION: "[{]"},
    {
        nvidia.REGISTER_ANNOTATION: '[{"id":"GPU-forged","index":0,"count":10,"devmem":900000000,'
        '"devcore":100,"type":"NVIDIA-H100","numa":0,"mode":"hami-core","health":true}]'
    },
    {names.GPU_SCHEDULER_POLICY: "fastest"},
    {names.NODE_DEVICE_CORDON: ",,,"},
)


@pytest.fixture
def fuzzed(control_plane: ControlPlane, namespace: str) -> Iterator[tuple[str, OperatorThread]]:
    scheduler = env.new_scheduler(control_plane, namespace, prefix="fuzz")
    with OperatorThread(env.options(control_plane, namespace)) as running:
        yield scheduler, running
    env.cleanup_group(control_plane, namespace)
    for name in _forged_names(control_plane, namespace):
        control_plane.delete(f"{env.INVENTORIES}/{name}")


def _forged_names(cp: ControlPlane, namespace: str) -> list[str]:
    items = cp.get(env.INVENTORIES).get("items", [])
    return [i["metadata"]["name"] for i in items if i["metadata"]["name"].startswith(namespace)]


def _pod(
    namespace: str, name: str, scheduler: str, rng: random.Random
) -> tuple[dict[str, Any], bool]:
    memory, memory_ok = rng.choice(MEMORIES)
    count, count_ok = rng.choice(COUNTS)
    cores, cores_ok = rng.choice(CORES)
    pod = env.gpu_pod(namespace, name, scheduler=scheduler, group=namespace)
    pod["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpu": count,
        "nvidia.com/gpumem": memory,
        "nvidia.com/gpucores": cores,
    }
    annotations = dict(rng.choice(ANNOTATIONS))
    if annotations:
        pod["metadata"]["annotations"] = annotations
    readable = (
        memory_ok and count_ok and cores_ok and names.DEVICE_SCORING_WEIGHTS not in annotations
    )
    return pod, readable


def _forge_inventory(cp: ControlPlane, namespace: str, victim: str, rng: random.Random) -> None:
    """An inventory that lies: it names another node, or claims impossible cards. The API
    server may refuse it (the CRD's rules); if it takes it, the operator must not believe it."""
    name = f"{namespace}-forged-{rng.randrange(10**6)}"
    forged = env.Card("GPU-forged", memory_mib=rng.choice((900000, 10**9)))
    status = env.inventory_status(rng.choice((victim, name)), [forged])
    status["devices"][0]["memoryMiB"] = rng.choice((900000, -5, 10**9, "a lot"))
    created = {
        "apiVersion": f"{names.CRD_GROUP}/{names.CRD_VERSION}",
        "kind": names.DEVICE_INVENTORY_KIND,
        "metadata": {"name": name},
    }
    cp.create(env.INVENTORIES, created)
    refusal = env.refusal(lambda: cp.patch(f"{env.INVENTORIES}/{name}/status", {"status": status}))
    assert refusal is None or refusal.status in (400, 422), refusal


def _decided(pod: dict[str, Any]) -> bool:
    if pod["spec"].get("nodeName"):
        return True
    condition = env.condition(pod)
    return bool(condition and condition.get("status") == "False" and condition.get("message"))


@pytest.mark.parametrize("seed", SEEDS)
def test_malformed_input_never_crashes_or_overbooks(
    control_plane: ControlPlane,
    namespace: str,
    fuzzed: tuple[str, OperatorThread],
    seed: int,
) -> None:
    scheduler, operator = fuzzed
    rng = random.Random(seed)
    authentic = {
        f"{namespace}-n{i}": env.cards(f"{namespace}-n{i}", 2, memory_mib=16000, split_count=4)
        for i in range(2)
    }
    for node, node_cards in authentic.items():
        env.gpu_node(control_plane, node, node_cards, group=namespace)
    for node in authentic:
        bad = dict(rng.choice(NODE_ANNOTATIONS))
        control_plane.patch(f"/api/v1/nodes/{node}", {"metadata": {"annotations": bad}})
        _forge_inventory(control_plane, namespace, node, rng)

    readable: dict[str, bool] = {}
    for i in range(PODS_PER_ROUND):
        pod, ok = _pod(namespace, f"p{seed}-{i}", scheduler, rng)
        refusal = env.refusal(functools.partial(env.create_pod, control_plane, pod))
        if refusal is not None:
            # What is not a whole quantity at all the API server refuses itself.
            assert refusal.status in (400, 422), refusal
            assert not ok
            continue
        readable[pod["metadata"]["name"]] = ok

    def all_decided() -> list[dict[str, Any]] | None:
        pods = [
            p for p in env.list_pods(control_plane, namespace) if p["metadata"]["name"] in readable
        ]
        return pods if len(pods) == len(readable) and all(_decided(p) for p in pods) else None

    pods = env.wait_until("every fuzzed pod to be bound or told why it waits", all_decided, 60)
    assert operator.alive, "the operator's thread died"

    cards = {c.uuid: c for node_cards in authentic.values() for c in node_cards}
    for pod in pods:
        name = pod["metadata"]["name"]
        if pod["spec"].get("nodeName"):
            assert readable[name], f"{name} asked for something unreadable but was bound"
            assert pod["spec"]["nodeName"] in authentic
            assert env.allocation(pod), f"{name} is a GPU pod bound without a GPU"
        elif not readable[name]:
            message = env.condition(pod)["message"]
            assert "nvidia.com/" in message or names.DEVICE_SCORING_WEIGHTS in message, message
    for uuid, (shares, memory, cores) in env.usage_by_card(pods).items():
        assert uuid in cards, f"a pod was bound to {uuid}, a card no authentic report has"
        card = cards[uuid]
        assert shares <= card.split_count
        assert memory <= card.memory_mib
        assert cores <= card.cores
