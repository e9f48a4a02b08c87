"""Command line: `vgpu-operator run | agent | simulate | crds | demo | defrag plan`."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

from vgpu_operator.cli_types import Seconds


@click.group()
@click.version_option(package_name="vgpu-operator")
def main() -> None:
    """GPU sharing for Kubernetes, compatible with HAMi's annotations."""


@main.command()
@click.argument("scenario_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--now", type=Seconds(0.0), default=None, help="Unix time of the decisions.")
@click.option("--check", "check_expect", is_flag=True, help="Exit 1 if `expect` is not met.")
@click.option("--reference", is_flag=True, help="Decide without the node index.")
@click.option(
    "--scores/--no-scores",
    default=True,
    help="Each scheduled pod's score on every node (a Fit on every node per pod).",
)
def simulate(
    scenario_file: Path, now: float | None, check_expect: bool, reference: bool, scores: bool
) -> None:
    """Run the scheduling engine on a scenario file; print decisions as JSON (streamed:
    each decision as it is made, unless --check needs them all first)."""
    from vgpu_operator import simulation, simulation_stream
    from vgpu_operator.errors import ScenarioError

    result: dict[str, object] | None = None
    try:
        scenario = simulation.read_scenario(scenario_file)
        at = time.time() if now is None else now
        if check_expect:
            result = simulation.simulate(scenario, at, not reference, scores)
        else:
            simulation_stream.write(scenario, sys.stdout, at, not reference, scores)
    except ScenarioError as exc:
        click.echo(f"error: invalid scenario {scenario_file}: {_one_line(str(exc))}", err=True)
        sys.exit(2)
    except (RecursionError, MemoryError) as exc:
        # Within the file's bounds, yet too much for the engine (a selector nested too
        # deep, say): a sentence, not a traceback.
        what = "nested too deeply" if isinstance(exc, RecursionError) else "too large"
        click.echo(f"error: scenario {scenario_file} is {what} to simulate", err=True)
        sys.exit(2)
    except Exception as exc:
        # Whatever a scenario holds must end in one line and a failure status; a
        # traceback is no answer to a user (and this is a bug to report).
        message = _one_line(f"{type(exc).__name__}: {exc}")
        click.echo(f"error: simulating {scenario_file} failed ({message})", err=True)
        sys.exit(3)
    if result is not None:
        click.echo(json.dumps(result, indent=2))
    if check_expect and result is not None:
        problems = simulation.check(scenario, result)
        for problem in problems:
            click.echo(f"expectation not met: {problem}", err=True)
        if problems:
            sys.exit(1)


#: The most characters of a message the command prints (it may quote the input).
_MESSAGE_CHARS = 500


def _one_line(message: str) -> str:
    """A message on one bounded line: a scenario's value may be long or multi-line."""
    flat = " ".join(message.split())
    if len(flat) <= _MESSAGE_CHARS:
        return flat
    return f"{flat[:_MESSAGE_CHARS]}... ({len(flat) - _MESSAGE_CHARS} more characters)"


def _register_commands() -> None:
    """Subcommands whose modules import Kubernetes and NVML libraries, kept out of simulate."""
    from vgpu_operator.agent.cli import agent_command, crds_command
    from vgpu_operator.operator_cli import defrag_group, run

    main.add_command(run)
    main.add_command(defrag_group)
    main.add_command(agent_command)
    main.add_command(crds_command)
    try:
        # The demo starts a local control plane, which needs the `test` extra
        # (cryptography); an image without it still has every other command.
        from vgpu_operator.demo import demo_command
    except ImportError:
        return
    main.add_command(demo_command)


_register_commands()
