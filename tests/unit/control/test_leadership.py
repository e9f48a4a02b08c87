"""Peering: Kopf's rule read back, older replicas first, a grace period at start."""

from __future__ import annotations

import datetime
import random
from typing import Any

import pytest
from manual_clock import ManualClock

from vgpu_operator.control.leadership import PeeringGate, is_active, peering_priority

NOW = datetime.datetime(2030, 1, 1, 12, 0, 0, tzinfo=datetime.UTC)


def peer(priority: int, seconds_ago: float = 1.0, lifetime: int = 60) -> dict[str, Any]:
    seen = NOW - datetime.timedelta(seconds=seconds_ago)
    return {"priority": priority, "lifetime": lifetime, "lastseen": seen.isoformat()}


@pytest.mark.parametrize(
    ("peers", "active"),
    [
        pytest.param({"me": peer(10)}, True, id="alone"),
        pytest.param({"me": peer(10), "other": peer(5)}, True, id="outranks-other"),
        pytest.param({"me": peer(10), "other": peer(20)}, False, id="outranked"),
        pytest.param({"me": peer(10), "other": peer(10)}, False, id="equal-pauses-both"),
        pytest.param(
            {"me": peer(10), "other": peer(20, seconds_ago=61)}, True, id="higher-but-dead"
        ),
        pytest.param({"me": peer(10), "other": {"priority": 20}}, False, id="no-lastseen-is-alive"),
    ],
)
def test_is_active_follows_kopf_rule(peers: dict[str, Any], active: bool) -> None:
    assert is_active(peers, "me", 10, NOW) is active


def test_older_replica_gets_higher_priority() -> None:
    rng = random.Random(1)
    older = peering_priority(1_700_000_000, rng)
    newer = peering_priority(1_700_000_001, rng)
    assert older > newer


async def _no_read() -> None:
    return None


def test_gate_opens_only_after_own_record_settles_and_counts_openings() -> None:
    clock = ManualClock()
    changes: list[bool] = []
    gate = PeeringGate(_no_read, "me", 10, grace_s=5.0, clock=clock, on_change=changes.append)
    alone = {"status": {"me": peer(10)}}
    assert not gate.observe(alone, NOW)  # our record just appeared
    clock.now = 5.0
    assert gate.observe(alone, NOW)
    assert gate.is_open()
    assert gate.observe({"status": {"me": peer(10), "boss": peer(99)}}, NOW) is False
    assert not gate.is_open()
    assert gate.observe(alone, NOW)
    assert changes == [True, False, True]


def test_gate_closes_when_the_peering_object_cannot_be_read() -> None:
    clock = ManualClock()
    gate = PeeringGate(_no_read, "me", 10, grace_s=0.0, clock=clock)
    assert gate.observe({"status": {"me": peer(10)}}, NOW)
    assert not gate.observe(None, NOW)
