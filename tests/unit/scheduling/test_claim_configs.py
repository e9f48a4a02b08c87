"""A claim's opaque configs of this driver (``claim_configs``): ``hamiCore`` must be a
boolean (issue 44: ``hamiCore: "false"``, a string, was admitted and taken as on)."""

from __future__ import annotations

from typing import Any

import pytest
from dra_cluster import DraCluster

from vgpu_operator.devices import dra
from vgpu_operator.scheduling.dialects.claims import claim_configs


def config(value: Any) -> list[dict[str, Any]]:
    return [{"opaque": {"driver": dra.DRIVER, "parameters": {"hamiCore": value}}}]


@pytest.mark.parametrize("value", ["false", "False", 0, None, {"on": False}])
def test_a_hami_core_that_is_no_boolean_is_refused_with_a_sentence(value: Any) -> None:
    decision = DraCluster().decide("c", "team", {}, config=config(value))
    assert not decision.scheduled
    assert decision.diagnosis is not None
    assert decision.diagnosis.error == (
        f"ResourceClaim team/c: an opaque config of {dra.DRIVER} sets hamiCore to {value!r}, "
        "which is no boolean: write hamiCore: false (unquoted) to turn HAMi-core off, or "
        "remove it"
    )


@pytest.mark.parametrize(("value", "off"), [(True, False), (False, True)])
def test_a_boolean_is_read_as_written(value: bool, off: bool) -> None:
    assert claim_configs.hami_core_problem(config(value)) is None
    assert claim_configs.turn_hami_core_off(config(value)) is off
    # The claim's own config wins over its class's (the later one).
    assert claim_configs.turn_hami_core_off([*config(not value), *config(value)]) is off
