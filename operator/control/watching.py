"""The feed's watches: one plain list-then-watch loop per kind the engine reads.

Pods, Nodes, DeviceInventories, ResourceQuotas and PodDisruptionBudgets, cluster-wide,
and the node Leases (the agents' heartbeats) in their namespace.
Each loop lists its kind once (``StateFeed.*_listed`` reconciles the books with the
listing), then watches from the listing's resourceVersion and hands every event to the
feed as it arrives: no per-event handler pipeline, no copies of the object beyond the
feed's own slim one. A watch the server ends, or a broken connection, resumes from the
last resourceVersion seen (bookmarks keep it fresh on quiet kinds); only when the server
no longer has that version (410 Gone) is the kind listed again. So there is no periodic
full relisting: a watch resumed this way misses nothing.

The loops run on every replica, active or standby: a standby's books stay current (its
webhook answers with the quotas in force, and a failover starts from warm books).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import structlog

from vgpu_operator.control import claims_feed, feed
from vgpu_operator.kube import claims, listing
from vgpu_operator.kube.requests import ApiClient

log = structlog.get_logger("vgpu_operator.watching")

#: Waits before reconnecting after a failure (the last one repeats).
RETRY_S: Final = (0.5, 1.0, 2.0, 5.0, 10.0)
#: How often a kind the API server does not serve is looked for again.
ABSENT_RECHECK_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class WatchedKind:
    name: str
    path: str
    listed: Callable[[Iterable[Mapping[str, Any]], str | None], None]
    event: Callable[[str | None, Mapping[str, Any]], None]
    #: Whether the feed may have warnings to report after this kind changed.
    warns: bool = False


def dra_kinds_of(claim_feed: claims_feed.ClaimFeed) -> tuple[WatchedKind, ...]:
    """The DRA path's kinds: ResourceSlices, DeviceClasses and ResourceClaims (listed
    before the pods, so that a restart knows every claim's allocation first)."""
    return (
        WatchedKind(
            "slice", claims.RESOURCE_SLICES, claim_feed.slices_listed, claim_feed.slice_event
        ),
        WatchedKind(
            "deviceclass", claims.DEVICE_CLASSES, claim_feed.classes_listed, claim_feed.class_event
        ),
        WatchedKind(
            "claim", claims.RESOURCE_CLAIMS, claim_feed.claims_listed, claim_feed.claim_event
        ),
    )


def kinds_of(state_feed: feed.StateFeed) -> tuple[WatchedKind, ...]:
    return (
        WatchedKind("node", listing.NODES, state_feed.nodes_listed, state_feed.node_event, True),
        WatchedKind(
            "inventory",
            listing.DEVICE_INVENTORIES,
            state_feed.inventories_listed,
            state_feed.inventory_event,
            True,
        ),
        WatchedKind("lease", listing.NODE_LEASES, state_feed.leases_listed, state_feed.lease_event),
        WatchedKind(
            "quota", listing.RESOURCE_QUOTAS, state_feed.quotas_listed, state_feed.quota_event
        ),
        WatchedKind(
            "budget",
            listing.POD_DISRUPTION_BUDGETS,
            state_feed.budgets_listed,
            state_feed.budget_event,
        ),
        WatchedKind("pod", listing.PODS, state_feed.pods_listed, state_feed.pod_event),
    )


class FeedWatches:
    """See the module docstring. ``report_warnings`` writes what the feed found wrong
    (Events on Nodes and DeviceInventories); ``on_error`` counts a failed watch."""

    def __init__(
        self,
        api: ApiClient,
        state_feed: feed.StateFeed,
        *,
        report_warnings: Callable[[], Any],
        on_error: Callable[[str], None],
        claim_feed: claims_feed.ClaimFeed | None = None,
    ) -> None:
        self._api = api
        dra = () if claim_feed is None else dra_kinds_of(claim_feed)
        self._kinds = (*dra, *kinds_of(state_feed))
        self._report_warnings = report_warnings
        self._on_error = on_error
        self._unlisted = {kind.name for kind in self._kinds}
        #: Set once every kind has been listed (the books hold the whole cluster).
        self.listed = asyncio.Event()

    async def run(self) -> None:
        """Watch every kind forever (until cancelled)."""
        await asyncio.gather(*(self._run_kind(kind) for kind in self._kinds))

    async def _run_kind(self, kind: WatchedKind) -> None:
        version: str | None = None
        delays = iter(RETRY_S)
        while True:
            try:
                if version is None:
                    found = await listing.list_all(self._api, kind.path)
                    kind.listed(found.items, found.resource_version)
                    version = found.resource_version
                    await self._after(kind)
                    self._mark_listed(kind)
                    if version is None:
                        # Not served (a CRD not installed yet): look again later.
                        await asyncio.sleep(ABSENT_RECHECK_S)
                        continue
                async for event_type, obj in listing.watch(
                    self._api, kind.path, resource_version=version, bookmarks=True
                ):
                    version = (obj.get("metadata") or {}).get("resourceVersion") or version
                    if event_type == listing.BOOKMARK:
                        continue
                    kind.event(event_type, obj)
                    await self._after(kind)
                delays = iter(RETRY_S)
            except listing.WatchExpired:
                log.info("watch_expired_relisting", kind=kind.name)
                version = None
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                delay = next(delays, RETRY_S[-1])
                log.warning("watch_failed", kind=kind.name, error=str(exc), retry_after_s=delay)
                self._on_error(f"{kind.name}_watch")
                await asyncio.sleep(delay)

    async def _after(self, kind: WatchedKind) -> None:
        if kind.warns:
            await self._report_warnings()

    def _mark_listed(self, kind: WatchedKind) -> None:
        self._unlisted.discard(kind.name)
        if not self._unlisted:
            self.listed.set()
