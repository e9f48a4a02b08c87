"""Asking Karpenter for exactly the nodes the waiting pods need (``run
--autoscale-instance-types FILE``; docs/autoscaling.md).

Every ``interval_s`` (and soon after a pod is found waiting), while this replica decides
and its books are synced, a round:

1. reads the NodePools and NodeClaims; the options are the instance types of the catalogue
   (``autoscale_catalogue``) each NodePool allows, less those cooling off;
2. follows the NodeClaims it asked for (``OWNED_LABEL``): one whose node takes pods gets
   the shares of the pods planned on it held there in the plan's order (a preemptor's hold,
   ``DefragBooks.hold``) and those pods woken; one gone, failed, or not taking pods after
   ``node_timeout_s`` is withdrawn, its instance type cools off, its pods told why;
3. once no new pod came for ``batch_idle_s`` (Karpenter's batching window), plans
   (``scheduling.autoscale.search``) for the waiting pods, the claims on their way counted;
4. deletes the claims no pod needs any more, creates the new ones (``autoscale_claims``),
   writes each planned pod's ``status.nominatedNodeName`` (the claim's name: Karpenter's
   provisioner passes over a nominated pod, so it never asks for a node for it too), and
   tells each pod what it waits for (``note``: the worker adds it to the pod's
   ``PodScheduled`` message: ``waits for a new node: 1 x gpu-8xh100 requested``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog

from vgpu_operator.control import (
    autoscale_claims,
    autoscale_holds,
    autoscale_shrink,
    autoscale_units,
    feed,
    gang_runtime,
    queue,
)
from vgpu_operator.control.autoscale_catalogue import Catalogue
from vgpu_operator.control.options import AutoscaleOptions
from vgpu_operator.metrics.autoscale import AutoscaleMetrics, ClaimEvent
from vgpu_operator.scheduling.autoscale import catalogue, search, shrink, shrink_claims
from vgpu_operator.scheduling.autoscale.whatif import Slot, Unit
from vgpu_operator.scheduling.books.entries import is_dra_node
from vgpu_operator.scheduling.cycle import ClusterState
from vgpu_operator.scheduling.defrag.defrag_books import DefragBooks
from vgpu_operator.scheduling.pod_key import PodKey, pod_key
from vgpu_operator.wire import Pod

log = structlog.get_logger("vgpu_operator.autoscaler")

#: The most nodes one round looks at for scale-down (each costs a LIST and a what-if).
_SCALE_DOWN_LOOKS = 4
#: The shortest time between two rounds.
_MIN_GAP_S = 0.2


class KarpenterApi(Protocol):
    """What the autoscaler reads and writes through the API (``kube.karpenter``)."""

    async def node_pools(self) -> list[dict[str, Any]]: ...
    async def node_claims(self) -> list[dict[str, Any]]: ...
    async def create_claim(self, body: Mapping[str, Any]) -> dict[str, Any]: ...
    async def delete_claim(self, name: str) -> bool: ...
    async def pods_on(self, node: str) -> list[Pod]: ...
    async def nominate(self, namespace: str, name: str, node: str | None) -> bool: ...
    async def template(self, namespace: str, name: str) -> dict[str, Any] | None: ...


@dataclass
class NodeClaimRequest:
    """A NodeClaim this operator asked for, and the pods planned on it, in plan order."""

    claim: str
    option: catalogue.NodeOption
    asked_at: float
    pods: tuple[PodKey, ...] = ()
    #: The node it became, once the books hold it with its inventory (shares held there),
    #: and since when (its pods wait for it, not planned again, for ``node_timeout_s``).
    arrived: str | None = None
    arrived_at: float = 0.0


@dataclass
class _Round:
    """What one round read: NodePool objects by name, the options, the claims by name."""

    pools: dict[str, Mapping[str, Any]] = field(default_factory=dict)
    options: list[catalogue.NodeOption] = field(default_factory=list)
    claims: dict[str, autoscale_claims.NodeClaimFacts] = field(default_factory=dict)
    #: Every NodeClaim, Karpenter's own too.
    every: list[autoscale_claims.NodeClaimFacts] = field(default_factory=list)


class Autoscaler:
    """See the module docstring."""

    def __init__(
        self,
        state: ClusterState,
        state_feed: feed.StateFeed,
        pods_queue: queue.SchedulingQueue,
        gangs: gang_runtime.GangRuntime | None,
        api: KarpenterApi,
        types: Catalogue,
        settings: AutoscaleOptions,
        *,
        decides: Callable[[], bool],
        wall_clock: Callable[[], float] = time.time,
        cpu_clock: Callable[[], float] = time.process_time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        metrics: AutoscaleMetrics | None = None,
    ) -> None:
        self._state = state
        self._books = DefragBooks(state)
        self._feed = state_feed
        self._queue = pods_queue
        self._gangs = gangs
        self._api = api
        self._types = types
        self._settings = settings
        self._decides = decides
        self._wall_clock = wall_clock
        self._cpu_clock = cpu_clock
        self._sleep = sleep
        self._metrics = metrics if metrics is not None else AutoscaleMetrics(None)
        self._budget = search.SearchBudget(max_seconds=settings.max_search_s)
        self.requests: dict[str, NodeClaimRequest] = {}
        #: Per pod, what it is told it waits for (``note``), and the claim it is nominated to.
        self._notes: dict[PodKey, str] = {}
        self._nominated: dict[PodKey, str] = {}
        #: Options (their keys) not asked for until then: their claims timed out or failed.
        self._cooling: dict[tuple[str, str, str, str], float] = {}
        self._soon = asyncio.Event()
        self._wait_s = settings.interval_s
        #: Claims of ours whose node arrived and whose pods are placed: nodes like any other.
        self._released: set[str] = set()
        #: No node is given back before then (the last one's pods are finding their places).
        self._quiet_until = 0.0
        #: Pods whose claim was withdrawn: what they are told, and until when.
        self._withdrawn: dict[PodKey, tuple[str, float]] = {}
        #: When each unit not planned yet was first found waiting (the batching window).
        self._first_seen: dict[str, float] = {}
        self.last_plan: search.ScalePlan | None = None
        for problem in types.problems:
            log.warning("autoscale_instance_type_refused", problem=problem)

    def node_changed(self, node: str) -> None:
        """A node joined or changed (the feed, before it wakes the waiting pods): if it is
        the node of a claim asked for, its pods' shares are held there first, so that the
        pods woken by its arrival do not take each other's places."""
        entry = self._state.books.nodes.get(node)
        claim = None if entry is None else entry.facts.labels.get(autoscale_claims.CLAIM_LABEL)
        request = None if claim is None else self.requests.get(claim)
        if request is not None:
            self._arrive(request, node, self._wall_clock())

    def note(self, key: PodKey) -> str | None:
        """What the pod waits for, for its ``PodScheduled`` message (None: nothing)."""
        return self._notes.get(key)

    def poke(self) -> None:
        """A pod was found waiting: a round soon."""
        self._soon.set()

    async def run(self) -> None:
        """Forever: a round every ``interval_s``, or sooner when poked (until cancelled);
        never two rounds (two listings of NodePools and NodeClaims) less than
        ``_MIN_GAP_S`` apart, however many pods are found waiting."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._soon.wait(), self._wait_s)
            await self._sleep(_MIN_GAP_S)
            self._soon.clear()
            self._wait_s = self._settings.interval_s
            if not self._decides():
                continue
            try:
                await self.round()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # an API error: next round
                log.warning("autoscale_round_failed", error=str(exc))

    async def round(self) -> search.ScalePlan | None:
        now = self._wall_clock()
        read = await self._read(now)
        await self._follow(read, now)
        on_way = self._on_their_way()
        expecting = {
            k
            for r in self.requests.values()
            if r.arrived is not None and now - r.arrived_at < self._settings.node_timeout_s
            for k in r.pods
        }
        waiting = [
            p
            for p in self._feed.waiting_for(self._feed.scheduler_name)
            if pod_key(p) not in expecting
        ]
        units, left = autoscale_units.gather(
            waiting,
            planned={k for r in on_way for k in r.pods},
            parked=self._queue.is_unschedulable,
            in_books=self._in_books,
            listed=self._listed(),
            gangs=self._gangs,
            pins={k: r.claim for r in on_way for k in r.pods},
            limit=self._settings.max_pods,
            templates=await autoscale_units.read_templates(self._api.template, waiting),
        )
        requested = [Slot(r.claim, r.option) for r in on_way]
        if units and self._batching(units, now):
            return None  # pods are still coming in: plan them together
        if not units and not requested:
            self._tell({}, left)
            self._metrics.round_idle()
            self._metrics.in_flight(())
            await self._scale_down(read, now)
            return None
        began = self._cpu_clock()
        plan = search.plan(
            self._state.books,
            units,
            read.options,
            requested,
            now=now,
            budget=self._budget,
            clock=self._cpu_clock,
        )
        self.last_plan = plan
        unplaceable = sum(len(u.keys) for u in units if u.key in plan.unplaceable)
        self._metrics.planned(self._cpu_clock() - began, unplaceable)
        await self._carry_out(plan, units, left, read, now)
        self._metrics.in_flight(
            (r.option.instance_type.name, r.option.price)
            for r in self.requests.values()
            if r.arrived is None
        )
        return plan

    def _on_their_way(self) -> list[NodeClaimRequest]:
        """The requests the next plan counts as nodes requested: those whose node has not
        arrived, and those whose node has but holds a gang's members not held yet (a gang
        is held whole once all its nodes are here: until then it is planned on its
        requests, so that a round between two arrivals asks for no third node)."""
        out = []
        for request in self.requests.values():
            if request.arrived is None or any(
                (pod := self._feed.pending_pod(k)) is not None
                and not self._in_books(k)
                and gang_runtime.GangRuntime.group_of(pod) is not None
                for k in request.pods
            ):
                out.append(request)
        return out

    def _batching(self, units: Sequence[Unit], now: float) -> bool:
        """Whether new pods are still coming in (Karpenter's batching window): no new
        nodes yet while a pod not planned before was first seen waiting (decided or not)
        less than ``batch_idle_s`` ago, for at most ``batch_max_s`` after the first of
        them."""
        pinned = {k for u in units if u.pinned is not None for k in u.keys}
        fresh = [
            key
            for pod in self._feed.waiting_for(self._feed.scheduler_name)
            if (key := pod_key(pod)) not in pinned and not self._in_books(key)
        ]
        self._first_seen = {k: self._first_seen.get(k, now) for k in fresh}
        if not self._first_seen or all(u.pinned is not None for u in units):
            return False
        newest, oldest = max(self._first_seen.values()), min(self._first_seen.values())
        settings = self._settings
        waiting = now - newest < settings.batch_idle_s and now - oldest < settings.batch_max_s
        if waiting:
            # Look again when the window may close (no event need come).
            self._wait_s = min(settings.interval_s, max(0.05, settings.batch_idle_s / 2))
        return waiting

    async def _scale_down(self, read: _Round, now: float) -> None:
        """Give back one node whose pods would all fit elsewhere (``autoscale_shrink``)."""
        settings = self._settings
        if settings.scale_down_min_savings is None or now < self._quiet_until:
            return
        busy = frozenset(
            r.arrived
            for r in self.requests.values()
            if r.arrived is not None and any(self._feed.pending_pod(k) for k in r.pods)
        )
        found = autoscale_shrink.candidates(
            self._state.books.nodes.values(),
            read.every,
            self._types.types,
            now=now,
            after_s=settings.scale_down_after_s,
            min_savings=settings.scale_down_min_savings,
            busy=busy,
        )
        for candidate in found[:_SCALE_DOWN_LOOKS]:
            running = {pod_key(p): p for p in await self._api.pods_on(candidate.node)}
            # The templates the node's claims pods' claims would be made again from.
            keys = shrink_claims.template_keys(running.values())
            templates = await autoscale_units.read_template_keys(self._api.template, keys)
            out = shrink.empty_node(
                self._state, candidate.node, running, self._wall_clock(), templates=templates
            )
            if isinstance(out, str):
                log.debug("autoscale_node_kept", node=candidate.node, reason=out)
                continue
            await self._api.delete_claim(candidate.claim)
            self._metrics.claim(ClaimEvent.GIVEN_BACK)
            self._quiet_until = now + settings.node_timeout_s / 4
            log.info(
                "autoscale_node_given_back",
                node=candidate.node,
                claim=candidate.claim,
                saves_per_hour=candidate.price,
                moves={str(k): v for k, v in out.moves.items()},
            )
            return

    # --- reading -------------------------------------------------------------------------
    async def _read(self, now: float) -> _Round:
        read = _Round()
        pools: list[catalogue.NodePool] = []
        for obj in await self._api.node_pools():
            try:
                pool = catalogue.read_node_pool(obj)
            except catalogue.NodePoolError as exc:
                log.debug("autoscale_node_pool_skipped", reason=str(exc))
                continue
            pools.append(pool)
            read.pools[pool.name] = obj
        for key, until in list(self._cooling.items()):
            if until <= now:
                del self._cooling[key]
        read.options = [
            o for o in catalogue.options(pools, self._types.types) if o.key not in self._cooling
        ]  # their pools' use is completed from the claims below
        every = [c for c in map(autoscale_claims.read_claim, await self._api.node_claims()) if c]
        read.every = every
        read.claims = {c.name: c for c in every if c.ours}
        read.options = autoscale_claims.with_claims_counted(read.options, every, self._types.types)
        return read

    def _listed(self) -> frozenset[str]:
        return frozenset(r for t in self._types.types for r in t.capacity)

    def _in_books(self, key: PodKey) -> bool:
        return key in self._state.books.pods or self._state.nominated_node(key) is not None

    # --- the claims asked for -------------------------------------------------------------
    async def _follow(self, read: _Round, now: float) -> None:
        """Claims gone, failed or late are withdrawn; arrived ones get their pods held."""
        options = {o.key: o for o in read.options}
        joined = self._joined()
        for name, seen in read.claims.items():
            if (
                name not in self.requests
                and name not in self._released
                and not seen.deleting
                and not seen.initialized
                and seen.option_key in options
            ):
                # A claim of ours from before a restart: its pods are those nominated to it.
                asked = seen.created if seen.created is not None else now
                pods = tuple(k for k, n in self._nominated_from_pods().items() if n == name)
                self.requests[name] = NodeClaimRequest(name, options[seen.option_key], asked, pods)
        for name, request in list(self.requests.items()):
            claim = read.claims.get(name)
            why = self._withdrawal(request, claim, now)
            if why is not None:
                await self._withdraw(request, why)
                continue
            node = joined.get(name) or (claim.node if claim is not None else None)
            if node:
                self._arrive(request, node, now)
            if request.arrived is not None and not any(
                self._feed.pending_pod(k) is not None for k in request.pods
            ):
                del self.requests[name]  # all its pods bound (or gone): a node like any
                self._released.add(name)
        self._released &= set(read.claims)

    def _joined(self) -> dict[str, str]:
        """The claims of ours whose node the books hold: claim -> node (its label)."""
        joined: dict[str, str] = {}
        for node in self._state.books.nodes.values():
            claim = node.facts.labels.get(autoscale_claims.CLAIM_LABEL)
            if claim is not None and claim in self.requests:
                joined[claim] = node.name
        return joined

    def _withdrawal(
        self, request: NodeClaimRequest, claim: autoscale_claims.NodeClaimFacts | None, now: float
    ) -> str | None:
        kind = request.option.instance_type.name
        if request.arrived is not None:
            return None
        joined = request.claim in self._joined()  # a node that takes no pod yet: timeout only
        if not joined and (claim is None or claim.deleting):
            return f"NodeClaim {request.claim} ({kind}) is gone"
        if not joined and claim is not None and claim.failure is not None:
            return f"NodeClaim {request.claim} ({kind}) could not be launched: {claim.failure}"
        if now - request.asked_at > self._settings.node_timeout_s:
            return (
                f"NodeClaim {request.claim} ({kind}) did not become a node within "
                f"{self._settings.node_timeout_s:.0f} s"
            )
        return None

    async def _withdraw(self, request: NodeClaimRequest, why: str) -> None:
        """Delete a claim that failed (its instance type cools off) and tell its pods."""
        del self.requests[request.claim]
        self._metrics.claim(ClaimEvent.WITHDRAWN)
        self._cooling[request.option.key] = self._wall_clock() + self._settings.cool_off_s
        with contextlib.suppress(Exception):
            await self._api.delete_claim(request.claim)
        log.warning("autoscale_claim_withdrawn", claim=request.claim, reason=why)
        message = (
            f"{why}: withdrawn; {request.option.instance_type.name} is not asked for again "
            f"for {self._settings.cool_off_s:.0f} s"
        )
        until = self._wall_clock() + self._settings.cool_off_s
        for pod in request.pods:
            self._withdrawn[pod] = (message, until)
            self._notes[pod] = message
            self._queue.wake_one(pod)

    def _arrive(self, request: NodeClaimRequest, node: str, now: float) -> None:
        """The claim's node is in the books with its inventory and takes pods
        (``autoscale_holds.takes_pods``): the shares of the pods planned on the nodes
        arrived are held there in plan order, a gang's once all its nodes are here, and
        the pods woken (the worker binds them). Until then its claim is a node on its way
        to the plans, with the room its planned pods leave (for a pod come later too)."""
        books = self._state.books
        entry = books.nodes.get(node)
        if entry is None or entry.inventory is None:
            return
        if is_dra_node(entry) and books.claims.pool_of(node) is None:
            return  # on the DRA path, a node is there for claims once its slice is read
        if not autoscale_holds.takes_pods(entry.facts, request.option.pool.template):
            return  # Karpenter has not registered it yet: still on its way (its room planned)
        if request.arrived is None:
            request.arrived, request.arrived_at = node, now
            log.info("autoscale_node_arrived", claim=request.claim, node=node)
        planned = [
            autoscale_holds.Planned(key, r.arrived)
            for r in self.requests.values()
            for key in r.pods
        ]
        held = autoscale_holds.hold_arrived(
            planned,
            pending=self._feed.pending_pod,
            in_books=self._in_books,
            hold=lambda pod, at: self._books.hold(pod, at, frozenset(), now) is not None,
            release=lambda key: self._books.release(key, frozenset()),
        )
        for key in held:
            self._notes.pop(key, None)
            self._feed.held_for(key)

    def _nominated_from_pods(self) -> dict[PodKey, str]:
        nominated: dict[PodKey, str] = {}
        for pod in self._feed.waiting_for(self._feed.scheduler_name):
            node = (pod.get("status") or {}).get("nominatedNodeName")
            if isinstance(node, str) and node:
                nominated[pod_key(pod)] = node
        return nominated

    # --- carrying out a plan ----------------------------------------------------------------
    async def _carry_out(
        self,
        plan: search.ScalePlan,
        units: Sequence[Any],
        left: Mapping[PodKey, str],
        read: _Round,
        now: float,
    ) -> None:
        joined = self._joined()
        for name in plan.unused:
            if name in joined:
                continue  # its node joined meanwhile: a node now, never withdrawn
            request = self.requests.pop(name, None)
            if request is not None:
                self._metrics.claim(ClaimEvent.UNNEEDED)
                log.info("autoscale_claim_unneeded", claim=name)
                with contextlib.suppress(Exception):
                    await self._api.delete_claim(name)
        names: dict[str, str] = {}
        for slot in plan.new:
            pool = read.pools.get(slot.option.pool.name)
            if pool is None:
                continue
            name = autoscale_claims.claim_name(slot.option.pool.name)
            body = autoscale_claims.claim_manifest(slot.option, pool, name)
            created = await self._api.create_claim(body)
            claim = str((created.get("metadata") or {}).get("name") or "")
            if not claim:
                continue
            names[slot.name] = claim
            self.requests[claim] = NodeClaimRequest(claim, slot.option, now)
            self._metrics.claim(ClaimEvent.CREATED)
            log.info(
                "autoscale_claim_created",
                claim=claim,
                instance_type=slot.option.instance_type.name,
                pool=slot.option.pool.name,
                pods=list(plan.pods_on(slot.name)),
            )
        for claim, request in self.requests.items():
            if request.arrived is None:
                on = [n for n, c in names.items() if c == claim] or [claim]
                request.pods = plan.pods_on(on[0])
        refused = ""
        if self._types.problems:
            shown = "; ".join(self._types.problems[:2])
            more = len(self._types.problems) - 2
            refused = f" (the catalogue: {shown}{f'; {more} more' if more > 0 else ''})"
        unplaceable = {
            key: f"no new node would hold it: {plan.unplaceable[unit.key]}{refused}"
            for unit in units
            if unit.key in plan.unplaceable
            for key in unit.keys
        }
        await self._nominate()
        considered = {k for unit in units for k in unit.keys}
        self._tell(self._planned_notes(), {**left, **unplaceable}, considered)
        log.info(
            "autoscale_plan",
            new=plan.summary(),
            requested=len([r for r in self.requests.values() if r.arrived is None]),
            unplaceable=len(plan.unplaceable),
            optimal=plan.optimal,
            trials=plan.trials,
        )

    def _planned_notes(self) -> dict[PodKey, str]:
        pending = [r for r in self.requests.values() if r.arrived is None]
        counts: dict[str, int] = {}
        for request in pending:
            kind = request.option.instance_type.name
            counts[kind] = counts.get(kind, 0) + 1
        summary = ", ".join(f"{n} x {kind}" for kind, n in sorted(counts.items()))
        notes: dict[PodKey, str] = {}
        for request in pending:
            for key in request.pods:
                notes[key] = (
                    f"waits for a new node: {summary} requested (its node: NodeClaim "
                    f"{request.claim}, {request.option.instance_type.name})"
                )
        return notes

    def _tell(
        self,
        planned: Mapping[PodKey, str],
        left: Mapping[PodKey, str],
        considered: Collection[PodKey] = (),
    ) -> None:
        """Set each pod's note; a pod whose note changed is woken (the worker tells it). A
        pod whose claim was withdrawn is told so until it is planned again (or the type
        cools down), whatever else keeps it waiting meanwhile. A pending pod the round did
        not look at (``considered``: it was being decided) keeps its note."""
        now = self._wall_clock()
        self._withdrawn = {
            k: (m, until)
            for k, (m, until) in self._withdrawn.items()
            if until > now and not planned.get(k) and self._feed.pending_pod(k) is not None
        }
        withdrawn = {k: m for k, (m, _) in self._withdrawn.items()}
        wanted = {**left, **withdrawn, **{k: v for k, v in planned.items() if v}}
        for key in set(self._notes) | set(wanted):
            if key not in wanted and key not in considered and self._feed.pending_pod(key):
                continue  # not looked at this round (being decided): it keeps its note
            new = wanted.get(key)
            if self._notes.get(key) == new:
                continue
            if new is None:
                self._notes.pop(key, None)
            else:
                self._notes[key] = new
            self._queue.wake_one(key)

    async def _nominate(self) -> None:
        """Each planned pod's ``nominatedNodeName`` is its claim; cleared when it has none."""
        wanted = {k: r.claim for r in self.requests.values() if r.arrived is None for k in r.pods}
        for key in set(self._nominated) | set(wanted):
            claim = wanted.get(key)
            if self._nominated.get(key) == claim:
                continue
            namespace, _, name = str(key).partition("/")
            with contextlib.suppress(Exception):
                await self._api.nominate(namespace, name, claim)
            if claim is None:
                self._nominated.pop(key, None)
            else:
                self._nominated[key] = claim
