"""Before a DRA pod's Binding: its claims' allocations and reservations, written and
checked against other allocators.

The worker calls ``reserve`` between the decision and the Binding, and ``undo`` when the
Binding is not written: each claim gets the engine's allocation (and the delete-protection
finalizer) and the pod in ``reservedFor``, on the copy the decision read (a change since,
by anyone, is a conflict: the pod is decided again).

Nothing locks a device between two allocators: kube-scheduler, deciding from a copy of
the claims that does not show our allocation yet, may allocate the same capacity a
moment later, and each allocation alone is valid. So while another scheduler may be
allocating on the same slices (a pod of another scheduler with claims waits, or did
within ``RECENT_S``), the Binding waits ``settle_s`` after the claims are written, the
books (fed by the claims' watch, which by then shows what any allocator wrote before or
just after ours) recount the devices this pod got, and if any is over-committed the
pod's claims are released and it is decided again; the other allocator's pod keeps its
shares. Without such a scheduler nothing waits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final, Protocol, cast

import structlog

from vgpu_operator.kube.claims import WriteOutcome
from vgpu_operator.scheduling.cycle import ClaimWrite
from vgpu_operator.wire import ResourceClaim, meta_of

log = structlog.get_logger("vgpu_operator.claim_binding")

#: Default wait after writing claims while another allocator is active (seconds): longer
#: than that allocator's scheduling cycle plus its watch's delay on a loaded machine.
DEFAULT_SETTLE_S: Final = 1.0
#: A pod of another scheduler with claims seen waiting this recently counts as active.
RECENT_S: Final = 10.0
#: How long a member's Binding waits for its group claim's allocation, which another
#: member's decision is writing (``group_claims``), and how often it looks.
GROUP_WAIT_S: Final = 30.0
_GROUP_POLL_S: Final = 0.05


class ClaimWriter(Protocol):
    async def allocate(
        self,
        claim: ResourceClaim,
        allocation: Mapping[str, Any] | None,
        consumer: Mapping[str, str],
    ) -> WriteOutcome: ...

    async def release(
        self, namespace: str, name: str, consumer_uid: str, deallocate: bool
    ) -> None: ...

    async def create(self, claim: Mapping[str, Any]) -> ResourceClaim | None:
        """Create the claim; None when one of its name exists already."""
        ...

    async def discard(self, namespace: str, name: str) -> None:
        """Delete a claim we created (its finalizer and allocation taken off first)."""
        ...

    async def write_pod_status(self, namespace: str, pod: str, status: Mapping[str, Any]) -> bool:
        """``status.extendedResourceClaimStatus`` of the pod; False when it is gone."""
        ...


class ClaimBooksView(Protocol):
    def claim_object(self, key: str) -> Mapping[str, Any] | None: ...
    def over_committed(self, node: str, devices: Sequence[str]) -> list[str]: ...
    def holds_claim(self, key: str) -> bool: ...


class ClaimBinding:
    def __init__(
        self,
        books: ClaimBooksView,
        writer: ClaimWriter,
        *,
        other_allocator_seen: Callable[[], float | None],
        settle_s: float = DEFAULT_SETTLE_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self._books = books
        self._writer = writer
        self._other_allocator_seen = other_allocator_seen
        self._settle_s = settle_s
        self._clock = clock
        self._sleep = sleep
        #: Claim writes made (API calls), for the writes-per-pod figure.
        self.writes = 0

    def _other_allocator_active(self) -> bool:
        seen = self._other_allocator_seen()
        return seen is not None and self._clock() - seen <= RECENT_S

    async def reserve(self, key: str, node: str, writes: Sequence[ClaimWrite]) -> str | None:
        """Write the claims; None when the pod may be bound, else why not (its claims
        are released again)."""
        done: list[ClaimWrite] = []
        for write in writes:
            if write.awaits_allocation:
                waited = await self._await_group_allocation(write)
                if waited is not None:
                    await self.undo(done)
                    return waited
                continue
            claim = await self._claim_for(write)
            if isinstance(claim, str):
                await self.undo(done)
                return claim
            outcome = await self._writer.allocate(claim, write.allocation, write.consumer)
            self.writes += 2 if write.allocation is not None else 1
            if outcome is not WriteOutcome.WRITTEN:
                await self.undo([*done, write] if write.create is not None else done)
                return f"ResourceClaim {write.key}: {outcome.value}"
            done.append(write)
        problem = await self._write_pod_status(writes)
        if problem is not None:
            await self.undo(done)
            return problem
        if not self._other_allocator_active():
            return None
        await self._sleep(self._settle_s)
        devices = [
            result["device"]
            for write in done
            if write.allocation is not None
            for result in write.allocation["devices"]["results"]
        ]
        over = self._books.over_committed(node, devices)
        if over:
            log.warning("claim_allocation_raced", pod=key, node=node, devices=over)
            await self.undo(done)
            return f"devices {', '.join(over)} on {node} were allocated by another scheduler too"
        return None

    async def _claim_for(self, write: ClaimWrite) -> ResourceClaim | str:
        """The claim to write on, as the decision read it (or as just created: the pod's
        special claim, ``extended_claims``); a string says why not."""
        if write.create is not None:
            created = await self._writer.create(write.create)
            self.writes += 1
            if created is None:
                # Made by an earlier attempt whose clean-up has not landed: the books
                # will read it as the pod's, and the next decision uses it.
                return f"ResourceClaim {write.key} exists already"
            return created
        # The books keep the claim as it was watched (``claims_feed``): a ResourceClaim.
        claim = cast(ResourceClaim | None, self._books.claim_object(write.key))
        meta = meta_of(claim) if claim is not None else {}
        if claim is None or meta.get("uid") != write.uid:
            return f"ResourceClaim {write.key} is gone or was replaced"
        if str(meta.get("resourceVersion")) != write.resource_version:
            return f"ResourceClaim {write.key} changed since the decision"
        return claim

    async def _await_group_allocation(self, write: ClaimWrite) -> str | None:
        """Until the group claim another member's decision allocates shows, as the watch
        has it, that allocation and the group in ``reservedFor``; None then, else why not
        (the decision was given up, the claim went, or ``GROUP_WAIT_S`` passed)."""
        deadline = self._clock() + GROUP_WAIT_S
        while True:
            claim = self._books.claim_object(write.key)
            meta = meta_of(cast(ResourceClaim, claim)) if claim is not None else {}
            if claim is None or meta.get("uid") != write.uid:
                return f"ResourceClaim {write.key} is gone or was replaced"
            status = claim.get("status") or {}
            reserved = any(
                r.get("uid") == write.consumer["uid"] for r in status.get("reservedFor") or ()
            )
            if status.get("allocation") and reserved:
                return None
            if not self._books.holds_claim(write.key):
                return f"ResourceClaim {write.key}: the group member allocating it gave up"
            if self._clock() >= deadline:
                return f"ResourceClaim {write.key}: its allocation for the group did not come"
            await self._sleep(_GROUP_POLL_S)

    async def _write_pod_status(self, writes: Sequence[ClaimWrite]) -> str | None:
        """The pod's ``extendedResourceClaimStatus``, as kube-scheduler writes it before
        the Binding: kubelet reads from it which container gets which request."""
        for write in writes:
            if write.pod_status is None:
                continue
            pod = write.consumer.get("name", "")
            self.writes += 1
            if not await self._writer.write_pod_status(write.namespace, pod, write.pod_status):
                return f"pod {write.namespace}/{pod} is gone"
        return None

    async def undo(self, writes: Sequence[ClaimWrite]) -> None:
        """Release what ``reserve`` wrote for a pod that is not bound; a special claim we
        created is deleted (upstream's Unreserve does the same). A group claim stays: it is
        the PodGroup's, its other members may use it already, and it is released when the
        PodGroup goes (``group_claims``)."""
        for write in writes:
            if write.awaits_allocation or write.consumer.get("resource") == "podgroups":
                continue
            try:
                if write.create is not None:
                    await self._writer.discard(write.namespace, write.name)
                    self.writes += 1
                    continue
                await self._writer.release(
                    write.namespace, write.name, write.consumer["uid"], write.allocation is not None
                )
                self.writes += 1
            except Exception as exc:  # the claim controller cleans up after the pod
                log.warning("claim_release_failed", claim=write.key, error=str(exc))
