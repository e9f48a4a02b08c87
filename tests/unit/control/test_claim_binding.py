"""Writing a DRA pod's claims before its Binding (``claim_binding``): conflicts give the
decision up, and while another allocator is active an over-commit found after the
settle wait releases what was written."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from vgpu_operator.control.claim_binding import ClaimBinding
from vgpu_operator.kube.claims import WriteOutcome
from vgpu_operator.scheduling.claim_decision import ClaimWrite

ALLOCATION = {"devices": {"results": [{"device": "gpu-a"}]}}


class Books:
    def __init__(self, over: list[str]) -> None:
        self.over = over
        self.claims = {"ns/c": {"metadata": {"uid": "u", "resourceVersion": "7"}}}

    def claim_object(self, key: str) -> Mapping[str, Any] | None:
        return self.claims.get(key)

    def over_committed(self, node: str, devices: Sequence[str]) -> list[str]:
        return [d for d in devices if d in self.over]


class Writer:
    def __init__(self, outcome: WriteOutcome = WriteOutcome.WRITTEN) -> None:
        self.outcome = outcome
        self.released: list[tuple[str, bool]] = []

    async def allocate(
        self, claim: Mapping[str, Any], allocation: Mapping[str, Any] | None, consumer: Any
    ) -> WriteOutcome:
        return self.outcome

    async def release(self, namespace: str, name: str, consumer_uid: str, deallocate: bool) -> None:
        self.released.append((f"{namespace}/{name}", deallocate))


def write(version: str = "7") -> ClaimWrite:
    return ClaimWrite("ns", "c", "u", version, ALLOCATION, {"uid": "pod"})


def run(binding: ClaimBinding, writes: list[ClaimWrite]) -> str | None:
    return asyncio.run(binding.reserve("ns/p", "node", writes))


async def no_sleep(_seconds: float) -> None:
    return None


def test_without_another_allocator_the_pod_binds_at_once() -> None:
    writer = Writer()
    binding = ClaimBinding(Books(over=["gpu-a"]), writer, other_allocator_seen=lambda: None)
    assert run(binding, [write()]) is None
    assert writer.released == []


def test_a_changed_claim_is_a_conflict() -> None:
    writer = Writer()
    binding = ClaimBinding(Books(over=[]), writer, other_allocator_seen=lambda: None)
    assert "changed since the decision" in (run(binding, [write(version="6")]) or "")


def test_an_over_commit_after_the_settle_wait_releases_the_claims() -> None:
    writer = Writer()
    binding = ClaimBinding(
        Books(over=["gpu-a"]),
        writer,
        other_allocator_seen=lambda: 100.0,
        clock=lambda: 101.0,
        sleep=no_sleep,
    )
    assert "allocated by another scheduler" in (run(binding, [write()]) or "")
    assert writer.released == [("ns/c", True)]


def test_an_old_sighting_of_another_allocator_does_not_wait() -> None:
    writer = Writer()
    binding = ClaimBinding(
        Books(over=["gpu-a"]), writer, other_allocator_seen=lambda: 0.0, clock=lambda: 1000.0
    )
    assert run(binding, [write()]) is None


def test_a_pod_waits_for_the_claims_its_templates_make() -> None:
    from vgpu_operator.control import pod_facts

    pod: dict[str, Any] = {
        "spec": {
            "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "t"},
                {"name": "own", "resourceClaimName": "c"},
            ]
        }
    }
    assert pod_facts.awaits_its_claims(pod)
    pod["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x"}]}
    assert not pod_facts.awaits_its_claims(pod)
