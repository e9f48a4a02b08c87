"""DeviceTaintRules (KEP-5055, ``resource.k8s.io/v1`` since 1.37): taints put on devices
without rewriting their ResourceSlices, by an administrator (a card to drain) or a driver.

Upstream's allocator treats a rule's taint as if the selected devices carried it in their
slice; so does the engine: each slice is handed to the books with the taints of the rules
that select its devices added (``tainted_slice``), and the Fit sees one list of taints
per device. A rule selects by ``driver``, ``pool`` and ``device`` name, every one given
having to match; a rule without ``deviceSelector`` selects nothing (the API's rule; its
CEL selectors were withdrawn in 1.35). A rule whose taint has no key or an unknown effect
is ignored: the API server validates both, so such an object is not one it served.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from vgpu_operator.wire import DeviceTaintRule, ResourceSlice, Taint

#: The effects a device taint may have (``None``: informational, nothing kept off).
EFFECTS: Final = frozenset({"NoSchedule", "NoExecute", "None"})


@dataclass(frozen=True, slots=True)
class TaintRule:
    """One DeviceTaintRule: what it selects (None: any) and its one taint."""

    name: str
    driver: str | None
    pool: str | None
    device: str | None
    taint: Taint

    def selects(self, driver: str, pool: str, device: str) -> bool:
        return (
            (self.driver is None or self.driver == driver)
            and (self.pool is None or self.pool == pool)
            and (self.device is None or self.device == device)
        )


def read_rule(obj: DeviceTaintRule) -> TaintRule | None:
    """The rule, or None when it selects nothing or its taint is unusable."""
    spec = obj.get("spec")
    if not isinstance(spec, Mapping):
        return None
    selector = spec.get("deviceSelector")
    taint = spec.get("taint")
    if not isinstance(selector, Mapping) or not isinstance(taint, Mapping):
        return None
    key, effect = taint.get("key"), taint.get("effect")
    if not isinstance(key, str) or not key or effect not in EFFECTS:
        return None
    value = taint.get("value")

    def field(name: str) -> str | None:
        found = selector.get(name)
        return found if isinstance(found, str) and found else None

    name = (obj.get("metadata") or {}).get("name")
    return TaintRule(
        name=str(name or ""),
        driver=field("driver"),
        pool=field("pool"),
        device=field("device"),
        taint={"key": key, "value": value if isinstance(value, str) else "", "effect": effect},
    )


def tainted_slice(obj: ResourceSlice, rules: Sequence[TaintRule]) -> ResourceSlice:
    """The slice with each rule's taint added to the devices it selects, after their own;
    the same object when no rule selects any of them."""
    spec = obj.get("spec")
    if not rules or not isinstance(spec, Mapping):
        return obj
    driver = str(spec.get("driver", ""))
    pool = str((spec.get("pool") or {}).get("name", ""))
    devices = spec.get("devices") or []
    changed = False
    tainted = []
    for device in devices:
        if not isinstance(device, Mapping):
            tainted.append(device)
            continue
        name = str(device.get("name", ""))
        extra = [r.taint.copy() for r in rules if r.selects(driver, pool, name)]
        if extra:
            changed = True
            device = {**device, "taints": [*(device.get("taints") or ()), *extra]}
        tainted.append(device)
    if not changed:
        return obj
    return {**obj, "spec": {**spec, "devices": tainted}}
