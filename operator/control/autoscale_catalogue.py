"""The instance types the autoscaler may add (``run --autoscale-instance-types FILE``).

The file is a JSON list in the format of Karpenter's KWOK provider (its
``--instance-types-file-path``): per instance type its ``name``, ``offerings`` (``Price``,
``Available`` and ``Requirements`` on ``topology.kubernetes.io/zone`` and
``karpenter.sh/capacity-type``), ``architecture``, ``operatingSystems`` and ``resources``
(cpu, memory, pods, ``nvidia.com/gpu``...), plus ``cards``: the devices the node's agent
reports in its DeviceInventory (``status.devices``; ``vgpu-operator agent`` prints them on
a machine of that type). Karpenter ignores ``cards``, so one file may serve both. From the
same cards the catalogue builds what the node's DRA driver would publish on the DRA path
(``dra_shapes``, the agent's own code): a new node of a NodePool that labels its nodes for
DRA is tried with those slices (``scheduling.autoscale.hypothetical``).

Every entry is checked on its own: an entry that cannot be read, or has no cards, is left
out with a sentence saying what to change (``Catalogue.problems``: logged, and said to a
pod that only such a type could hold); the others are used.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

from pydantic import TypeAdapter, ValidationError

from vgpu_operator import dra_shapes, resources
from vgpu_operator.devices import plausibility
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError, ConfigError
from vgpu_operator.scheduling.autoscale.catalogue import (
    CAPACITY_TYPE_LABEL,
    ZONE_LABEL,
    InstanceType,
    Offering,
)

#: The largest file read, and the most entries, offerings and resources taken from it.
MAX_BYTES: Final = 4 * 1024 * 1024
MAX_TYPES: Final = 512
_MAX_ITEMS: Final = 64
_CARDS: Final = TypeAdapter(tuple[resources.Device, ...])


@dataclass(frozen=True, slots=True)
class Catalogue:
    types: tuple[InstanceType, ...] = ()
    #: Entries left out, each with what to change.
    problems: tuple[str, ...] = ()


def read_catalogue(path: Path) -> Catalogue:
    """The file's instance types; ``ConfigError`` when the file itself cannot be read."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(str(path), f"cannot read the instance types: {exc}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(str(path), f"larger than {MAX_BYTES} bytes")
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise ConfigError(str(path), f"not JSON: {exc}") from None
    return parse_catalogue(raw, str(path))


def parse_catalogue(raw: Any, where: str = "instance types") -> Catalogue:
    if not isinstance(raw, list):
        raise ConfigError(where, "must be a JSON list of instance types")
    if len(raw) > MAX_TYPES:
        raise ConfigError(where, f"lists {len(raw)} instance types, at most {MAX_TYPES}")
    types: list[InstanceType] = []
    problems: list[str] = []
    seen: set[str] = set()
    for index, entry in enumerate(raw):
        name = entry.get("name") if isinstance(entry, Mapping) else None
        label = f"instance type {name!r}" if isinstance(name, str) else f"entry {index}"
        try:
            parsed = instance_type(entry)
        except ValueError as exc:
            problems.append(f"{label} is left out: {exc}")
            continue
        if parsed.name in seen:
            problems.append(f"{label} is left out: listed twice")
            continue
        seen.add(parsed.name)
        types.append(parsed)
    return Catalogue(tuple(types), tuple(problems))


def instance_type(entry: Any) -> InstanceType:
    """One entry; ``ValueError`` says what to change."""
    if not isinstance(entry, Mapping):
        raise ValueError("not an object")
    name = entry.get("name")
    if not isinstance(name, str) or not name or len(name) > 63:
        raise ValueError("name must be a string of 1 to 63 characters")
    offerings = tuple(_offerings(entry.get("offerings")))
    if not offerings:
        raise ValueError("no available offering (offerings: Price, Available, Requirements)")
    capacity = _resources(entry.get("resources"))
    raw_cards = entry.get("cards")
    if not raw_cards:
        raise ValueError(
            "no card facts: add cards, the devices the node's agent reports in its "
            "DeviceInventory (status.devices)"
        )
    try:
        cards = _CARDS.validate_python(raw_cards)
    except ValidationError as exc:
        first = exc.errors()[0]
        place = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"cards.{place}: {first['msg']}") from None
    if len(cards) > plausibility.MAX_DEVICES or len({c.uuid for c in cards}) != len(cards):
        raise ValueError(f"cards must name at most {plausibility.MAX_DEVICES} distinct UUIDs")
    try:
        devices, scores = resources.devices_from_cards(cards, "cards")
        # The request defaults are the device config's, set per new node (``hypothetical``).
        dra_cards = dra_shapes.card_shapes(cards, dra_shapes.RequestDefaults())
        dra_mig_cards = dra_shapes.mig_card_shapes(cards)
    except CodecError as exc:
        raise ValueError(str(exc)) from None
    architecture = entry.get("architecture") or "amd64"
    systems = entry.get("operatingSystems") or ["linux"]
    if not isinstance(architecture, str) or not _strings(systems):
        raise ValueError("architecture must be a string, operatingSystems a list of strings")
    return InstanceType(
        name=name,
        offerings=offerings,
        capacity=capacity,
        devices=tuple(devices),
        pair_scores=scores,
        architecture=architecture,
        operating_systems=tuple(systems),
        dra_cards=tuple(dra_cards),
        dra_mig_cards=tuple(dra_mig_cards),
    )


def _strings(values: Any) -> bool:
    return isinstance(values, list) and all(isinstance(v, str) for v in values[:_MAX_ITEMS])


def _offerings(raw: Any) -> list[Offering]:
    if not isinstance(raw, list) or len(raw) > _MAX_ITEMS:
        raise ValueError(f"offerings must be a list of at most {_MAX_ITEMS}")
    out: list[Offering] = []
    for offering in raw:
        if not isinstance(offering, Mapping):
            raise ValueError("an offering is not an object")
        price = offering.get("Price", offering.get("price"))
        if isinstance(price, bool) or not isinstance(price, int | float):
            raise ValueError("an offering has no Price (a number)")
        if not math.isfinite(price) or price < 0:
            raise ValueError(f"an offering's Price {price} is not a finite number >= 0")
        if offering.get("Available", offering.get("available", True)) is False:
            continue
        values = _requirement_values(offering.get("Requirements", offering.get("requirements")))
        zone = values.get(ZONE_LABEL)
        capacity_type = values.get(CAPACITY_TYPE_LABEL)
        out.append(Offering(float(price), zone, capacity_type))
    return out


def _requirement_values(raw: Any) -> dict[str, str]:
    """An offering's single-valued ``In`` requirements (its zone and capacity type)."""
    if raw is None:
        return {}
    if not isinstance(raw, list) or len(raw) > _MAX_ITEMS:
        raise ValueError("an offering's Requirements must be a list")
    values: dict[str, str] = {}
    for requirement in raw:
        if not isinstance(requirement, Mapping):
            raise ValueError("an offering's requirement is not an object")
        key, listed = requirement.get("key"), requirement.get("values")
        if (
            isinstance(key, str)
            and requirement.get("operator") == "In"
            and isinstance(listed, Sequence)
            and len(listed) == 1
            and isinstance(listed[0], str)
        ):
            values[key] = listed[0]
    return values


def _resources(raw: Any) -> dict[str, Fraction]:
    if not isinstance(raw, Mapping) or len(raw) > _MAX_ITEMS:
        raise ValueError("resources must be a map of quantities (cpu, memory, pods...)")
    out: dict[str, Fraction] = {}
    for key, value in raw.items():
        try:
            out[str(key)] = parse_quantity(value, f"resources.{key}")
        except CodecError as exc:
            raise ValueError(str(exc)) from None
    for needed in ("cpu", "memory"):
        if needed not in out:
            raise ValueError(f"resources has no {needed}")
    return out
