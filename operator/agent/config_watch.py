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
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from vgpu_operator.agent import nodeconfig
from vgpu_operator.agent.backoff import Backoff
from vgpu_operator.agent.inventory import RegistrationOptions
from vgpu_operator.agent.nodeconfig import NodeConfig
from vgpu_operator.config import load_config_yaml
from vgpu_operator.errors import ConfigError
from vgpu_operator.kube import listing
from vgpu_operator.kube.requests import ApiClient

log = structlog.get_logger(__name__)


class ConfigFollower:
    """Turns ConfigMap events into this node's settings (no I/O: ``on_event`` is fed)."""

    def __init__(
        self, node: str, key: str, flags: RegistrationOptions, apply: Callable[[NodeConfig], None]
    ) -> None:
        self.node = node
        self.key = key
        self.flags = flags
        self._apply = apply

    def on_event(self, kind: str | None, config_map: Mapping[str, Any]) -> None:
        meta = config_map.get("metadata") or {}
        name = f"{meta.get('namespace')}/{meta.get('name')}"
        if kind == "DELETED":
            log.warning("device_config_deleted_last_good_kept", config_map=name)
            return
        text = (config_map.get("data") or {}).get(self.key)
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
    """List, then watch, the ConfigMap until ``stop`` is set; errors are retried."""
    task = asyncio.create_task(
        _follow(api, follower, namespace, name, Backoff(backoff_initial_s, backoff_max_s))
    )
    await stop.wait()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _follow(
    api: ApiClient, follower: ConfigFollower, namespace: str, name: str, backoff: Backoff
) -> None:
    path = f"/api/v1/namespaces/{namespace}/configmaps"
    selector = f"metadata.name={name}"
    version: str | None = None
    while True:
        try:
            if version is None:
                found = await listing.list_all(api, path, field_selector=selector)
                if not found.items:
                    log.info("device_config_absent", config_map=f"{namespace}/{name}")
                for item in found.items:
                    follower.on_event(None, item)
                version = found.resource_version
            async for kind, obj in listing.watch(
                api, path, resource_version=version, field_selector=selector
            ):
                follower.on_event(kind, obj)
                version = (obj.get("metadata") or {}).get("resourceVersion") or version
            backoff.reset()
        except listing.WatchExpired:
            version = None
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            delay = backoff.next_delay_s()
            log.warning(
                "device_config_watch_failed",
                config_map=f"{namespace}/{name}",
                error=str(exc),
                retry_in_s=round(delay, 3),
            )
            version = None
            await asyncio.sleep(delay)
