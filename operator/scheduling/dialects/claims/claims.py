"""A pod's ResourceClaims, read for the engine: what each request asks of which devices.

``read_pod_claims`` resolves the claims a pod names (directly, or made from its templates
by kube-controller-manager, found through ``status.resourceClaimStatuses``), and reads each
claim's requests: device class, count, CEL selectors (the class's and the request's),
capacity requests and tolerations, the alternatives of a ``firstAvailable`` request (each a
request named ``<request>/<subrequest>``, as the allocation names it), and the claim's
``matchAttribute`` and ``distinctAttribute`` constraints. What
the engine does not allocate is refused with a sentence that says what to change
(``Refusal``); what is not there yet (a claim still to be made) is a wait (``Waiting``).
A claim already allocated (by anyone) is kept as it is: it pins the pod to its node.

``eligible`` then says, for one request and one published device, whether the device
may serve it and what it would consume of each capacity (upstream's request-policy
rounding, ``dra_pool.CapacityPolicy``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final

from vgpu_operator import wire
from vgpu_operator.devices import dra
from vgpu_operator.devices.quantity import parse_quantity
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.cel import claim_cel
from vgpu_operator.scheduling.dialects.claims import claim_configs, dra_pool
from vgpu_operator.wire import (
    AllocationResult,
    DeviceClaim,
    DeviceClaimConfiguration,
    DeviceClassConfiguration,
    DeviceRequest,
    ExactDeviceRequest,
    Pod,
    ResourceClaim,
    ResourceClaimConsumer,
    Toleration,
)

#: The DeviceClasses whose claims the engine allocates (manifests/dra-deviceclasses.yaml).
OUR_CLASSES: Final = frozenset({dra.SHARED_CLASS, dra.EXCLUSIVE_CLASS, dra.MIG_CLASS})
#: The most pods one claim may be reserved for (the API's limit).
MAX_RESERVED_FOR: Final = 256


class Refusal(Exception):
    """The engine will not allocate this pod's claims as they are; the message says why
    and what to change."""


class Waiting(Exception):
    """A claim the pod names does not exist yet (or is being deleted)."""


@dataclass(frozen=True, slots=True)
class DeviceClass:
    name: str
    selectors: tuple[str, ...] = ()
    #: Opaque configs of the class, as the allocation's ``config`` carries them.
    config: tuple[DeviceClassConfiguration, ...] = ()
    #: ``spec.extendedResourceName`` (KEP-5004): pods asking it get a special claim.
    extended_resource_name: str | None = None

    @classmethod
    def of(cls, obj: wire.DeviceClass) -> DeviceClass:
        spec = obj.get("spec") or {}
        return cls(
            name=str((obj.get("metadata") or {}).get("name", "")),
            selectors=tuple(
                str((s.get("cel") or {}).get("expression", ""))
                for s in spec.get("selectors") or ()
                if isinstance(s, Mapping) and s.get("cel")
            ),
            config=tuple(c for c in spec.get("config") or () if isinstance(c, Mapping)),
            extended_resource_name=str(spec["extendedResourceName"])
            if spec.get("extendedResourceName")
            else None,
        )


@dataclass(frozen=True, slots=True)
class Request:
    """One request of a claim (``exactly``), or one alternative of a ``firstAvailable``
    request (then ``name`` is ``<request>/<subrequest>``, the allocation's name for it)."""

    name: str
    device_class: str
    count: int
    selectors: tuple[claim_cel.Selector, ...]
    capacity: Mapping[str, Fraction]
    tolerations: tuple[Toleration, ...]
    #: Where ``selectors`` were written (the DeviceClass's come first).
    written: claim_cel.Written = ("", 0)
    #: ``adminAccess``: devices shared with whoever holds them, consuming nothing.
    admin_access: bool = False


@dataclass(frozen=True, slots=True)
class AllocatedShare:
    """One device an existing allocation names, and what it consumes."""

    request: str
    node: str
    device: str
    memory_bytes: Fraction | None
    cores: Fraction | None
    shares: Fraction | None


@dataclass(frozen=True, slots=True)
class Claim:
    """One claim of the pod, as the engine needs it."""

    namespace: str
    name: str
    uid: str
    resource_version: str
    #: One request per request of the claim; for a ``firstAvailable`` request its first
    #: alternative (``choices`` has them all; ``claim_variants`` tries them in order).
    requests: tuple[Request, ...]
    #: Per ``matchAttribute`` constraint: the requests it covers (all when empty), and
    #: the attribute's qualified name. A covered name is a request or, as upstream
    #: allows, ``<request>/<subrequest>`` (then it covers only that alternative).
    match_attributes: tuple[tuple[tuple[str, ...], str], ...] = ()
    #: Per ``distinctAttribute`` constraint, the same: each device of the covered
    #: requests must have a value of the attribute no other of them has.
    distinct_attributes: tuple[tuple[tuple[str, ...], str], ...] = ()
    #: Per request of the claim, its alternatives in order (one for ``exactly``); empty
    #: when every request is ``exactly`` (then ``requests`` is all there is).
    choices: tuple[tuple[Request, ...], ...] = ()
    #: The claim's own opaque configs (``spec.devices.config``).
    config: tuple[DeviceClaimConfiguration, ...] = ()
    #: Set when the claim is allocated already (the node it is on, and its devices).
    allocated_node: str | None = None
    allocated: tuple[AllocatedShare, ...] = ()
    reserved_for: tuple[ResourceClaimConsumer, ...] = ()
    #: Its configs (or its classes') turn HAMi-core off: nothing will limit what its
    #: containers take, so each device it gets is taken whole (the books count it so).
    whole_devices: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class PodClaims:
    """Every claim a pod names: those to allocate, and those allocated already."""

    claims: tuple[Claim, ...]
    #: The node the allocated ones pin the pod to (None: none is allocated).
    node: str | None = None
    pending: tuple[Claim, ...] = field(default=())


def pod_claim_keys(pod: Pod) -> list[str] | str:
    """The ``namespace/name`` of every claim the pod uses, or a sentence saying which
    claim is not made yet (a template's claim waits for kube-controller-manager)."""
    meta = pod.get("metadata") or {}
    namespace = meta.get("namespace") or "default"
    spec = pod.get("spec") or {}
    made = {
        str(s.get("name")): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or ()
        if isinstance(s, Mapping)
    }
    keys: list[str] = []
    for entry in spec.get("resourceClaims") or ():
        if not isinstance(entry, Mapping):
            continue
        if entry.get("resourceClaimName"):
            keys.append(f"{namespace}/{entry['resourceClaimName']}")
        elif entry.get("resourceClaimTemplateName"):
            name = str(entry.get("name"))
            if name not in made:
                return (
                    f"waiting for the ResourceClaim of template "
                    f"{entry['resourceClaimTemplateName']!r} ({name}) to be created"
                )
            if made[name]:
                keys.append(f"{namespace}/{made[name]}")
    return keys


def uses_claims(pod: Pod) -> bool:
    return bool((pod.get("spec") or {}).get("resourceClaims"))


def _quantity(raw: Any, where: str) -> Fraction:
    try:
        return parse_quantity(raw, where)
    except CodecError as exc:
        raise Refusal(str(exc)) from None


def read_claim(
    obj: ResourceClaim,
    classes: Mapping[str, DeviceClass],
    cache: claim_cel.SelectorCache,
) -> Claim:
    """One claim; raises Refusal for what the engine does not allocate."""
    meta = obj.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    name = str(meta.get("name", ""))
    where = f"ResourceClaim {namespace}/{name}"
    devices = (obj.get("spec") or {}).get("devices") or {}
    allocation = (obj.get("status") or {}).get("allocation")
    reserved = tuple(r for r in (obj.get("status") or {}).get("reservedFor") or () if r)
    if isinstance(allocation, Mapping):
        node, shares = read_allocated(allocation)
        return Claim(
            namespace,
            name,
            str(meta.get("uid", "")),
            str(meta.get("resourceVersion", "")),
            (),
            allocated_node=node,
            allocated=shares,
            reserved_for=reserved,
        )
    choices = tuple(_read_request(r, where, classes, cache) for r in devices.get("requests") or ())
    if not choices:
        raise Refusal(f"{where} requests no device")
    combinations = math.prod(len(choice) for choice in choices)
    if combinations > MAX_VARIANTS:
        raise Refusal(
            f"{where}: its firstAvailable alternatives make {combinations} combinations, "
            f"more than this scheduler tries ({MAX_VARIANTS}); list fewer alternatives"
        )
    _mig_shape(choices, devices, where)
    requests = tuple(c[0] for c in choices)
    known = {r.name for c in choices for r in c} | {r.name.split("/", 1)[0] for r in requests}
    matches: list[tuple[tuple[str, ...], str]] = []
    distincts: list[tuple[tuple[str, ...], str]] = []
    for constraint in devices.get("constraints") or ():
        if not isinstance(constraint, Mapping):
            continue
        match = constraint.get("matchAttribute")
        distinct = constraint.get("distinctAttribute")
        if bool(match) == bool(distinct):
            raise Refusal(
                f"{where}: a constraint must give exactly one of matchAttribute and "
                "distinctAttribute"
            )
        covered = tuple(str(r) for r in constraint.get("requests") or ())
        unknown = [r for r in covered if r not in known]
        if unknown:
            raise Refusal(
                f"{where}: a constraint names {', '.join(map(repr, unknown))}, which is not a "
                "request (or <request>/<subrequest>) of the claim"
            )
        (matches if match else distincts).append((covered, str(match or distinct)))
    own = tuple(c for c in devices.get("config") or () if isinstance(c, Mapping))
    if (problem := claim_configs.hami_core_problem(own)) is not None:
        raise Refusal(f"{where}: {problem}")
    from_classes = [
        c
        for r in {r.device_class: r for c in choices for r in c}.values()
        if r.device_class in classes
        for c in classes[r.device_class].config
    ]
    return Claim(
        namespace,
        name,
        str(meta.get("uid", "")),
        str(meta.get("resourceVersion", "")),
        requests,
        match_attributes=tuple(matches),
        distinct_attributes=tuple(distincts),
        choices=choices if any(len(c) > 1 or "/" in c[0].name for c in choices) else (),
        config=own,
        reserved_for=reserved,
        whole_devices=claim_configs.turn_hami_core_off([*from_classes, *own]),
    )


def _mig_shape(choices: Sequence[tuple[Request, ...]], devices: DeviceClaim, where: str) -> None:
    """A claim of the MIG class is placed by ``claim_mig`` on its own: refuse what that
    does not honour (rather than ignore it)."""
    mig = [r.name for c in choices for r in c if r.device_class == dra.MIG_CLASS]
    if not mig:
        return
    if len(mig) < sum(len(c) for c in choices):
        raise Refusal(
            f"{where} mixes DeviceClass {dra.MIG_CLASS} with other classes; this scheduler "
            "allocates MIG instances in claims of their own (use one claim per class)"
        )
    if any(len(c) > 1 or "/" in c[0].name for c in choices):
        raise Refusal(
            f"{where}: firstAvailable is not honoured for DeviceClass {dra.MIG_CLASS}; "
            "name one profile (or the memory needed) per request"
        )
    if devices.get("constraints"):
        raise Refusal(
            f"{where}: constraints are not honoured for DeviceClass {dra.MIG_CLASS} by this "
            "scheduler; remove them"
        )


#: The most alternatives of one ``firstAvailable`` request (the API's limit).
MAX_SUBREQUESTS: Final = 8
#: The most combinations of alternatives the engine tries for one claim
#: (``claim_variants``). Upstream has no such bound (its allocator backtracks through
#: them all); a claim past it is refused with a sentence rather than tried for seconds.
MAX_VARIANTS: Final = 256


def _read_request(
    raw: DeviceRequest,
    where: str,
    classes: Mapping[str, DeviceClass],
    cache: claim_cel.SelectorCache,
) -> tuple[Request, ...]:
    """One request of the claim: its alternatives in order (one for ``exactly``)."""
    name = str(raw.get("name", ""))
    exactly = raw.get("exactly")
    alternatives = raw.get("firstAvailable")
    if alternatives and exactly:
        raise Refusal(f"{where}: request {name!r} gives both exactly and firstAvailable")
    if alternatives:
        if not isinstance(alternatives, list) or len(alternatives) > MAX_SUBREQUESTS:
            raise Refusal(
                f"{where}: request {name!r}: firstAvailable must list 1 to "
                f"{MAX_SUBREQUESTS} alternatives"
            )
        read: list[Request] = []
        for sub in alternatives:
            if not isinstance(sub, Mapping) or not sub.get("name"):
                raise Refusal(f"{where}: request {name!r} has an alternative without a name")
            read.append(
                _read_exactly(sub, f"{name}/{sub['name']}", where, classes, cache, sub=True)
            )
        if len({r.name for r in read}) < len(read):
            raise Refusal(f"{where}: request {name!r} names one alternative twice")
        return tuple(read)
    if not isinstance(exactly, Mapping):
        raise Refusal(f"{where}: request {name!r} has neither exactly nor firstAvailable")
    return (_read_exactly(exactly, name, where, classes, cache, sub=False),)


def _read_exactly(
    exactly: ExactDeviceRequest,
    name: str,
    where: str,
    classes: Mapping[str, DeviceClass],
    cache: claim_cel.SelectorCache,
    *,
    sub: bool,
) -> Request:
    """An ``exactly`` request, or one alternative (``sub``) of a ``firstAvailable`` one."""
    what = f"the alternative {name!r}" if sub else f"request {name!r}"
    class_name = str(exactly.get("deviceClassName", ""))
    if class_name not in OUR_CLASSES:
        raise Refusal(
            f"{where}: {what} uses DeviceClass {class_name!r}; this scheduler "
            f"allocates only {', '.join(sorted(OUR_CLASSES))} (use kube-scheduler for others)"
        )
    device_class = classes.get(class_name)
    if device_class is None:
        raise Waiting(f"DeviceClass {class_name!r} does not exist")
    mode = exactly.get("allocationMode") or "ExactCount"
    if mode != "ExactCount":
        raise Refusal(
            f"{where}: {what} asks allocationMode {mode}; this scheduler "
            "allocates ExactCount requests (give a count)"
        )
    count = exactly.get("count", 1)
    if not isinstance(count, int) or isinstance(count, bool) or count < 1:
        raise Refusal(f"{where}: {what} has count {count!r}")
    expressions = [
        *device_class.selectors,
        *(
            str((s.get("cel") or {}).get("expression", ""))
            for s in exactly.get("selectors") or ()
            if isinstance(s, Mapping)
        ),
    ]
    written = (class_name, len(device_class.selectors))
    try:
        selectors = claim_cel.compile_all(cache, expressions, written)
    except claim_cel.CelRefused as exc:
        raise Refusal(f"{where}: {what}, {exc}") from None
    requested = (exactly.get("capacity") or {}).get("requests") or {}
    capacity = {str(k): _quantity(v, f"{where}.{name}.capacity.{k}") for k, v in requested.items()}
    return Request(
        name,
        class_name,
        count,
        selectors,
        capacity,
        tuple(t for t in exactly.get("tolerations") or () if isinstance(t, Mapping)),
        written,
        exactly.get("adminAccess") is True,
    )


def read_allocated(
    allocation: AllocationResult,
) -> tuple[str | None, tuple[AllocatedShare, ...]]:
    """The node an allocation pins (its node selector, else its pool) and this driver's
    devices in it. Unreadable amounts count as the whole device (None)."""
    nodes = dra.selected_nodes(allocation.get("nodeSelector"))
    node = sorted(nodes)[0] if nodes else None
    shares = []
    for result in (allocation.get("devices") or {}).get("results") or ():
        if not isinstance(result, Mapping) or result.get("driver") != dra.DRIVER:
            continue
        consumed = result.get("consumedCapacity") or {}

        def amount(key: str, consumed: Any = consumed) -> Fraction | None:
            try:
                value = parse_quantity(consumed.get(key), key)
            except (CodecError, AttributeError, TypeError):
                return None
            return value if value >= 0 else None

        pool = str(result.get("pool", ""))
        shares.append(
            AllocatedShare(
                request=str(result.get("request", "")),
                node=pool,
                device=str(result.get("device", "")),
                memory_bytes=amount(dra.MEMORY),
                cores=amount(dra.CORES),
                shares=amount(dra.SHARES),
            )
        )
    if node is None and shares:
        node = shares[0].node
    return node, tuple(shares)


def read_pod_claims(
    pod: Pod,
    claims: Mapping[str, ResourceClaim],
    classes: Mapping[str, DeviceClass],
    cache: claim_cel.SelectorCache,
) -> PodClaims:
    """Raises Waiting or Refusal."""
    keys = pod_claim_keys(pod)
    if isinstance(keys, str):
        raise Waiting(keys)
    read: list[Claim] = []
    uid = (pod.get("metadata") or {}).get("uid")
    for key in keys:
        obj = claims.get(key)
        if obj is None:
            raise Waiting(f"ResourceClaim {key} does not exist yet")
        if (obj.get("metadata") or {}).get("deletionTimestamp"):
            raise Waiting(f"ResourceClaim {key} is being deleted")
        claim = read_claim(obj, classes, cache)
        if len(claim.reserved_for) >= MAX_RESERVED_FOR and not any(
            r.get("uid") == uid for r in claim.reserved_for
        ):
            raise Waiting(f"ResourceClaim {key} is reserved for {MAX_RESERVED_FOR} pods already")
        read.append(claim)
    nodes = {c.allocated_node for c in read if c.allocated_node is not None}
    if len(nodes) > 1:
        raise Refusal(
            f"the pod's claims are allocated on different nodes ({', '.join(sorted(nodes))}); "
            "no node can run it"
        )
    return PodClaims(
        tuple(read),
        node=next(iter(nodes), None),
        pending=tuple(c for c in read if c.allocated_node is None),
    )


# --- one request on one device ---------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Consumption:
    """What a request would consume of one device: every capacity, exact; and in the
    engine's units (MiB, cores, slots). ``None`` capacities: a device without consumable
    capacity, taken whole."""

    capacity: Mapping[str, Fraction] | None
    memory_mib: int
    cores: int
    slots: int


def eligible(
    request: Request,
    device: dra_pool.PoolDevice,
    cache: claim_cel.SelectorCache,
    total_memory_mib: int,
    total_cores: int,
    total_slots: int,
    *,
    whole: bool = False,
) -> Consumption | None:
    """What ``request`` consumes of ``device``, or None when the device may not serve it
    (a selector says no, a taint is not tolerated, a capacity it names is missing, or the
    rounded amount breaks the device's request policy). ``whole``: the claim takes each
    device whole (HAMi-core off), every capacity consumed to its value, whatever it asked.
    Raises CelRuntimeError naming the selector."""
    if not claim_cel.all_select(request.selectors, cache, device.key, device.view, request.written):
        return None
    if not dra_pool.tolerated(device.taints, request.tolerations):
        return None
    # The rest depends only on the request's capacities and the device's capacity shape
    # (equal for every card of a model): computed once per pair, not per card and node.
    key = (tuple(request.capacity.items()), device.capacity_shape, whole,
           total_memory_mib, total_cores, total_slots)  # fmt: skip
    try:
        return _CONSUMED[key]
    except KeyError:
        pass
    found = _consumption(request, device, total_memory_mib, total_cores, total_slots, whole)
    if len(_CONSUMED) >= _CONSUMED_LIMIT:
        _CONSUMED.clear()
    _CONSUMED[key] = found
    return found


#: (request capacities, device shape, whole, totals) -> what the request consumes.
_CONSUMED: dict[tuple[Any, ...], Consumption | None] = {}
_CONSUMED_LIMIT = 4096


def _consumption(
    request: Request,
    device: dra_pool.PoolDevice,
    total_memory_mib: int,
    total_cores: int,
    total_slots: int,
    whole: bool,
) -> Consumption | None:
    names: dict[str, Fraction] = {}
    for asked, amount in request.capacity.items():
        key = device.capacity_named(asked)
        if key is None:
            return None
        names[key] = amount
    if not device.allow_multiple:
        if names:
            return None  # capacity requests need consumable capacity
        return Consumption(None, total_memory_mib, total_cores, total_slots)
    if whole:
        everything = {key: policy.value for key, policy in device.capacity.items()}
        return Consumption(everything, total_memory_mib, total_cores, total_slots)
    consumed: dict[str, Fraction] = {}
    for key, policy in device.capacity.items():
        rounded = policy.consumed(names.get(key))
        if rounded is None or rounded > policy.value:
            return None
        consumed[key] = rounded
    memory = consumed.get(dra.MEMORY)
    cores = consumed.get(dra.CORES)
    shares = consumed.get(dra.SHARES)
    return Consumption(
        consumed,
        memory_mib=total_memory_mib if memory is None else int(-(-memory // dra.MIB)),
        cores=0 if cores is None else int(-(-cores // 1)),
        slots=1 if shares is None else int(-(-shares // 1)),
    )


def attribute_groups(
    claim: Claim, devices: Sequence[dra_pool.PoolDevice]
) -> list[dict[str, frozenset[str]]]:
    """For a claim with ``matchAttribute`` constraints: each way to satisfy them on this
    node, as request name -> the devices it may use (those whose attribute has the
    chosen value); one unrestricted entry without constraints. A device without the
    attribute satisfies no such constraint."""
    if not claim.match_attributes:
        return [{}]
    options: list[dict[str, frozenset[str]]] = [{}]
    for covered, attribute in claim.match_attributes:
        requests = covered or tuple(r.name for r in claim.requests)
        values: dict[Any, set[str]] = {}
        for device in devices:
            value = device.attribute(attribute)
            if value is not None:
                values.setdefault(value, set()).add(device.name)
        expanded: list[dict[str, frozenset[str]]] = []
        for option in options:
            for _value, names in sorted(values.items(), key=lambda kv: str(kv[0])):
                combined = dict(option)
                for request in requests:
                    previous = combined.get(request)
                    combined[request] = (
                        frozenset(names) if previous is None else previous & frozenset(names)
                    )
                expanded.append(combined)
        options = expanded
    return options
