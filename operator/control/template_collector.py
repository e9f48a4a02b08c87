"""The ResourceClaimTemplates the webhook made, collected once no pod names them.

On the DRA path the webhook makes a template per request shape (``claim_admission``);
kube-controller-manager makes each pod its claim from it, and deletes the claim with the
pod, but nothing deletes the template. The leader looks, every ``interval_s``, at the
templates that say they are the webhook's (label, name prefix and digest annotation:
``claim_admission.made_by_webhook``), and deletes those that no pod of their namespace
names, once ``grace_s`` has passed since the later of their creation and the last pod
the webhook admitted with them (``kube/claims.LAST_ADMITTED``): a pod admitted a moment
ago may not be created yet. Each delete carries the listed uid and resourceVersion as
preconditions, so a template stamped meanwhile stays.

Bounded: one listing of our templates per round, one listing of pods per namespace that
has a candidate, at most ``max_deletes`` deletes per round (the rest wait for the next).
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

import structlog

from vgpu_operator.control.options import TemplateCollection
from vgpu_operator.kube import claims
from vgpu_operator.kube.requests import ApiClient
from vgpu_operator.scheduling.dialects.claims import claim_admission
from vgpu_operator.timestamps import parse_rfc3339
from vgpu_operator.wire import ResourceClaimTemplate, meta_of

log = structlog.get_logger("vgpu_operator.template_collector")


class TemplateStore(Protocol):
    async def list_ours(self) -> list[ResourceClaimTemplate]: ...
    async def names_in_use(self, namespace: str) -> set[str]: ...
    async def delete(self, template: ResourceClaimTemplate) -> bool: ...


class ApiTemplateStore:
    """``TemplateStore`` over the API (``kube/claims``)."""

    def __init__(self, api: ApiClient) -> None:
        self._api = api

    async def list_ours(self) -> list[ResourceClaimTemplate]:
        return await claims.list_webhook_templates(self._api)

    async def names_in_use(self, namespace: str) -> set[str]:
        return await claims.templates_named_by_pods(self._api, namespace)

    async def delete(self, template: ResourceClaimTemplate) -> bool:
        return await claims.delete_template(self._api, template)


def last_used(template: ResourceClaimTemplate) -> datetime.datetime | None:
    """The later of the template's creation and the webhook's last admission with it."""
    meta = meta_of(template)
    times = [
        parse_rfc3339(meta.get("creationTimestamp")),
        parse_rfc3339((meta.get("annotations") or {}).get(claims.LAST_ADMITTED)),
    ]
    known = [t for t in times if t is not None]
    return max(known) if known else None


def past_grace(
    templates: Iterable[ResourceClaimTemplate], now: datetime.datetime, grace_s: float
) -> list[ResourceClaimTemplate]:
    """The webhook's templates whose grace has passed (not yet asked whether in use); a
    template whose times cannot be read is kept."""
    out = []
    for template in templates:
        if not claim_admission.made_by_webhook(template):
            continue
        if meta_of(template).get("deletionTimestamp"):
            continue
        used = last_used(template)
        if used is not None and (now - used).total_seconds() >= grace_s:
            out.append(template)
    return out


class TemplateCollector:
    """See the module docstring; ``run`` loops, ``collect_once`` is one round."""

    def __init__(
        self,
        store: TemplateStore,
        options: TemplateCollection,
        *,
        clock: Callable[[], datetime.datetime] | None = None,
    ) -> None:
        self._store = store
        self._options = options
        self._clock = clock or (lambda: datetime.datetime.now(datetime.UTC))

    async def collect_once(self) -> list[str]:
        """One round; the ``namespace/name`` of each template deleted."""
        candidates = past_grace(await self._store.list_ours(), self._clock(), self._options.grace_s)
        by_namespace: dict[str, list[ResourceClaimTemplate]] = {}
        for template in candidates:
            namespace = str(meta_of(template).get("namespace") or "")
            by_namespace.setdefault(namespace, []).append(template)
        deleted: list[str] = []
        for namespace, templates in sorted(by_namespace.items()):
            if len(deleted) >= self._options.max_deletes:
                break
            in_use = await self._store.names_in_use(namespace)
            for template in templates:
                if len(deleted) >= self._options.max_deletes:
                    break
                name = str(meta_of(template).get("name"))
                if name in in_use:
                    continue
                if await self._store.delete(template):
                    deleted.append(f"{namespace}/{name}")
        if deleted:
            log.info("claim_templates_collected", templates=deleted)
        return deleted

    async def run(
        self,
        decides: Callable[[], bool],
        on_error: Callable[[], None] = lambda: None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Forever: a round every ``interval_s`` while ``decides()`` (the leader)."""
        while True:
            await sleep(self._options.interval_s)
            if not decides():
                continue
            try:
                await self.collect_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("claim_template_collection_failed", error=str(exc))
                on_error()
