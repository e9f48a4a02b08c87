"""HAMi v2.10's ``hami.io/vgpu-mig-allocations`` codec (pkg/device/nvidia/mig_allocations.go)."""

from __future__ import annotations

import pytest

from vgpu_operator.devices import mig_allocations
from vgpu_operator.devices.mig_allocations import MigAllocation
from vgpu_operator.errors import CodecError


def test_encodes_as_go_marshals_hamis_struct() -> None:
    records = [
        MigAllocation(0, 0, "GPU-a", "1g.5gb", 6, 1),
        MigAllocation(1, 0, "GPU-a", "2g.10gb", 0, 2),
    ]
    assert mig_allocations.encode(records) == (
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"1g.5gb",'
        '"placement":{"start":6,"size":1}},'
        '{"containerIndex":1,"deviceIndex":0,"gpuUUID":"GPU-a","profile":"2g.10gb",'
        '"placement":{"start":0,"size":2}}]'
    )
    assert mig_allocations.decode(mig_allocations.encode(records)) == records


@pytest.mark.parametrize(
    "raw",
    [
        # As HAMi's device plugin tests write it, before and after the instance exists.
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-live","profile":"1g.5gb",'
        '"placement":{"start":6,"size":1}}]',
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"GPU-live","profile":"1g.5gb",'
        '"placement":{"start":6,"size":1},"migUUID":"MIG-aaaa","gpuInstanceID":6,'
        '"computeInstanceID":0}]',
    ],
)
def test_reads_hamis_forms(raw: str) -> None:
    assert mig_allocations.decode(raw) == [MigAllocation(0, 0, "GPU-live", "1g.5gb", 6, 1)]


@pytest.mark.parametrize("raw", ["", "null", "[]"])
def test_empty_forms_are_no_entries(raw: str) -> None:
    assert mig_allocations.decode(raw) == []


@pytest.mark.parametrize(
    "raw",
    [
        "{",
        '{"containerIndex":0}',
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"","profile":"1g.5gb",'
        '"placement":{"start":0,"size":1}}]',
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb",'
        '"placement":{"start":0,"size":0}}]',
        '[{"containerIndex":-1,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb",'
        '"placement":{"start":0,"size":1}}]',
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb",'
        '"placement":{"start":0,"size":1},"migUUID":"MIG-x"}]',
        '[{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb",'
        '"placement":{"start":0,"size":1}},'
        '{"containerIndex":0,"deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb",'
        '"placement":{"start":1,"size":1}}]',
        '[{"containerIndex":"0","deviceIndex":0,"gpuUUID":"G","profile":"1g.5gb",'
        '"placement":{"start":0,"size":1}}]',
    ],
    ids=["not-json", "not-a-list", "no-gpu", "no-size", "negative", "partial-runtime",
         "duplicate", "string-index"],
)  # fmt: skip
def test_refuses_what_hami_refuses(raw: str) -> None:
    with pytest.raises(CodecError) as caught:
        mig_allocations.decode(raw)
    assert caught.value.field == "hami.io/vgpu-mig-allocations"


def test_encoder_refuses_an_entry_hami_could_not_read() -> None:
    with pytest.raises(CodecError):
        mig_allocations.encode([MigAllocation(0, 0, "GPU-a", "", 0, 1)])
