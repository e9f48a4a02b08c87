"""Writing a DRA pod's claims before its Binding (``claim_binding``): conflicts give the
decision up, and while another allocator is active an over-commit found after the
settle wait releases what was written."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from vgpu_operator.control.claim_binding import ClaimBinding
from vgpu_operator.kube.claims import WriteOutcome
from vgpu_operator.scheduling.cycle import ClaimWrite

ALLOCATION = {"devices": {"results": [{"device": "gpu-a"}]}}


class Books:
    def __init__(self, over: list[str]) -> None:
        self.over = over
        self.claims = {"ns/c": {"metadata": {"uid": "u", "resourceVersion": "7"}}}

    def claim_object(self, key: str) -> Mapping[str, Any] | None:
        return self.claims.get(key)

    def over_committed(self, node: str, devices: Sequence[str]) -> list[str]:
        return [d for d in devices if d in self.over]

    def holds_claim(self, key: str) -> bool:
        return key in self.claims


class Writer:
    def __init__(self, outcome: WriteOutcome = WriteOutcome.WRITTEN) -> None:
        self.outcome = outcome
        self.released: list[tuple[str, bool]] = []
        self.created: list[Mapping[str, Any]] = []
        self.discarded: list[str] = []
        self.statuses: list[tuple[str, str, Mapping[str, Any]]] = []
        self.exists = False
        self.pod_gone = False

    async def allocate(
        self, claim: Mapping[str, Any], allocation: Mapping[str, Any] | None, consumer: Any
    ) -> WriteOutcome:
        return self.outcome

    async def release(self, namespace: str, name: str, consumer_uid: str, deallocate: bool) -> None:
        self.released.append((f"{namespace}/{name}", deallocate))

    async def create(self, claim: Mapping[str, Any]) -> Any:
        self.created.append(claim)
        if self.exists:
            return None
        return {**claim, "metadata": {**claim["metadata"], "uid": "real", "resourceVersion": "1"}}

    async def discard(self, namespace: str, name: str) -> None:
        self.discarded.append(f"{namespace}/{name}")

    async def write_pod_status(self, namespace: str, pod: str, status: Mapping[str, Any]) -> bool:
        self.statuses.append((namespace, pod, status))
        return not self.pod_gone


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


SPECIAL = {"metadata": {"namespace": "ns", "name": "p-extended-resources-bcdfg"}, "spec": {}}
STATUS = {"resourceClaimName": "p-extended-resources-bcdfg", "requestMappings": []}


def special_write() -> ClaimWrite:
    return ClaimWrite(
        "ns",
        "p-extended-resources-bcdfg",
        "uid-p-extended-resources",
        "",
        ALLOCATION,
        {"uid": "pod", "name": "p"},
        create=SPECIAL,
        pod_status=STATUS,
    )


def test_a_special_claim_is_created_then_allocated_then_named_in_the_pods_status() -> None:
    writer = Writer()
    binding = ClaimBinding(Books(over=[]), writer, other_allocator_seen=lambda: None)
    assert run(binding, [special_write()]) is None
    assert writer.created == [SPECIAL]
    assert writer.statuses == [("ns", "p", STATUS)]
    assert writer.released == []
    assert not writer.discarded


def test_a_special_claim_that_exists_already_gives_the_decision_up() -> None:
    writer = Writer()
    writer.exists = True
    binding = ClaimBinding(Books(over=[]), writer, other_allocator_seen=lambda: None)
    assert "exists already" in (run(binding, [special_write()]) or "")
    assert not writer.statuses


def test_a_created_claim_is_deleted_when_the_pod_is_not_bound() -> None:
    writer = Writer()
    writer.pod_gone = True
    binding = ClaimBinding(Books(over=[]), writer, other_allocator_seen=lambda: None)
    assert "is gone" in (run(binding, [special_write()]) or "")
    assert writer.discarded == ["ns/p-extended-resources-bcdfg"]
    writer.discarded = []
    asyncio.run(binding.undo([special_write()]))  # the Binding failed
    assert writer.discarded == ["ns/p-extended-resources-bcdfg"]
    assert writer.released == []


def test_a_conflict_on_a_created_claim_deletes_it() -> None:
    writer = Writer(WriteOutcome.CONFLICT)
    binding = ClaimBinding(Books(over=[]), writer, other_allocator_seen=lambda: None)
    assert "conflict" in (run(binding, [special_write()]) or "")
    assert writer.discarded == ["ns/p-extended-resources-bcdfg"]
