"""Fit for one container: the order of the card checks and the reasons they count (§6)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from builders import A100_40, T4

from vgpu_operator.devices import model, nvidia
from vgpu_operator.scheduling.dialects.annotation import fit
from vgpu_operator.scheduling.mig import mig
from vgpu_operator.scheduling.status import Reason

R = Reason


def card(
    uuid: str,
    *,
    numa: int = 0,
    memory_mib: int = 16384,
    used_memory_mib: int = 0,
    count: int = 10,
    used: int = 0,
    cores: int = 100,
    used_cores: int = 0,
    type: str = A100_40,
    mode: str = model.MODE_HAMI_CORE,
    health: bool = True,
) -> model.DeviceUsage:
    return model.DeviceUsage(
        uuid, 0, count, used, memory_mib, used_memory_mib, cores, used_cores, type, numa,
        health, mode,
    )  # fmt: skip


def request(
    count: int = 1, memory_mib: int = 1024, cores: int = 0, percent: int = 101
) -> model.ContainerRequest:
    return model.ContainerRequest(count, "NVIDIA", memory_mib, percent, cores)


def options(
    annotations: dict[str, str] | None = None,
    *,
    cordoned: Sequence[str] = (),
    mutex: bool = False,
    numa_bind: bool = False,
    quota_ok: fit.QuotaCheck | None = None,
) -> fit.FitOptions:
    extra: dict[str, Any] = {} if quota_ok is None else {"quota_ok": quota_ok}
    return fit.FitOptions(
        spec=nvidia.SPEC,
        annotations=annotations or {},
        cordoned=frozenset(cordoned),
        mutex=mutex,
        numa_bind=numa_bind,
        **extra,
    )


def no_quota(_candidates: Sequence[tuple[str, int, int]]) -> bool:
    return False


# Each failure, alone on one card, and the option set that provokes it.
_FAILS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "health": ({"health": False}, {}),
    "cordon": ({}, {"cordoned": ["GPU-x"]}),
    "type": ({"type": T4}, {"annotations": {nvidia.USE_TYPE_ANNOTATION: "A100"}}),
    "uuid": ({}, {"annotations": {nvidia.NOUSE_UUID_ANNOTATION: "GPU-x"}}),
    "slots": ({"count": 1, "used": 1}, {}),
    "mutex": ({"used": 1}, {"mutex": True}),
    "quota": ({}, {"quota_ok": no_quota}),
    "memory": ({"used_memory_mib": 16000}, {}),
    "cores": ({"used_cores": 90}, {}),
}


def _merge(*names_: str) -> tuple[dict[str, Any], dict[str, Any]]:
    card_kw: dict[str, Any] = {}
    opt_kw: dict[str, Any] = {}
    for name in names_:
        c, o = _FAILS[name]
        card_kw.update(c)
        for key, value in o.items():
            if key == "annotations":
                opt_kw.setdefault("annotations", {}).update(value)
            else:
                opt_kw[key] = value
    return card_kw, opt_kw


@pytest.mark.parametrize(
    ("failures", "req", "expected"),
    [
        pytest.param(("health",), request(), R.CARD_NOT_HEALTH, id="CardNotHealth"),
        pytest.param(("cordon",), request(), R.CARD_CORDONED, id="CardCordoned"),
        pytest.param(("type",), request(), R.CARD_TYPE_MISMATCH, id="CardTypeMismatch"),
        pytest.param(("uuid",), request(), R.CARD_UUID_MISMATCH, id="CardUuidMismatch"),
        pytest.param(("slots",), request(), R.CARD_TIME_SLICING_EXHAUSTED, id="TimeSlicing"),
        pytest.param(("mutex",), request(), R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, id="mutex"),
        pytest.param(("quota",), request(), R.RESOURCE_QUOTA_NOT_FIT, id="ResourceQuotaNotFit"),
        pytest.param(("memory",), request(), R.CARD_INSUFFICIENT_MEMORY, id="InsufficientMemory"),
        pytest.param(
            ("cores",), request(cores=20), R.CARD_INSUFFICIENT_CORE, id="InsufficientCore"
        ),
        pytest.param((), request(cores=100), None, id="exclusive-on-idle-card-fits"),
        # Pairs: the card is counted under the check that comes first.
        pytest.param(("health", "cordon"), request(), R.CARD_NOT_HEALTH, id="health-before-cordon"),
        pytest.param(("cordon", "type"), request(), R.CARD_CORDONED, id="cordon-before-type"),
        pytest.param(("type", "uuid"), request(), R.CARD_TYPE_MISMATCH, id="type-before-uuid"),
        pytest.param(("uuid", "slots"), request(), R.CARD_UUID_MISMATCH, id="uuid-before-slots"),
        pytest.param(
            ("slots", "mutex"), request(), R.CARD_TIME_SLICING_EXHAUSTED, id="slots-before-mutex"
        ),
        pytest.param(
            ("mutex", "quota"),
            request(),
            R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
            id="mutex-before-quota",
        ),
        pytest.param(
            ("quota", "memory"), request(), R.RESOURCE_QUOTA_NOT_FIT, id="quota-before-memory"
        ),
        pytest.param(
            ("memory", "cores"),
            request(cores=20),
            R.CARD_INSUFFICIENT_MEMORY,
            id="memory-before-cores",
        ),
        pytest.param(
            ("health", "memory", "slots"),
            request(),
            R.CARD_NOT_HEALTH,
            id="three-failures-first-wins",
        ),
    ],
)
def test_card_failing_checks_counted_under_first(
    failures: tuple[str, ...], req: model.ContainerRequest, expected: Reason | None
) -> None:
    card_kw, opt_kw = _merge(*failures)
    result = fit.fit_container([card("GPU-x", **card_kw)], req, options(**opt_kw))
    if expected is None:
        assert result.ok
    else:
        assert not result.ok
        assert dict(result.reasons) == {expected: 1}


@pytest.mark.parametrize(
    ("card_kw", "req", "expected"),
    [
        pytest.param(
            {"used": 1, "used_cores": 10},
            request(cores=100),
            R.CARD_INSUFFICIENT_CORE,
            id="cores-before-exclusive",
        ),
        pytest.param(
            {"used": 1}, request(cores=100), R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT, id="exclusive"
        ),
        pytest.param(
            {"used": 1},
            request(cores=150),
            R.EXCLUSIVE_DEVICE_ALLOCATE_CONFLICT,
            id="cores-capped-to-100-then-exclusive",
        ),
        pytest.param(
            {"used": 1, "used_cores": 100},
            request(cores=0),
            R.CARD_COMPUTE_UNITS_EXHAUSTED,
            id="compute-units-exhausted",
        ),
        pytest.param(
            {"used": 1, "used_cores": 100, "used_memory_mib": 16000},
            request(cores=0),
            R.CARD_INSUFFICIENT_MEMORY,
            id="memory-before-compute-units",
        ),
    ],
)
def test_late_checks_counted_in_order(
    card_kw: dict[str, Any], req: model.ContainerRequest, expected: Reason
) -> None:
    result = fit.fit_container([card("GPU-x", **card_kw)], req, options())
    assert dict(result.reasons) == {expected: 1}


def test_cores_above_100_booked_as_100() -> None:
    result = fit.fit_container([card("GPU-x")], request(cores=150), options())
    assert [(p.card.id, p.cores) for p in result.picks] == [("GPU-x", 100)]


def test_percentage_resolved_per_card() -> None:
    cards = [card("GPU-small", memory_mib=15360), card("GPU-big", memory_mib=40960)]
    result = fit.fit_container(cards, request(count=2, memory_mib=0, percent=50), options())
    assert {p.card.id: p.memory_mib for p in result.picks} == {
        "GPU-big": 20480,
        "GPU-small": 7680,
    }


def test_memory_wins_over_percentage() -> None:
    result = fit.fit_container([card("GPU-x")], request(memory_mib=1000, percent=50), options())
    assert [p.memory_mib for p in result.picks] == [1000]


def test_cards_scanned_from_the_end() -> None:
    cards = [card("GPU-0"), card("GPU-1"), card("GPU-2")]
    result = fit.fit_container(cards, request(count=2), options())
    assert [p.card.id for p in result.picks] == ["GPU-2", "GPU-1"]


def test_reasons_counted_per_card_and_short_pick_reported() -> None:
    cards = [
        card("GPU-0", type=T4),
        card("GPU-1", used_memory_mib=16000),
        card("GPU-2", type=T4),
        card("GPU-3"),
    ]
    result = fit.fit_container(
        cards, request(count=2), options({nvidia.USE_TYPE_ANNOTATION: "A100"})
    )
    assert not result.ok
    assert dict(result.reasons) == {
        R.CARD_TYPE_MISMATCH: 2,
        R.CARD_INSUFFICIENT_MEMORY: 1,
        R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: 1,
    }


@pytest.mark.parametrize(
    ("cards", "count"),
    [
        pytest.param([card("GPU-0")], 2, id="more-than-cards"),
        pytest.param([card("GPU-0"), card("GPU-1", type="Hygon Z100")], 2, id="invisible-card"),
    ],
)
def test_count_above_visible_cards_node_insufficient_device(
    cards: list[model.DeviceUsage], count: int
) -> None:
    result = fit.fit_container(cards, request(count=count), options())
    assert dict(result.reasons) == {R.NODE_INSUFFICIENT_DEVICE: 1}


@pytest.mark.parametrize(
    ("annotation", "card_mode", "fits"),
    [
        pytest.param("hami-core", model.MODE_HAMI_CORE, True, id="same-mode"),
        pytest.param("mps", model.MODE_HAMI_CORE, False, id="other-mode"),
        pytest.param("mig,hami-core", model.MODE_HAMI_CORE, True, id="mode-in-list"),
        pytest.param("mps", "", True, id="empty-card-mode-always-matches"),
    ],
)
def test_vgpu_mode_filters_by_substring(annotation: str, card_mode: str, fits: bool) -> None:
    result = fit.fit_container(
        [card("GPU-x", mode=card_mode)], request(), options({nvidia.MODE_ANNOTATION: annotation})
    )
    assert result.ok is fits
    if not fits:
        assert dict(result.reasons) == {R.CARD_TYPE_MISMATCH: 1}


# --- NUMA -----------------------------------------------------------------------------


def test_numa_bind_takes_one_group() -> None:
    cards = [card("GPU-a0", numa=0), card("GPU-a1", numa=0), card("GPU-b0", numa=1)]
    result = fit.fit_container(cards, request(count=2), options(numa_bind=True))
    assert [p.card.id for p in result.picks] == ["GPU-a1", "GPU-a0"]


def test_numa_bind_no_group_big_enough_numa_not_fit() -> None:
    cards = [card("GPU-a0", numa=0), card("GPU-b0", numa=1)]
    result = fit.fit_container(cards, request(count=2), options(numa_bind=True))
    assert dict(result.reasons) == {
        R.NUMA_NOT_FIT: 1,
        R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: 1,
    }


def test_numa_without_bind_mixes_groups() -> None:
    cards = [card("GPU-a0", numa=0), card("GPU-b0", numa=1)]
    result = fit.fit_container(cards, request(count=2), options())
    assert result.ok


def test_numa_reset_after_type_check() -> None:
    # A card of the wrong type is dropped before the NUMA reset, so it does not split the
    # group that surrounds it in scan order.
    cards = [card("GPU-a0", numa=0), card("GPU-t", numa=1, type=T4), card("GPU-a1", numa=0)]
    result = fit.fit_container(
        cards, request(count=2), options({nvidia.USE_TYPE_ANNOTATION: "A100"}, numa_bind=True)
    )
    assert [p.card.id for p in result.picks] == ["GPU-a1", "GPU-a0"]


def test_numa_reset_before_uuid_check() -> None:
    # A card excluded by UUID still starts a new NUMA group, which drops earlier picks.
    cards = [card("GPU-a0", numa=0), card("GPU-x", numa=1), card("GPU-a1", numa=0)]
    result = fit.fit_container(
        cards, request(count=2), options({nvidia.NOUSE_UUID_ANNOTATION: "GPU-x"}, numa_bind=True)
    )
    assert dict(result.reasons) == {
        R.CARD_UUID_MISMATCH: 1,
        R.NUMA_NOT_FIT: 1,
        R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: 1,
    }


# --- MIG ------------------------------------------------------------------------------

_GEOMETRIES = (
    mig.KnownGeometries(
        ("A100-SXM4-40GB",),
        (
            (model.MigTemplate("1g.5gb", 5120, 14, 7),),
            (model.MigTemplate("3g.20gb", 20480, 42, 2),),
        ),
    ),
)


def mig_card(uuid: str) -> model.DeviceUsage:
    device = card(uuid, memory_mib=40960, count=7, mode=model.MODE_MIG)
    mig.attach(device, _GEOMETRIES)
    return device


def test_mig_card_retried_for_several_instances() -> None:
    result = fit.fit_container([mig_card("GPU-m")], request(count=3, memory_mib=4096), options())
    assert result.ok
    assert [p.card.id for p in result.picks] == ["GPU-m", "GPU-m", "GPU-m"]


def test_mig_card_out_of_instances_is_topology_infeasible() -> None:
    result = fit.fit_container([mig_card("GPU-m")], request(count=3, memory_mib=10000), options())
    assert not result.ok
    assert dict(result.reasons) == {
        R.CARD_MIG_TOPOLOGY_INFEASIBLE: 1,
        R.ALLOCATED_CARDS_INSUFFICIENT_REQUEST: 2,
    }


def test_mig_card_refuses_percentage() -> None:
    result = fit.fit_container([mig_card("GPU-m")], request(memory_mib=0, percent=50), options())
    assert dict(result.reasons) == {R.CARD_MIG_TOPOLOGY_INFEASIBLE: 1}
