"""``vgpu-operator demo`` end to end: its own control plane, the simulated nodes' agents,
the operator process and the pods of examples/; then what the operator decided.

The demo runs once for the module; each test checks one example's outcome against the
cards the agents reported (their NUMA nodes and NVLink peers come from the inventories).
"""

from __future__ import annotations

import itertools
import re

import pytest

from vgpu_operator.demo import DemoResult, PlacedPod, render_result, run_demo
from vgpu_operator.testing.controlplane import Binaries

L40S_SECOND_CARD = "GPU-0b7e2c41-5a66-4f1e-8c2d-4a5b00000001"
A100_WHOLE_CARD = "GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d001"


@pytest.fixture(scope="module")
def demo(control_plane_binaries: Binaries) -> DemoResult:
    lines: list[str] = []
    result = run_demo(binaries=control_plane_binaries, timeout_s=90, say=lines.append)
    print("\n".join(lines))  # shown by pytest when a test fails
    return result


def _cards_of(pod: PlacedPod) -> list[str]:
    return [grant.card_uuid for grant in pod.gpus]


def test_demo_every_pod_is_decided(demo: DemoResult) -> None:
    assert demo.undecided == ()
    gang = {f"big-{i}" for i in range(4)}
    assert {p.name for p in demo.waiting} == {"quota-second", "too-big", *gang}


def test_shared_pods_share_one_card(demo: DemoResult) -> None:
    a, b = demo.placed_pod("shared-a"), demo.placed_pod("shared-b")
    assert a.node == b.node
    assert _cards_of(a) == _cards_of(b)
    assert len(_cards_of(a)) == 1
    assert [(g.memory_mib, g.cores) for g in (*a.gpus, *b.gpus)] == [(10240, 25)] * 2


def test_exclusive_pod_is_alone_on_its_card_with_all_cores(demo: DemoResult) -> None:
    pod = demo.placed_pod("exclusive")
    (grant,) = pod.gpus
    assert grant.cores == 100
    assert grant.memory_mib == demo.cards[grant.card_uuid].memory_mib
    others = [
        other.name
        for other in demo.placed
        if other.name != "exclusive" and grant.card_uuid in _cards_of(other)
    ]
    assert others == []


def test_type_selection_lands_on_an_l40s(demo: DemoResult) -> None:
    (grant,) = demo.placed_pod("want-l40s").gpus
    card = demo.cards[grant.card_uuid]
    assert "L40S" in card.model
    assert grant.memory_mib == card.memory_mib // 2


def test_type_exclusion_avoids_h100_and_a100(demo: DemoResult) -> None:
    (grant,) = demo.placed_pod("avoid-h100").gpus
    model = demo.cards[grant.card_uuid].model
    assert "H100" not in model
    assert "A100" not in model


def test_uuid_selection_lands_on_that_card(demo: DemoResult) -> None:
    pod = demo.placed_pod("pinned-uuid")
    assert _cards_of(pod) == [L40S_SECOND_CARD]
    assert pod.node == demo.cards[L40S_SECOND_CARD].node


def test_numa_bound_pair_shares_one_numa_node(demo: DemoResult) -> None:
    cards = [demo.cards[uuid] for uuid in _cards_of(demo.placed_pod("numa-pair"))]
    assert len({c.uuid for c in cards}) == 2
    numa_nodes = {c.numa_node for c in cards}
    assert len(numa_nodes) == 1
    assert None not in numa_nodes


def test_topology_pod_gets_eight_cards_joined_by_nvlink(demo: DemoResult) -> None:
    pod = demo.placed_pod("nvlink-eight")
    cards = [demo.cards[uuid] for uuid in _cards_of(pod)]
    assert len({c.uuid for c in cards}) == 8
    assert {c.node for c in cards} == {pod.node}
    # One NVLink island: every pair is directly linked (islands-16 links only within 8).
    for a, b in itertools.combinations(cards, 2):
        assert b.uuid in a.nvlink_peers, (a.index, b.index)


def test_mig_pod_gets_an_instance_of_a_mig_card(demo: DemoResult) -> None:
    (grant,) = demo.placed_pod("mig-small").gpus
    assert re.fullmatch(r"GPU-[0-9a-f-]+\[\d+-\d+\]", grant.uuid)
    card = demo.cards[grant.card_uuid]
    assert card.mode == "mig"
    assert "A100" in card.model
    assert 4096 <= grant.memory_mib < card.memory_mib


def test_first_pod_of_the_quota_namespace_fits(demo: DemoResult) -> None:
    pod = demo.placed_pod("quota-first")
    assert pod.namespace == "team-quota"
    assert [g.memory_mib for g in pod.gpus] == [12288]


def test_second_pod_of_the_quota_namespace_waits_for_quota(demo: DemoResult) -> None:
    waiting = demo.waiting_pod("quota-second")
    assert waiting.namespace == "team-quota"
    assert "ResourceQuotaNotFit" in waiting.message
    assert "ResourceQuotaNotFit" in waiting.event_message


def test_too_big_pod_waits_for_memory(demo: DemoResult) -> None:
    waiting = demo.waiting_pod("too-big")
    assert "CardInsufficientMemory" in waiting.message
    assert re.search(r"Devices ruled out: .*\d+ CardInsufficientMemory", waiting.event_message)


def test_a_gang_is_placed_together_and_another_waits_whole(demo: DemoResult) -> None:
    for i in range(4):
        placed = demo.placed_pod(f"train-{i}")
        assert [g.memory_mib for g in placed.gpus] == [8192]
    for i in range(4):
        waiting = demo.waiting_pod(f"big-{i}")
        assert "pod group vgpu-demo/big:" in waiting.message
        assert "of the 4 members it needs fit at once" in waiting.message


def test_no_card_is_overcommitted(demo: DemoResult) -> None:
    used: dict[str, tuple[int, int]] = {}
    for pod in demo.placed:
        for grant in pod.gpus:
            memory, cores = used.get(grant.card_uuid, (0, 0))
            used[grant.card_uuid] = (memory + grant.memory_mib, cores + grant.cores)
    for uuid, (memory, cores) in used.items():
        assert memory <= demo.cards[uuid].memory_mib, uuid
        assert cores <= 100, uuid


def test_rendered_table_names_every_pod_and_why_the_waiting_ones_wait(
    demo: DemoResult,
) -> None:
    text = render_result(demo)
    header = text.splitlines()[0].split()
    assert header[:3] == ["POD", "NODE", "GPU"]
    for pod in demo.placed:
        assert f"{pod.namespace}/{pod.name}" in text
    waiting_section = text.split("Waiting:", 1)[1]
    assert "team-quota/quota-second" in waiting_section
    assert "ResourceQuotaNotFit" in waiting_section
    assert "CardInsufficientMemory" in waiting_section


def test_urgent_pod_preempts_the_batch_job_and_takes_its_card(demo: DemoResult) -> None:
    assert [(p.name, p.message) for p in demo.preempted] == [
        ("batch-a100", "Preempted by vgpu-demo/urgent-a100 on node gpu-a100-mig")
    ]
    urgent = demo.placed_pod("urgent-a100")
    assert urgent.node == "gpu-a100-mig"
    assert [(g.card_uuid, g.memory_mib, g.cores) for g in urgent.gpus] == [
        (A100_WHOLE_CARD, 20000, 40)
    ]
    with pytest.raises(KeyError):
        demo.placed_pod("batch-a100")
    assert "Preempted:" in render_result(demo)


def test_every_placed_container_received_exactly_its_own_pods_cards(demo: DemoResult) -> None:
    """Through the allocation gate, the agents' device plugins and the kubelet stand-ins:
    each container's visible devices and limits are its own pod's allocation."""
    assert demo.unsettled == ()
    received = {got.pod: got for got in demo.containers}
    for pod in demo.placed:
        if not pod.gpus:
            continue
        got = received[f"{pod.namespace}/{pod.name}"]
        assert got.error is None, got.error
        visible = got.envs["NVIDIA_VISIBLE_DEVICES"].split(",")
        if any("[" in g.uuid for g in pod.gpus):  # a MIG instance: its own UUID
            assert all(v.startswith("MIG-") for v in visible), visible
            continue
        assert sorted(visible) == sorted(g.card_uuid for g in pod.gpus)
        limits = sorted(v for k, v in got.envs.items() if k.startswith("CUDA_DEVICE_MEMORY_LIMIT_"))
        assert limits == sorted(f"{g.memory_mib}m" for g in pod.gpus)
        assert got.envs["CUDA_DEVICE_SM_LIMIT"] == str(pod.gpus[0].cores)


def test_the_table_shows_what_each_container_receives(demo: DemoResult) -> None:
    text = render_result(demo)
    section = text.split("What each container receives from its node's device plugin:", 1)[1]
    assert "NVIDIA_VISIBLE_DEVICES" in section
    assert "vgpu-demo/shared-a" in section


def test_the_dra_part_shows_the_engine_beside_kube_schedulers_first_fit(
    demo: DemoResult,
) -> None:
    shown = demo.dra
    assert shown is not None
    by = {(c.what, c.allocator): c for c in shown.choices}
    share, pair = "a 10 GiB, 25 % share", "2 cards x 30 GiB"
    # First fit takes card #0; the engine's binpack the tightest fit, card #1 (60 GiB held).
    assert by[share, "kube-scheduler"].cards == (0,)
    assert by[share, "engine"].cards == (1,)
    assert by[share, "engine"].free_mib == (10240,)
    # Two cards: first fit crosses the sockets; the engine takes the bridged pair.
    assert by[pair, "kube-scheduler"].cards == (0, 2)
    assert by[pair, "kube-scheduler"].linked is False
    assert sorted(by[pair, "engine"].cards) == [2, 3]
    assert by[pair, "engine"].linked is True
    # The engine's share, prepared by the node's DRA plugin.
    assert shown.node == "gpu-dra-a100"
    assert (shown.memory_mib, shown.cores) == (10240, 25)
    assert shown.env["NVIDIA_VISIBLE_DEVICES"].lower() == shown.device
    assert shown.env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "10240m"
    assert shown.env["CUDA_DEVICE_SM_LIMIT"] == "25"
    assert "/etc/ld.so.preload" in shown.mounts
    assert shown.cdi_ids
    assert all(i.startswith("vgpu-operator.io/gpu=") for i in shown.cdi_ids)
    text = render_result(demo)
    assert "DRA: the engine's choice beside kube-scheduler's first fit" in text
    assert "bridged pair" in text
    assert "CUDA_DEVICE_MEMORY_LIMIT_0=10240m" in text
