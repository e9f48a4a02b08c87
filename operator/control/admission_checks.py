"""The runtime of Kueue's AdmissionCheck ``vgpu-operator.io/placeable`` (off by default;
``--kueue-placeable-check``; docs/kueue.md): the watches, the answers written, the holds
ended.

Two list-then-watch loops, as the feed's (``watching``): AdmissionChecks, to know which
checks are ours (``spec.controllerName``) and mark them Active; Workloads, to answer. A
workload is judged (``placeable_check``) when Kueue has reserved its quota
(``QuotaReserved``), it is not admitted yet, and one of our checks on it is ``Pending``;
the answer is written on each of our checks it names. Its hold ends when it is admitted
(its pods follow, ungated, and take the room), loses its quota reservation (evicted,
requeued after a Retry), finishes or is deleted, or when the hold's time is up; the room
then freed wakes the pods waiting for it (``StateFeed.settle_releases``).

Kueue v0.17 evicts a workload for a Retry answer only once: a workload still marked
Evicted that is answered Retry again loses its quota reservation but keeps the Retry
state, which its scheduler then parks as inadmissible for good. So, as Kueue does at its
first eviction, a Retry answer of ours on a workload that has lost its quota reservation
is set back to Pending at once (``_reset_retries``); the workload still waits out the
``requeueAfterSeconds`` of the Retry (Kueue's ``requeueState``), then Kueue reserves
quota again and asks anew. The reset must land before that requeue (Kueue looks at a
parked workload again only when its Evicted or Requeued condition changes), hence
``requeueAfterSeconds`` of at least 2 (timestamps are whole seconds).

Only the replica that decides (the leader, its books synced) judges: a standby leaves the
checks Pending, and the leader judges them when it takes over (``_rejudge`` looks again
every second at the workloads still Pending).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Final

import structlog

from vgpu_operator.control import placeable_check
from vgpu_operator.control.options import PlaceableOptions
from vgpu_operator.kube import binding, claims, watch_loop, workloads
from vgpu_operator.kube.requests import ApiClient, ApiError
from vgpu_operator.scheduling.gangs import gangs
from vgpu_operator.wire import KubeObject, WatchEventType

log = structlog.get_logger("vgpu_operator.admission_checks")

#: How often holds are expired and Pending workloads looked at again.
_TICK_S: Final = 1.0
#: The most ResourceClaimTemplates read for one judgement (Kueue allows 8 pod sets; a
#: pod names few claims).
MAX_TEMPLATES: Final = 32


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


class PlaceableController:
    """See the module docstring."""

    def __init__(
        self,
        api: ApiClient,
        check: placeable_check.PlaceableCheck,
        options: PlaceableOptions,
        *,
        decides: Callable[[], bool],
        on_released: Callable[[], None],
        on_error: Callable[[str], None],
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._api = api
        self._check = check
        self._options = options
        self._decides = decides
        self._on_released = on_released
        self._on_error = on_error
        self._clock = wall_clock
        #: Names of the AdmissionChecks whose controllerName is ours.
        self.checks: set[str] = set()
        #: Workloads with one of our checks Pending, as last seen (judged when we decide).
        self._pending: dict[str, Mapping[str, Any]] = {}
        #: Workloads left with our Retry and no quota reservation (set back to Pending).
        self._retried: dict[str, Mapping[str, Any]] = {}
        #: The resourceVersion each workload had when we last answered it.
        self._answered: dict[str, str] = {}
        #: Set once the AdmissionChecks are listed (workloads are read after: which of
        #: their checks are ours must be known first).
        self._checks_listed = asyncio.Event()

    async def run(self) -> None:
        checks = self._loop("admissioncheck", workloads.ADMISSION_CHECKS, self._check_event)
        self._checks_listed = checks.listed
        await asyncio.gather(checks.run(), self._watch_after_checks(), self._tick())

    async def _watch_after_checks(self) -> None:
        # Which of a workload's checks are ours must be known before it is read.
        await self._checks_listed.wait()
        await self._loop("workload", workloads.WORKLOADS, self._workload_event).run()

    # --- watches (the operator's one list-then-watch loop, kube/watch_loop.py) -------------

    def _loop(
        self, kind: str, path: str, handle: Callable[[str, dict[str, Any]], Awaitable[None]]
    ) -> watch_loop.WatchLoop:
        return watch_loop.WatchLoop(
            kind,
            watch_loop.ApiSource(self._api),
            watch_loop.Collection(path),
            _EachObject(handle),
            on_error=lambda _what: self._on_error("kueue_watch"),
        )

    async def _check_event(self, event_type: str, check: dict[str, Any]) -> None:
        name = str((check.get("metadata") or {}).get("name") or "")
        ours = (check.get("spec") or {}).get("controllerName") == placeable_check.CONTROLLER_NAME
        if event_type == "DELETED" or not ours:
            self.checks.discard(name)
            return
        self.checks.add(name)
        # Every replica may say so (the same write): Kueue needs it before any workload
        # of the ClusterQueue is admitted, leader or not.
        if not workloads.condition_true(check, "Active"):
            try:
                await workloads.set_check_active(self._api, name, self._clock())
                log.info("kueue_check_active", check=name)
            except ApiError as exc:
                log.warning("kueue_check_activate_failed", check=name, error=str(exc))
                self._on_error("kueue_check")

    async def _workload_event(self, event_type: str, wl: dict[str, Any]) -> None:
        wid = placeable_check.workload_id(wl)
        if event_type != "DELETED" and self._left_in_retry(wl):
            self._retried[wid] = wl
        else:
            self._retried.pop(wid, None)
        if event_type == "DELETED" or not self._wants_answer(wl):
            self._pending.pop(wid, None)
            self._answered.pop(wid, None)
            if self._holds_room_no_longer(event_type, wl) and self._check.release(wid):
                log.info("kueue_hold_released", workload=wid)
                self._on_released()
            return
        self._pending[wid] = wl
        await self._judge(wid)

    def _wants_answer(self, wl: Mapping[str, Any]) -> bool:
        if not workloads.condition_true(wl, "QuotaReserved"):
            return False
        if workloads.condition_true(wl, "Admitted") or workloads.condition_true(wl, "Finished"):
            return False
        states = workloads.check_states(wl)
        return any(states.get(name, {}).get("state") == "Pending" for name in self.checks)

    def _left_in_retry(self, wl: Mapping[str, Any]) -> bool:
        if workloads.condition_true(wl, "QuotaReserved") or workloads.condition_true(
            wl, "Finished"
        ):
            return False
        states = workloads.check_states(wl)
        return any(states.get(name, {}).get("state") == "Retry" for name in self.checks)

    async def _reset_retries(self) -> None:
        now = self._clock()
        for wid, wl in list(self._retried.items()):
            states = workloads.check_states(wl)
            due = [
                name for name in sorted(self.checks) if states.get(name, {}).get("state") == "Retry"
            ]
            if not due:
                continue
            try:
                for name in due:
                    await workloads.set_check_state(
                        self._api,
                        wl,
                        name,
                        "Pending",
                        "asking again: " + str(states[name].get("message") or ""),
                        now,
                    )
            except ApiError as exc:
                if exc.status not in (404, 409):
                    log.warning("kueue_check_reset_failed", workload=wid, error=str(exc))
                    self._on_error("kueue_check")
                    continue
                log.info("kueue_check_stale", workload=wid, status=exc.status)
            else:
                log.info("kueue_check_asks_again", workload=wid, checks=due)
            self._retried.pop(wid, None)

    def _holds_room_no_longer(self, event_type: str, wl: Mapping[str, Any]) -> bool:
        """Admitted (its pods take the room now), no quota any more, finished or gone. A
        workload whose check we just answered Ready and that Kueue has not admitted yet
        keeps its hold."""
        if event_type == "DELETED":
            return True
        return (
            workloads.condition_true(wl, "Admitted")
            or workloads.condition_true(wl, "Finished")
            or not workloads.condition_true(wl, "QuotaReserved")
        )

    # --- answers ---------------------------------------------------------------------------

    async def _judge(self, wid: str) -> None:
        wl = self._pending.get(wid)
        if wl is None or not self._decides() or self._answered.get(wid) == _rv(wl):
            return
        try:
            templates = await self._templates(wl)
            group = await self._pod_group(wl)
        except ApiError as exc:  # left pending: judged again at the next tick
            log.warning("kueue_check_templates_unread", workload=wid, error=str(exc))
            self._on_error("kueue_check")
            return
        wl = self._pending.get(wid)  # the read awaited: a newer version may have come
        if wl is None or self._answered.get(wid) == _rv(wl):
            return
        now = self._clock()
        answer = self._check.judge(wl, now, templates, group)
        states = workloads.check_states(wl)
        ours = [n for n in sorted(self.checks) if states.get(n, {}).get("state") == "Pending"]
        retry = self._options.retry_after_s if answer.state == "Retry" else None
        try:
            for name in ours:
                await workloads.set_check_state(
                    self._api, wl, name, answer.state, answer.message, now, requeue_after_s=retry
                )
        except ApiError as exc:
            if self._check.release(wid):
                self._on_released()
            if exc.status in (404, 409):
                self._pending.pop(wid, None)
                # Gone, or changed since it was read: its next version is judged as it comes.
                log.info("kueue_check_stale", workload=wid, status=exc.status)
                return
            # Left pending: judged again at the next tick.
            log.warning("kueue_check_write_failed", workload=wid, error=str(exc))
            self._on_error("kueue_check")
            return
        self._answered[wid] = _rv(wl)
        self._pending.pop(wid, None)
        log.info("kueue_check_answered", workload=wid, state=answer.state, message=answer.message)

    async def _templates(self, wl: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
        """The ResourceClaimTemplates the workload's pod sets name (at most
        ``MAX_TEMPLATES`` reads: a pod set names few; a workload naming more is judged
        with the rest missing, and answered Retry saying which)."""
        found: dict[str, dict[str, Any]] = {}
        for key in placeable_check.templates_named(wl)[:MAX_TEMPLATES]:
            namespace, _, name = key.partition("/")
            template = await claims.read_template(self._api, namespace, name)
            if template is not None:
                found[key] = template
        return found

    async def _pod_group(self, wl: Mapping[str, Any]) -> str | None:
        """The PodGroup the workload's pods name, read from its first pod (Kueue's pod
        integration owns a workload by its pods): Kueue v0.17's Workload keeps no
        ``schedulingGroup`` in its pod sets (its Pod type predates the field). None for
        a workload owned by no pod (a Job's: its pod sets say it, or nothing does)."""
        meta = wl.get("metadata") or {}
        owners = meta.get("ownerReferences") or ()
        pod = next((o for o in owners if isinstance(o, Mapping) and o.get("kind") == "Pod"), None)
        if pod is None or not isinstance(pod.get("name"), str):
            return None
        namespace = str(meta.get("namespace") or "default")
        try:
            found = await binding.read_pod(self._api, namespace, pod["name"])
        except ApiError as exc:
            if exc.status != 403:
                raise
            # An identity without ``get`` on pods (the check's own role alone): judged
            # pod by pod, as before the check read groups.
            log.warning("kueue_check_pod_unread", workload=placeable_check.workload_id(wl))
            return None
        return None if found is None else gangs.group_of(found)

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(_TICK_S)
            if self._check.expire(self._clock()):
                self._on_released()
            for wid in list(self._pending):
                await self._judge(wid)
            if self._decides():
                await self._reset_retries()


class _EachObject:
    """A kind whose objects are handled one by one: a listing's as ADDED events (the
    check keeps no state that a missing DELETED could leave wrong for long: a workload's
    hold expires, and checks are read again at the next listing)."""

    def __init__(self, handle: Callable[[str, dict[str, Any]], Awaitable[None]]) -> None:
        self._handle = handle

    async def listed(self, items: Sequence[KubeObject], version: str | None) -> None:
        for item in items:
            await self._handle("ADDED", dict(item))

    async def event(self, event_type: WatchEventType, obj: KubeObject) -> None:
        await self._handle(str(event_type), dict(obj))
