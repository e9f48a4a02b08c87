"""What a card report may claim: a MIG profile must fit its card (HAMi v2.10's form)."""

from __future__ import annotations

import dataclasses

import pytest

from vgpu_operator.devices import model, plausibility

CARD = model.DeviceInfo("GPU-a", 0, 7, 40960, 100, "NVIDIA A100-SXM4-40GB", 0, True, "mig")
ONE_G = model.MigProfile("1g.5gb", 5120, 14, 1, ((0, 1), (6, 1)))


def _with(*profiles: model.MigProfile) -> model.DeviceInfo:
    return dataclasses.replace(CARD, mig_profiles=profiles)


def test_plausible_profiles_pass() -> None:
    assert plausibility.card_problems([_with(ONE_G)]) == []


@pytest.mark.parametrize(
    ("profiles", "word"),
    [
        pytest.param((ONE_G, ONE_G), "listed twice", id="repeated-name"),
        pytest.param((dataclasses.replace(ONE_G, name=""),), "unnamed", id="unnamed"),
        pytest.param((dataclasses.replace(ONE_G, memory_mib=50000),), "memory", id="more-memory"),
        pytest.param((dataclasses.replace(ONE_G, memory_mib=0),), "memory", id="no-memory"),
        pytest.param((dataclasses.replace(ONE_G, cores=101),), "cores", id="more-cores"),
        pytest.param((dataclasses.replace(ONE_G, placements=((0, 0),)),), "placement", id="size-0"),
        pytest.param(
            (dataclasses.replace(ONE_G, placements=((2**32 - 1, 1),)),), "placement", id="far-off"
        ),
    ],
)
def test_a_profile_beyond_its_card_is_refused(
    profiles: tuple[model.MigProfile, ...], word: str
) -> None:
    problems = plausibility.card_problems([_with(*profiles)])
    assert problems
    assert word in problems[0]
