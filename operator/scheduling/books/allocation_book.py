"""The books' part that keeps what bound pods' allocation annotations are believed to
say: each pod's allocation as first seen (later edits change nothing,
``allocation_trust.FirstRecords``), and why an allocation is not believed or what of
an edit was ignored, for the runtime's log."""

from __future__ import annotations

from collections.abc import Mapping

from vgpu_operator.config import DeviceConfig
from vgpu_operator.devices import codec, model
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.books import allocation_trust
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.wire import Pod

EDITED = (
    "its allocation annotations were changed after it was bound; the books keep the "
    "allocation it was bound with"
)


class Allocations:
    def __init__(self, keys: list[str]) -> None:
        self._first = allocation_trust.FirstRecords(keys)
        #: Bound pods whose allocation annotation could not be read or is not believed
        #: (``allocation_trust``), and why: they book nothing.
        self._errors: dict[PodKey, str] = {}
        #: Bound pods whose allocation annotations were edited after binding (their first
        #: allocation stays booked), and what was ignored.
        self._warnings: dict[PodKey, str] = {}

    def set_keys(self, keys: list[str]) -> None:
        """The annotations an allocation is read from changed (the config did)."""
        self._first.set_keys(keys)

    def reconsider(self) -> list[Pod]:
        """The pods to read again after ``set_keys``."""
        return list(self._first.reconsider())

    def error(self, key: PodKey) -> str | None:
        return self._errors.get(key)

    def warning(self, key: PodKey) -> str | None:
        return self._warnings.get(key)

    def clear(self, key: PodKey) -> None:
        self._errors.pop(key, None)
        self._warnings.pop(key, None)

    def forget(self, key: PodKey) -> None:
        self.clear(key)
        self._first.forget(key)

    def read(
        self,
        key: PodKey,
        uid: str,
        pod: Pod,
        vendors: Vendors,
        config: DeviceConfig,
    ) -> tuple[Mapping[str, str], dict[str, model.PodSingleDevice]]:
        """The pod's annotations as first seen, and its allocation if the books believe
        it (``allocation_trust``); else no devices, and the reason is kept (``error``)."""
        meta = pod.get("metadata") or {}
        annotations, edited = self._first.view(key, uid, meta.get("annotations") or {})
        if edited:
            self._warnings[key] = EDITED
        try:
            devices = codec.decode_pod_devices(annotations, vendors.allocated_keys())
            _check_instance_names(devices)
        except CodecError as exc:
            self._errors[key] = str(exc)
            return annotations, {}
        judged, refused = self._first.judged(key)
        if not judged:
            trusted = config.scheduler.trusted_names()
            refused = allocation_trust.refusal(pod, devices, vendors, trusted)
            self._first.judge(key, refused, pod)
        if refused is not None:
            self._errors[key] = refused
            return annotations, {}
        return annotations, devices


def _check_instance_names(devices: model.PodDevices) -> None:
    """Raise CodecError for a device id with a bracket that is not a MIG suffix
    (``GPU-a[x``): HAMi's decoder lets it through, and no card could be named by it."""
    for single in devices.values():
        for container in single:
            for device in container:
                codec.split_mig_uuid(device.uuid)
