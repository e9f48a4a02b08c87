"""Publishing the node's cards as its ResourceSlice pool, on every change of what it reports.

The agent tells the publisher each status it writes into the DeviceInventory; the
publisher turns it into the pool's one slice and writes it when the devices changed, with
the pool's generation one higher than any slice of the pool the server holds (the
allocator trusts only the newest generation of a pool). A failed write is retried with
backoff; the latest status is what lands. Every ``check_interval_s`` the server's copy is
read back: kubelet deletes a node's slices when it starts (no driver is registered then),
and a slice deleted or changed by anyone else is written again, one generation higher.

The slice is owned by the node's DeviceInventory, itself owned by the Node: deleting the
node, or uninstalling (the CRD and with it every inventory), removes the slices through
the garbage collector; kubelet also wipes a driver's slices when its plugin stays
unregistered, which is what happens when the agent's DaemonSet goes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Protocol

import structlog

from vgpu_operator import dra_shapes as shapes
from vgpu_operator import resources
from vgpu_operator.agent.backoff import Backoff, wait_or_stop
from vgpu_operator.agent.dra import mig_prepare
from vgpu_operator.devices import dra, dra_mig
from vgpu_operator.wire import OwnerReference, ResourceSlice

log = structlog.get_logger("vgpu_operator.dra")


class SliceStore(Protocol):
    """The API calls of the publisher (``kube.resource_slices`` and the inventory)."""

    async def list_slices(self, driver: str, node: str) -> list[ResourceSlice]: ...

    async def put_slice(self, wanted: ResourceSlice) -> None: ...

    async def delete_slice(self, name: str) -> None: ...

    async def owner(self, node: str) -> OwnerReference | None:
        """The ownerReference the node's slices carry (its DeviceInventory), or None."""
        ...


class SlicePublisher:
    """Keeps ``node``'s pool equal to the last status reported."""

    def __init__(
        self,
        node: str,
        store: SliceStore,
        defaults: shapes.RequestDefaults,
        *,
        pcie_root: Callable[[str], str | None] = lambda bus_id: None,
        backoff_initial_s: float = 1.0,
        backoff_max_s: float = 60.0,
        check_interval_s: float = 30.0,
        own_instances: Callable[[], Collection[str]] = frozenset,
    ) -> None:
        self.node = node
        #: The UUIDs of the MIG instances this driver made for claims (CDI records).
        self._own_instances = own_instances
        self.store = store
        self.defaults = defaults
        self._pcie_root = pcie_root
        self._status: resources.DeviceInventoryStatus | None = None
        self._cards: list[dra.CardShape] = []
        self._mig_cards: list[dra_mig.MigCardShape] = []
        self._published: list[_Content] | None = None
        self._generation: int | None = None
        self._wake = asyncio.Event()
        self._backoff = Backoff(backoff_initial_s, backoff_max_s)
        self.check_interval_s = check_interval_s
        #: Slices written so far.
        self.writes = 0

    @property
    def generation(self) -> int | None:
        """The pool generation last written."""
        return self._generation

    def cards(self) -> Mapping[str, dra.CardShape]:
        """Device name -> card, as last published (what Prepare checks claims against)."""
        return shapes.by_name(self._cards)

    def mig_placements(self) -> Mapping[str, mig_prepare.Placement]:
        """MIG device name -> its card, profile and start, as last published."""
        return mig_prepare.placements(self._mig_cards)

    def set_status(self, status: resources.DeviceInventoryStatus) -> None:
        """A status the agent wrote: published at once if its cards changed."""
        self._status = status
        self._rebuild()

    def refresh(self) -> None:
        """The driver's own MIG instances changed (a claim's were made): published again
        with the counters they leave."""
        self._rebuild()

    def set_defaults(self, defaults: shapes.RequestDefaults) -> None:
        if defaults != self.defaults:
            self.defaults = defaults
            self._rebuild()

    def _rebuild(self) -> None:
        if self._status is None:
            return
        devices, own = self._status.devices, self._own_instances()
        self._cards = shapes.card_shapes(devices, self.defaults, self._pcie_root)
        self._mig_cards = shapes.mig_card_shapes(devices, own)
        for device in devices:
            for instance in shapes.unreadable_instances(device.mig_instances, own):
                log.warning("mig_instance_placement_unknown", instance=instance)
        self._wake.set()

    async def run(self, stop: asyncio.Event) -> None:
        stopper = asyncio.create_task(self._wake_on(stop))
        try:
            while not stop.is_set():
                woken = True
                try:
                    await asyncio.wait_for(self._wake.wait(), timeout=self.check_interval_s)
                except TimeoutError:
                    woken = False
                self._wake.clear()
                if stop.is_set():
                    return
                try:
                    if not woken:
                        await self.check_server_copy()
                    await self.publish()
                except Exception as exc:
                    delay = self._backoff.next_delay_s()
                    log.warning(
                        "resource_slice_write_failed",
                        node=self.node,
                        error=str(exc),
                        retry_in_s=round(delay, 3),
                    )
                    await wait_or_stop(stop, delay)
                    self._wake.set()
                else:
                    self._backoff.reset()
        finally:
            stopper.cancel()

    async def _wake_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._wake.set()

    async def check_server_copy(self) -> None:
        """Forget what was written when the server no longer holds it as written (the
        next ``publish`` then writes it again, above the server's generation)."""
        if self._generation is None or self._published is None:
            return
        existing = await self.store.list_slices(dra.DRIVER, self.node)
        wanted = {name for name, _ in self._published}
        held_by_name = {
            str(s["metadata"]["name"]): int(s["spec"]["pool"].get("generation", 0))
            for s in existing
        }
        held = held_by_name.get(dra.slice_name(self.node))
        if any(held_by_name.get(name) != self._generation for name in wanted):
            log.warning(
                "resource_slice_gone" if held is None else "resource_slice_overwritten",
                node=self.node,
                generation=self._generation,
                server_generation=held,
            )
            self._published = None
            self._generation = max(
                [self._generation] + [int(s["spec"]["pool"].get("generation", 0)) for s in existing]
            )

    async def publish(self) -> bool:
        """Write the pool if its devices differ from what was last written; True if it
        wrote. Raises whatever the API raised. Nothing is written before the agent's first
        status: an empty pool would say the node has no cards."""
        if self._status is None:
            return False
        wanted = _contents(dra_mig.pool_slices(self.node, self._cards, self._mig_cards, 0, None))
        if self._generation is None:
            existing = await self.store.list_slices(dra.DRIVER, self.node)
            self._generation = max(
                (int(s["spec"]["pool"].get("generation", 0)) for s in existing), default=0
            )
            names = {name for name, _ in wanted}
            for stale in existing:
                name = str(stale["metadata"]["name"])
                if name not in names:
                    await self.store.delete_slice(name)
            held = [s for s in existing if s["metadata"]["name"] in names]
            generations = {int(s["spec"]["pool"].get("generation", 0)) for s in held}
            if len(generations) == 1 and sorted(_contents(held)) == sorted(wanted):
                self._published = wanted
                return False
        if self._published is not None and sorted(self._published) == sorted(wanted):
            return False
        owner = await self.store.owner(self.node)
        generation = self._generation + 1
        slices = dra_mig.pool_slices(self.node, self._cards, self._mig_cards, generation, owner)
        for slice_ in slices:
            await self.store.put_slice(slice_)
        if self._published is not None:
            gone = {n for n, _ in self._published} - {n for n, _ in wanted}
            for name in sorted(gone):
                await self.store.delete_slice(name)
        self._generation = generation
        self._published = wanted
        self.writes += 1
        log.info(
            "resource_slice_published",
            node=self.node,
            devices=len(self._cards),
            mig_cards=len(self._mig_cards),
            tainted=sum(1 for card in self._cards if not card.healthy),
            generation=generation,
        )
        return True


#: One slice as compared with the server's: its name and its devices and counter sets.
_Content = tuple[str, str]


def _contents(slices: Sequence[ResourceSlice]) -> list[_Content]:
    """What a write would change, per slice (JSON: dicts compare as text, in key order)."""
    out = []
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        body = {
            "devices": spec.get("devices") or [],
            "sharedCounters": spec.get("sharedCounters") or [],
            "resourceSliceCount": (spec.get("pool") or {}).get("resourceSliceCount", 1),
        }
        out.append((str(slice_["metadata"]["name"]), json.dumps(body, sort_keys=True)))
    return out
