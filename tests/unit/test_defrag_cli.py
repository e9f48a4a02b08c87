"""The command line of defragmentation: ``run --defrag`` and its options, and what
``defrag plan`` prints (the live cluster's listing is tested in tests/integration)."""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Iterator

import pytest
import structlog
from builders import cluster, make_node
from click.testing import CliRunner
from defrag_cases import running_pod, waiting_pod

from vgpu_operator import logging as vgpu_logging
from vgpu_operator import operator_cli
from vgpu_operator.control import snapshot
from vgpu_operator.control.options import DefragOptions, OperatorOptions
from vgpu_operator.handlers import runtime
from vgpu_operator.kube import client
from vgpu_operator.scheduling.defrag import defrag

GIB = 1024


def _options(monkeypatch: pytest.MonkeyPatch, *args: str) -> OperatorOptions:
    seen: list[OperatorOptions] = []
    monkeypatch.setattr(runtime, "run_forever", seen.append)
    monkeypatch.setattr(vgpu_logging, "configure", lambda *a, **k: "json")
    result = CliRunner().invoke(operator_cli.run, ["--standalone", *args])
    assert result.exit_code == 0, result.output
    return seen[0]


def test_defragmentation_is_off_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _options(monkeypatch).defrag is None


def test_defragmentation_options_reach_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    options = _options(
        monkeypatch,
        "--defrag",
        "--defrag-interval",
        "30",
        "--defrag-max-evictions",
        "2",
        "--defrag-allow-bare-pods",
        "--defrag-owner-kind",
        "example.com/Trainer",
        "--defrag-owner-kind",
        "LeaderWorkerSet",
        "--defrag-step-timeout",
        "90",
    )
    assert options.defrag == DefragOptions(
        interval_s=30.0,
        max_evictions=2,
        allow_bare_pods=True,
        owner_kinds=frozenset({"example.com/Trainer", "LeaderWorkerSet"}),
        step_timeout_s=90.0,
    )


def _report() -> defrag.Report:
    state = cluster(
        make_node("a").gpu("GPU-a0", memory_mib=16 * GIB).gpu("GPU-a1", memory_mib=16 * GIB),
        make_node("b").gpu("GPU-b0", memory_mib=16 * GIB),
        make_node("c").gpu("GPU-c0", memory_mib=16 * GIB).gpu("GPU-c1", memory_mib=16 * GIB),
    )
    daemon = ("apps/v1", "DaemonSet")
    pods = [
        running_pod("p10", "a", "GPU-a0", 10 * GIB),
        running_pod("p8", "a", "GPU-a1", 8 * GIB),
        running_pod("keeper", "b", "GPU-b0", 6 * GIB, priority=100),
        running_pod("d10", "c", "GPU-c0", 10 * GIB, owner=daemon),
        running_pod("d9", "c", "GPU-c1", 9 * GIB, owner=daemon),
    ]
    for pod in pods:
        state.set_pod(pod)
    # w first (higher priority); then x, whose only scattered room is on c, where
    # nothing may move.
    waiting = [waiting_pod("x", 12 * GIB, priority=-1), waiting_pod("w", 12 * GIB)]
    return defrag.plan(state, waiting, pods, 0.0)


def test_the_table_lists_each_plans_moves_in_order_and_the_pods_left_without() -> None:
    text = operator_cli.report_table(_report())
    lines = text.splitlines()
    assert lines[0] == (
        "Plan 1: default/w fits on a (GPU-a1) after 1 eviction, 8192 MiB moved (exact)"
    )
    assert lines[1].split() == [
        "STEP", "EVICT", "OWNER", "FROM", "FITS", "AGAIN", "ON", "MiB", "REPLACEMENT",
    ]  # fmt: skip
    assert lines[2].split() == [
        "1", "default/p8", "ReplicaSet/p8-owner", "a", "GPU-a1", "b", "GPU-b0", "8192",
        "while-terminating",
    ]  # fmt: skip
    assert "Waiting for scattered room, without a plan:" in lines
    assert any(line.startswith("  default/x: no plan of at most 3 evictions") for line in lines)


def test_json_is_what_simulate_prints() -> None:
    report = _report()
    out = json.loads(json.dumps(operator_cli.report_json(report)))
    assert out["fragmented"] == ["default/w", "default/x"]
    assert out["plans"] == [report.plans[0].to_json()]
    assert set(out["unplanned"]) == {"default/x"}


def test_an_empty_report_says_so() -> None:
    empty = defrag.Report((), (), {})
    assert operator_cli.report_table(empty) == "No pod is waiting for room scattered over cards."


@contextlib.asynccontextmanager
async def _no_api(_kubeconfig: object) -> AsyncIterator[None]:
    yield None


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """The CLI configures logging for the process: put back what the tests had."""
    saved = structlog.get_config()
    handlers, level = logging.root.handlers[:], logging.root.level
    yield
    structlog.configure(**saved)
    logging.root.handlers[:] = handlers
    logging.root.setLevel(level)


def test_plan_prints_only_json_on_stdout_whatever_reading_the_cluster_logs(
    monkeypatch: pytest.MonkeyPatch, logging_restored: None
) -> None:
    report = _report()

    class _Snapshot:
        def __init__(self) -> None:
            self.state = None
            self.pods: list[object] = []

        def waiting(self) -> list[object]:
            return []

    async def read_cluster(*_args: object, **_kwargs: object) -> _Snapshot:
        log = structlog.get_logger("vgpu_operator.test")
        log.warning("pod_allocation_not_booked", pod="default/evil")
        log.info("inventory_not_reported_yet", node="n")
        return _Snapshot()

    monkeypatch.setattr(client, "api_client", _no_api)
    monkeypatch.setattr(snapshot, "read_cluster", read_cluster)
    monkeypatch.setattr(defrag, "plan", lambda *_a, **_k: report)
    result = CliRunner().invoke(operator_cli.defrag_plan, ["-o", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == operator_cli.report_json(report)
    assert "pod_allocation_not_booked" in result.stderr
    assert "inventory_not_reported_yet" not in result.output
