"""The device config: seed 003's defaults, validation naming the field, node overrides."""

from __future__ import annotations

from typing import Any

import pytest
from builders import card_uuids, cluster, make_node, make_pod

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import nvidia
from vgpu_operator.devices.catalog import load_config, load_config_yaml
from vgpu_operator.errors import ConfigError


def test_defaults_are_seed_003s() -> None:
    section = nvidia.section(load_config({}))
    assert (
        section.device_memory_scaling,
        section.device_split_count,
        section.default_memory,
        section.default_cores,
        section.default_gpu_num,
        section.memory_factor,
    ) == (1.0, 10, 0, 0, 1, 1)


def test_default_resource_names_and_policies() -> None:
    config = load_config({})
    section = nvidia.section(config)
    assert (
        section.resource_count_name,
        section.resource_memory_name,
        section.resource_memory_percentage_name,
        section.resource_core_name,
        section.resource_priority_name,
    ) == (
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "nvidia.com/priority",
    )
    assert config.scheduler.node_scheduler_policy == "binpack"
    assert config.scheduler.gpu_scheduler_policy == "spread"
    assert section.gpu_core_policy == "default"
    assert not section.overwrite_env


def test_empty_yaml_gives_defaults() -> None:
    assert load_config_yaml("") == DeviceConfig()
    assert load_config_yaml("   \n") == DeviceConfig()


def test_hami_chart_yaml_accepted() -> None:
    config = load_config_yaml(
        """
nvidia:
  resourceCountName: nvidia.com/gpu
  deviceSplitCount: 4
  deviceMemoryScaling: 1.5
  defaultMemory: 2048
  defaultCores: 20
  defaultGPUNum: 2
  memoryFactor: 1024
  knownMigGeometries:
    - models: ["A100-SXM4-40GB"]
      allowedGeometries:
        - - {name: 1g.5gb, core: 14, memory: 5120, count: 7}
cambricon:
  resourceCountName: cambricon.com/mlu
"""
    )
    section = nvidia.section(config)
    assert (section.device_split_count, section.device_memory_scaling) == (4, 1.5)
    assert (section.default_memory, section.default_cores, section.default_gpu_num) == (2048, 20, 2)
    assert section.effective_memory_factor == 1024
    assert section.known_mig_geometries[0].models == ("A100-SXM4-40GB",)


def test_memory_factor_zero_reads_as_one() -> None:
    config = load_config({"nvidia": {"memoryFactor": 0}})
    assert nvidia.section(config).effective_memory_factor == 1


@pytest.mark.parametrize(
    ("data", "field"),
    [
        pytest.param({"nvidia": {"defaultCores": 101}}, "nvidia.defaultCores", id="cores-over"),
        pytest.param({"nvidia": {"defaultMemory": -1}}, "nvidia.defaultMemory", id="memory-neg"),
        pytest.param({"nvidia": {"defaultGPUNum": "two"}}, "nvidia.defaultGPUNum", id="gpu-num"),
        pytest.param(
            {"nvidia": {"deviceSplitCount": 0}}, "nvidia.deviceSplitCount", id="split-count"
        ),
        pytest.param(
            {"nvidia": {"deviceMemoryScaling": 0}},
            "nvidia.deviceMemoryScaling",
            id="memory-scaling",
        ),
        pytest.param(
            {"nvidia": {"gpuCorePolicy": "always"}}, "nvidia.gpuCorePolicy", id="core-policy"
        ),
        pytest.param(
            {"scheduler": {"nodeSchedulerPolicy": "random"}},
            "scheduler.nodeSchedulerPolicy",
            id="node-policy",
        ),
        pytest.param(
            {"scheduler": {"gpuSchedulerPolicy": "binpack,best-fit"}},
            "scheduler.gpuSchedulerPolicy",
            id="gpu-policy-token",
        ),
        pytest.param(
            {"nodeconfig": [{"name": "n", "devicesplitcount": 0}]},
            "nodeconfig.0.devicesplitcount",
            id="node-override",
        ),
        pytest.param(
            {"nodeconfig": [{"name": "n", "filterdevices": {"index": ["first"]}}]},
            "nodeconfig.0.filterdevices.index.0",
            id="filter-index",
        ),
        pytest.param(
            {"nvidia": {"knownMigGeometries": [{"models": [], "allowedGeometries": [[]]}]}},
            "nvidia.knownMigGeometries.0.models",
            id="mig-models-empty",
        ),
    ],
)
def test_bad_value_config_error_names_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(data)
    assert caught.value.field == field
    assert field in str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("nvidia: [", id="not-yaml"),
        pytest.param("- a\n- b\n", id="not-a-mapping"),
    ],
)
def test_bad_yaml_config_error(text: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config_yaml(text)
    assert caught.value.field == "device-config.yaml"


def test_node_override_found_by_name() -> None:
    config = load_config(
        {
            "nodeconfig": [
                {"name": "gpu-1", "devicesplitcount": 4, "filterdevices": {"uuid": ["GPU-x"]}},
                {"name": "gpu-2", "operatingmode": "mig"},
            ]
        }
    )
    first = config.node_override("gpu-1")
    assert first is not None
    assert (first.device_split_count, first.filter_devices.uuid) == (4, ("GPU-x",))
    second = config.node_override("gpu-2")
    assert second is not None
    assert second.operating_mode == "mig"
    assert config.node_override("gpu-3") is None


@pytest.mark.parametrize(
    ("filterdevices", "visible"),
    [
        pytest.param({}, ["GPU-0", "GPU-1", "GPU-2"], id="none-filtered"),
        pytest.param({"uuid": ["GPU-1"]}, ["GPU-0", "GPU-2"], id="by-uuid"),
        pytest.param({"index": [0, 2]}, ["GPU-1"], id="by-index"),
    ],
)
def test_node_override_filterdevices_hides_cards(
    filterdevices: dict[str, Any], visible: list[str]
) -> None:
    config = load_config({"nodeconfig": [{"name": "n", "filterdevices": filterdevices}]})
    state = cluster(
        make_node("n").gpu("GPU-0").gpu("GPU-1").gpu("GPU-2"),
        make_node("other").gpu("GPU-1"),
        config=config,
    )
    assert [r.uuid for r in state.device_usage() if r.node == "n"] == visible
    assert [r.uuid for r in state.device_usage() if r.node == "other"] == ["GPU-1"]


def test_node_override_applied_when_config_changes() -> None:
    state = cluster(make_node("n").gpu("GPU-0").gpu("GPU-1"))
    state.set_config(
        load_config({"nodeconfig": [{"name": "n", "filterdevices": {"uuid": ["GPU-1"]}}]})
    )
    pod = make_pod("p").container(gpu=1, gpumem=1024).obj()
    assert card_uuids(state.schedule(pod, 0)) == [["GPU-0"]]
