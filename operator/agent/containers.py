"""Which container on this node holds which card: the rows of the agent's
``vgpu_agent_container_device_info`` series.

DCGM exporter labels a card's figures with one pod at most, and with none when several
pods share the card; these rows let a query join its per-card series (on the card's UUID)
to every container that holds a share of it. They come from the pods bound to this node:
a container's cards are its entry of the scheduler's allocation
(``hami.io/vgpu-devices-allocated``, init containers first), once the device plugin has
handed that entry out (its entry to allocate is empty). A MIG instance counts as its card.
Finished pods and init containers that run to completion hold nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from vgpu_operator import names
from vgpu_operator.devices import codec, model, nvidia
from vgpu_operator.errors import CodecError
from vgpu_operator.wire import Pod, meta_of


@dataclass(frozen=True, slots=True, order=True)
class ContainerCard:
    """One container holding (a share of) one card."""

    namespace: str
    pod: str
    container: str
    uuid: str


def _entries(annotations: Mapping[str, str], key: str) -> model.PodSingleDevice | None:
    raw = annotations.get(key)
    if not raw:
        return None
    try:
        return codec.decode_pod_single_device(raw, key)
    except CodecError:
        return None


def _card(uuid: str) -> str | None:
    try:
        return codec.split_mig_uuid(uuid, nvidia.ALLOCATED_ANNOTATION)[0]
    except CodecError:
        return None


def _holds_after_start(position: int, inits: list[Any]) -> bool:
    """Whether the container at ``position`` (init containers first) keeps running: an
    app container, or a restartable init container (a sidecar)."""
    if position >= len(inits):
        return True
    init = inits[position]
    return isinstance(init, Mapping) and init.get("restartPolicy") == "Always"


def container_cards(pods: Iterable[Pod], node: str) -> set[ContainerCard]:
    """Every container of a pod bound to ``node`` and its cards, as handed out."""
    rows: set[ContainerCard] = set()
    for pod in pods:
        meta = meta_of(pod)
        spec = pod.get("spec") or {}
        if (
            spec.get("nodeName") != node
            or (pod.get("status") or {}).get("phase") in names.TERMINAL_PHASES
        ):
            continue
        annotations = meta.get("annotations") or {}
        allocated = _entries(annotations, nvidia.ALLOCATED_ANNOTATION)
        if not allocated:
            continue
        to_allocate = _entries(annotations, nvidia.TO_ALLOCATE_ANNOTATION) or ()
        inits = list(spec.get("initContainers") or [])
        containers = [*inits, *(spec.get("containers") or [])]
        for position, (container, entry) in enumerate(zip(containers, allocated, strict=False)):
            if not entry or not _holds_after_start(position, inits):
                continue
            if position < len(to_allocate) and to_allocate[position]:
                continue  # not handed out yet
            name = str(container.get("name", "")) if isinstance(container, Mapping) else ""
            for device in entry:
                card = _card(device.uuid)
                if card is not None:
                    rows.add(
                        ContainerCard(
                            str(meta.get("namespace", "")), str(meta.get("name", "")), name, card
                        )
                    )
    return rows
