"""The DRA shapes (``resource.k8s.io/v1``): claims, their templates, slices, device
classes and device taint rules; the fields the engine and the agent read and write."""

from __future__ import annotations

from typing import Any, TypedDict

from vgpu_operator.wire.core import KubeObject, NodeSelector, ObjectMeta, Taint, Toleration


class DeviceRequestAllocationResult(TypedDict, total=False):
    request: str
    driver: str
    pool: str
    device: str
    adminAccess: bool
    consumedCapacity: dict[str, str]
    shareID: str
    tolerations: list[Toleration]


class DeviceAllocationConfiguration(TypedDict, total=False):
    source: str
    requests: list[str]
    opaque: OpaqueDeviceConfiguration


class DeviceAllocation(TypedDict, total=False):
    results: list[DeviceRequestAllocationResult]
    config: list[DeviceAllocationConfiguration]


class AllocationResult(TypedDict, total=False):
    devices: DeviceAllocation
    nodeSelector: NodeSelector
    allocationTimestamp: str


class ResourceClaimConsumer(TypedDict, total=False):
    apiGroup: str
    resource: str
    name: str
    uid: str


class ResourceClaimStatus(TypedDict, total=False):
    allocation: AllocationResult
    reservedFor: list[ResourceClaimConsumer]


class CELDeviceSelector(TypedDict, total=False):
    expression: str


class DeviceSelector(TypedDict, total=False):
    cel: CELDeviceSelector


class CapacityRequirements(TypedDict, total=False):
    #: Quantities by capacity name.
    requests: dict[str, str]


#: A request's toleration of device taints: the fields of a pod's.
DeviceToleration = Toleration


class ExactDeviceRequest(TypedDict, total=False):
    deviceClassName: str
    selectors: list[DeviceSelector]
    allocationMode: str
    count: int
    adminAccess: bool
    tolerations: list[DeviceToleration]
    capacity: CapacityRequirements


class DeviceSubRequest(ExactDeviceRequest, total=False):
    """One alternative of a ``firstAvailable`` request."""

    name: str


class DeviceRequest(TypedDict, total=False):
    name: str
    exactly: ExactDeviceRequest
    firstAvailable: list[DeviceSubRequest]


class DeviceConstraint(TypedDict, total=False):
    requests: list[str]
    matchAttribute: str
    distinctAttribute: str


class OpaqueDeviceConfiguration(TypedDict, total=False):
    driver: str
    #: The driver's own parameters: any JSON, read by the driver (``claim_configs``).
    parameters: dict[str, Any]


class DeviceClaimConfiguration(TypedDict, total=False):
    requests: list[str]
    opaque: OpaqueDeviceConfiguration


class DeviceClaim(TypedDict, total=False):
    requests: list[DeviceRequest]
    constraints: list[DeviceConstraint]
    config: list[DeviceClaimConfiguration]


class ResourceClaimSpec(TypedDict, total=False):
    devices: DeviceClaim


class ResourceClaim(KubeObject, total=False):
    spec: ResourceClaimSpec
    status: ResourceClaimStatus


class ResourceClaimTemplateSpec(TypedDict, total=False):
    metadata: ObjectMeta
    spec: ResourceClaimSpec


class ResourceClaimTemplate(KubeObject, total=False):
    spec: ResourceClaimTemplateSpec


class ResourcePool(TypedDict, total=False):
    name: str
    generation: int
    resourceSliceCount: int


class DeviceAttribute(TypedDict, total=False):
    """Exactly one of the four is set."""

    int: int
    bool: bool
    string: str
    version: str


class CapacityValidRange(TypedDict, total=False):
    min: str
    max: str
    step: str


class CapacityRequestPolicy(TypedDict, total=False):
    default: str
    validValues: list[str]
    validRange: CapacityValidRange


class DeviceCapacity(TypedDict, total=False):
    value: str
    requestPolicy: CapacityRequestPolicy


#: A device's taint: the fields of a node's.
DeviceTaint = Taint


class Counter(TypedDict, total=False):
    value: str


class DeviceCounterConsumption(TypedDict, total=False):
    counterSet: str
    counters: dict[str, Counter]


class CounterSet(TypedDict, total=False):
    name: str
    counters: dict[str, Counter]


class SliceDevice(TypedDict, total=False):
    name: str
    attributes: dict[str, DeviceAttribute]
    capacity: dict[str, DeviceCapacity]
    allowMultipleAllocations: bool
    taints: list[DeviceTaint]
    consumesCounters: list[DeviceCounterConsumption]


class ResourceSliceSpec(TypedDict, total=False):
    driver: str
    nodeName: str
    pool: ResourcePool
    devices: list[SliceDevice]
    sharedCounters: list[CounterSet]


class ResourceSlice(KubeObject, total=False):
    spec: ResourceSliceSpec


class DeviceClassConfiguration(TypedDict, total=False):
    opaque: OpaqueDeviceConfiguration


class DeviceClassSpec(TypedDict, total=False):
    selectors: list[DeviceSelector]
    config: list[DeviceClassConfiguration]
    extendedResourceName: str


class DeviceClass(KubeObject, total=False):
    spec: DeviceClassSpec


class DeviceTaintSelector(TypedDict, total=False):
    deviceClassName: str
    driver: str
    pool: str
    device: str


class DeviceTaintRuleSpec(TypedDict, total=False):
    deviceSelector: DeviceTaintSelector
    taint: DeviceTaint


class DeviceTaintRule(KubeObject, total=False):
    spec: DeviceTaintRuleSpec
