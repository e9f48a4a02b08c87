"""NVIDIA: its row of the vendor table and HAMi's admission defaults (MutateAdmission)."""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import Field

from vgpu_operator import names
from vgpu_operator.config import DeviceConfig, VendorConfig
from vgpu_operator.devices import vendor
from vgpu_operator.devices.quantity import as_int

COMMON_WORD: Final = "NVIDIA"
#: Its section of ``device-config.yaml``.
CONFIG_KEY: Final = "nvidia"

# HAMi's NVIDIA keys, byte for byte: the Node's registration and link scores (written by
# the device plugin, our agent), the allocation the scheduler writes on a pod, and the
# card restrictions a pod or a Node may carry.
REGISTER_ANNOTATION: Final = "hami.io/node-nvidia-register"
SCORE_ANNOTATION: Final = "hami.io/node-nvidia-score"
TO_ALLOCATE_ANNOTATION: Final = "hami.io/vgpu-devices-to-allocate"
ALLOCATED_ANNOTATION: Final = "hami.io/vgpu-devices-allocated"
USE_TYPE_ANNOTATION: Final = "nvidia.com/use-gputype"
NOUSE_TYPE_ANNOTATION: Final = "nvidia.com/nouse-gputype"
USE_UUID_ANNOTATION: Final = "nvidia.com/use-gpuuuid"
NOUSE_UUID_ANNOTATION: Final = "nvidia.com/nouse-gpuuuid"
NUMA_BIND_ANNOTATION: Final = "nvidia.com/numa-bind"
MODE_ANNOTATION: Final = "nvidia.com/vgpu-mode"
#: Where its resources are named (the Kueue check knows a device pod by it).
RESOURCE_PREFIX: Final = "nvidia.com/"
#: The count resource its device plugins advertise unless the device config names another
#: (``resourceCountName``), and the other resources of HAMi's chart (its defaults).
COUNT_RESOURCE: Final = f"{RESOURCE_PREFIX}gpu"
MEMORY_RESOURCE: Final = f"{RESOURCE_PREFIX}gpumem"
MEMORY_PERCENTAGE_RESOURCE: Final = f"{RESOURCE_PREFIX}gpumem-percentage"
CORES_RESOURCE: Final = f"{RESOURCE_PREFIX}gpucores"
PRIORITY_RESOURCE: Final = f"{RESOURCE_PREFIX}priority"
#: Kueue's guide counts a pod's memory and cores over all its cards as these (its
#: ResourceTransformation multiplies the per-card figures by the count; docs/kueue.md).
TOTAL_MEMORY_RESOURCE: Final = f"{RESOURCE_PREFIX}total-gpumem"
TOTAL_CORES_RESOURCE: Final = f"{RESOURCE_PREFIX}total-gpucores"
#: The node label NVIDIA's GPU feature discovery sets on GPU nodes (the demo's nodes carry
#: it, as real ones do).
GPU_PRESENT_LABEL: Final = "nvidia.com/gpu.present"
#: The taint NVIDIA's tooling puts on nodes with MIG cards (HAMi's rule for MIG cards).
MIG_TAINT_KEY: Final = "nvidia.com/mig"
#: Which cards a container sees (the container toolkit reads it).
VISIBLE_DEVICES_ENV: Final = names.ENV_VISIBLE_DEVICES


class NvidiaConfig(VendorConfig):
    """The ``nvidia`` section of ``device-config.yaml`` (HAMi's chart's keys and defaults)."""

    resource_count_name: str = Field(COUNT_RESOURCE, alias="resourceCountName")
    resource_memory_name: str = Field(MEMORY_RESOURCE, alias="resourceMemoryName")
    resource_memory_percentage_name: str = Field(
        MEMORY_PERCENTAGE_RESOURCE, alias="resourceMemoryPercentageName"
    )
    resource_core_name: str = Field(CORES_RESOURCE, alias="resourceCoreName")
    resource_priority_name: str = Field(PRIORITY_RESOURCE, alias="resourcePriorityName")
    overwrite_env: bool = Field(False, alias="overwriteEnv")
    gpu_core_policy: Literal["default", "force", "disable"] = Field(
        "default", alias="gpuCorePolicy"
    )
    runtime_class_name: str = Field("", alias="runtimeClassName")


def section(config: DeviceConfig) -> NvidiaConfig:
    """The device config's ``nvidia`` section (its defaults where the file has none);
    raises ``ConfigError`` naming the bad field."""
    read = config.section(CONFIG_KEY, NvidiaConfig)
    assert isinstance(read, NvidiaConfig)
    return read


def _env_append(container: dict[str, Any], name: str, value: str) -> None:
    """Add an env var unless the container already sets it (keeps admission idempotent)."""
    env = container.setdefault("env", [])
    if not any(entry.get("name") == name for entry in env):
        env.append({"name": name, "value": value})


def _has(container: dict[str, Any], section: str, name: str) -> bool:
    return bool(name) and name in ((container.get("resources") or {}).get(section) or {})


def mutate_container(config: NvidiaConfig, container: dict[str, Any], pod: dict[str, Any]) -> bool:
    """HAMi's MutateAdmission for one container, in place; True if it asks for a GPU.

    Raises ValueError when gpumem-percentage is outside 0..100. Applying it twice
    changes nothing, so an already admitted pod is left as it is.
    """
    names_ = vendor.resource_names(config)
    resources = container.setdefault("resources", {})
    limits = resources.setdefault("limits", {})
    percentage = as_int(limits.get(names_.memory_percentage))
    if names_.memory_percentage in limits and (percentage is None or not 0 <= percentage <= 100):
        raise ValueError(
            f"container {container.get('name', '')!r}: {names_.memory_percentage} must be an "
            f"integer between 0 and 100, got {limits[names_.memory_percentage]!r}"
        )
    if config.resource_priority_name in limits:
        _env_append(container, names.ENV_TASK_PRIORITY, str(limits[config.resource_priority_name]))
    if config.gpu_core_policy not in ("", "default"):
        _env_append(container, names.ENV_CORE_UTILIZATION_POLICY, config.gpu_core_policy)

    has_resource = names_.count in limits
    if not has_resource and config.default_gpu_num > 0:
        wants_share = any(
            n in limits for n in (names_.cores, names_.memory, names_.memory_percentage) if n
        )
        if wants_share:
            limits[names_.count] = config.default_gpu_num
            has_resource = True

    count_present = _has(container, "limits", names_.count) or _has(
        container, "requests", names_.count
    )
    cores_present = _has(container, "limits", names_.cores) or _has(
        container, "requests", names_.cores
    )
    # A count of 0 asks for nothing: no exclusive default is added (HAMi adds one, which
    # ``vendor.container_request`` would then read as a share asked with no device).
    requested = (resources.get("requests") or {}).get(names_.count)
    asks_none = as_int(limits.get(names_.count, requested)) == 0
    if count_present and not cores_present and not asks_none:
        pct_present = _has(container, "limits", names_.memory_percentage) or _has(
            container, "requests", names_.memory_percentage
        )
        mem_present = _has(container, "limits", names_.memory) or _has(
            container, "requests", names_.memory
        )
        if pct_present:
            exclusive = percentage == 100 or (
                as_int((resources.get("requests") or {}).get(names_.memory_percentage)) == 100
                and names_.memory_percentage not in limits
            )
        else:
            exclusive = not names_.memory or not mem_present
        if exclusive:
            limits[names_.cores] = 100
            has_resource = True

    spec = pod.setdefault("spec", {})
    if has_resource and config.runtime_class_name and not spec.get("runtimeClassName"):
        spec["runtimeClassName"] = config.runtime_class_name
    if not has_resource and config.overwrite_env:
        _env_append(container, names.ENV_VISIBLE_DEVICES, "none")
    return has_resource


def _mutate(config: VendorConfig, container: dict[str, Any], pod: dict[str, Any]) -> bool:
    if not isinstance(config, NvidiaConfig):
        raise TypeError(f"NVIDIA's section must be read as NvidiaConfig, got {type(config)}")
    return mutate_container(config, container, pod)


SPEC: Final = vendor.VendorSpec(
    common_word=COMMON_WORD,
    config_key=CONFIG_KEY,
    config_type=NvidiaConfig,
    type_marker="NVIDIA",
    register_annotation=REGISTER_ANNOTATION,
    score_annotation=SCORE_ANNOTATION,
    to_allocate_annotation=TO_ALLOCATE_ANNOTATION,
    allocated_annotation=ALLOCATED_ANNOTATION,
    use_type_annotation=USE_TYPE_ANNOTATION,
    nouse_type_annotation=NOUSE_TYPE_ANNOTATION,
    use_uuid_annotation=USE_UUID_ANNOTATION,
    nouse_uuid_annotation=NOUSE_UUID_ANNOTATION,
    mode_annotation=MODE_ANNOTATION,
    numa_bind_annotation=NUMA_BIND_ANNOTATION,
    supports_mig=True,
    supports_topology=True,
    mutate=_mutate,
    isolation_off_env=names.ENV_DISABLE_CONTROL,
    watch_lost_devices=True,
)
