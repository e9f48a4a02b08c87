"""The demo from start to finish: control plane, nodes, operator, examples, story, result."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import click

from vgpu_operator import node_leases
from vgpu_operator.demo.dra_claim import run_dra_claim
from vgpu_operator.demo.manifests import (
    PREEMPTION_DIR,
    Manifest,
    apply_manifest,
    default_examples_dir,
    example_files,
    load_manifests,
    story_files,
)
from vgpu_operator.demo.nodes import (
    DEMO_NODES,
    AgentFleet,
    CardFacts,
    DemoNode,
    MachineSummary,
    cards_from_inventories,
    create_nodes,
    install_crd,
    wait_for_inventories,
)
from vgpu_operator.demo.operator_process import OperatorProcess
from vgpu_operator.demo.render import render_nodes, render_result
from vgpu_operator.demo.result import (
    DemoResult,
    collect_result,
    read_preempted,
    read_snapshot,
    wait_for_allocations,
    wait_for_decisions,
)
from vgpu_operator.demo.settings import DEFAULT_TIMEOUT_S, DemoError, Say
from vgpu_operator.testing.controlplane import (
    Binaries,
    BinariesNotFoundError,
    ControlPlane,
    ControlPlaneError,
)


class _Clock:
    """Seconds per phase, for the closing line."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self._mark = self.started
        self.phases: dict[str, float] = {}

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self.phases[phase] = round(now - self._mark, 1)
        self._mark = now

    @property
    def total_s(self) -> float:
        return round(time.monotonic() - self.started, 1)


def play_story(
    cp: ControlPlane,
    steps: Sequence[Sequence[Manifest]],
    operator: OperatorProcess,
    timeout_s: float,
) -> list[str]:
    """Apply each step's objects, then wait until its pods are decided before the next
    step (so the batch job runs before the urgent pod arrives); the pods' keys."""
    keys: list[str] = []
    for step in steps:
        step_keys = []
        for manifest in step:
            apply_manifest(cp, manifest)
            if manifest.kind == "Pod":
                step_keys.append(f"{manifest.namespace}/{manifest.name}")
        wait_for_decisions(cp, step_keys, operator, timeout_s)
        keys += step_keys
    return keys


@contextlib.contextmanager
def _running_operator(
    cp: ControlPlane, say: Say, startup_timeout_s: float
) -> Iterator[OperatorProcess]:
    operator = OperatorProcess(cp.kubeconfig_path, cp.log_path("operator"), cp.env())
    operator.start()
    try:
        operator.wait_ready(startup_timeout_s)
        yield operator
    finally:
        status = operator.stop()
        if status not in (None, 0, -signal.SIGTERM):
            say(f"the operator exited with status {status} (log: {operator.log_path})")


def _wait_for_interrupt(cp: ControlPlane, operator: OperatorProcess, say: Say) -> None:
    say("")
    say("The cluster keeps running. Try:")
    say(f"  export KUBECONFIG={cp.kubeconfig_path}")
    say("  kubectl get pods -A -o wide; kubectl get deviceinventories")
    say(f"Operator log: {operator.log_path}")
    say("Press Ctrl-C to stop.")
    with contextlib.suppress(KeyboardInterrupt):
        while cp.running:
            operator.check_alive()
            time.sleep(1)


def _read_examples(source: Path) -> tuple[list[Manifest], list[Manifest], list[list[Manifest]]]:
    """The setup (the device config), the examples and the preemption story's steps,
    every kind checked before anything starts."""
    config_file, files = example_files(source)
    if not files:
        raise DemoError(f"no *.yaml manifests in {source}")
    setup = load_manifests(config_file) if config_file is not None else []
    examples = [m for path in files for m in load_manifests(path)]
    story = [load_manifests(path) for path in story_files(source)]
    for manifest in (*setup, *examples, *(m for step in story for m in step)):
        manifest.collection_path()  # refuse an unsupported kind before starting anything
    return setup, examples, story


@dataclasses.dataclass(frozen=True)
class _Examples:
    source: Path
    examples: Sequence[Manifest]
    story: Sequence[Sequence[Manifest]]


def _decide_examples(
    cp: ControlPlane,
    operator: OperatorProcess,
    given: _Examples,
    fleet: AgentFleet,
    cards: Mapping[str, CardFacts],
    clock: _Clock,
    say: Say,
    timeout_s: float,
) -> DemoResult:
    """Apply the examples one pod at a time, play the preemption story, and read what
    the operator decided (the pods preempted, the containers' settings, what waits)."""
    source, examples, story = given.source, given.examples, given.story
    keys = []
    say(f"applying {len(examples)} objects from {source}, each pod once the")
    say("previous one is decided (so the table reads the same on every run)...")
    for manifest in examples:
        apply_manifest(cp, manifest)
        if manifest.kind == "Pod":
            keys.append(f"{manifest.namespace}/{manifest.name}")
            wait_for_decisions(cp, keys[-1:], operator, timeout_s)
    snapshot = wait_for_decisions(cp, keys, operator, timeout_s)
    clock.lap("scheduling")
    if story:
        say(f"preemption: {len(story)} steps from {source / PREEMPTION_DIR}...")
        keys += play_story(cp, story, operator, timeout_s)
        clock.lap("preemption")
    preempted = read_preempted(cp, [key.split("/", 1)[0] for key in keys])
    gone = {f"{p.namespace}/{p.name}" for p in preempted}
    keys = [key for key in keys if key not in gone]
    unsettled = wait_for_allocations(cp, keys, operator, timeout_s=20)
    snapshot = read_snapshot(cp, keys)
    result = collect_result(keys, snapshot, cards, clock.phases)
    containers = tuple(s for s in fleet.container_settings() if s.pod in set(keys))
    result = dataclasses.replace(
        result,
        preempted=preempted,
        containers=containers,
        unsettled=tuple(unsettled),
    )
    return result


def _cards_reported(
    cp: ControlPlane, machines: Mapping[str, MachineSummary], fleet: AgentFleet, say: Say
) -> dict[str, CardFacts]:
    """The cards the node agents report, once every node's inventory is there."""
    inventories = wait_for_inventories(cp, machines, fleet, timeout_s=60)
    cards = cards_from_inventories(inventories)
    total = sum(m.gpus for m in machines.values())
    say(f"{len(machines)} GPU nodes ready, {total} GPUs reported by the node agents:")
    for line in render_nodes(cards):
        say(line)
    return cards


@dataclasses.dataclass(frozen=True)
class RunningDemo:
    """The demo cluster once every pod is decided, for ``run_demo``'s ``while_running``."""

    cp: ControlPlane
    operator: OperatorProcess
    #: Node -> the port its agent serves /metrics on (``agent_metrics_ports``).
    agent_metrics_ports: Mapping[str, int]
    result: DemoResult


def run_demo(
    examples_dir: Path | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    keep_running: bool = False,
    nodes: Sequence[DemoNode] = DEMO_NODES,
    binaries: Binaries | None = None,
    say: Say = print,
    agent_metrics_ports: Mapping[str, int] | None = None,
    agent_heartbeat_s: float = 20.0,
    while_running: Callable[[RunningDemo], None] | None = None,
) -> DemoResult:
    """Run the demo end to end and return what the operator decided.

    Progress lines and the final table go to ``say``. Raises ``DemoError`` (or
    ``ControlPlaneError``) when something could not be started or stopped working;
    pods that wait are part of the result, not an error. ``while_running`` is called
    with the cluster once the table is printed, before anything stops (the dashboard's
    test scrapes it then); ``agent_metrics_ports`` serves agents' metrics.
    """
    source = examples_dir if examples_dir is not None else default_examples_dir()
    setup, examples, story = _read_examples(source)
    clock = _Clock()
    say("starting the control plane (etcd, kube-apiserver, KWOK)...")
    with ControlPlane(kwok=True, binaries=binaries) as cp:
        say(f"control plane up at {cp.server}")
        clock.lap("control plane")
        install_crd(cp)
        # Where the agents renew their nodes' Leases (manifests/namespace.yaml in a cluster).
        cp.ensure_namespace(node_leases.NAMESPACE)
        for manifest in setup:
            apply_manifest(cp, manifest)
        machines = create_nodes(cp, nodes)
        fleet = AgentFleet(
            cp.kubeconfig_path,
            nodes,
            heartbeat_interval_s=agent_heartbeat_s,
            plugin_root=cp.workdir / "nodes",
            metrics_ports=agent_metrics_ports,
        )
        fleet.start()
        try:
            cards = _cards_reported(cp, machines, fleet, say)
            clock.lap("nodes and agents")
            say("starting the operator...")
            with _running_operator(cp, say, startup_timeout_s=60) as operator:
                say("operator ready")
                clock.lap("operator start")
                result = _decide_examples(
                    cp,
                    operator,
                    _Examples(source, examples, story),
                    fleet,
                    cards,
                    clock,
                    say,
                    timeout_s,
                )
                dra_shown = run_dra_claim(cp, say, timeout_s)
                clock.lap("dra claim")
                result = dataclasses.replace(result, dra=dra_shown)
                say("")
                say(render_result(result))
                say("")
                if while_running is not None:
                    while_running(
                        RunningDemo(cp, operator, dict(agent_metrics_ports or {}), result)
                    )
                if keep_running:
                    _wait_for_interrupt(cp, operator, say)
                    clock.lap("kept running")
                say("stopping the operator, the agents and the control plane...")
        finally:
            fleet.stop()
    clock.lap("stop")
    phases = ", ".join(f"{phase} {seconds:.1f}s" for phase, seconds in clock.phases.items())
    say(f"done in {clock.total_s:.1f}s ({phases})")
    return dataclasses.replace(result, timings_s=dict(clock.phases))


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM acts as Ctrl-C: everything started is stopped on the way out, and it ends
    ``--keep-running`` normally."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@click.command("demo")
@click.option(
    "--examples",
    "examples_dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Folder of manifests to apply in file order (default: the repository's examples/).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    help="Seconds to wait for every pod to be bound or reported as waiting.",
)
@click.option(
    "--keep-running",
    is_flag=True,
    help="Leave the cluster up after the table, until Ctrl-C; prints the kubeconfig path.",
)
def demo_command(examples_dir: Path | None, timeout_s: float, keep_running: bool) -> None:
    """Local control plane, simulated GPU nodes, the operator and the example pods: print
    where each pod went and why the others wait, then stop everything."""
    from vgpu_operator import logging as vgpu_logging

    # The agents run in this process: only their errors belong next to the table (the
    # simulated failing card's XID warning is shown in the node summary instead).
    vgpu_logging.configure("console", "ERROR")
    try:
        with _sigterm_as_interrupt():
            result = run_demo(
                examples_dir,
                timeout_s=timeout_s,
                keep_running=keep_running,
                say=click.echo,
            )
    except BinariesNotFoundError as exc:
        click.echo(f"demo failed: {exc}", err=True)
        sys.exit(2)
    except (DemoError, ControlPlaneError) as exc:
        click.echo(f"demo failed: {exc}", err=True)
        sys.exit(1)
    if result.undecided:
        click.echo(
            f"demo failed: {len(result.undecided)} pods were neither bound nor reported "
            f"as waiting within {timeout_s:.0f}s: {', '.join(result.undecided)}",
            err=True,
        )
        sys.exit(1)
