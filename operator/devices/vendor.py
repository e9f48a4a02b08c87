"""What a device vendor is, as data: names, annotation keys and the pure predicates.

Every vendor (NVIDIA, Hygon DCU) is one ``VendorSpec`` in the table of
``devices.catalog``; what differs between them is data (wire keys, config section,
admission mutation, whether cards need MIG preparation), so the scheduling algorithms
are written once and every vendor list is derived from the table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from vgpu_operator.config import VendorConfig
from vgpu_operator.devices import model
from vgpu_operator.devices.quantity import parse_whole
from vgpu_operator.errors import CodecError

_MAX_INT32 = 2**31 - 1
_TRUE_WORDS = frozenset({"1", "t", "T", "TRUE", "true", "True"})
#: Go's strconv.ParseBool falsehood.
_FALSE_WORDS = frozenset({"0", "f", "F", "FALSE", "false", "False"})
#: The card modes a vgpu-mode annotation may name (the card's mode must be in its text).
CARD_MODES: Final = (model.MODE_HAMI_CORE, model.MODE_MIG, model.MODE_MPS)


@dataclass(frozen=True, slots=True)
class ResourceNames:
    count: str
    memory: str
    memory_percentage: str
    cores: str


#: Admission defaults for one container, in place (seed 001 ``MutateAdmission``); True
#: when the container asks this vendor for devices.
Mutation = Callable[[VendorConfig, dict[str, Any], dict[str, Any]], bool]


def mutate_plain(config: VendorConfig, container: dict[str, Any], pod: dict[str, Any]) -> bool:
    """A vendor without HAMi-core extras: only the default count is filled in."""
    limits = container.setdefault("resources", {}).setdefault("limits", {})
    if config.resource_count_name in limits:
        return True
    wanted = (config.resource_memory_name, config.resource_core_name)
    if config.default_gpu_num > 0 and any(n in limits for n in wanted if n):
        limits[config.resource_count_name] = config.default_gpu_num
        return True
    return has_resource(container, config.resource_count_name)


@dataclass(frozen=True, slots=True)
class VendorSpec:
    """Everything that makes one vendor: one row of the vendor table."""

    common_word: str
    #: Its section in ``device-config.yaml`` and the model that reads it.
    config_key: str
    config_type: type[VendorConfig]
    #: A card is visible to this vendor when its type contains this (case-insensitive).
    type_marker: str
    register_annotation: str
    score_annotation: str | None
    to_allocate_annotation: str
    allocated_annotation: str
    use_type_annotation: str
    nouse_type_annotation: str
    use_uuid_annotation: str
    nouse_uuid_annotation: str
    mode_annotation: str | None = None
    numa_bind_annotation: str | None = None
    #: Cards in MIG mode get their geometry table before usage is booked on them.
    supports_mig: bool = False
    supports_topology: bool = False
    mutate: Mutation = mutate_plain
    #: A container env that, set true, takes the share's isolation away (HAMi-core is
    #: not loaded): such a container is booked as the whole card.
    isolation_off_env: str | None = None
    #: Its count resource vanishing from a node's allocatable makes the node unhealthy
    #: (seed 000 §9: the device plugin is gone).
    watch_lost_devices: bool = False

    def node_annotations(self) -> tuple[str, ...]:
        """The Node annotations of this vendor the engine reads (registration, scores, the
        node layer's card restrictions)."""
        keys = (
            self.register_annotation,
            self.score_annotation,
            self.use_type_annotation,
            self.nouse_type_annotation,
            self.use_uuid_annotation,
            self.nouse_uuid_annotation,
        )
        return tuple(k for k in keys if k)


def resource_names(config: VendorConfig) -> ResourceNames:
    return ResourceNames(
        config.resource_count_name,
        config.resource_memory_name,
        config.resource_memory_percentage_name,
        config.resource_core_name,
    )


def is_true(value: str | None) -> bool:
    """Go's strconv.ParseBool truth, which HAMi uses for annotation flags."""
    return value is not None and value.strip() in _TRUE_WORDS


def split_list(value: str | None) -> list[str]:
    """A comma list annotation: trimmed items, empty items dropped."""
    if value is None:
        return []
    return [item.strip() for item in value.split(",") if item.strip()]


@dataclass(frozen=True, slots=True)
class CardFilter:
    """One vendor's card restrictions from a set of annotations (a pod's or a node's),
    read once and then asked for every card: type, mode, UUID, NUMA binding."""

    use_types: tuple[str, ...] = ()
    nouse_types: tuple[str, ...] = ()
    use_uuids: tuple[str, ...] = ()
    nouse_uuids: tuple[str, ...] = ()
    #: The vgpu-mode annotation as written (None: absent, any mode passes).
    mode: str | None = None
    numa_bind: bool = False

    @classmethod
    def read(cls, spec: VendorSpec, annotations: Mapping[str, str]) -> CardFilter:
        upper = [item.upper() for item in split_list(annotations.get(spec.use_type_annotation))]
        return cls(
            use_types=tuple(upper),
            nouse_types=tuple(
                item.upper() for item in split_list(annotations.get(spec.nouse_type_annotation))
            ),
            use_uuids=tuple(split_list(annotations.get(spec.use_uuid_annotation))),
            nouse_uuids=tuple(split_list(annotations.get(spec.nouse_uuid_annotation))),
            mode=None if spec.mode_annotation is None else annotations.get(spec.mode_annotation),
            numa_bind=spec.numa_bind_annotation is not None
            and is_true(annotations.get(spec.numa_bind_annotation)),
        )

    def type_allowed(self, card_type: str) -> bool:
        """use-/nouse-type: case-insensitive substring of the card type; both apply."""
        upper = card_type.upper()
        if self.use_types and not any(item in upper for item in self.use_types):
            return False
        return not any(item in upper for item in self.nouse_types)

    def mode_allowed(self, card_mode: str) -> bool:
        """vgpu-mode: the card mode must be a substring of the annotation."""
        return self.mode is None or card_mode in self.mode

    def uuid_allowed(self, card_id: str) -> bool:
        """use-/nouse-uuid: exact match against trimmed items; both apply; empty = none."""
        if self.use_uuids and card_id not in self.use_uuids:
            return False
        return card_id not in self.nouse_uuids


def card_filter_problem(spec: VendorSpec, annotations: Mapping[str, str]) -> str | None:
    """Why the webhook must refuse the pod's card-filter annotations of this vendor (a
    value HAMi would read as something else than written), naming the value and what is
    allowed; None when they read as written."""
    if spec.numa_bind_annotation is not None:
        value = annotations.get(spec.numa_bind_annotation)
        if value is not None and value.strip() not in _TRUE_WORDS | _FALSE_WORDS:
            return (
                f"annotation {spec.numa_bind_annotation}={value[:64]!r} is not a boolean: "
                "write true or false"
            )
    if spec.mode_annotation is not None:
        value = annotations.get(spec.mode_annotation)
        if value is not None and not any(mode in value for mode in CARD_MODES):
            return (
                f"annotation {spec.mode_annotation}={value[:64]!r} names no card mode, so no "
                f"card would match: write one or more of {', '.join(CARD_MODES)}"
            )
    return None


def type_allowed(spec: VendorSpec, annotations: Mapping[str, str], card_type: str) -> bool:
    return CardFilter.read(spec, annotations).type_allowed(card_type)


def mode_allowed(spec: VendorSpec, annotations: Mapping[str, str], card_mode: str) -> bool:
    return CardFilter.read(spec, annotations).mode_allowed(card_mode)


def uuid_allowed(spec: VendorSpec, annotations: Mapping[str, str], card_id: str) -> bool:
    return CardFilter.read(spec, annotations).uuid_allowed(card_id)


def numa_bind(spec: VendorSpec, annotations: Mapping[str, str]) -> bool:
    return CardFilter.read(spec, annotations).numa_bind


_MISSING: Final = object()


def _raw(resources: Mapping[str, Any], name: str) -> object:
    """The value of one resource, limits before requests; ``_MISSING`` when absent."""
    for section in ("limits", "requests"):
        values = resources.get(section) or {}
        if name and name in values:
            return values[name]
    return _MISSING


def _whole(container: Mapping[str, Any], name: str, raw: object, unit: str) -> int:
    """A resource value that must be a whole number of ``unit``; the error says which
    container and what to write instead."""
    field = f"container {container.get('name', '')!r}: {name}"
    try:
        return parse_whole(raw, field)
    except CodecError:
        raise CodecError(field, f"must be a whole number of {unit}", str(raw)) from None


def _memory_problem(raw: object, value: int, limit: int) -> str:
    suffixed = isinstance(raw, str) and any(c.isalpha() for c in raw.strip().lstrip("+-"))
    got = (
        f"{raw!r}, which is {value} MiB (a quantity suffix multiplies the number of MiB)"
        if suffixed
        else f"{value}"
    )
    return (
        f"must be a number of MiB between 0 and {limit}, got {got}; "
        "write the number of MiB, for example 4096 for 4 GiB"
    )


def container_request(
    spec: VendorSpec, config: VendorConfig, container: Mapping[str, Any]
) -> model.ContainerRequest | None:
    """HAMi's GenerateResourceRequests for one container (hami-semantics §2).

    None when the container asks this vendor for nothing (no count, or a count of 0).
    A value that cannot be honoured raises ``CodecError`` saying what to write: unlike
    HAMi, which drops such a container's whole request (and so places a GPU pod with no
    GPU), a request is never silently turned into "no request".
    """
    resources = container.get("resources") or {}
    names = resource_names(config)
    raw = _raw(resources, names.count)
    if raw is _MISSING:
        return None
    count = _whole(container, names.count, raw, "devices")
    if count < 0:
        field = f"container {container.get('name', '')!r}: {names.count}"
        raise CodecError(field, "must not be negative", str(raw))
    if count == 0:
        shares = [
            n
            for n in (names.memory, names.memory_percentage, names.cores)
            if n and _raw(resources, n) is not _MISSING
        ]
        if shares:
            # HAMi reads it as no request at all: the share asked would be ignored.
            field = f"container {container.get('name', '')!r}: {names.count}"
            raise CodecError(
                field,
                f"is 0 while the container asks {', '.join(shares)}: ask at least one "
                f"device ({names.count}: 1) or remove {', '.join(shares)}",
                str(raw),
            )
        return None
    factor = config.effective_memory_factor
    memory = 0
    raw = _raw(resources, names.memory)
    if raw is not _MISSING:
        value = _whole(container, names.memory, raw, "MiB")
        limit = _MAX_INT32 // factor
        if value < 0 or value > limit:
            field = f"container {container.get('name', '')!r}: {names.memory}"
            raise CodecError(field, _memory_problem(raw, value, limit))
        memory = value * factor
    percent = model.MEMORY_PERCENT_UNSET
    raw = _raw(resources, names.memory_percentage)
    if raw is not _MISSING:
        value = _whole(container, names.memory_percentage, raw, "percent")
        if value > 0:
            percent = min(value, 100)
    if percent == model.MEMORY_PERCENT_UNSET and memory == 0:
        if config.default_memory != 0:
            memory = config.default_memory
        else:
            percent = 100
    cores = config.default_cores
    raw = _raw(resources, names.cores)
    if raw is not _MISSING:
        cores = _whole(container, names.cores, raw, "percent of a GPU's compute")
        if cores < 0:
            field = f"container {container.get('name', '')!r}: {names.cores}"
            raise CodecError(field, "must be between 0 and 100 (percent)", str(raw))
    if isolation_off(spec, container):
        # Nothing limits it on the card: it holds the whole card, whatever it asked.
        return model.ContainerRequest(count, spec.common_word, 0, 100, 100)
    return model.ContainerRequest(count, spec.common_word, memory, percent, cores)


def isolation_off(spec: VendorSpec, container: Mapping[str, Any]) -> bool:
    """Whether the container turns the vendor's share isolation off (HAMi-core's
    ``CUDA_DISABLE_CONTROL``, with a true value, as the device plugin reads it)."""
    if spec.isolation_off_env is None:
        return False
    for env in container.get("env") or []:
        if isinstance(env, Mapping) and env.get("name") == spec.isolation_off_env:
            return is_true(str(env.get("value", "")))
    return False


def admission_problem(
    spec: VendorSpec, config: VendorConfig, container: Mapping[str, Any]
) -> str | None:
    """Why the webhook must refuse this container's request for this vendor (a value
    ``container_request`` cannot read), or None."""
    try:
        container_request(spec, config, container)
    except CodecError as exc:
        return str(exc)
    return None


def admission_warning(
    spec: VendorSpec, config: VendorConfig, container: Mapping[str, Any]
) -> str | None:
    """What the engine will quietly adjust, for the webhook to say (kubectl shows admission
    warnings): cores above 100 are booked as 100, as HAMi does."""
    try:
        request = container_request(spec, config, container)
    except CodecError:
        return None
    return request_warning(spec, config, container, request)


def request_warning(
    spec: VendorSpec,
    config: VendorConfig,
    container: Mapping[str, Any],
    request: model.ContainerRequest | None,
) -> str | None:
    """``admission_warning`` of a request already read (``container_request``'s answer)."""
    if request is not None and isolation_off(spec, container):
        return (
            f"container {container.get('name', '')!r}: {spec.isolation_off_env} turns the "
            "share's isolation off; it is booked as whole cards"
        )
    if request is None or request.cores <= 100:
        return None
    names = resource_names(config)
    return (
        f"container {container.get('name', '')!r}: {names.cores}={request.cores} is a "
        "percentage of one GPU's compute; it is booked as 100 (the whole card's compute)"
    )


def has_resource(container: Mapping[str, Any], name: str) -> bool:
    resources = container.get("resources") or {}
    return any(name in (resources.get(s) or {}) for s in ("limits", "requests"))
