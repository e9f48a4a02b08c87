"""The MIG accessors tools use (make gpu-check): the profiles a card offers, and removing
every instance, through NVML's calls on the simulated A100 machine."""

from __future__ import annotations

import pytest

from vgpu_operator.agent.deviceplugin.allocation import AllocationError
from vgpu_operator.agent.mig import MigInstances
from vgpu_operator.agent.simulated import SimulatedBackend
from vgpu_operator.devices import model

MIG_CARD = "GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d000"
WHOLE_CARD = "GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d001"


def instances_on(backend: SimulatedBackend, uuid: str) -> list[str]:
    (card,) = [gpu for gpu in backend.read().gpus if gpu.uuid == uuid]
    return sorted(m.profile or "" for m in card.mig_instances)


def test_offered_profiles_are_named_as_nvidia_does_smallest_first(
    backend: SimulatedBackend,
) -> None:
    mig = MigInstances(backend.nvml_module, lambda card_type: ())
    assert mig.offered_profiles(MIG_CARD) == ["1g.5gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]


def test_remove_all_destroys_every_instance_and_a_new_one_can_be_made(
    backend: SimulatedBackend,
) -> None:
    single = ((model.MigTemplate("1g.5gb", 4864, 14, 1),),)
    mig = MigInstances(backend.nvml_module, lambda card_type: single)
    removed = mig.remove_all(MIG_CARD)
    assert len(removed) == 3
    assert all(uuid.startswith("MIG-") for uuid in removed)
    assert instances_on(backend, MIG_CARD) == []
    made = mig.device(MIG_CARD, 0, 0)
    assert instances_on(backend, MIG_CARD) == ["1g.5gb"]
    assert mig.remove_all(MIG_CARD) == [made]
    assert instances_on(backend, MIG_CARD) == []


def test_a_card_without_mig_mode_offers_no_profile(backend: SimulatedBackend) -> None:
    mig = MigInstances(backend.nvml_module, lambda card_type: ())
    assert mig.offered_profiles(WHOLE_CARD) == []
    assert mig.remove_all(WHOLE_CARD) == []


def test_an_unknown_card_is_refused_with_its_uuid(backend: SimulatedBackend) -> None:
    mig = MigInstances(backend.nvml_module, lambda card_type: ())
    with pytest.raises(AllocationError, match="GPU-nope"):
        mig.remove_all("GPU-nope")
