"""The webhook's ResourceClaimTemplates collected once no pod names them
(``template_collector``, issue 33 item 6)."""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Mapping
from typing import Any

from vgpu_operator.config import DeviceConfig
from vgpu_operator.control.options import TemplateCollection
from vgpu_operator.control.template_collector import TemplateCollector
from vgpu_operator.devices.catalog import VENDOR_TABLE
from vgpu_operator.kube import claims
from vgpu_operator.scheduling.dialects.claims import claim_admission
from vgpu_operator.scheduling.vendors import Vendors
from vgpu_operator.timestamps import format_rfc3339

NOW = datetime.datetime(2026, 11, 28, 12, 0, tzinfo=datetime.UTC)
VENDORS = Vendors(DeviceConfig(), VENDOR_TABLE)


def made(namespace: str, memory: int, *, age_s: float, stamped_s: float | None = None) -> Any:
    pod = {
        "metadata": {"name": "p", "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpumem": memory}},
                }
            ]
        },
    }
    converted = claim_admission.convert(pod, VENDORS)
    assert converted is not None
    [template] = converted.templates
    meta = template["metadata"]
    meta["uid"] = f"uid-{namespace}-{memory}"
    meta["resourceVersion"] = "1"
    meta["creationTimestamp"] = format_rfc3339(NOW - datetime.timedelta(seconds=age_s))
    if stamped_s is not None:
        stamp = format_rfc3339(NOW - datetime.timedelta(seconds=stamped_s))
        meta["annotations"][claims.LAST_ADMITTED] = stamp
    return template


class FakeStore:
    def __init__(self, templates: list[dict[str, Any]], in_use: dict[str, set[str]]) -> None:
        self.templates = templates
        self.in_use = in_use
        self.deleted: list[str] = []
        self.pod_listings: list[str] = []

    async def list_ours(self) -> list[dict[str, Any]]:
        return list(self.templates)

    async def names_in_use(self, namespace: str) -> set[str]:
        self.pod_listings.append(namespace)
        return self.in_use.get(namespace, set())

    async def delete(self, template: Mapping[str, Any]) -> bool:
        self.deleted.append(template["metadata"]["name"])
        return True


def name(template: Mapping[str, Any]) -> str:
    return str(template["metadata"]["name"])


def collect(store: FakeStore, **options: Any) -> list[str]:
    collector = TemplateCollector(store, TemplateCollection(**options), clock=lambda: NOW)
    return asyncio.run(collector.collect_once())


def test_unnamed_templates_past_their_grace_go_and_the_others_stay() -> None:
    old_unused = made("a", 100, age_s=3600)
    old_used = made("a", 200, age_s=3600)
    young = made("a", 300, age_s=10)
    recently_admitted = made("a", 400, age_s=3600, stamped_s=30)
    store = FakeStore([old_unused, old_used, young, recently_admitted], {"a": {name(old_used)}})
    assert collect(store, grace_s=600) == [f"a/{name(old_unused)}"]
    assert store.deleted == [name(old_unused)]


def test_templates_the_webhook_did_not_make_are_never_deleted() -> None:
    ours = made("a", 100, age_s=3600)
    foreign = made("a", 200, age_s=3600)
    foreign["metadata"]["annotations"].pop(claim_admission.DIGEST_ANNOTATION)
    renamed = made("a", 300, age_s=3600)
    renamed["metadata"]["name"] = "vgpu-user-made"
    store = FakeStore([ours, foreign, renamed], {})
    collect(store)
    assert store.deleted == [name(ours)]


def test_a_round_is_bounded() -> None:
    templates = [made(ns, m, age_s=3600) for ns in ("a", "b", "c") for m in (1, 2)]
    store = FakeStore(templates, {})
    assert len(collect(store, max_deletes=3)) == 3
    assert store.pod_listings == ["a", "b"]  # no namespace listed past the bound
    # Nothing to collect: no pod listing at all.
    idle = FakeStore([made("a", 1, age_s=5)], {})
    assert collect(idle) == []
    assert idle.pod_listings == []
