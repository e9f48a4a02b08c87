"""Pair scores from PCIe levels and NVLink counts (hami-semantics §9)."""

from __future__ import annotations

import pytest

from vgpu_operator.devices import links

P2P = links.P2PLevel


@pytest.mark.parametrize(
    ("level", "score"),
    [
        pytest.param(P2P.UNKNOWN, 0, id="unknown"),
        pytest.param(P2P.CROSS_CPU, 10, id="cross-cpu"),
        pytest.param(P2P.SAME_CPU, 20, id="same-cpu"),
        pytest.param(P2P.HOST_BRIDGE, 30, id="host-bridge"),
        pytest.param(P2P.MULTI_SWITCH, 40, id="multi-switch"),
        pytest.param(P2P.SINGLE_SWITCH, 50, id="single-switch"),
        pytest.param(P2P.SAME_BOARD, 60, id="same-board"),
    ],
)
def test_level_score_is_hamis_points(level: links.P2PLevel, score: int) -> None:
    assert level.score == score


def test_level_values_travel_as_names() -> None:
    assert str(P2P.CROSS_CPU) == "CrossCPU"
    assert P2P("SameBoard") is P2P.SAME_BOARD


@pytest.mark.parametrize(
    ("nvml_level", "level"),
    [
        pytest.param(0, P2P.SAME_BOARD, id="internal"),
        pytest.param(10, P2P.SINGLE_SWITCH, id="single"),
        pytest.param(20, P2P.MULTI_SWITCH, id="multiple"),
        pytest.param(30, P2P.HOST_BRIDGE, id="hostbridge"),
        pytest.param(40, P2P.SAME_CPU, id="node"),
        pytest.param(50, P2P.CROSS_CPU, id="system"),
    ],
)
def test_nvml_common_ancestor_maps_to_level(nvml_level: int, level: links.P2PLevel) -> None:
    assert P2P.from_nvml_common_ancestor(nvml_level) is level


@pytest.mark.parametrize("nvml_level", [-1, 5, 60])
def test_undefined_nvml_level_is_rejected(nvml_level: int) -> None:
    with pytest.raises(ValueError, match="topology level"):
        P2P.from_nvml_common_ancestor(nvml_level)


@pytest.mark.parametrize(
    ("level", "nvlinks", "score"),
    [
        pytest.param(P2P.HOST_BRIDGE, 12, 1230, id="a100-pcie-12-link-bridge"),
        pytest.param(P2P.SAME_CPU, 18, 1820, id="nvswitch-same-socket"),
        pytest.param(P2P.CROSS_CPU, 18, 1810, id="nvswitch-cross-socket"),
        pytest.param(P2P.SAME_CPU, 0, 20, id="pcie-only"),
        pytest.param(P2P.UNKNOWN, 1, 100, id="one-link-no-pcie-level"),
        pytest.param(P2P.UNKNOWN, 0, 0, id="nothing-known"),
        pytest.param(P2P.SAME_BOARD, 19, 60, id="count-hami-cannot-name-adds-nothing"),
        pytest.param(P2P.SAME_BOARD, -1, 60, id="negative-count-adds-nothing"),
    ],
)
def test_pair_score_adds_pcie_and_nvlink_points(
    level: links.P2PLevel, nvlinks: int, score: int
) -> None:
    assert links.pair_score(level, nvlinks) == score


@pytest.mark.parametrize(
    ("level", "a_to_b", "b_to_a", "level_b_to_a", "score"),
    [
        pytest.param(P2P.HOST_BRIDGE, 12, 12, None, 1230, id="agreeing-directions"),
        pytest.param(P2P.HOST_BRIDGE, 12, 0, None, 0, id="nvlink-seen-one-way-only"),
        pytest.param(P2P.HOST_BRIDGE, 0, 4, None, 0, id="nvlink-seen-other-way-only"),
        pytest.param(P2P.HOST_BRIDGE, 12, 10, None, 1230, id="different-counts-keep-a-view"),
        pytest.param(P2P.SAME_CPU, 18, 18, P2P.UNKNOWN, 0, id="pcie-level-one-way-only"),
        pytest.param(P2P.SAME_CPU, 18, 19, None, 0, id="unnameable-count-one-way"),
        pytest.param(P2P.UNKNOWN, 0, 0, None, 0, id="no-links-either-way"),
    ],
)
def test_symmetric_pair_score_zeroes_inconsistent_pairs(
    level: links.P2PLevel,
    a_to_b: int,
    b_to_a: int,
    level_b_to_a: links.P2PLevel | None,
    score: int,
) -> None:
    assert links.symmetric_pair_score(level, a_to_b, b_to_a, level_b_to_a=level_b_to_a) == score


def test_build_pair_scores_covers_every_ordered_pair_in_order() -> None:
    uuids = ["GPU-a0", "GPU-a1", "GPU-a2"]
    p2p = {
        ("GPU-a0", "GPU-a1"): P2P.HOST_BRIDGE,
        ("GPU-a1", "GPU-a0"): P2P.HOST_BRIDGE,
        ("GPU-a0", "GPU-a2"): P2P.SAME_CPU,
        ("GPU-a2", "GPU-a0"): P2P.SAME_CPU,
    }
    nvlinks = {("GPU-a0", "GPU-a1"): 12, ("GPU-a1", "GPU-a0"): 12}

    scores = links.build_pair_scores(uuids, p2p, nvlinks)

    assert scores == {
        "GPU-a0": {"GPU-a1": 1230, "GPU-a2": 20},
        "GPU-a1": {"GPU-a0": 1230, "GPU-a2": 0},
        "GPU-a2": {"GPU-a0": 20, "GPU-a1": 0},
    }
    assert list(scores) == uuids
    assert list(scores["GPU-a1"]) == ["GPU-a0", "GPU-a2"]


def test_build_pair_scores_reads_a_pair_listed_once_both_ways() -> None:
    scores = links.build_pair_scores(["a", "b"], {("a", "b"): P2P.SINGLE_SWITCH}, {("b", "a"): 2})

    assert scores == {"a": {"b": 250}, "b": {"a": 250}}


def test_build_pair_scores_zeroes_a_pair_whose_directions_disagree() -> None:
    scores = links.build_pair_scores(
        ["a", "b"],
        {("a", "b"): P2P.SAME_CPU, ("b", "a"): P2P.SAME_CPU},
        {("a", "b"): 4, ("b", "a"): 0},
    )

    assert scores == {"a": {"b": 0}, "b": {"a": 0}}


def test_build_pair_scores_rejects_repeated_uuids() -> None:
    with pytest.raises(ValueError, match="repeat"):
        links.build_pair_scores(["a", "b", "a"], {}, {})
