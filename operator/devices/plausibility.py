"""What a card report may claim: bounds that no real card exceeds, even oversubscribed.

A report (a DeviceInventory, or HAMi's node register annotation) comes from a program
that may be buggy or hostile; a value past these bounds is refused rather than turned
into capacity the hardware does not have. The same numbers bound the CRD's schema.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from vgpu_operator.devices import model

#: 16 TiB: today's largest cards have under 200 GiB; memory scaling may multiply that.
MAX_MEMORY_MIB: Final = 16 * 1024 * 1024
#: 100 x core scaling; no deployment scales compute a hundredfold.
MAX_CORES: Final = 10_000
#: Tasks that may share one card (HAMi's deviceSplitCount).
MAX_SPLIT_COUNT: Final = 1024
#: Cards on one node (NVL72 racks report 72; room for more).
MAX_DEVICES: Final = 1024
#: MIG profiles a card publishes, and places per profile (NVIDIA's cards: under 20 and 8).
MAX_MIG_PROFILES: Final = 64
#: Memory slices of one card (NVIDIA's cards have 8).
MAX_MIG_SLICES: Final = 64


def card_problems(devices: Sequence[model.DeviceInfo]) -> list[str]:
    """Why these cards cannot be believed, card by card; empty when they are plausible."""
    problems: list[str] = []
    if len(devices) > MAX_DEVICES:
        problems.append(f"{len(devices)} cards on one node, more than {MAX_DEVICES}")
    seen: set[str] = set()
    for card in devices:
        if card.id in seen:
            problems.append(f"card {card.id} is listed twice")
        seen.add(card.id)
        if not 0 <= card.memory_mib <= MAX_MEMORY_MIB:
            problems.append(
                f"card {card.id}: memory {card.memory_mib} MiB is outside 0..{MAX_MEMORY_MIB}"
            )
        if not 0 <= card.cores <= MAX_CORES:
            problems.append(f"card {card.id}: cores {card.cores} is outside 0..{MAX_CORES}")
        if not 1 <= card.count <= MAX_SPLIT_COUNT:
            problems.append(
                f"card {card.id}: split count {card.count} is outside 1..{MAX_SPLIT_COUNT}"
            )
        problems.extend(_mig_profile_problems(card))
    return problems


def _mig_profile_problems(card: model.DeviceInfo) -> list[str]:
    """A published MIG profile must fit its card: no more memory or cores than the
    card has, at least one slice per place, every place within the card's slices, and
    one entry per profile name (a placement is named by the profile's entry)."""
    problems: list[str] = []
    if len(card.mig_profiles) > MAX_MIG_PROFILES:
        problems.append(f"card {card.id}: {len(card.mig_profiles)} MIG profiles")
    names: set[str] = set()
    for profile in card.mig_profiles:
        where = f"card {card.id}: MIG profile {profile.name!r}"
        if not profile.name or profile.name in names:
            problems.append(f"{where} is unnamed or listed twice")
        names.add(profile.name)
        if not 0 < profile.memory_mib <= card.memory_mib:
            problems.append(f"{where}: memory {profile.memory_mib} MiB is outside the card's")
        if not 0 <= profile.cores <= max(card.cores, 0):
            problems.append(f"{where}: cores {profile.cores} are outside the card's")
        if len(profile.placements) > MAX_MIG_PROFILES:
            problems.append(f"{where}: {len(profile.placements)} placements")
        for start, size in profile.placements:
            if size < 1 or start + size > MAX_MIG_SLICES:
                problems.append(f"{where}: placement ({start}, {size}) is not on a card")
    return problems
