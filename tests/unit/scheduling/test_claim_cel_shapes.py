"""Which selectors the scheduling loop evaluates itself (``claim_cel_shapes``): the shapes
this project writes, and a tenant's of the same shape; every other goes off the loop."""

from __future__ import annotations

import pytest

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import dra
from vgpu_operator.devices.catalog import VENDOR_TABLE
from vgpu_operator.scheduling.cel import claim_cel, claim_cel_shapes
from vgpu_operator.scheduling.dialects.claims import claim_admission
from vgpu_operator.scheduling.vendors import Vendors

D = dra.DRIVER
ATTRS = f'device.attributes["{D}"]'
A100 = "a" * 100


def our_selectors() -> list[str]:
    """What the project writes: its DeviceClasses' and the webhook's card filters."""
    written = [
        str(s["cel"]["expression"]) for c in dra.device_classes() for s in c["spec"]["selectors"]
    ]
    spec = Vendors(DeviceConfig(), VENDOR_TABLE).spec(dra.VENDOR)
    annotations = {
        spec.use_type_annotation: "A100,H100",
        spec.nouse_type_annotation: "T4",
        spec.use_uuid_annotation: "GPU-1,GPU-2",
        spec.nouse_uuid_annotation: "GPU-3",
    }
    written += claim_admission.selectors(spec, annotations)
    assert len(written) >= 7
    return written


def test_every_selector_the_project_writes_is_evaluated_on_the_loop() -> None:
    for expression in our_selectors():
        assert claim_cel_shapes.candidate(expression), expression
        assert not claim_cel.compile_selector(expression).off_loop, expression


@pytest.mark.parametrize(
    "expression",
    [
        f"{ATTRS}.index == 0",
        f'{ATTRS}.index in [0, 1, 2] && device.driver == "{D}"',
        f'device.capacity["{D}"].memory.compareTo(quantity("40Gi")) >= 0',
        f'has({ATTRS}.uuid) ? {ATTRS}.uuid.startsWith("GPU-") : false',
        f'!({ATTRS}.type.lowerAscii().contains("t4"))',
    ],
)
def test_a_tenants_selector_of_those_shapes_is_too(expression: str) -> None:
    assert claim_cel_shapes.candidate(expression)
    assert not claim_cel.compile_selector(expression).off_loop


@pytest.mark.parametrize(
    ("expression", "parsed_on_the_loop"),
    [
        # The issue's: never even parsed on the loop.
        (f'"{A100}".replace("a", "{A100}").split("").size() > 5', False),
        (f'{ATTRS}.type.matches("^A.*")', False),
        ('["a"].map(x, x).size() > 0', False),
        (" || ".join(f'device.driver == "{i}"' for i in range(40)), False),  # too long
        # Parsed, and found to be of no inline shape:
        (f'{ATTRS}.type + "x" == "A100x"', True),
        ("[" + ",".join("0" for _ in range(40)) + "].exists(x, x == 1)", True),  # a long range
        (f'[{ATTRS}.type].exists(x, x == "a")', True),  # a range of no literals
        (f'{ATTRS}["{D}"] == 1', True),
        (f'["a"].exists(x, ["b"].exists(y, {ATTRS}.type.contains(x)))', True),  # nested
        ('"replace(" == device.driver', True),  # a name inside a literal is no call
    ],
)
def test_any_other_is_evaluated_off_the_loop(expression: str, parsed_on_the_loop: bool) -> None:
    assert claim_cel_shapes.candidate(expression) is parsed_on_the_loop
    cache = claim_cel.SelectorCache()
    cache.deferring = True
    selector = cache.compile(expression)
    assert (selector.program is not None) is parsed_on_the_loop
    if selector.off_loop:
        with pytest.raises(claim_cel.CelPending):
            cache.matches(selector, "dev-1", claim_cel.DeviceView(D, True, {}, {}))
