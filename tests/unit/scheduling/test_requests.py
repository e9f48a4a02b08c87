"""A container's device request (hami-semantics §2, GenerateResourceRequests)."""

from __future__ import annotations

from typing import Any

import pytest

from vgpu_operator.config import load_config
from vgpu_operator.devices import model, nvidia, vendor
from vgpu_operator.errors import CodecError

UNSET = model.MEMORY_PERCENT_UNSET
#: The request cannot be honoured: refused with an error (never read as "no request").
REFUSED = "refused"
MAX_INT32 = 2**31 - 1


def request(
    limits: dict[str, Any] | None = None,
    requests: dict[str, Any] | None = None,
    **config: Any,
) -> model.ContainerRequest | None:
    container: dict[str, Any] = {"name": "c", "resources": {}}
    if limits is not None:
        container["resources"]["limits"] = limits
    if requests is not None:
        container["resources"]["requests"] = requests
    nvidia_config = nvidia.section(load_config({"nvidia": config}))
    return vendor.container_request(nvidia.SPEC, nvidia_config, container)


def want(count: int, memory_mib: int, percent: int, cores: int) -> model.ContainerRequest:
    return model.ContainerRequest(count, "NVIDIA", memory_mib, percent, cores)


@pytest.mark.parametrize(
    ("limits", "requests", "expected"),
    [
        pytest.param({"nvidia.com/gpu": 1}, None, want(1, 0, 100, 0), id="count-only-whole-card"),
        pytest.param(None, {"nvidia.com/gpu": 2}, want(2, 0, 100, 0), id="count-in-requests"),
        pytest.param(
            {"nvidia.com/gpu": 2},
            {"nvidia.com/gpu": 1},
            want(2, 0, 100, 0),
            id="limits-before-requests",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096},
            {"nvidia.com/gpumem": 1024},
            want(1, 4096, UNSET, 0),
            id="memory-limits-before-requests",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1},
            {"nvidia.com/gpumem": 1024, "nvidia.com/gpucores": 30},
            want(1, 1024, UNSET, 30),
            id="each-name-falls-back-to-requests-on-its-own",
        ),
        pytest.param({"nvidia.com/gpu": "3"}, None, want(3, 0, 100, 0), id="count-as-string"),
        pytest.param({"nvidia.com/gpumem": 4096}, None, None, id="no-count-no-request"),
        pytest.param({"nvidia.com/gpu": 0}, None, None, id="count-zero-no-request"),
        pytest.param({"nvidia.com/gpu": -1}, None, REFUSED, id="count-negative-refused"),
        pytest.param({"nvidia.com/gpu": "1.5"}, None, REFUSED, id="count-non-integer-refused"),
        pytest.param({"nvidia.com/gpu": "one"}, None, REFUSED, id="count-not-a-number-refused"),
        pytest.param(
            {"nvidia.com/gpu": "1.5"},
            {"nvidia.com/gpu": 1},
            REFUSED,
            id="bad-limit-refused-not-replaced-by-requests",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 0},
            None,
            want(1, 0, 100, 0),
            id="memory-zero-means-not-given",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": -1},
            None,
            REFUSED,
            id="memory-negative-refused",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "4.5"},
            None,
            REFUSED,
            id="memory-non-integer-refused",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": MAX_INT32},
            None,
            want(1, MAX_INT32, UNSET, 0),
            id="memory-at-int32-max-kept",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": MAX_INT32 + 1},
            None,
            REFUSED,
            id="memory-overflow-refused",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 50},
            None,
            want(1, 0, 50, 0),
            id="percentage-kept",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 150},
            None,
            want(1, 0, 100, 0),
            id="percentage-above-100-clamped",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 0},
            None,
            want(1, 0, 100, 0),
            id="percentage-zero-is-unset-whole-card",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": -5},
            None,
            want(1, 0, 100, 0),
            id="percentage-negative-is-unset",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": "half"},
            None,
            REFUSED,
            id="percentage-non-integer-refused",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096, "nvidia.com/gpumem-percentage": 50},
            None,
            want(1, 4096, 50, 0),
            id="memory-and-percentage-both-kept",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 150},
            None,
            want(1, 0, 100, 150),
            id="cores-not-clamped-by-parser",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpucores": "x"},
            None,
            REFUSED,
            id="cores-non-integer-refused",
        ),
    ],
)
def test_container_request_default_config_parses(
    limits: dict[str, Any] | None,
    requests: dict[str, Any] | None,
    expected: model.ContainerRequest | str | None,
) -> None:
    if expected == REFUSED:
        with pytest.raises(CodecError):
            request(limits, requests)
    else:
        assert request(limits, requests) == expected


@pytest.mark.parametrize(
    ("limits", "config", "expected"),
    [
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4},
            {"memoryFactor": 1024},
            want(1, 4096, UNSET, 0),
            id="memory-factor-multiplies",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096},
            {"memoryFactor": 0},
            want(1, 4096, UNSET, 0),
            id="memory-factor-zero-reads-as-one",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": MAX_INT32 // 1024},
            {"memoryFactor": 1024},
            want(1, (MAX_INT32 // 1024) * 1024, UNSET, 0),
            id="memory-factor-bound-kept",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem": MAX_INT32 // 1024 + 1},
            {"memoryFactor": 1024},
            REFUSED,
            id="memory-factor-overflow-refused",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1},
            {"defaultMemory": 2048},
            want(1, 2048, UNSET, 0),
            id="default-memory-when-nothing-said",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1},
            {"defaultMemory": 4, "memoryFactor": 1024},
            want(1, 4, UNSET, 0),
            id="default-memory-not-multiplied-by-factor",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpumem-percentage": 25},
            {"defaultMemory": 2048},
            want(1, 0, 25, 0),
            id="percentage-wins-over-default-memory",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1},
            {"defaultCores": 30},
            want(1, 0, 100, 30),
            id="default-cores",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 50},
            {"defaultCores": 30},
            want(1, 0, 100, 50),
            id="cores-override-default",
        ),
        pytest.param(
            {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 0},
            {"defaultCores": 30},
            want(1, 0, 100, 0),
            id="explicit-zero-cores-override-default",
        ),
        pytest.param(
            {"example.com/vgpu": 2, "example.com/vmem": 3000},
            {"resourceCountName": "example.com/vgpu", "resourceMemoryName": "example.com/vmem"},
            want(2, 3000, UNSET, 0),
            id="renamed-resources",
        ),
        pytest.param(
            {"nvidia.com/gpu": 2},
            {"resourceCountName": "example.com/vgpu"},
            None,
            id="old-name-ignored-after-rename",
        ),
    ],
)
def test_container_request_configured_parses(
    limits: dict[str, Any], config: dict[str, Any], expected: model.ContainerRequest | str | None
) -> None:
    if expected == REFUSED:
        with pytest.raises(CodecError, match="MiB"):
            request(limits, None, **config)
    else:
        assert request(limits, None, **config) == expected


@pytest.mark.parametrize(
    ("memory_mib", "percent", "uses_percentage"),
    [
        pytest.param(0, 50, True, id="percentage-only"),
        pytest.param(4096, 50, False, id="memory-wins"),
        pytest.param(4096, UNSET, False, id="memory-only"),
        pytest.param(0, 100, True, id="whole-card"),
    ],
)
def test_uses_percentage_only_without_memory(
    memory_mib: int, percent: int, uses_percentage: bool
) -> None:
    assert want(1, memory_mib, percent, 0).uses_percentage is uses_percentage


@pytest.mark.parametrize(
    "gpumem",
    [
        pytest.param("4Gi", id="binary-suffix"),
        pytest.param("16G", id="decimal-suffix"),
        pytest.param(2147483648, id="bytes-over-int32"),
        pytest.param("1e30", id="exponent"),
    ],
)
def test_memory_in_bytes_is_refused_with_the_unit_named(gpumem: Any) -> None:
    with pytest.raises(CodecError) as refused:
        request({"nvidia.com/gpu": 1, "nvidia.com/gpumem": gpumem})
    message = str(refused.value)
    assert "nvidia.com/gpumem" in message
    assert "MiB" in message
    assert "'c'" in message  # the container is named
