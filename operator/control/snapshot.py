"""The cluster read once, as the operator reads it, for one-off commands.

``read_cluster`` lists the device-config ConfigMap, then every kind the operator watches
(``watching.kinds_of``: Nodes, DeviceInventories, node Leases, ResourceQuotas,
PodDisruptionBudgets, Pods) and hands each listing to a ``StateFeed`` over a fresh
``ClusterState``, exactly as the operator's own listings are handed over: the same
checks (a refused inventory, an unreadable annotation) give the same books; and the
PodGroups, through the operator's store (how defragmentation may move their members),
where the API serves them and the identity may list them (else their members are read
as of a PodGroup not read, which no plan moves). It only reads (get and list).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from vgpu_operator import config as device_config
from vgpu_operator.control import feed, gang_runtime, queue, watching
from vgpu_operator.kube import listing, pod_groups
from vgpu_operator.kube.requests import ApiClient, ApiError
from vgpu_operator.scheduling.cycle.cluster import ClusterState
from vgpu_operator.wire import ConfigMap, Pod


class SnapshotError(Exception):
    """The cluster could not be read as the operator reads it."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    state: ClusterState
    feed: feed.StateFeed
    #: Every pod listed (the running pods' owners and specs; the waiting pods).
    pods: list[Pod]

    def waiting(self) -> list[Pod]:
        """Pods waiting for the operator's scheduler name."""
        return self.feed.waiting_for(self.feed.scheduler_name)


async def read_cluster(
    api: ApiClient,
    *,
    namespace: str,
    config_map: str,
    config_key: str = feed.DEFAULT_CONFIG_KEY,
    inventory_timeout_s: float | None = 120.0,
) -> Snapshot:
    """Raises ``SnapshotError`` when the device config cannot be read or is refused:
    books with another configuration would not be the operator's."""
    state = ClusterState(device_config.DeviceConfig(), inventory_timeout_s=inventory_timeout_s)
    state_feed = feed.StateFeed(
        state,
        queue.SchedulingQueue(),
        config_key=config_key,
        inventory_timeout_s=inventory_timeout_s,
    )
    config = watching.config_collection(namespace, config_map)
    found = await listing.list_all(api, config.path, field_selector=config.field_selector)
    for item in found.items:
        result = state_feed.config_event(None, cast(ConfigMap, item))
        if result.outcome is feed.ConfigOutcome.REJECTED and result.error is not None:
            raise SnapshotError(
                f"the device config {namespace}/{config_map} is refused "
                f"({result.error.field}: {result.error.message})"
            )
    pods: list[Pod] = []
    for kind in watching.kinds_of(state_feed):
        listed = await listing.list_all(api, kind.collection.path)
        kind.on_listed(listed.items, listed.resource_version)
        if kind.name == "pod":
            pods = cast(list[Pod], listed.items)
    try:
        groups = await listing.list_all(api, pod_groups.POD_GROUPS)
    except ApiError as exc:
        if exc.status not in (403, 404):
            raise
    else:
        store = gang_runtime.PodGroupStore(books=state.books)
        await store.listed(groups.items, groups.resource_version)
    return Snapshot(state, state_feed, pods)
