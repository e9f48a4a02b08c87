"""How well two GPUs of one node talk to each other, as HAMi scores it.

The node agent reads the PCIe common ancestor and the NVLink count of every ordered GPU
pair from NVML and turns them into the pair scores of ``hami.io/node-nvidia-score``
(hami-semantics §4.1, §9). The scheduler only ever sees those scores. This module is the
shared vocabulary: the PCIe levels, their points, and the pair-score rules. It talks to
no library; the NVML level numbers are written out here so that the agent can convert
without this module importing pynvml.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Final

#: HAMi names link counts one to eighteen; any other count adds no NVLink entry.
MAX_NVLINKS: Final = 18
#: Points per NVLink between the two GPUs.
NVLINK_POINTS: Final = 100


class P2PLevel(enum.StrEnum):
    """The closest PCIe common ancestor of two GPUs (HAMi's ``P2PLink*`` names)."""

    UNKNOWN = "Unknown"
    CROSS_CPU = "CrossCPU"
    SAME_CPU = "SameCPU"
    HOST_BRIDGE = "HostBridge"
    MULTI_SWITCH = "MultiSwitch"
    SINGLE_SWITCH = "SingleSwitch"
    SAME_BOARD = "SameBoard"

    @property
    def score(self) -> int:
        """The level's share of a pair score: closer ancestors score higher."""
        return _LEVEL_SCORES[self]

    @classmethod
    def from_nvml_common_ancestor(cls, level: int) -> P2PLevel:
        """Map an ``nvmlGpuTopologyLevel_t`` value to its level.

        Raises ``ValueError`` for a value NVML does not define, as HAMi's plugin fails
        on one instead of guessing.
        """
        try:
            return _NVML_ANCESTOR_LEVELS[level]
        except KeyError:
            raise ValueError(f"unknown NVML topology level {level}") from None


_LEVEL_SCORES: Final[Mapping[P2PLevel, int]] = {
    P2PLevel.UNKNOWN: 0,
    P2PLevel.CROSS_CPU: 10,
    P2PLevel.SAME_CPU: 20,
    P2PLevel.HOST_BRIDGE: 30,
    P2PLevel.MULTI_SWITCH: 40,
    P2PLevel.SINGLE_SWITCH: 50,
    P2PLevel.SAME_BOARD: 60,
}

# nvmlGpuTopologyLevel_t: INTERNAL 0, SINGLE 10, MULTIPLE 20, HOSTBRIDGE 30,
# NODE 40 (formerly CPU), SYSTEM 50.
_NVML_ANCESTOR_LEVELS: Final[Mapping[int, P2PLevel]] = {
    0: P2PLevel.SAME_BOARD,
    10: P2PLevel.SINGLE_SWITCH,
    20: P2PLevel.MULTI_SWITCH,
    30: P2PLevel.HOST_BRIDGE,
    40: P2PLevel.SAME_CPU,
    50: P2PLevel.CROSS_CPU,
}


def nvlink_points(nvlinks: int) -> int:
    """Points for ``nvlinks`` links: 100 each, nothing outside HAMi's 1..18 range."""
    if 1 <= nvlinks <= MAX_NVLINKS:
        return NVLINK_POINTS * nvlinks
    return 0


def pair_score(p2p: P2PLevel, nvlinks: int) -> int:
    """Score of the ordered pair (a, b) seen from a: PCIe points plus NVLink points.

    Example: two A100 PCIe under one host bridge with a 12-link bridge score
    30 + 1200 = 1230.
    """
    return p2p.score + nvlink_points(nvlinks)


def _link_entries(level: P2PLevel, nvlinks: int) -> int:
    # HAMi keeps a list of link entries per direction: one for a known PCIe level and
    # one for an NVLink count it can name.
    return (level is not P2PLevel.UNKNOWN) + (1 <= nvlinks <= MAX_NVLINKS)


def symmetric_pair_score(
    level: P2PLevel,
    links_a_to_b: int,
    links_b_to_a: int,
    *,
    level_b_to_a: P2PLevel | None = None,
) -> int:
    """Score of (a, b) with HAMi's consistency rule applied.

    HAMi scores a pair 0 (and logs an error) when the two directions do not report the
    same number of link entries, e.g. NVLinks seen from a but not from b. It compares
    the number of entries, not the NVLink counts: 12 links one way and 10 the other
    still scores a's view. ``level_b_to_a`` defaults to ``level`` (NVML's common
    ancestor is symmetric).
    """
    reverse_level = level if level_b_to_a is None else level_b_to_a
    if _link_entries(level, links_a_to_b) != _link_entries(reverse_level, links_b_to_a):
        return 0
    return pair_score(level, links_a_to_b)


def build_pair_scores(
    uuids: Sequence[str],
    p2p: Mapping[tuple[str, str], P2PLevel],
    nvlinks: Mapping[tuple[str, str], int],
) -> dict[str, dict[str, int]]:
    """Every GPU's scores to every other GPU, in ``uuids`` order, ready to encode.

    ``p2p`` and ``nvlinks`` are keyed by ordered (a, b) pairs. A pair listed in one
    direction only counts the same in both (one physical link); a pair absent in both
    directions is ``UNKNOWN`` with no NVLink. Raises ``ValueError`` on repeated UUIDs,
    which would make the per-GPU maps ambiguous.
    """
    if len(set(uuids)) != len(uuids):
        raise ValueError(f"GPU UUIDs repeat: {list(uuids)}")
    scores: dict[str, dict[str, int]] = {}
    for a in uuids:
        row: dict[str, int] = {}
        for b in uuids:
            if a == b:
                continue
            level_ab = p2p.get((a, b), p2p.get((b, a), P2PLevel.UNKNOWN))
            level_ba = p2p.get((b, a), level_ab)
            links_ab = nvlinks.get((a, b), nvlinks.get((b, a), 0))
            links_ba = nvlinks.get((b, a), links_ab)
            row[b] = symmetric_pair_score(level_ab, links_ab, links_ba, level_b_to_a=level_ba)
        scores[a] = row
    return scores
