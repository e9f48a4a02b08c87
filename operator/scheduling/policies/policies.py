"""Card and node scores and the card order that GPU policies impose (hami-semantics §8)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from vgpu_operator import names

# The vocabulary lives in config (the ConfigMap validates with it); re-exported for the engine.
from vgpu_operator.config import BINPACK as BINPACK
from vgpu_operator.config import FRAGMENTATION as FRAGMENTATION
from vgpu_operator.config import MUTEX as MUTEX
from vgpu_operator.config import NUMA as NUMA
from vgpu_operator.config import SPREAD as SPREAD
from vgpu_operator.config import TOPOLOGY as TOPOLOGY
from vgpu_operator.config import parse_gpu_policy
from vgpu_operator.devices import model
from vgpu_operator.errors import CodecError


@dataclass(frozen=True, slots=True)
class ScoringWeights:
    """``hami.io/device-scoring-weights``: how much slots, cores and memory weigh."""

    slot: int = 1
    core: int = 1
    memory: int = 1


DEFAULT_WEIGHTS: Final = ScoringWeights()

#: The largest weight admitted. Only the ratios between weights matter, so a million to
#: one is finer than any policy needs, while a score stays a float (a 400-digit weight
#: overflowed the float division and failed every decision for the pod).
MAX_SCORING_WEIGHT: Final = 1_000_000


def parse_scoring_weights(value: str | None) -> ScoringWeights:
    """Exactly ``slot=..,core=..,memory=..`` once each, integers from 0 to
    ``MAX_SCORING_WEIGHT``, not all zero."""
    if value is None:
        return DEFAULT_WEIGHTS
    field = names.DEVICE_SCORING_WEIGHTS
    entries = value.split(",")
    if len(entries) != 3:
        raise CodecError(field, "expected three entries slot=N,core=N,memory=N", value)
    parsed: dict[str, int] = {}
    for entry in entries:
        key, sep, number = entry.partition("=")
        key = key.strip()
        if not sep or key not in ("slot", "core", "memory") or key in parsed:
            raise CodecError(field, f"bad or repeated entry {entry.strip()!r}", value)
        digits = number.strip()
        allowed = f"each weight must be an integer from 0 to {MAX_SCORING_WEIGHT}"
        if digits.startswith("-") and digits[1:].isdigit():
            raise CodecError(field, f"weight of {key} is negative; {allowed}", value)
        # ASCII digits only: int() would also take "1_000", "+1" and other scripts' digits.
        if not (digits.isascii() and digits.isdigit()):
            raise CodecError(field, f"weight of {key} is not an integer; {allowed}", value)
        if len(digits.lstrip("0")) > len(str(MAX_SCORING_WEIGHT)) or (
            int(digits) > MAX_SCORING_WEIGHT
        ):
            raise CodecError(field, f"weight of {key} is too large; {allowed}", value)
        weight = int(digits)
        parsed[key] = weight
    if not any(parsed.values()):
        raise CodecError(field, "at least one weight must be positive", value)
    return ScoringWeights(parsed["slot"], parsed["core"], parsed["memory"])


def card_score(
    card: model.DeviceUsage,
    requests: Sequence[model.ContainerRequest],
    weights: ScoringWeights = DEFAULT_WEIGHTS,
) -> float:
    """HAMi's ComputeScore: usage (plus requests of the same *type*) over capacity.

    The request terms only count when a request's type equals the card's type, which
    for real cards (type = model name, request type = vendor word) never happens: the
    score is in practice the card's existing usage, exactly as in HAMi.
    """
    if card.count == 0 or card.total_cores == 0 or card.total_memory_mib == 0:
        return 0.0
    # The parser refuses larger weights; bounded here too so that no weights object,
    # however built, can make a decision raise (an unbounded int overflows the float).
    slot_w, core_w, memory_w = (
        min(max(w, 0), MAX_SCORING_WEIGHT) for w in (weights.slot, weights.core, weights.memory)
    )
    request = core = memory = 0
    for req in requests:
        if req.vendor != card.type:
            continue
        request += 1
        core += req.cores
        if req.memory_percent not in (0, model.MEMORY_PERCENT_UNSET):
            memory += card.total_memory_mib * req.memory_percent // 100
        else:
            memory += req.memory_mib
    return 10 * (
        slot_w * (request + card.used) / card.count
        + core_w * (core + card.used_cores) / card.total_cores
        + memory_w * (memory + card.used_memory_mib) / card.total_memory_mib
    )


SortKey = Callable[[model.DeviceUsage], tuple[float, ...]]


def card_sort_key(policy: str, numa_bind: bool, scores: Mapping[str, float]) -> SortKey:
    """The ascending sort key equivalent to HAMi's ``DeviceUsageList.Less``.

    Fit scans the sorted list from its end, so the card that sorts last is tried first.
    Python's sort is stable, so full ties keep the previous order, as Go's insertion
    sort does on nodes of up to 12 cards.
    """
    tokens = parse_gpu_policy(policy) if policy else ()
    if not is_chain(policy):
        single = tokens[0] if tokens else SPREAD
        if single == MUTEX:
            return lambda d: (-d.used, d.numa)
        if single == FRAGMENTATION:
            # Scores are minus each card's rise in fragmentation (``fragmentation``): the
            # least rise sorts last, tried first; ties go to the lower index.
            if numa_bind:
                return lambda d: (-d.numa, scores[d.id], -d.index)
            return lambda d: (scores[d.id], -d.index)
        if single == BINPACK:
            if numa_bind:
                return lambda d: (-d.numa, scores[d.id])
            return lambda d: (scores[d.id], d.numa)
        if numa_bind:
            return lambda d: (d.numa, -scores[d.id])
        return lambda d: (-scores[d.id], d.numa)
    chain: list[str] = []
    for token in tokens:
        if token in (BINPACK, SPREAD, NUMA) and token not in chain:
            chain.append(token)
    if not chain:
        chain = [SPREAD]
    if numa_bind and chain[0] != NUMA:
        # numa-bind needs each NUMA group contiguous (Fit gathers one group at a time),
        # so NUMA leads whether or not the chain names it, as in HAMi v2.10.
        chain = [NUMA, *(t for t in chain if t != NUMA)]

    def chained(d: model.DeviceUsage) -> tuple[float, ...]:
        key: list[float] = []
        for token in chain:
            if token == BINPACK:
                key.append(scores[d.id])
            elif token == SPREAD:
                key.append(-scores[d.id])
            else:
                key.append(d.numa)
        key.append(d.index)
        return tuple(key)

    return chained


def is_chain(policy: str) -> bool:
    """Whether HAMi v2.10 reads the policy as a chain of sort keys (a comma list, or
    bare ``numa``) rather than as one name: the two sort differently (a chain breaks
    ties on the card index and, under numa-bind, puts the lowest NUMA node last)."""
    return "," in policy or policy.strip() == NUMA


def normalize_gpu_policy(value: str) -> str:
    """A pod's policy as HAMi reads it: unknown single names sort like ``spread``, and
    unknown tokens of a comma chain are dropped. A chain stays a chain (a trailing comma
    marks one that keeps a single known token, or none: ``binpack,best-fit`` ->
    ``binpack,``), because HAMi sorts by the comma, not by how many names it knows."""
    tokens = [t.strip() for t in value.split(",") if t.strip()]
    known = [t for t in tokens if t in (BINPACK, SPREAD, TOPOLOGY, MUTEX, NUMA, FRAGMENTATION)]
    if "," not in value:
        return known[0] if known else SPREAD
    joined = ",".join(known)
    return joined if len(known) > 1 else f"{joined},"


def policy_has(policy: str, token: str) -> bool:
    return token in parse_gpu_policy(policy) if policy else False


def node_score(cards: Sequence[model.DeviceUsage]) -> float:
    """HAMi's ComputeDefaultScore: slots, cores and memory used over totals, times 10."""
    used = count = used_cores = total_cores = used_mem = total_mem = 0
    for card in cards:
        used += card.used
        count += card.count
        used_cores += card.used_cores
        total_cores += card.total_cores
        used_mem += card.used_memory_mib
        total_mem += card.total_memory_mib
    return score_from_sums(used, count, used_cores, total_cores, used_mem, total_mem)


#: The highest node score: slots, cores and memory all fully used.
NODE_SCORE_MAX: Final = 30.0


def node_preference(score: float, policy: str) -> float:
    """How much a node wants the next pod under its own node policy; higher is better.

    binpack prefers full nodes (the score itself), spread empty ones (what is left to
    the maximum), so nodes with different policies compare on one 0..30 scale: a
    binpack node 2/3 full weighs as much as a spread node 1/3 full. A node annotated
    ``fragmentation`` ranks as binpack here (the fragmentation walk itself is chosen by
    the pod's or the ConfigMap's node policy: ``fragmentation_order``).
    """
    return score if policy in (BINPACK, FRAGMENTATION) else NODE_SCORE_MAX - score


def score_from_sums(
    used: int, count: int, used_cores: int, total_cores: int, used_mem: int, total_mem: int
) -> float:
    """HAMi's ComputeDefaultScore over a node's sums: 0 when any total is 0."""
    if not count or not total_cores or not total_mem:
        return 0.0
    return 10 * (used / count + used_cores / total_cores + used_mem / total_mem)
