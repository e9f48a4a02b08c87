"""What the operator watches: one ``kube.watch_loop.WatchLoop`` per kind, each with its
handler (the table below).

The device-config ConfigMap (in the operator's namespace, by name), the DRA kinds
(ResourceSlices, DeviceClasses, DeviceTaintRules, ResourceClaims), Nodes,
DeviceInventories, node Leases (the agents' heartbeats, in their namespace),
ResourceQuotas, PodDisruptionBudgets and Pods. Each event goes straight to the feed
(``feed.StateFeed``, ``claims_feed.ClaimFeed``): no per-event handler pipeline, no copies
of the object beyond the feed's own slim one.
The loop resumes a broken watch from the last resourceVersion and relists only on 410
Gone, so there is no periodic full relisting: a watch resumed so misses nothing.

The order of the table is the order of a full resync (``relist_all``, a failover): the
config first (it says which scheduler name is ours), the claims before the pods (a pod's
claims' allocations are known when the pod arrives), the pods last.

The loops run on every replica, active or standby: a standby's books stay current (its
webhook answers with the quotas in force, and a failover starts from warm books).

To watch another kind: give the feed its ``*_listed`` and ``*_event`` (or write a
``KindHandler``), and add a row to ``feed_kinds``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import structlog

from vgpu_operator.control import claims_feed, feed
from vgpu_operator.kube import claims, listing
from vgpu_operator.kube.watch_loop import Collection, KindHandler, Source, WatchLoop
from vgpu_operator.wire import KubeObject, WatchEventType

log = structlog.get_logger("vgpu_operator.watching")


#: The kind's shape (``wire``): what the loop's objects are taken to be here, where the
#: kind becomes known.
_Shape = TypeVar("_Shape", bound=Mapping[str, Any])


@dataclass(frozen=True, slots=True)
class FeedKind(Generic[_Shape]):
    """A kind the feed takes synchronously: its listing and events, then (for the kinds
    whose objects can be refused) the warnings the feed found written as Events."""

    name: str
    collection: Collection
    on_listed: Callable[[Iterable[_Shape], str | None], None]
    on_event: Callable[[str | None, _Shape], None]
    #: None for most kinds: no coroutine per event where there is nothing to await.
    after: Callable[[], Awaitable[None]] | None = None

    async def listed(self, items: Sequence[KubeObject], version: str | None) -> None:
        self.on_listed(cast(Sequence[_Shape], items), version)
        if self.after is not None:
            await self.after()

    async def event(self, event_type: WatchEventType, obj: KubeObject) -> None:
        self.on_event(event_type, cast(_Shape, obj))
        if self.after is not None:
            await self.after()


def config_collection(namespace: str, config_map: str) -> Collection:
    """The device-config ConfigMap: watched by name in its namespace (a cluster-wide
    watch would see every ConfigMap of the cluster to find one)."""
    return Collection(
        f"/api/v1/namespaces/{namespace}/configmaps", field_selector=f"metadata.name={config_map}"
    )


def dra_kinds_of(claim_feed: claims_feed.ClaimFeed) -> tuple[FeedKind[Any], ...]:
    """The DRA path's kinds: ResourceSlices, DeviceClasses, DeviceTaintRules (a cluster
    that does not serve them has none), the Namespaces labelled for adminAccess (only
    those) and ResourceClaims."""
    return (
        FeedKind(
            "slice",
            Collection(claims.RESOURCE_SLICES),
            claim_feed.slices_listed,
            claim_feed.slice_event,
        ),
        FeedKind(
            "deviceclass",
            Collection(claims.DEVICE_CLASSES),
            claim_feed.classes_listed,
            claim_feed.class_event,
        ),
        FeedKind(
            "devicetaintrule",
            Collection(claims.DEVICE_TAINT_RULES),
            claim_feed.rules_listed,
            claim_feed.rule_event,
        ),
        FeedKind(
            "adminnamespace",
            Collection(listing.NAMESPACES, label_selector=f"{claims_feed.ADMIN_ACCESS_LABEL}=true"),
            claim_feed.admin_namespaces_listed,
            claim_feed.admin_namespace_event,
        ),
        FeedKind(
            "claim",
            Collection(claims.RESOURCE_CLAIMS),
            claim_feed.claims_listed,
            claim_feed.claim_event,
        ),
    )


def kinds_of(
    state_feed: feed.StateFeed, report_warnings: Callable[[], Awaitable[None]] | None = None
) -> tuple[FeedKind[Any], ...]:
    """The annotation path's kinds, the pods last."""
    return (
        FeedKind(
            "node",
            Collection(listing.NODES),
            state_feed.nodes_listed,
            state_feed.node_event,
            report_warnings,
        ),
        FeedKind(
            "inventory",
            Collection(listing.DEVICE_INVENTORIES),
            state_feed.inventories_listed,
            state_feed.inventory_event,
            report_warnings,
        ),
        FeedKind(
            "lease",
            Collection(listing.NODE_LEASES),
            state_feed.leases_listed,
            state_feed.lease_event,
        ),
        FeedKind(
            "quota",
            Collection(listing.RESOURCE_QUOTAS),
            state_feed.quotas_listed,
            state_feed.quota_event,
        ),
        FeedKind(
            "budget",
            Collection(listing.POD_DISRUPTION_BUDGETS),
            state_feed.budgets_listed,
            state_feed.budget_event,
        ),
        FeedKind("pod", Collection(listing.PODS), state_feed.pods_listed, state_feed.pod_event),
    )


class Watches:
    """Every loop the operator runs, in resync order (see the module docstring)."""

    def __init__(
        self,
        source: Source,
        *,
        config: tuple[Collection, KindHandler],
        state_feed: feed.StateFeed,
        claim_feed: claims_feed.ClaimFeed,
        report_warnings: Callable[[], Awaitable[None]],
        on_error: Callable[[str], None],
        before_pods: Sequence[tuple[str, Collection, KindHandler]] = (),
    ) -> None:
        config_loop = WatchLoop("config", source, config[0], config[1], on_error=on_error)
        kinds = kinds_of(state_feed, report_warnings)
        # Kinds of their own handler (PodGroups): before the pods, whose groups they name.
        own = tuple(
            WatchLoop(name, source, collection, handler, on_error=on_error)
            for name, collection, handler in before_pods
        )
        self.loops: tuple[WatchLoop, ...] = (
            config_loop,
            *(
                WatchLoop(kind.name, source, kind.collection, kind, on_error=on_error)
                for kind in (*dra_kinds_of(claim_feed), *kinds[:-1])
            ),
            *own,
            WatchLoop(kinds[-1].name, source, kinds[-1].collection, kinds[-1], on_error=on_error),
        )
        self.config = config_loop

    async def run(self) -> None:
        """Run every loop until cancelled."""
        await asyncio.gather(*(loop.run() for loop in self.loops))

    async def all_listed(self) -> None:
        """Wait until every loop has handed over its first listing (the books hold the
        whole cluster)."""
        for loop in self.loops:
            await loop.listed.wait()

    async def relist_all(self) -> dict[str, int]:
        """List every kind again, in order, through the same handlers (a failover's
        resync); returns how many objects of each kind."""
        started = time.monotonic()
        counts = {loop.name: await loop.relist() for loop in self.loops}
        log.info("resync_done", **counts, duration_s=round(time.monotonic() - started, 3))
        return counts
