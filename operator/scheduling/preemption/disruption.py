"""PodDisruptionBudgets as preemption reads them: which victims would violate one.

Only what kube-scheduler's DefaultPreemption reads: a budget's namespace, its
``spec.selector`` and ``status.disruptionsAllowed`` (and ``status.disruptedPods``, pods
already counted against it). Pure functions over the plain dicts the API returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from vgpu_operator.wire import LabelSelector, LabelSelectorRequirement, PodDisruptionBudget

#: A pod's identity and labels, as budgets match them.
Labels = Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Budget:
    namespace: str
    name: str
    selector: LabelSelector | None
    disruptions_allowed: int
    disrupted_pods: frozenset[str]

    @classmethod
    def from_object(cls, pdb: PodDisruptionBudget) -> Budget:
        meta = pdb.get("metadata") or {}
        spec = pdb.get("spec") or {}
        status = pdb.get("status") or {}
        allowed = status.get("disruptionsAllowed")
        disrupted = status.get("disruptedPods")
        return cls(
            namespace=meta.get("namespace") or "default",
            name=str(meta.get("name") or ""),
            selector=spec.get("selector") if isinstance(spec.get("selector"), Mapping) else None,
            disruptions_allowed=allowed if isinstance(allowed, int) else 0,
            disrupted_pods=frozenset(disrupted) if isinstance(disrupted, Mapping) else frozenset(),
        )

    def covers(self, namespace: str, name: str, labels: Labels) -> bool:
        """Whether an eviction of this pod counts against the budget.

        As kube-scheduler: an absent or empty selector selects nothing, a pod without
        labels is covered by no budget, and a pod already listed in ``disruptedPods``
        has been counted.
        """
        if namespace != self.namespace or not labels or not self.selector:
            return False
        if name in self.disrupted_pods:
            return False
        return selector_matches(self.selector, labels)


def selector_matches(selector: LabelSelector, labels: Labels) -> bool:
    """A metav1.LabelSelector (``matchLabels`` and ``matchExpressions``) against labels."""
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(k) != v for k, v in match_labels.items()):
        return False
    return all(_expression_matches(expr, labels) for expr in expressions)


def _expression_matches(expr: LabelSelectorRequirement, labels: Labels) -> bool:
    key = expr.get("key", "")
    operator = expr.get("operator")
    values = expr.get("values") or []
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False  # an unknown operator selects nothing, as the API would refuse it


@dataclass(frozen=True, slots=True)
class PodIdentity:
    namespace: str
    name: str
    labels: Labels


def split_by_violation(
    pods: Sequence[PodIdentity], budgets: Sequence[Budget]
) -> tuple[list[int], list[int]]:
    """Positions of ``pods`` whose eviction would violate a budget, and of the others.

    kube-scheduler's ``filterPodsWithPDBViolation``: walk the pods in the given order,
    each one spending one allowed disruption of every budget that covers it; a pod that
    takes a budget below zero is violating.
    """
    allowed = [b.disruptions_allowed for b in budgets]
    violating: list[int] = []
    others: list[int] = []
    for position, pod in enumerate(pods):
        violates = False
        for index, budget in enumerate(budgets):
            if budget.covers(pod.namespace, pod.name, pod.labels):
                allowed[index] -= 1
                if allowed[index] < 0:
                    violates = True
        (violating if violates else others).append(position)
    return violating, others


def blocking_budgets(
    pods: Sequence[PodIdentity], budgets: Sequence[Budget]
) -> list[tuple[PodIdentity, Budget]]:
    """Each pod whose eviction a budget would refuse, with that budget (the first one it
    takes below zero), walking ``pods`` in order as ``split_by_violation`` does."""
    allowed = [b.disruptions_allowed for b in budgets]
    blocked: list[tuple[PodIdentity, Budget]] = []
    for pod in pods:
        first: Budget | None = None
        for index, budget in enumerate(budgets):
            if budget.covers(pod.namespace, pod.name, pod.labels):
                allowed[index] -= 1
                if allowed[index] < 0 and first is None:
                    first = budget
        if first is not None:
            blocked.append((pod, first))
    return blocked


def less_leaving(budgets: Sequence[Budget], leaving: Sequence[PodIdentity]) -> list[Budget]:
    """The budgets with the disruptions already spent by ``leaving`` (victims of
    preemptions under way): the Eviction API counts them once they go, but the status we
    read may not show it yet, and a second preemptor (a gang's next member, typically)
    would otherwise spend the same allowance again."""
    out: list[Budget] = []
    for budget in budgets:
        spent = sum(1 for pod in leaving if budget.covers(pod.namespace, pod.name, pod.labels))
        out.append(replace(budget, disruptions_allowed=budget.disruptions_allowed - spent))
    return out


def covered(pod: PodIdentity, budgets: Sequence[Budget]) -> bool:
    """Whether any budget counts an eviction of the pod (the Eviction API may refuse it)."""
    return any(b.covers(pod.namespace, pod.name, pod.labels) for b in budgets)
