"""The one node walk of every dialect, and the diagnosis of the nodes it did not fit.

The walk visits the nodes in the order the dialect gives (``Plugin.order``: its ranking,
without the nodes an O(1) rule-out excludes, unless a verdict judges them), skips those a
verdict's groups or card classes rule out (into ``judged``), fits the others with the
dialect's fit (``Plugin.fit``: the one fit, which trials, verdicts and the diagnosis call
too) and stops at the first node that fits and settles (``Plugin.settles``: the claims
dialect looks on for linked cards), else keeps the first that fitted. Every fit that
failed goes into ``tried``, so that the diagnosis does not fit those nodes again. With
``scores`` (``simulate``'s explanation) it visits every node of the order and notes the
score of each that fits.

A fit that fails with an error (a claim's CEL selector failing at run time, or its
verdicts still being computed) ends the walk: the whole attempt fails (``Unfit``), as
kube-scheduler's does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from vgpu_operator.scheduling.books.entries import NodeEntry
from vgpu_operator.scheduling.books.view import BooksView
from vgpu_operator.scheduling.cycle.plugin import Fit, Plugin
from vgpu_operator.scheduling.cycle.verdicts import failure_of
from vgpu_operator.scheduling.status import Diagnosis, NodeFailure

R = TypeVar("R")
F = TypeVar("F", bound=Fit)

#: A verdict's judgement of a node by card classes (None: it may fit: fit it in full).
Judge = Callable[[str], NodeFailure | None]


class Unfit(Exception):
    """A fit failed with an error: the attempt fails with it (the message)."""


def find(
    plugin: Plugin[R, F],
    request: R,
    now: float,
    tried: dict[str, F],
    only: set[str] | None = None,
    judge: Judge | None = None,
    judged: dict[str, NodeFailure] | None = None,
    scores: dict[str, float] | None = None,
) -> tuple[NodeEntry, F] | None:
    """The node the pod goes to, with its fit (see the module docstring). ``only``: the
    nodes that may fit (a verdict's changed nodes: every other is known to rule the pod
    out); ``judge`` and ``judged``: a verdict's judgement by card classes, and where its
    failures go. Raises ``Unfit``."""
    found: tuple[NodeEntry, F] | None = None
    settled = False
    # A node the judge rules out goes into ``judged`` (its group's or its card classes'
    # judgement, kept per node change), where a node the O(1) rule-out left out would be
    # judged again by the verdict's refresh: with a judge, the order leaves nodes out only
    # while a fit may be near (``AnnotationPlugin.order``).
    by_classes = judge is not None and judged is not None
    for node in plugin.order(request, only, rule_out=not by_classes):
        name = node.name
        if by_classes:
            assert judge is not None
            assert judged is not None
            failure = judge(name)
            if failure is not None:
                judged[name] = failure
                continue
        fit = plugin.fit(node, request, now)
        if fit.error is not None:
            raise Unfit(fit.error)
        if not fit.ok:
            tried[name] = fit
            continue
        if scores is not None:
            scores[name] = node.score
        settles = plugin.settles(node, request, fit)
        if found is None or (settles and not settled):
            found, settled = (node, fit), settles
        if settled and scores is None:
            break
    return found


def in_node_order(view: BooksView, scores: Mapping[str, float]) -> dict[str, float]:
    """Candidate nodes' scores in the order the books met the nodes (``simulate``'s)."""
    nodes = view.nodes
    return {name: scores[name] for name in sorted(scores, key=lambda n: nodes[n].order)}


def diagnose(
    view: BooksView,
    plugin: Plugin[R, F],
    request: R,
    now: float,
    tried: Mapping[str, F],
    judged: Mapping[str, NodeFailure] | None = None,
) -> Diagnosis:
    """Per node, why the pod does not fit: the walk's failed fits (``tried``) and
    judgements (``judged``, made at this moment of the books), the dialect's judgement of
    every other node."""
    failures: dict[str, NodeFailure] = {}
    known = judged or {}
    #: One entry per fit object: nodes judged alike by their class share their fit.
    made: dict[int, NodeFailure] = {}
    for name in view.nodes:
        fit = tried.get(name)
        if fit is not None:
            failure = made.get(id(fit))
            if failure is None:
                failure = made[id(fit)] = failure_of(fit)
            failures[name] = failure
            continue
        failure = known.get(name) or plugin.judge(name, request, now)
        if failure is not None:
            failures[name] = failure
    return Diagnosis(failures, len(view.nodes))
