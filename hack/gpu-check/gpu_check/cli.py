"""``make gpu-check``: run the checks in order inside one time budget, then write the report.

No step may take the run down: an exception ends that step as a failure with its
traceback, a step that cannot start in the time left is skipped, and a watchdog writes the
report and ends the process if a step hangs past the budget (a call into the driver cannot
be interrupted otherwise). The exit status is 0 when nothing failed, 1 when something did,
3 when the run was cut short.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Final

from gpu_check import (
    allocate_check,
    dra_check,
    enforcement,
    hamicore_build,
    inventory_check,
    machine,
    mig_check,
)
from gpu_check.budget import Budget
from gpu_check.context import Options, Run
from gpu_check.outcome import CheckResult, failed, skipped
from gpu_check.report import Report, render_json, render_markdown, splice

Step = Callable[[Run], CheckResult]

#: (name, step, seconds it needs at least to be worth starting), in the order they run:
#: each hands the next what it found (the inventory, the library, Allocate's settings).
STEPS: Final[Sequence[tuple[str, Step, float]]] = (
    (inventory_check.READ, inventory_check.read_inventory, 5),
    (inventory_check.COMPARE, inventory_check.compare_with_nvidia_smi, 5),
    (dra_check.NAME, dra_check.resource_slice, 2),
    (hamicore_build.NAME, hamicore_build.build_hami_core, 20),
    (allocate_check.NAME, allocate_check.allocate_share, 5),
    (enforcement.MEMORY, enforcement.memory_limit, 15),
    (enforcement.COMPUTE, enforcement.sm_limit, 25),
    (mig_check.LIST, mig_check.list_instances, 2),
    (mig_check.CREATE, mig_check.create_and_remove, 20),
)
DEFAULT_BUDGET_S: Final = 540.0
#: How long past the budget the watchdog waits before it ends a hung run.
_GRACE_S: Final = 30.0


def parse_options(argv: Sequence[str] | None) -> Options:
    parser = argparse.ArgumentParser(
        prog="make gpu-check GPU_CHECK_ARGS=...",
        description="The node agent's code against a real GPU (docs/hardware.md).",
    )
    parser.add_argument("--repo-root", type=Path, default=Path.cwd(), help=argparse.SUPPRESS)
    parser.add_argument(
        "--backend", default="nvml", help="nvml (default), or sim:NAME for a simulated machine"
    )
    parser.add_argument("--node-name", default="gpu-check", help="the node the inventory names")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to compare with")
    parser.add_argument(
        "--hami-core-src", type=Path, help="HAMi-core's source (.gpu-check/hami-core)"
    )
    parser.add_argument(
        "--cuda-headers", type=Path, help="cuda.h and nvml.h (.gpu-check/cuda-headers)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=DEFAULT_BUDGET_S,
        help=f"seconds for the whole run (default {DEFAULT_BUDGET_S:.0f})",
    )
    parser.add_argument("--report", type=Path, help="the Markdown report (.gpu-check/report.md)")
    parser.add_argument(
        "--json", dest="json_report", type=Path, help="also write the results as JSON"
    )
    parser.add_argument(
        "--update-doc",
        type=Path,
        help="replace the report section of this file (docs/hardware.md) with the report",
    )
    parser.add_argument(
        "--mig-reconfigure",
        action="store_true",
        help="let the MIG check replace a card's instances (it puts the same profiles back)",
    )
    parser.add_argument(
        "--enable-mig",
        action="store_true",
        help="switch MIG mode on for the MIG check where it is off, and off after (root)",
    )
    parser.add_argument(
        "--share-memory-mib", type=int, help="the pod's memory share (default: min(4096, card/4))"
    )
    parser.add_argument(
        "--share-cores", type=int, default=30, help="the pod's SM share in %% (default 30)"
    )
    args = parser.parse_args(argv)
    root = args.repo_root.resolve()
    return Options(
        repo_root=root,
        backend=args.backend,
        node_name=args.node_name,
        nvidia_smi=args.nvidia_smi,
        hami_core_src=args.hami_core_src,
        cuda_headers=args.cuda_headers,
        budget_s=args.budget,
        report=args.report or root / ".gpu-check" / "report.md",
        json_report=args.json_report,
        update_doc=args.update_doc,
        mig_reconfigure=args.mig_reconfigure,
        enable_mig=args.enable_mig,
        share_cores=args.share_cores,
        share_memory_mib=args.share_memory_mib,
    )


def run_step(run: Run, name: str, step: Step, needs_s: float) -> CheckResult:
    """One step, never raising: its result, timed."""
    if not run.budget.allows(needs_s):
        return skipped(name, f"the time budget ({run.budget.total_s:.0f} s) is spent")
    run.say(f"{name} ...")
    start = run.budget.spent()
    try:
        result = step(run)
    except Exception as exc:  # every failure is reported, none ends the run
        lines = traceback.format_exc().strip().splitlines()
        result = failed(name, f"{type(exc).__name__}: {exc}", ["```", *lines[-20:], "```"])
    result = replace(result, seconds=run.budget.spent() - start)
    run.say(f"{name}: {result.status}: {result.summary}")
    return result


class _Writer:
    """Writes the report once: at the end, or from the watchdog / a signal if the run
    does not get there."""

    def __init__(self, run: Run, started: datetime, results: list[CheckResult]) -> None:
        self.run = run
        self.started = started
        self.results = results
        self.current: str | None = None
        # Reentrant: a signal handled while the report is being written runs in that thread.
        self._lock = threading.RLock()
        self._written = False

    def write(self, cut_short: str | None = None) -> Report:
        with self._lock:
            results = list(self.results)
            if cut_short and self.current:
                results.append(failed(self.current, f"did not finish: {cut_short}"))
            try:
                facts = machine.facts(self.run)
            except Exception as exc:
                facts = [("facts", f"could not be gathered: {exc}")]
            report = Report(
                started=self.started,
                facts=facts,
                results=results,
                budget_s=self.run.budget.total_s,
                spent_s=self.run.budget.spent(),
                cut_short=cut_short,
            )
            if not self._written:
                self._written = True
                _emit(self.run.options, report)
            return report


def _emit(options: Options, report: Report) -> None:
    text = render_markdown(report)
    print(text, flush=True)
    outputs = [(options.report, text), (options.json_report, render_json(report))]
    for path, content in outputs:
        if path is None:
            continue
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            print(f"[gpu-check] wrote {path}", file=sys.stderr)
        except OSError as exc:
            print(f"[gpu-check] could not write {path}: {exc}", file=sys.stderr)
    if options.update_doc is not None:
        try:
            document = options.update_doc.read_text() if options.update_doc.exists() else ""
            options.update_doc.write_text(splice(document, text))
            print(f"[gpu-check] updated {options.update_doc}", file=sys.stderr)
        except OSError as exc:
            print(f"[gpu-check] could not update {options.update_doc}: {exc}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(argv)
    budget = Budget(options.budget_s)
    work_dir = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    run = Run(options, budget, work_dir)
    results: list[CheckResult] = []
    writer = _Writer(run, datetime.now(UTC), results)

    def cut(reason: str, status: int) -> None:
        writer.write(cut_short=reason)
        os._exit(status)

    watchdog = threading.Timer(
        options.budget_s + _GRACE_S,
        cut,
        args=(f"still running {_GRACE_S:.0f} s past the {options.budget_s:.0f} s budget", 3),
    )
    watchdog.daemon = True
    watchdog.start()

    def on_signal(number: int, frame: FrameType | None) -> None:
        cut(f"stopped by signal {signal.Signals(number).name}", 128 + number)

    signal.signal(signal.SIGTERM, on_signal)
    run.say(f"backend {options.backend}, budget {options.budget_s:.0f} s, scratch {work_dir}")
    try:
        for name, step, needs_s in STEPS:
            writer.current = name
            results.append(run_step(run, name, step, needs_s))
        writer.current = None
    except KeyboardInterrupt:
        writer.write(cut_short="interrupted")
        return 130
    finally:
        watchdog.cancel()
        if run.backend is not None:
            try:
                run.backend.close()
            except Exception as exc:
                run.notes.append(f"closing the backend failed: {exc}")
    report = writer.write()
    return 0 if report.ok else 1
