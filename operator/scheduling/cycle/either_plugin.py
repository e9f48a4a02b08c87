"""A mapped extended resource served on either path, as upstream serves it (KEP-5004).

With a DeviceClass of ours mapping an extended resource (``nvidia.com/gpu``, or the
implicit ``deviceclass.resource.kubernetes.io/<class>``), kube-scheduler satisfies a pod
asking it from a node's device plugin where the node's allocatable has the resource, and
through DRA devices (the pod's special claim) elsewhere. This dialect does the same in the
one walk: it holds both readings of the pod (the claims dialect's, with the special claim,
and the annotation dialect's, the resource read as HAMi's request) and, per node, asks the
dialect that serves the pod there: a node on the DRA path (``entries.is_dra_node``) the
claims dialect, any other node the annotation dialect. The fit records which path it took
(``EitherFit.path``); the reservation is that dialect's, so the Binding carries either the
annotation allocation or the special claim's writes, never both.

One walk: the nodes in the claims dialect's order (the node policy's ranking over every
node, its best fit under binpack), which covers both kinds of nodes, so the policy's
scores compare them as for any pod. A pod whose request only one path can read (HAMi's
admission refuses it, or the claim cannot say it) is refused on the other path's nodes
with that path's reason (``ExtendedClaimRefused``, ``DevicePluginRequestRefused``).

A pod that names claims of its own besides the resource stays on the claims dialect (its
claims need a DRA node anyway).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

from vgpu_operator.scheduling.books.entries import NodeEntry, is_dra_node
from vgpu_operator.scheduling.cycle.annotation_freeing import AnnotationFreeing
from vgpu_operator.scheduling.cycle.annotation_plugin import AnnotationPlugin
from vgpu_operator.scheduling.cycle.claims_plugin import ClaimsPlugin
from vgpu_operator.scheduling.cycle.claims_request import ClaimsRequest
from vgpu_operator.scheduling.cycle.plugin import Freeing, Reserved, Room, Unread
from vgpu_operator.scheduling.cycle.pod_read import PodRead
from vgpu_operator.scheduling.cycle.verdicts import failure_of
from vgpu_operator.scheduling.dialects.annotation import placement
from vgpu_operator.scheduling.dialects.claims import claim_fit
from vgpu_operator.scheduling.pod_key import PodKey
from vgpu_operator.scheduling.status import NodeFailure, Reason

Path = Literal["claims", "annotations"]


@dataclass(frozen=True, slots=True)
class EitherRequest:
    """Both readings of the pod: None where that path cannot serve it (``*_error`` says
    why)."""

    claims: ClaimsRequest | None
    job: placement.Job | None
    claims_error: str = ""
    job_error: str = ""


@dataclass(frozen=True, slots=True)
class EitherFit:
    """One node's fit and the path it took (``plugin.Fit``)."""

    path: Path
    inner: claim_fit.ClaimsOutcome | placement.Outcome

    @property
    def ok(self) -> bool:
        return self.inner.ok

    @property
    def reasons(self) -> Mapping[Reason, int]:
        return self.inner.reasons

    @property
    def refused_by(self) -> Mapping[Reason, set[str]]:
        return self.inner.refused_by

    @property
    def allowed_reasons(self) -> Mapping[Reason, int]:
        return self.inner.allowed_reasons

    @property
    def error(self) -> str | None:
        return self.inner.error


def path_of(node: NodeEntry) -> Path:
    """Which dialect serves a mapped extended resource on ``node``."""
    return "claims" if is_dra_node(node) else "annotations"


class EitherPlugin:
    """The two dialects behind one, chosen per node (see the module docstring)."""

    name = "either"
    #: A DRA node's claims may be shared by several pods (``ClaimsPlugin``).
    per_card_victims = True

    def __init__(self, annotations: AnnotationPlugin, claims: ClaimsPlugin) -> None:
        self.annotations = annotations
        self.claims = claims
        self.view = claims.view

    def request(self, read: PodRead) -> EitherRequest | Unread:
        """Both readings; a special claim still to arrive in the books is waited for."""
        dra = self.claims.request(read)
        if isinstance(dra, Unread) and dra.waits_for_claims:
            return dra
        job = read.device_plugin
        if job is not None:
            job = self.annotations.placer.with_mix(job)
        if isinstance(dra, Unread):
            if job is None:
                both = EitherRequest(None, None, dra.error, read.device_plugin_error)
                return Unread(" ".join(notes(both)))
            return EitherRequest(None, job, claims_error=dra.error)
        return EitherRequest(dra, job, job_error=read.device_plugin_error)

    def shape(self, request: EitherRequest) -> str:
        dra = self.claims.shape(request.claims) if request.claims is not None else "-"
        return f"{dra}|either:{int(request.job is not None)}"

    def order(
        self, request: EitherRequest, only: set[str] | None, rule_out: bool = True
    ) -> Iterable[NodeEntry]:
        """The claims' order (every node, ranked by the node policy), without the
        device-plugin nodes whose free-capacity summary rules HAMi's request out (O(1)
        each, as the annotation dialect's order; ``rule_out`` False: none left out);
        with no claim to place, that dialect's."""
        job = request.job
        if request.claims is None:
            assert job is not None
            return self.annotations.order(job, only, rule_out)
        nodes = self.claims.order(request.claims, only, rule_out)
        if job is None or not rule_out:
            return nodes
        return [n for n in nodes if is_dra_node(n) or n.summary.may_fit(job)]

    def fit(
        self, node: NodeEntry, request: EitherRequest, now: float, room: Room | None = None
    ) -> EitherFit:
        if path_of(node) == "claims":
            if request.claims is None:
                return EitherFit("claims", _refused(Reason.EXTENDED_CLAIM_REFUSED))
            return EitherFit("claims", self.claims.fit(node, request.claims, now, room))
        if request.job is None:
            return EitherFit("annotations", _refused(Reason.DEVICE_PLUGIN_REFUSED))
        return EitherFit("annotations", self.annotations.fit(node, request.job, now, room))

    def settles(self, node: NodeEntry, request: EitherRequest, fit: EitherFit) -> bool:
        if isinstance(fit.inner, claim_fit.ClaimsOutcome) and request.claims is not None:
            return self.claims.settles(node, request.claims, fit.inner)
        return True

    def judge(self, name: str, request: EitherRequest, now: float) -> NodeFailure | None:
        node = self.view.nodes.get(name)
        if node is None:
            return NodeFailure({Reason.NODE_NOT_CLAIMS_NODE: 1})
        if path_of(node) == "claims" and request.claims is not None:
            return self.claims.judge(name, request.claims, now)
        outcome = self.fit(node, request, now)
        return None if outcome.ok or outcome.error is not None else failure_of(outcome)

    def freeing(self, node: NodeEntry, request: EitherRequest, now: float) -> Freeing:
        if path_of(node) == "claims" and request.claims is not None:
            return self.claims.freeing(node, request.claims, now)
        # (A node whose path cannot read the request refuses every trial: any freeing.)
        return AnnotationFreeing(self.view, node)

    def one_card(self, request: EitherRequest) -> tuple[int, int] | None:
        return None  # each card's walk without the arithmetic short cut

    def taken_on_card(self, fit: EitherFit) -> tuple[int, int, int]:
        if isinstance(fit.inner, claim_fit.ClaimsOutcome):
            return self.claims.taken_on_card(fit.inner)
        return self.annotations.taken_on_card(fit.inner)

    def reserve(
        self,
        key: PodKey,
        request: EitherRequest,
        node: NodeEntry,
        fit: EitherFit,
        now: float,
        nominated: bool,
    ) -> Reserved:
        """The reservation of the path the fit took: the annotation allocation, or the
        special claim's holds and writes."""
        if isinstance(fit.inner, claim_fit.ClaimsOutcome):
            assert request.claims is not None
            return self.claims.reserve(key, request.claims, node, fit.inner, now, nominated)
        assert request.job is not None
        return self.annotations.reserve(key, request.job, node, fit.inner, now, nominated)


def notes(request: EitherRequest) -> tuple[str, ...]:
    """Why a path cannot serve the pod at all: what the diagnosis's message ends with."""
    out: list[str] = []
    if request.claims is None:
        out.append(f"DRA nodes cannot serve it: {request.claims_error}")
    if request.job is None:
        out.append(f"Device-plugin nodes cannot serve it: {request.job_error}")
    return tuple(out)


def _refused(reason: Reason) -> placement.Outcome:
    return placement.Outcome.rejected(Counter({reason: 1}))
