"""Where the simulated machine's GPU instances sit on their card: NVML's placements (the
first memory slice and how many), as a real A100/H100 keeps them (pure).

A machine file may give an instance's ``placementStart``; one that gives none is placed
as NVML places an instance created without a placement: at the lowest start its profile
allows that overlaps no instance placed before it. ``nvmlDeviceCreateGpuInstance`` places
the same way; ``nvmlDeviceCreateGpuInstanceWithPlacement`` takes the start it is given if
the profile allows it there and no memory slice is taken.
"""

from __future__ import annotations

from collections.abc import Iterable

from vgpu_operator.devices import dra_mig

#: (start, size) in memory slices.
Placement = tuple[int, int]


def shape_of(profile: str) -> tuple[int, tuple[int, ...]] | None:
    """The profile's memory slices and allowed starts (``3g.20gb`` -> (4, (0, 4)))."""
    parsed = dra_mig.parse_profile(profile)
    return None if parsed is None else dra_mig.geometry_of(parsed[0])


def _taken(placed: Iterable[Placement]) -> set[int]:
    return {slot for start, size in placed for slot in range(start, start + size)}


def fits_at(profile: str, start: int, placed: Iterable[Placement]) -> bool:
    """Whether an instance of ``profile`` may be placed at ``start`` beside ``placed``."""
    shape = shape_of(profile)
    if shape is None or start not in shape[1]:
        return False
    return not _taken(placed) & set(range(start, start + shape[0]))


def first_start(profile: str, placed: Iterable[Placement]) -> int | None:
    """The lowest start the profile allows that overlaps nothing ``placed``; None: none."""
    shape = shape_of(profile)
    placed = list(placed)
    if shape is None:
        return None
    return next((s for s in shape[1] if fits_at(profile, s, placed)), None)


def size_of(profile: str) -> int:
    shape = shape_of(profile)
    return 0 if shape is None else shape[0]
