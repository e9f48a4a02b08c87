"""No card is ever over-committed, and every placement honours the pod's request and filters.

Bookings are recomputed here from the decisions alone (the devices each live pod was
given), never read from the engine, so an accounting bug in the engine cannot hide
itself. The filters are re-checked with this file's own reading of the annotations.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from builders import Json
from hypothesis import given
from strategies import Replay, Scenario, Schedule, annotations_of, scenarios

from vgpu_operator import names
from vgpu_operator.devices import model, nvidia
from vgpu_operator.scheduling.cycle.cluster import Decision

Usage = dict[str, list[int]]  # card id -> [slots, memory MiB, cores]


def _base(uuid: str) -> str:
    return uuid.split("[", 1)[0]


def _init_count(pod: Json) -> int:
    return len(pod["spec"].get("initContainers") or [])


def pod_usage(pod: Json, decision: Decision) -> dict[str, list[int]]:
    """What one pod holds per device id (MIG instances separately): app containers
    summed, one slot each; init containers at their peak, one slot; the larger kept."""
    app: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    init: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    inits = _init_count(pod)
    for position, container in enumerate(decision.devices.get("NVIDIA", ())):
        for device in container:
            if position < inits:
                peak = init[device.uuid]
                peak[:] = [1, max(peak[1], device.memory_mib), max(peak[2], device.cores)]
            else:
                total = app[device.uuid]
                total[:] = [total[0] + 1, total[1] + device.memory_mib, total[2] + device.cores]
    held: dict[str, list[int]] = {}
    for uuid in {*app, *init}:
        pairs = zip(app.get(uuid, [0, 0, 0]), init.get(uuid, [0, 0, 0]), strict=True)
        held[uuid] = [max(a, i) for a, i in pairs]
    return held


def card_usage(live: dict[str, tuple[Json, Decision]]) -> Usage:
    totals: Usage = defaultdict(lambda: [0, 0, 0])
    for pod, decision in live.values():
        for uuid, (slots, memory, cores) in pod_usage(pod, decision).items():
            card = totals[_base(uuid)]
            card[:] = [card[0] + slots, card[1] + memory, card[2] + cores]
    return dict(totals)


def assert_within_capacity(usage: Usage, cards: dict[str, model.DeviceInfo]) -> None:
    for uuid, (slots, memory, cores) in usage.items():
        card = cards[uuid]
        assert slots <= card.count, f"{uuid}: {slots} tasks on {card.count} slots"
        assert memory <= card.memory_mib, f"{uuid}: {memory} MiB booked of {card.memory_mib}"
        assert cores <= card.cores, f"{uuid}: {cores} cores booked of {card.cores}"


def assert_mig_instances_not_shared(live: dict[str, tuple[Json, Decision]]) -> None:
    owners: dict[str, str] = {}
    for key, (pod, decision) in live.items():
        for uuid in pod_usage(pod, decision):
            if "[" in uuid:
                assert uuid not in owners, f"MIG instance {uuid} held by {owners[uuid]} and {key}"
                owners[uuid] = key


def _items(value: str | None) -> list[str]:
    return [v.strip() for v in (value or "").split(",") if v.strip()]


def _given(resources: dict[str, Any], name: str) -> int | None:
    value = resources.get(name)
    return None if value is None else int(value)


def expected_request(container: Json) -> tuple[int, int | None, int | None, int]:
    """(count, gpumem, percentage, cores) after admission defaults, for this file's pods."""
    limits = container["resources"].get("limits") or {}
    count = _given(limits, "nvidia.com/gpu")
    memory = _given(limits, "nvidia.com/gpumem")
    percent = _given(limits, "nvidia.com/gpumem-percentage")
    cores = _given(limits, "nvidia.com/gpucores")
    if count is None:
        count = 1 if any(v is not None for v in (memory, percent, cores)) else 0
    if cores is None:
        exclusive = percent == 100 if percent is not None else memory is None
        cores = 100 if exclusive else 0
    return count, memory or None, percent or None, min(cores, 100)


def assert_placement_honours_pod(
    pod: Json, decision: Decision, cards: dict[str, model.DeviceInfo], before: Usage
) -> None:
    annotations = annotations_of(pod)
    containers = [*(pod["spec"].get("initContainers") or []), *pod["spec"]["containers"]]
    single = decision.devices.get("NVIDIA", ())
    if single:
        assert len(single) == len(containers)
    use_types = [t.upper() for t in _items(annotations.get(nvidia.USE_TYPE_ANNOTATION))]
    nouse_types = [t.upper() for t in _items(annotations.get(nvidia.NOUSE_TYPE_ANNOTATION))]
    use_ids = _items(annotations.get(nvidia.USE_UUID_ANNOTATION))
    nouse_ids = _items(annotations.get(nvidia.NOUSE_UUID_ANNOTATION))
    mode = annotations.get(nvidia.MODE_ANNOTATION)
    numa_bind = annotations.get(nvidia.NUMA_BIND_ANNOTATION) == "true"
    mutex = "mutex" in _items(annotations.get(names.GPU_SCHEDULER_POLICY))
    for position, container in enumerate(containers):
        count, memory, percent, cores = expected_request(container)
        devices = single[position] if single else ()
        uuids = [d.uuid for d in devices]
        assert len(uuids) == count, f"container {position}: {uuids} for a count of {count}"
        assert len(set(uuids)) == count, f"container {position}: a device twice in {uuids}"
        for device in devices:
            card = cards[_base(device.uuid)]
            assert device.uuid.startswith(f"GPU-{decision.node}"), "card of another node"
            assert card.health, f"{card.id} is unhealthy"
            assert not use_types or any(t in card.type.upper() for t in use_types)
            assert not any(t in card.type.upper() for t in nouse_types)
            assert not use_ids or card.id in use_ids
            assert card.id not in nouse_ids
            assert mode is None or card.mode in mode
            if mutex:
                assert before.get(card.id, [0])[0] == 0, f"mutex placed on busy {card.id}"
            if card.mode == model.MODE_MIG:
                continue  # a MIG instance books its template's memory and cores
            assert card.mode != model.MODE_MIG
            if memory is not None:
                assert device.memory_mib == memory
            else:
                assert device.memory_mib == card.memory_mib * (percent or 100) // 100
            assert device.cores == cores
        if numa_bind and not any("[" in u for u in uuids):
            assert len({cards[u].numa for u in uuids}) <= 1, f"numa-bind split over {uuids}"
        if not any(cards[_base(u)].mode == model.MODE_MIG for u in uuids):
            assert len({_base(u) for u in uuids}) == count, "a card twice in one container"


@given(scenarios())
def test_cards_never_overcommitted_and_placements_honour_pods(scenario: Scenario) -> None:
    cards = scenario.cluster.cards()
    replay = Replay(scenario.cluster.build())
    for step in scenario.steps:
        before = card_usage(replay.live)
        decision = replay.apply(step)
        usage = card_usage(replay.live)
        assert_within_capacity(usage, cards)
        assert_mig_instances_not_shared(replay.live)
        if isinstance(step, Schedule) and decision is not None and decision.scheduled:
            assert_placement_honours_pod(step.pod, decision, cards, before)


@given(scenarios(max_steps=6))
def test_engine_usage_matches_the_decisions(scenario: Scenario) -> None:
    """device_usage() books exactly what the live decisions say (slots, memory, cores)."""
    replay = Replay(scenario.cluster.build())
    for step in scenario.steps:
        replay.apply(step)
        reported = {
            row.uuid: [row.used_slots, row.used_memory_mib, row.used_cores]
            for row in replay.state.device_usage()
            if row.used_slots or row.used_memory_mib or row.used_cores
        }
        assert reported == card_usage(replay.live)
