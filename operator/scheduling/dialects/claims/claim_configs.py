"""What a claim's opaque configs of this driver say: ``hamiCore``.

``hamiCore: false`` turns HAMi-core off for the claim (``agent.dra.prepare``: no preload,
so the share's limits are not enforced, and the books count the claim as its whole
cards); an administrator allows it per namespace (manifests/claim-policy.yaml). Any other
value than a boolean is refused with a sentence (issue 44: ``hamiCore: "false"``, a string,
was admitted and silently meant "on").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from vgpu_operator.devices import dra
from vgpu_operator.wire import DeviceClassConfiguration

#: The opaque config key that turns HAMi-core off for a claim (``agent.dra.prepare``).
CONFIG_HAMI_CORE: Final = "hamiCore"


def _parameters(configs: Sequence[DeviceClassConfiguration]) -> list[Mapping[str, object]]:
    """The parameters of the configs of this driver that name ``hamiCore``, in order."""
    out: list[Mapping[str, object]] = []
    for config in configs:
        opaque = config.get("opaque")
        if not isinstance(opaque, Mapping) or opaque.get("driver") != dra.DRIVER:
            continue
        parameters = opaque.get("parameters")
        if isinstance(parameters, Mapping) and CONFIG_HAMI_CORE in parameters:
            out.append(parameters)
    return out


def turn_hami_core_off(configs: Sequence[DeviceClassConfiguration]) -> bool:
    """Whether opaque configs of this driver, in precedence order (the class's first, the
    claim's after: a later one wins, as ``agent.dra.prepare`` reads them), say
    ``hamiCore: false``."""
    found = _parameters(configs)
    return bool(found) and found[-1][CONFIG_HAMI_CORE] is False


def hami_core_problem(configs: Sequence[DeviceClassConfiguration]) -> str | None:
    """Why a claim's own configs cannot be read: ``hamiCore`` given as anything but a
    boolean (None: fine)."""
    for parameters in _parameters(configs):
        value = parameters[CONFIG_HAMI_CORE]
        if not isinstance(value, bool):
            return (
                f"an opaque config of {dra.DRIVER} sets {CONFIG_HAMI_CORE} to {value!r}, "
                f"which is no boolean: write {CONFIG_HAMI_CORE}: false (unquoted) to turn "
                "HAMi-core off, or remove it"
            )
    return None
