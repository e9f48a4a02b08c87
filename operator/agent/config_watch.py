"""Following the device-config ConfigMap without a restart.

One list-then-watch on the ConfigMap (a field selector on its name, so RBAC can grant this
one object); every valid version is resolved for this node and handed to the agent. An
unreadable version is logged and the last good one stays, as the operator does; a deleted
ConfigMap keeps the last good settings too, so the agent and the operator, which also keeps
its last good config, go on agreeing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import cast

import structlog

from vgpu_operator.agent import nodeconfig
from vgpu_operator.agent.backoff import Backoff
from vgpu_operator.agent.inventory import RegistrationOptions
from vgpu_operator.agent.nodeconfig import NodeConfig
from vgpu_operator.devices.catalog import load_config_yaml
from vgpu_operator.errors import ConfigError
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.kube.watch_loop import ApiSource, Collection, WatchLoop
from vgpu_operator.wire import ConfigMap, KubeObject, WatchEventType, meta_of

log = structlog.get_logger(__name__)


class ConfigFollower:
    """Turns ConfigMap events into this node's settings (no I/O: the loop feeds it, as
    its ``KindHandler``)."""

    def __init__(
        self, node: str, key: str, flags: RegistrationOptions, apply: Callable[[NodeConfig], None]
    ) -> None:
        self.node = node
        self.key = key
        self.flags = flags
        self._apply = apply

    async def listed(self, items: Sequence[KubeObject], version: str | None) -> None:
        if not items:
            log.info("device_config_absent")
        for item in items:
            self.on_event(None, cast(ConfigMap, item))

    async def event(self, event_type: WatchEventType, obj: KubeObject) -> None:
        self.on_event(event_type, cast(ConfigMap, obj))

    def on_event(self, kind: str | None, config_map: ConfigMap) -> None:
        meta = meta_of(config_map)
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        if kind == "DELETED":
            log.warning("device_config_deleted_last_good_kept", config_map=name)
            return
        text = config_map.get("data", {}).get(self.key)
        if text is None:
            log.warning("device_config_key_missing", config_map=name, key=self.key)
            return
        try:
            config = load_config_yaml(str(text))
        except ConfigError as exc:
            log.error(
                "device_config_rejected",
                config_map=name,
                field=exc.field,
                error=exc.message,
                detail="the last good settings stay in force",
            )
            return
        self._apply(nodeconfig.resolve(config, self.node, self.flags))


async def follow(
    api: ApiClient,
    follower: ConfigFollower,
    namespace: str,
    name: str,
    stop: asyncio.Event,
    *,
    backoff_initial_s: float = 1.0,
    backoff_max_s: float = 60.0,
) -> None:
    """List, then watch, the ConfigMap until ``stop`` is set; errors are retried (the
    one list-then-watch loop, ``kube/watch_loop.py``)."""
    loop = WatchLoop(
        "device_config",
        ApiSource(api),
        Collection(
            f"/api/v1/namespaces/{namespace}/configmaps", field_selector=f"metadata.name={name}"
        ),
        follower,
        retry=Backoff(backoff_initial_s, backoff_max_s),
    )
    task = asyncio.create_task(loop.run())
    await stop.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
