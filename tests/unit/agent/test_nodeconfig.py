"""This node's settings from the device config: precedence, what they leave out, and the
agent following a new version without restart (inventory and device plugin together)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from agent_fakes import FakeClock
from test_agent_loop import RecordingWriter, ScriptedBackend, make_agent, reading

from vgpu_operator.agent import nodeconfig
from vgpu_operator.agent.config_watch import ConfigFollower
from vgpu_operator.agent.deviceplugin.server import cards_of
from vgpu_operator.agent.inventory import RegistrationOptions
from vgpu_operator.agent.nodeconfig import NodeConfig
from vgpu_operator.agent.readings import MIB, GpuReading, MachineReading
from vgpu_operator.config import load_config

FLAGS = RegistrationOptions(split_count=7, memory_scaling=1.5, core_scaling=2.0)


def resolve(data: dict[str, Any], node: str = "gpu-1") -> NodeConfig:
    return nodeconfig.resolve(load_config(data), node, FLAGS)


def test_the_nodes_entry_wins_over_the_nvidia_section_which_wins_over_flags() -> None:
    config = resolve(
        {
            "nvidia": {"deviceSplitCount": 5, "deviceMemoryScaling": 2},
            "nodeconfig": [
                {"name": "gpu-1", "devicesplitcount": 3},
                {"name": "gpu-2", "devicesplitcount": 9, "devicecorescaling": 4},
            ],
        }
    )
    assert config.registration == RegistrationOptions(
        split_count=3,  # its entry
        memory_scaling=2.0,  # the section
        core_scaling=2.0,  # neither names it: the flag, not the section's default of 1
    )


def test_a_config_that_names_nothing_keeps_every_flag() -> None:
    assert resolve({"nvidia": {"resourceCountName": "nvidia.com/gpu"}}).registration == FLAGS


def test_another_nodes_entry_does_not_apply() -> None:
    config = resolve({"nodeconfig": [{"name": "gpu-2", "filterdevices": {"index": [0]}}]})
    assert config.filter_indices == frozenset()
    assert config.registration == FLAGS


def test_unknown_operating_mode_and_mig_strategy_are_ignored_saying_so() -> None:
    config = resolve(
        {"nodeconfig": [{"name": "gpu-1", "operatingmode": "mps", "migstrategy": "mixed"}]}
    )
    assert config.operating_mode is None
    assert config.mig_strategy == "none"
    assert len(config.ignored) == 2
    assert "mps" in config.ignored[0]
    assert "mixed" in config.ignored[1]


def machine(*mig: bool) -> MachineReading:
    return MachineReading(
        gpus=tuple(
            GpuReading(i, f"GPU-{i}", "NVIDIA A100", 40960 * MIB, mig_enabled=on)
            for i, on in enumerate(mig)
        )
    )


@pytest.mark.parametrize(
    ("entry", "kept"),
    [
        pytest.param({}, ["GPU-0", "GPU-1", "GPU-2"], id="nothing-set"),
        pytest.param({"filterdevices": {"uuid": ["GPU-1"]}}, ["GPU-0", "GPU-2"], id="by-uuid"),
        pytest.param({"filterdevices": {"index": [0, 2]}}, ["GPU-1"], id="by-index"),
        pytest.param({"operatingmode": "hami-core"}, ["GPU-0", "GPU-2"], id="hami-core"),
        pytest.param({"operatingmode": "mig"}, ["GPU-1"], id="mig"),
    ],
)
def test_select_offers_only_the_cards_the_entry_leaves(
    entry: dict[str, Any], kept: list[str]
) -> None:
    config = resolve({"nodeconfig": [{"name": "gpu-1", **entry}]})
    selection = nodeconfig.select(machine(False, True, False), config)
    assert [gpu.uuid for gpu in selection.reading.gpus] == kept
    assert sorted(uuid for uuid, _ in selection.left_out) == sorted(
        {"GPU-0", "GPU-1", "GPU-2"} - set(kept)
    )


def _config_map(text: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "vgpu-operator", "name": "vgpu-device-config"},
        "data": {"device-config.yaml": text},
    }


def test_the_follower_keeps_the_last_good_settings() -> None:
    applied: list[NodeConfig] = []
    follower = ConfigFollower("gpu-1", "device-config.yaml", FLAGS, applied.append)
    follower.on_event(None, _config_map("nodeconfig: [{name: gpu-1, devicesplitcount: 4}]"))
    follower.on_event("MODIFIED", _config_map("nodeconfig: [{name: gpu-1, devicesplitcount: 0}]"))
    follower.on_event("MODIFIED", _config_map("nvidia: [not, a, mapping"))
    follower.on_event("DELETED", _config_map(""))
    assert [c.registration.split_count for c in applied] == [4]


def test_the_agent_reports_and_advertises_a_new_config_at_the_next_poll(clock: FakeClock) -> None:
    """No restart: the next status carries the new split and leaves the filtered card out,
    and the device plugin's cards (taken from that status) say the same."""
    writer = RecordingWriter()
    agent = make_agent(ScriptedBackend(reading(True, True)), writer, clock)
    advertised: list[list[tuple[str, int]]] = []
    agent.on_status = lambda status: advertised.append(
        [(card.uuid, card.split_count) for card in cards_of(status)]
    )
    asyncio.run(agent.step())
    agent.apply_config(
        resolve(
            {
                "nodeconfig": [
                    {"name": "node-a", "devicesplitcount": 3, "filterdevices": {"uuid": ["GPU-0"]}}
                ]
            },
            "node-a",
        )
    )
    asyncio.run(agent.step())
    statuses = [body for kind, body in writer.calls if kind == "status"]
    assert [(d["uuid"], d["splitCount"]) for d in statuses[-1]["devices"]] == [("GPU-1", 3)]
    assert advertised == [[("GPU-0", 10), ("GPU-1", 10)], [("GPU-1", 3)]]
