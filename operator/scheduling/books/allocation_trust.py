"""Which allocation annotations the books believe (docs/operations.md, "Security").

A bound pod's ``hami.io`` allocation annotations say which shares of which cards it
holds. The admission policies of ``manifests/`` keep them to the operator (its Binding)
and the node agent (the bind phase); the books do not rest on that alone, since a
cluster may lack the policies or a writer may be careless. They book a pod's allocation
only when:

- the pod names a scheduler they trust (this one, or one an administrator opted in with
  ``scheduler.trustedSchedulerNames``): a pod placed by anyone else, or bound by its own
  creator, holds nothing here whatever its annotations say;
- every container's devices are within what it asks for, read with the same admission
  defaults the decision used: exactly its device count, and no more memory or cores than
  it writes itself (MIG instances are whole instances: only the count is checked);
- and it is the pod's first allocation (``FirstRecords``): an edit of the annotations
  after the pod was bound changes nothing in the books. An allocation once believed
  stays believed: a later change of the config (a renamed scheduler) does not take a
  running pod's share out of the books; a refused one is judged again under a new
  config (which may have arrived after the pod).

Pure: plain dicts in, a refusal (a sentence for the log) or None out.
"""

from __future__ import annotations

import copy
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from vgpu_operator import names
from vgpu_operator.devices import codec, model, vendor
from vgpu_operator.errors import CodecError
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.wire import Container, Pod


def scheduler_of(pod: Pod) -> str:
    return str((pod.get("spec") or {}).get("schedulerName") or names.DEFAULT_SCHEDULER)


def refusal(
    pod: Pod,
    devices: model.PodDevices,
    vendors: Vendors,
    trusted_schedulers: Collection[str],
) -> str | None:
    """Why the books must not book ``devices`` (the pod's decoded allocation), or None."""
    if not any(any(single) for single in devices.values()):
        return None
    scheduler = scheduler_of(pod)
    if scheduler not in trusted_schedulers:
        return (
            f"it was placed by {scheduler!r}, not by a scheduler this operator trusts "
            f"({', '.join(sorted(trusted_schedulers))}); its allocation annotations are not booked"
        )
    containers = _admitted_containers(pod, vendors)
    if isinstance(containers, str):
        return containers
    has_mig_record = bool(
        ((pod.get("metadata") or {}).get("annotations") or {}).get(names.MIG_ALLOCATIONS)
    )
    for word, single in devices.items():
        problem = _beyond_request(word, single, containers, vendors, has_mig_record)
        if problem is not None:
            return f"{problem}; its allocation annotations are not booked"
    return None


def _admitted_containers(pod: Pod, vendors: Vendors) -> list[Container] | str:
    """The pod's containers (init containers first) with the admission defaults filled in,
    as the decision read them (the webhook may not have run: a pod can name this scheduler
    itself)."""
    mutated: dict[str, Any] = copy.deepcopy(dict(pod))
    spec = mutated.setdefault("spec", {})
    containers = [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
    for container in containers:
        for spec_ in vendors.specs():
            try:
                vendors.mutate(spec_.common_word, container, mutated)
            except ValueError as exc:
                return f"its request cannot be read ({exc})"
    return cast(list[Container], containers)  # the working copy, defaults written in


def _beyond_request(
    word: str,
    single: model.PodSingleDevice,
    containers: list[Container],
    vendors: Vendors,
    has_mig_record: bool,
) -> str | None:
    """Memory and cores are checked against what a container writes itself: a value
    that comes from a default (which an administrator may change while pods run) is
    not held against the pods bound under the old one."""
    if len(single) > len(containers):
        return f"its allocation names {len(single)} containers, the pod has {len(containers)}"
    resource_names = vendor.resource_names(vendors.config_for(word))
    for container, entry in zip(containers, single, strict=False):
        if not entry:
            continue
        name = container.get("name", "")
        try:
            request = vendors.requests(container).get(word)
        except CodecError as exc:
            return f"container {name!r}: its request cannot be read ({exc})"
        if request is None:
            return f"container {name!r} holds {word} devices but asks for none"
        if len(entry) != request.count:
            return f"container {name!r} holds {len(entry)} {word} devices, asks for {request.count}"
        memory = request.memory_mib if vendor.has_resource(container, resource_names.memory) else 0
        cores = request.cores if vendor.has_resource(container, resource_names.cores) else None
        for device in entry:
            if has_mig_record or _is_mig_instance(device.uuid):
                continue  # a MIG instance has its own fixed size
            if memory and device.memory_mib > memory:
                return (
                    f"container {name!r} holds {device.memory_mib} MiB of {device.uuid}, "
                    f"asks for {memory}"
                )
            if cores is not None and device.cores > max(cores, 0):
                return (
                    f"container {name!r} holds {device.cores} % of {device.uuid}'s cores, "
                    f"asks for {cores}"
                )
    return None


def _is_mig_instance(uuid: str) -> bool:
    try:
        return codec.split_mig_uuid(uuid)[1] is not None
    except CodecError:
        return True  # unreadable: the decoder refused it before; never check it here


@dataclass(slots=True)
class _Record:
    uid: str
    values: tuple[tuple[str, str], ...]
    #: The books' verdict on this allocation (``refusal``), once made. An allocation
    #: believed stays believed when the config changes (a renamed scheduler's running
    #: pods keep their shares until they end); a refusal is reconsidered (the config may
    #: have arrived after the pod: ``reconsider``), so the refused pod is kept.
    verdict: str | None = None
    judged: bool = False
    refused_pod: Pod | None = None


class FirstRecords:
    """Each bound pod's allocation annotations as the books first saw them bound, and
    the verdict on them.

    The books read a pod's allocation from this record, not from its current
    annotations: an allocation is written once, with the Binding, and nothing after
    that may change what the pod holds (only the bind phase moves on, and the pod's end
    releases it). ``view`` says when the pod's annotations differ from the record.
    """

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = tuple(dict.fromkeys(keys))
        self._records: dict[PodKey, _Record] = {}

    def set_keys(self, keys: Iterable[str]) -> None:
        """The record's keys changed (a config with other vendors' keys): start over."""
        wanted = tuple(dict.fromkeys(keys))
        if wanted != self._keys:
            self._keys = wanted
            self._records.clear()

    def view(
        self, key: PodKey, uid: str, annotations: Mapping[str, str]
    ) -> tuple[Mapping[str, str], bool]:
        """``annotations`` with the record's keys as first seen for this pod (recorded now
        when this is the first sighting of ``uid`` bound), and whether they were edited."""
        current = tuple((k, str(annotations[k])) for k in self._keys if k in annotations)
        recorded = self._records.get(key)
        if recorded is None or recorded.uid != uid:
            self._records[key] = _Record(uid, current)
            return annotations, False
        if recorded.values == current:
            return annotations, False
        view = {k: v for k, v in annotations.items() if k not in self._keys}
        view.update(recorded.values)
        return view, True

    def judged(self, key: PodKey) -> tuple[bool, str | None]:
        """Whether the pod's allocation was judged, and the verdict (a refusal or None)."""
        recorded = self._records.get(key)
        if recorded is None or not recorded.judged:
            return False, None
        return True, recorded.verdict

    def judge(self, key: PodKey, verdict: str | None, pod: Pod) -> None:
        recorded = self._records.get(key)
        if recorded is not None:
            recorded.verdict = verdict
            recorded.judged = True
            recorded.refused_pod = pod if verdict is not None else None

    def reconsider(self) -> list[Pod]:
        """The refused pods, their verdicts cleared, to be judged again (by a new config)."""
        pods = []
        for recorded in self._records.values():
            if recorded.refused_pod is not None:
                pods.append(recorded.refused_pod)
                recorded.judged = False
                recorded.verdict = None
                recorded.refused_pod = None
        return pods

    def forget(self, key: PodKey) -> None:
        self._records.pop(key, None)

    def __len__(self) -> int:
        return len(self._records)
