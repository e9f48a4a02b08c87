"""The DRA dialect's node walk reuses the pod's verdict, as the annotation path does.

A pod on the DRA path that fits nowhere gets a verdict (``verdicts.Verdict``, judged by
``claim_decision.ClaimJudge``): per node, why its claims do not fit. At the pod's next
attempt a node that has not changed since (``Verdict.changed``: the change log, the
config and quota epoch, node heartbeats) would be ruled out again for the same reasons,
so its kept failure stands and only the changed nodes are fitted. That is what keeps a
preemptor's decision cheap on a large cluster: before the victim search, the claims'
Fit on every node, at a fraction of a millisecond each, dominated it.

The verdict is looked up by the pod's shape and its claims' shape (``ClaimJudge.shape``:
what of the claims decides where they fit), which only ``claim_decision.place`` knows
once it has read the claims: hence a callable it asks.
"""

from __future__ import annotations

from collections.abc import Mapping

from vgpu_operator.scheduling.cycle import verdicts
from vgpu_operator.scheduling.cycle.pod_read import PodRead
from vgpu_operator.scheduling.status import NodeFailure


class KeptFailures:
    """For one decision: given the claims' shape, the failures the pod's verdict still
    holds (``claim_decision.KnownFailures``); remembers which nodes it left to fit, so
    that the verdict is then refreshed on those only (``changed_for``)."""

    def __init__(
        self,
        kept: Mapping[str, verdicts.Verdict],
        read: PodRead,
        books: verdicts.JudgedBooks,
        now: float,
    ) -> None:
        self._kept = kept
        self._read = read
        self._books = books
        self._now = now
        self._used: tuple[verdicts.Verdict, set[str]] | None = None

    def __call__(self, claims_shape: str) -> Mapping[str, NodeFailure] | None:
        if self._read.judged is None:
            return None
        verdict = self._kept.get(self._read.shape + claims_shape)
        if (
            verdict is None
            or verdict.dialect is None
            or verdict.job_epoch != self._books.epoch
            or verdict.seq < 0
        ):
            return None
        changed = verdict.changed(self._books, self._now)
        if changed is None:
            return None
        self._used = (verdict, changed)
        return {n: f for n, f in verdict.failures.items() if n not in changed}

    def changed_for(self, verdict: verdicts.Verdict) -> set[str] | None:
        """The nodes fitted again for ``verdict`` (None: it was not used, judge all)."""
        if self._used is not None and self._used[0] is verdict:
            return self._used[1]
        return None
