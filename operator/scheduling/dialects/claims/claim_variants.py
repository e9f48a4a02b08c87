"""A claim's prioritized alternatives (``firstAvailable``), in the order upstream tries them.

A request with ``firstAvailable`` lists alternatives (subrequests); the allocation names
the one chosen ``<request>/<subrequest>``. kube-scheduler's allocator walks the requests
in order and, for each, its alternatives in order, going back to the next alternative of
an earlier request only when no later request can be satisfied: the first combination
that fits, in lexicographic order of the alternatives' positions. ``variants`` lists the
claim as each such combination, one concrete claim per combination, in that order; the
Fit tries them in turn (``claim_fit``), the first that fits wins.

Constraints are resolved per combination, as upstream reads them: a constraint naming a
request covers whichever of its alternatives is chosen; one naming
``<request>/<subrequest>`` covers that alternative only when it is chosen (and nothing
otherwise); one naming no request covers every request.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

from vgpu_operator.scheduling.dialects.claims import claims

Constraint = tuple[tuple[str, ...], str]


def variants(claim: claims.Claim) -> list[claims.Claim]:
    """The claim as each combination of alternatives, in upstream's order: concrete
    requests only, constraints resolved. A claim without alternatives is its own only
    variant."""
    if not claim.choices:
        return [claim]
    out: list[claims.Claim] = []
    for combination in itertools.islice(itertools.product(*claim.choices), claims.MAX_VARIANTS):
        chosen = {r.name.split("/", 1)[0]: r.name for r in combination}
        out.append(
            dataclasses.replace(
                claim,
                requests=tuple(combination),
                choices=(),
                match_attributes=_resolve(claim.match_attributes, chosen),
                distinct_attributes=_resolve(claim.distinct_attributes, chosen),
            )
        )
    return out


def _resolve(constraints: Sequence[Constraint], chosen: dict[str, str]) -> tuple[Constraint, ...]:
    """The constraints over the chosen requests' names (``chosen``: request -> the name
    of its chosen alternative, itself for an ``exactly`` request)."""
    out: list[Constraint] = []
    for covered, attribute in constraints:
        if not covered:
            out.append(((), attribute))
            continue
        names = tuple(
            dict.fromkeys(
                chosen.get(name, name)
                for name in covered
                if name in chosen or name in chosen.values()
            )
        )
        if names:
            out.append((names, attribute))
    return tuple(out)
