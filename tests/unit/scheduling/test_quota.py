"""Namespace quota ledger: seed 002's rules, one table per rule."""

from __future__ import annotations

from typing import Any

import pytest

from vgpu_operator import errors
from vgpu_operator.devices import model
from vgpu_operator.scheduling import quota

MEM = "nvidia.com/gpumem"
CORES = "nvidia.com/gpucores"
DCU_MEM = "hygon.com/dcumem"
DCU_CORES = "hygon.com/dcucores"
NS = "ml-team"


def ledger() -> quota.QuotaLedger:
    return quota.QuotaLedger(
        memory_resources={"NVIDIA": MEM, "DCU": DCU_MEM},
        core_resources={"NVIDIA": CORES, "DCU": DCU_CORES},
    )


def resource_quota(hard: dict[str, Any], name: str = "gpu-quota", ns: str = NS) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"hard": hard},
    }


def pod(*containers: tuple[int, int], vendor: str = "NVIDIA") -> model.PodDevices:
    """A pod with one device per (memory_mib, cores) container."""
    return {
        vendor: tuple(
            (model.ContainerDevice(f"GPU-{i}", vendor, mem, cores),)
            for i, (mem, cores) in enumerate(containers)
        )
    }


SEED_002_QUOTA = {"limits.nvidia.com/gpumem": "32768", "limits.nvidia.com/gpucores": "400"}


@pytest.mark.parametrize(
    ("hard", "used", "memory_mib", "cores", "factor", "fits"),
    [
        pytest.param({}, (0, 0), 10**9, 10**6, 1, True, id="no-quota-fits-anything"),
        pytest.param(SEED_002_QUOTA, (0, 0), 32768, 400, 1, True, id="exactly-the-limit"),
        pytest.param(SEED_002_QUOTA, (30000, 0), 2768, 0, 1, True, id="used-plus-request-equal"),
        pytest.param(SEED_002_QUOTA, (30000, 0), 2769, 0, 1, False, id="memory-one-over"),
        pytest.param(SEED_002_QUOTA, (0, 350), 0, 51, 1, False, id="cores-one-over"),
        pytest.param(SEED_002_QUOTA, (0, 350), 0, 50, 1, True, id="cores-equal"),
        pytest.param(
            {"limits.nvidia.com/gpumem": "0", "limits.nvidia.com/gpucores": "0"},
            (10**6, 10**4),
            10**9,
            10**6,
            1,
            True,
            id="limit-zero-is-unlimited",
        ),
        pytest.param(
            {"limits.nvidia.com/gpumem": "10"}, (0, 0), 10240, 0, 1024, True, id="factor-scales"
        ),
        pytest.param(
            {"limits.nvidia.com/gpumem": "10"}, (0, 0), 10241, 0, 1024, False, id="factor-over"
        ),
        pytest.param(
            {"limits.nvidia.com/gpumem": "10"}, (0, 0), 11, 0, 1, False, id="factor-one-no-scale"
        ),
        pytest.param(
            {"limits.nvidia.com/gpumem": "10"}, (0, 0), 11, 0, 0, False, id="factor-zero-no-scale"
        ),
        pytest.param(
            {"limits.nvidia.com/gpucores": "100"},
            (0, 0),
            0,
            101,
            1024,
            False,
            id="factor-does-not-scale-cores",
        ),
        pytest.param(
            {"limits.nvidia.com/gpucores": "100"},
            (0, 0),
            10**9,
            0,
            1,
            True,
            id="only-cores-limited-memory-free",
        ),
        pytest.param(
            {"requests.nvidia.com/gpumem": "1", "nvidia.com/gpumem": "1", "limits.cpu": "1"},
            (0, 0),
            10**6,
            100,
            1,
            True,
            id="requests-bare-and-unmanaged-ignored",
        ),
        pytest.param(
            {"limits.nvidia.com/gpumem": "32Gi"},
            (0, 0),
            32 * 2**30,
            0,
            1,
            True,
            id="binary-suffix-quantity",
        ),
        pytest.param({"limits.nvidia.com/gpumem": 100}, (0, 0), 101, 0, 1, False, id="int-value"),
    ],
)
def test_fits_follows_seed_rules(
    hard: dict[str, Any],
    used: tuple[int, int],
    memory_mib: int,
    cores: int,
    factor: int,
    fits: bool,
) -> None:
    book = ledger()
    book.set_quota(resource_quota(hard))
    book.add_usage(NS, pod(used))
    assert book.fits(NS, "NVIDIA", memory_mib, cores, factor) is fits


def test_usage_accumulates_over_pods_and_containers() -> None:
    book = ledger()
    book.set_quota(resource_quota(SEED_002_QUOTA))
    book.add_usage(NS, pod((8000, 100), (8000, 100)))
    book.add_usage(NS, pod((16000, 100)))
    assert book.usage(NS) == {CORES: (300, 400), MEM: (32000, 32768)}
    assert book.fits(NS, "NVIDIA", 768, 100, 1)
    assert not book.fits(NS, "NVIDIA", 769, 0, 1)
    assert not book.fits(NS, "NVIDIA", 0, 101, 1)


def test_release_frees_quota_and_clamps_at_zero() -> None:
    book = ledger()
    book.set_quota(resource_quota(SEED_002_QUOTA))
    first, second = pod((20000, 200)), pod((12768, 200))
    book.add_usage(NS, first)
    book.add_usage(NS, second)
    assert not book.fits(NS, "NVIDIA", 1, 0, 1)
    book.remove_usage(NS, first)
    assert book.fits(NS, "NVIDIA", 20000, 200, 1)
    book.remove_usage(NS, first)  # released twice: clamps, never negative
    book.remove_usage(NS, second)
    assert book.usage(NS) == {CORES: (0, 400), MEM: (0, 32768)}
    assert book.fits(NS, "NVIDIA", 32768, 400, 1)
    assert not book.fits(NS, "NVIDIA", 32769, 0, 1)


def test_usage_is_kept_per_vendor_and_namespace() -> None:
    book = ledger()
    book.set_quota(
        resource_quota({"limits.nvidia.com/gpumem": "100", "limits.hygon.com/dcumem": "50"})
    )
    book.add_usage(NS, pod((100, 0)))
    book.add_usage("other", pod((10**6, 0)))
    assert not book.fits(NS, "NVIDIA", 1, 0, 1)
    assert book.fits(NS, "DCU", 50, 0, 1)
    assert book.fits("other", "NVIDIA", 10**6, 0, 1)
    assert book.used(NS, MEM) == 100
    assert book.used(NS, DCU_MEM) == 0


def test_unmanaged_vendor_is_ignored_and_always_fits() -> None:
    book = ledger()
    book.set_quota(resource_quota(SEED_002_QUOTA))
    book.add_usage(NS, pod((10**6, 100), vendor="Ascend"))
    assert book.usage(NS) == {CORES: (0, 400), MEM: (0, 32768)}
    assert book.fits(NS, "Ascend", 10**9, 10**6, 1)


@pytest.mark.parametrize(
    ("quotas", "expected_limit"),
    [
        pytest.param([("a", "100"), ("b", "50")], 50, id="tightest-wins"),
        pytest.param([("a", "50"), ("b", "100")], 50, id="order-does-not-matter"),
        pytest.param([("a", "0"), ("b", "100")], 100, id="zero-does-not-override-a-limit"),
        pytest.param([("a", "0"), ("b", "0")], 0, id="all-zero-unlimited"),
    ],
)
def test_multiple_quotas_use_tightest_non_zero_limit(
    quotas: list[tuple[str, str]], expected_limit: int
) -> None:
    book = ledger()
    for name, limit in quotas:
        book.set_quota(resource_quota({"limits.nvidia.com/gpumem": limit}, name=name))
    assert book.limit(NS, MEM) == expected_limit
    if expected_limit:
        assert book.fits(NS, "NVIDIA", expected_limit, 0, 1)
        assert not book.fits(NS, "NVIDIA", expected_limit + 1, 0, 1)
    else:
        assert book.fits(NS, "NVIDIA", 10**9, 0, 1)


def test_remove_quota_restores_the_other_quota_and_keeps_usage() -> None:
    book = ledger()
    book.set_quota(resource_quota({"limits.nvidia.com/gpumem": "100"}, name="wide"))
    book.set_quota(resource_quota({"limits.nvidia.com/gpumem": "10"}, name="tight"))
    book.add_usage(NS, pod((10, 0)))
    assert not book.fits(NS, "NVIDIA", 1, 0, 1)
    book.remove_quota(NS, "tight")
    assert book.usage(NS) == {MEM: (10, 100)}
    book.remove_quota(NS, "wide")
    assert book.usage(NS) == {MEM: (10, 0)}
    assert book.fits(NS, "NVIDIA", 10**9, 0, 1)
    book.remove_quota(NS, "never-existed")


def test_set_quota_again_replaces_that_quotas_limits() -> None:
    book = ledger()
    book.set_quota(resource_quota(SEED_002_QUOTA))
    book.set_quota(resource_quota({"limits.nvidia.com/gpumem": "64"}))
    assert book.usage(NS) == {MEM: (0, 64)}
    book.set_quota(resource_quota({"limits.cpu": "4"}))
    assert book.usage(NS) == {}
    assert book.namespaces() == []


@pytest.mark.parametrize(
    ("rq", "field"),
    [
        pytest.param(
            resource_quota({"limits.nvidia.com/gpumem": "1.5"}),
            "spec.hard.limits.nvidia.com/gpumem",
            id="fractional",
        ),
        pytest.param(
            resource_quota({"limits.nvidia.com/gpucores": "500m"}),
            "spec.hard.limits.nvidia.com/gpucores",
            id="milli-fraction",
        ),
        pytest.param(
            resource_quota({"limits.nvidia.com/gpumem": "lots"}),
            "spec.hard.limits.nvidia.com/gpumem",
            id="not-a-quantity",
        ),
        pytest.param(
            resource_quota({"limits.nvidia.com/gpumem": "-1"}),
            "spec.hard.limits.nvidia.com/gpumem",
            id="negative",
        ),
        pytest.param(
            resource_quota({"limits.nvidia.com/gpumem": None}),
            "spec.hard.limits.nvidia.com/gpumem",
            id="null",
        ),
        pytest.param({"spec": {"hard": {}}}, "metadata", id="no-metadata"),
        pytest.param(
            {"metadata": {"name": "q"}, "spec": {}}, "metadata.namespace", id="no-namespace"
        ),
        pytest.param({"metadata": {"namespace": NS}, "spec": {}}, "metadata.name", id="no-name"),
        pytest.param(
            {"metadata": {"namespace": NS, "name": "q"}, "spec": {"hard": ["x"]}},
            "spec.hard",
            id="hard-not-mapping",
        ),
    ],
)
def test_set_quota_bad_values_raise_naming_key_and_change_nothing(
    rq: dict[str, Any], field: str
) -> None:
    book = ledger()
    book.set_quota(resource_quota({"limits.nvidia.com/gpumem": "100"}))
    with pytest.raises(errors.CodecError) as caught:
        book.set_quota(rq)
    assert caught.value.field == field
    assert book.usage(NS) == {MEM: (0, 100)}


def test_unmanaged_bad_value_is_ignored() -> None:
    book = ledger()
    book.set_quota(resource_quota({"limits.cpu": "500m", "limits.nvidia.com/gpumem": "8"}))
    assert book.usage(NS) == {MEM: (0, 8)}


def test_copy_is_independent() -> None:
    book = ledger()
    book.set_quota(resource_quota(SEED_002_QUOTA))
    book.add_usage(NS, pod((1000, 10)))
    trial = book.copy()
    trial.add_usage(NS, pod((31768, 390)))
    trial.set_quota(resource_quota({"limits.nvidia.com/gpumem": "1"}, name="extra"))
    assert not trial.fits(NS, "NVIDIA", 1, 0, 1)
    assert book.usage(NS) == {CORES: (10, 400), MEM: (1000, 32768)}
    book.remove_usage(NS, pod((1000, 10)))
    assert trial.used(NS, MEM) == 32768


def test_namespaces_lists_quota_and_usage_holders() -> None:
    book = ledger()
    book.set_quota(resource_quota(SEED_002_QUOTA, ns="b"))
    book.add_usage("a", pod((1, 1)))
    book.add_usage("c", pod((0, 0)))
    assert book.namespaces() == ["a", "b"]
    assert book.managed_resources == frozenset({MEM, CORES, DCU_MEM, DCU_CORES})
