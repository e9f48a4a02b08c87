"""Topology-aware card choice: the worst-linked single card, the best-linked k cards.

Given a node's candidate cards (in HAMi's scan order) and their pair scores
(``hami.io/node-nvidia-score``, hami-semantics §9), decides which cards a topology-aware
container gets. It does not decide which cards are candidates: ``Fit`` does that.

HAMi enumerates all C(n, k) combinations and keeps the first best one. We return the same
combination, tie-break included, without enumerating: a depth-first branch and bound over
the candidates in scan order, with two reductions that never change the answer.

- **Interchangeable cards.** Two candidates are interchangeable when they score the same
  to every other candidate (all cards behind one NVSwitch, the two cards of a bridged
  pair). Swapping one for the other keeps the score and, when the earlier card comes in,
  makes the combination sort earlier. So the answer takes a prefix of each class of
  interchangeable cards in scan order, and the search only ever extends a class by its
  next card. An NVL72 domain with all pairs equal is a single class and one path.
- **Bounds that respect the tie-break.** The search visits combinations in the order
  ``itertools.combinations`` does. A branch is cut when its upper bound is below the best
  score found, or equal to it while every combination in the branch sorts after the best
  one. A greedy start gives a good best score before the search begins.

Cost: building the score matrix is O(n²) look-ups; each search node costs O(classes).
Structured machines (NVSwitch islands, PCIe trees, NVL72 trays) take a few dozen nodes
(``tests/bench/bench_topology.py``). The problem is NP-hard, so scores without any
structure can still take exponential time; in practice far less than HAMi's scan.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Final, TypeAlias

from vgpu_operator.devices import model

#: card UUID -> peer UUID -> score of that ordered pair; a missing entry scores 0.
PairScores: TypeAlias = model.PairScores

_NO_SCORES: Final[Mapping[str, int]] = {}
#: Greedy starts tried at most (one per class, the most promising first).
_GREEDY_STARTS: Final = 16


def _check_distinct(candidates: Sequence[str]) -> None:
    if not candidates:
        raise ValueError("no candidate cards")
    if len(set(candidates)) != len(candidates):
        raise ValueError(f"candidate cards repeat: {list(candidates)}")


def _check_request(candidates: Sequence[str], k: int) -> None:
    _check_distinct(candidates)
    if k <= 0:
        raise ValueError(f"requested cards must be positive, got {k}")
    if k > len(candidates):
        raise ValueError(f"requested {k} cards from {len(candidates)} candidates")


def worst_single_card(candidates: Sequence[str], scores: PairScores) -> str:
    """The candidate with the lowest sum of scores to the other candidates.

    Keeps well-linked cards free for multi-card jobs. Ties go to the first candidate in
    scan order. Raises ``ValueError`` for no candidates or repeated ones.
    """
    _check_distinct(candidates)
    worst = candidates[0]
    worst_total: int | None = None
    for card in candidates:
        row = scores.get(card, _NO_SCORES)
        total = sum(row.get(other, 0) for other in candidates if other != card)
        if worst_total is None or total < worst_total:
            worst, worst_total = card, total
    return worst


def combination_score(cards: Sequence[str], scores: PairScores) -> int:
    """Sum over i < j of ``scores[cards[i]][cards[j]]``: HAMi's combination score."""
    total = 0
    for i, card in enumerate(cards):
        row = scores.get(card, _NO_SCORES)
        total += sum(row.get(other, 0) for other in cards[i + 1 :])
    return total


def exhaustive_best_combination(
    candidates: Sequence[str], scores: PairScores, k: int
) -> tuple[str, ...]:
    """The reference: HAMi's scan of every combination, first best kept.

    Exponential; kept for tests and as the definition ``best_combination`` must meet.
    """
    _check_request(candidates, k)
    best: tuple[str, ...] = ()
    best_score: int | None = None
    for combination in itertools.combinations(candidates, k):
        score = combination_score(combination, scores)
        if best_score is None or score > best_score:
            best, best_score = combination, score
    return best


def best_combination(candidates: Sequence[str], scores: PairScores, k: int) -> tuple[str, ...]:
    """The k candidates with the highest combination score, in scan order.

    Equal to ``exhaustive_best_combination`` (same cards, same tie-break: the first best
    combination in ``itertools.combinations`` order) without enumerating every
    combination. Raises ``ValueError`` when k is not in 1..len(candidates) or candidates
    repeat.
    """
    _check_request(candidates, k)
    if k == len(candidates):
        return tuple(candidates)
    weights = _pair_weights(candidates, scores)
    chosen = _Search(weights, _interchangeable_classes(weights), k).run()
    return tuple(candidates[i] for i in chosen)


def _pair_weights(candidates: Sequence[str], scores: PairScores) -> list[list[int]]:
    """Symmetric matrix of what each unordered pair adds: ``score[c_i][c_j]`` for i < j.

    Only the earlier card's map counts, as in HAMi's sum; the diagonal is 0.
    """
    n = len(candidates)
    weights = [[0] * n for _ in range(n)]
    for i, card in enumerate(candidates):
        row = scores.get(card, _NO_SCORES)
        if not row:
            continue
        weights_i = weights[i]
        for j in range(i + 1, n):
            value = row.get(candidates[j], 0)
            weights_i[j] = value
            weights[j][i] = value
    return weights


def _interchangeable(weights: list[list[int]], a: int, b: int) -> bool:
    """Whether a < b weigh the same to every card other than themselves."""
    row_a, row_b = weights[a], weights[b]
    return (
        row_a[:a] == row_b[:a]
        and row_a[a + 1 : b] == row_b[a + 1 : b]
        and row_a[b + 1 :] == row_b[b + 1 :]
    )


def _interchangeable_classes(weights: list[list[int]]) -> list[list[int]]:
    """Partition of the candidate indices into interchangeable classes.

    Each class lists its members in scan order; classes come in the order of their first
    member. Interchangeability is transitive (a~b and b~c give w(a,b) = w(c,b)), so
    comparing with a class's first member suffices. Interchangeable cards have the same
    multiset of weights, hence the same row sum (the diagonal is 0): the sum buckets the
    comparisons without sorting every row. Within a bucket the newest class is tried
    first: cards of one class tend to come together in scan order (an NVL72 tray, an
    NVSwitch island), so the first comparison usually matches.
    """
    buckets: dict[int, list[list[int]]] = {}
    classes: list[list[int]] = []
    for i, row in enumerate(weights):
        groups = buckets.setdefault(sum(row), [])
        for members in reversed(groups):
            if _interchangeable(weights, members[0], i):
                members.append(i)
                break
        else:
            groups.append([i])
            classes.append(groups[-1])
    return classes


class _Search:
    """Branch and bound over candidate indices, visiting combinations in lexicographic order.

    State: ``chosen`` (ascending indices), ``taken[c]`` (how many of class c are chosen,
    always its first members), ``gain[c]`` (what the next member of class c would add: its
    weights to the chosen cards, the same for every unchosen member of c).

    Bound for adding r cards B to the chosen ones: ``sum over b in B of gain(b)`` plus the
    weights among B, which are at most half of what each b could have with r - 1 other
    cards. A quick bound takes those r - 1 from b's whole row; when it does not cut, a
    tighter one takes them from the cards still open in this branch. Values are doubled
    so that the halves stay integers.
    """

    def __init__(self, weights: list[list[int]], classes: list[list[int]], k: int) -> None:
        self.k = k
        self.members = classes
        self.class_of = [0] * len(weights)
        for c, members in enumerate(classes):
            for i in members:
                self.class_of[i] = c
        # Weight between a member of c and a member of d; for d == c, between two members.
        self.class_weights = [
            [_class_weight(weights, classes, c, d) for d in range(len(classes))]
            for c in range(len(classes))
        ]
        # row_top_sums[c][m]: the m largest weights of a member of c to any other card.
        self.row_top_sums: list[list[int]] = []
        for members in classes:
            first = members[0]
            row = sorted(weights[first][:first] + weights[first][first + 1 :], reverse=True)
            self.row_top_sums.append([0, *itertools.accumulate(row[: k - 1])])
        # partners[c]: (weight, d) for every class d, heaviest first.
        self.partners = [
            sorted(((weight, d) for d, weight in enumerate(row)), reverse=True)
            for row in self.class_weights
        ]
        self.taken = [0] * len(classes)
        self.gain = [0] * len(classes)
        self.chosen: list[int] = []
        self.best: tuple[int, ...] = ()
        self.best_score = 0

    def run(self) -> tuple[int, ...]:
        """The first best combination, as ascending candidate indices."""
        self.best, self.best_score = self._greedy_incumbent()
        self._extend(-1, 0)
        return self.best

    def _greedy_incumbent(self) -> tuple[tuple[int, ...], int]:
        """A good combination to start from: grow from one class by the largest gain.

        Tries the most promising classes as seeds; ties in gain go to the earliest card,
        and the result obeys the prefix rule like every combination the search visits.
        """
        k, members, class_weights = self.k, self.members, self.class_weights
        classes = range(len(members))
        seeds = sorted(classes, key=lambda c: (-self.row_top_sums[c][-1], members[c][0]))
        results = []
        for seed in seeds[:_GREEDY_STARTS]:
            taken = [0] * len(members)
            gain = [0] * len(members)
            score = 0
            pick = seed
            for picked in range(1, k + 1):
                score += gain[pick]
                taken[pick] += 1
                for d, weight in enumerate(class_weights[pick]):
                    gain[d] += weight
                if picked == k:
                    break
                # k < number of candidates, so some class always has a free member.
                pick = max(
                    (d for d in classes if taken[d] < len(members[d])),
                    key=lambda d: (gain[d], -members[d][taken[d]]),
                )
            combination = tuple(sorted(i for c in classes for i in members[c][: taken[c]]))
            results.append((-score, combination))
        negated_score, best = min(results)
        return best, -negated_score

    def _extend(self, last: int, partial: int) -> None:
        """Search every completion of ``chosen`` (score ``partial``, largest index ``last``)."""
        chosen = self.chosen
        remaining = self.k - len(chosen)
        if remaining == 0:
            if partial > self.best_score or (
                partial == self.best_score and tuple(chosen) < self.best
            ):
                self.best, self.best_score = tuple(chosen), partial
            return
        # A class is open when its next member comes after `last`. A class whose next
        # member lies before `last` was skipped there and stays closed (prefix rule).
        members, taken, gain = self.members, self.taken, self.gain
        free = [0] * len(members)
        open_classes: list[int] = []
        for c, class_members in enumerate(members):
            if taken[c] < len(class_members) and class_members[taken[c]] > last:
                free[c] = len(class_members) - taken[c]
                open_classes.append(c)
        if sum(free) < remaining:
            return
        best_doubled = 2 * self.best_score
        quick = [(2 * gain[c] + self.row_top_sums[c][remaining - 1], free[c]) for c in open_classes]
        bound = _doubled_bound(partial, quick, remaining)
        if bound >= best_doubled and remaining > 1:
            tight = [
                (2 * gain[c] + self._open_pair_sum(c, free, remaining - 1), free[c])
                for c in open_classes
            ]
            bound = _doubled_bound(partial, tight, remaining)
        # Equal to the best is still worth a look while the branch could sort first.
        if bound < best_doubled or (bound == best_doubled and self._sorts_after_best(last)):
            return
        class_of, class_weights = self.class_of, self.class_weights
        for index in sorted(members[c][taken[c]] for c in open_classes):
            c = class_of[index]
            added = gain[c]
            chosen.append(index)
            taken[c] += 1
            row = class_weights[c]
            for d, weight in enumerate(row):
                gain[d] += weight
            self._extend(index, partial + added)
            for d, weight in enumerate(row):
                gain[d] -= weight
            taken[c] -= 1
            chosen.pop()

    def _open_pair_sum(self, c: int, free: list[int], count: int) -> int:
        """The ``count`` largest weights from a member of c to other free, open cards."""
        total = 0
        for weight, d in self.partners[c]:
            others = free[d] - 1 if d == c else free[d]
            if others <= 0:
                continue
            if others >= count:
                return total + weight * count
            total += weight * others
            count -= others
        return total

    def _sorts_after_best(self, last: int) -> bool:
        """Whether every completion of ``chosen`` sorts after the best combination.

        Indices up to ``last`` are decided. The smallest decided index in exactly one of
        ``chosen`` and the best combination settles the order: the side holding it sorts
        first. With no such index the branch may still hold an earlier combination.
        """
        chosen = self.chosen
        for position, index in enumerate(self.best):
            if index > last:
                break
            if position >= len(chosen):
                return True
            if chosen[position] != index:
                return index < chosen[position]
        return False


def _class_weight(weights: list[list[int]], classes: list[list[int]], c: int, d: int) -> int:
    """Weight between a member of class c and a different member of class d (c == d allowed).

    Constant over the members: interchangeable cards weigh the same to everyone else,
    and within a class of three or more every pair weighs the same.
    """
    if c != d:
        return weights[classes[c][0]][classes[d][0]]
    members = classes[c]
    return weights[members[0]][members[1]] if len(members) > 1 else 0


def _doubled_bound(partial: int, options: list[tuple[int, int]], remaining: int) -> int:
    """Twice the best score reachable: ``remaining`` picks of (doubled value, free count)."""
    bound = 2 * partial
    for value, free in sorted(options, reverse=True):
        use = min(free, remaining)
        bound += value * use
        remaining -= use
        if remaining == 0:
            break
    return bound
