"""Backoff delays and the pure health rules (seed 000 §9, HAMi's ignored XIDs)."""

from __future__ import annotations

import pytest

from vgpu_operator.agent import health
from vgpu_operator.agent.backoff import Backoff
from vgpu_operator.agent.readings import GpuReading


@pytest.mark.parametrize(
    ("fraction", "expected"),
    [
        pytest.param(1.0, [1.0, 2.0, 4.0, 8.0, 10.0, 10.0], id="top-of-each-range"),
        pytest.param(0.0, [0.5, 1.0, 2.0, 4.0, 5.0, 5.0], id="bottom-of-each-range"),
    ],
)
def test_backoff_doubles_up_to_the_cap_with_jitter(fraction: float, expected: list[float]) -> None:
    backoff = Backoff(1.0, 10.0, random_fraction=lambda: fraction)
    assert [backoff.next_delay_s() for _ in expected] == expected
    assert backoff.failures == len(expected)


def test_backoff_starts_over_after_a_success() -> None:
    backoff = Backoff(1.0, 10.0, random_fraction=lambda: 1.0)
    for _ in range(3):
        backoff.next_delay_s()
    backoff.reset()
    assert backoff.next_delay_s() == 1.0


def test_backoff_survives_a_very_long_outage() -> None:
    backoff = Backoff(1.0, 60.0, random_fraction=lambda: 1.0)
    for _ in range(5000):
        delay = backoff.next_delay_s()
    assert delay == 60.0


@pytest.mark.parametrize(
    "arguments",
    [
        pytest.param((0.0, 1.0), id="zero-initial"),
        pytest.param((2.0, 1.0), id="cap-below-initial"),
        pytest.param((1.0, 2.0, 0.5), id="shrinking-factor"),
    ],
)
def test_backoff_rejects_nonsense(arguments: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="initial_s"):
        Backoff(*arguments)


@pytest.mark.parametrize(
    ("reported", "current", "healthy", "refresh", "remembered"),
    [
        pytest.param(0, 0, True, False, 0, id="no-gpu-yet-waits"),
        pytest.param(8, 0, False, False, 0, id="all-gpus-vanished"),
        pytest.param(0, 8, True, True, 8, id="gpus-appeared"),
        pytest.param(8, 7, True, True, 7, id="count-changed"),
        pytest.param(8, 8, True, False, 8, id="stable"),
    ],
)
def test_gpu_count_check_follows_seed_000_section_9(
    reported: int, current: int, healthy: bool, refresh: bool, remembered: int
) -> None:
    assert health.check_gpu_count(reported, current) == health.CountCheck(
        healthy=healthy, refresh=refresh, reported=remembered
    )


@pytest.mark.parametrize(
    ("xid", "critical"),
    [
        pytest.param(13, False, id="graphics-exception"),
        pytest.param(31, False, id="page-fault"),
        pytest.param(43, False, id="stopped-channel"),
        pytest.param(45, False, id="preemptive-cleanup"),
        pytest.param(68, False, id="video-decoder"),
        pytest.param(109, False, id="ctx-switch-timeout"),
        pytest.param(48, True, id="double-bit-ecc"),
        pytest.param(79, True, id="fallen-off-the-bus"),
        pytest.param(94, True, id="contained-ecc"),
    ],
)
def test_only_hardware_xids_are_critical(xid: int, critical: bool) -> None:
    assert health.is_critical_xid(xid) is critical


def _gpu(index: int, uuid: str) -> GpuReading:
    return GpuReading(index=index, uuid=uuid, name="NVIDIA L4", memory_total_bytes=1)


def test_vanished_cards_follow_the_present_ones_marked_unhealthy() -> None:
    last_seen = {u: _gpu(i, u) for i, u in enumerate(["GPU-a", "GPU-b", "GPU-c", "GPU-d"])}
    now = [_gpu(0, "GPU-a"), _gpu(1, "GPU-c")]
    result = health.carry_disappeared(now, last_seen)
    assert [(g.uuid, g.healthy, g.present) for g in result] == [
        ("GPU-a", True, True),
        ("GPU-c", True, True),
        ("GPU-b", False, False),
        ("GPU-d", False, False),
    ]
    assert result[2].health_reason == "GPU disappeared: NVML no longer reports it"


def test_first_health_reason_is_kept() -> None:
    gpu = _gpu(0, "GPU-a").unhealthy("critical XID 79").unhealthy("something later")
    assert gpu.health_reason == "critical XID 79"
