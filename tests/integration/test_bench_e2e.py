"""The end-to-end bench, small and for correctness only (``make bench`` measures).

Twenty KWOK nodes of the bench's four machines, the operator as its own process, and
about two hundred pods of every kind the bench uses, placed next to each other: every pod
the cluster can hold is bound, the unfittable ones wait with a reason, and the recount
from the API server finds no card holding more than it has. No speed is asserted.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from vgpu_operator.testing.controlplane import Binaries, ControlPlane

_BENCH = str(Path(__file__).resolve().parents[1] / "bench")
if _BENCH not in sys.path:
    sys.path.append(_BENCH)

from e2e import main as bench_main  # noqa: E402  (needs the path above)


def test_small_bench_places_every_pod_and_overcommits_nothing(
    control_plane_binaries: Binaries, tmp_path: Path
) -> None:
    # Its own control plane: the operator runs with the default scheduler name and
    # would see the shared plane's other nodes.
    with ControlPlane(kwok=True, binaries=control_plane_binaries) as cp:
        results = asyncio.run(bench_main.small(cp, tmp_path))
    assert [r.name for r in results] == [
        "whole-backlog",
        "selected",
        "whole",
        "fractional",
        "multi",
        "unfit",
    ]
    for result in results:
        assert result.completed, result.name
        assert result.check_ok, f"{result.name}: {result.check}"
    by_name = {r.name: r for r in results}
    assert by_name["whole-backlog"].placed == 20
    assert by_name["whole"].placed == 40
    assert by_name["multi"].placed == 10
    assert by_name["unfit"].placed == 36
    assert by_name["unfit"].reasoned == 4
    # The last recount covers all of them at once: 196 bound, 4 waiting with a reason.
    assert by_name["unfit"].check.startswith("200 pods: 196 bound, 4 pending with a reason")
