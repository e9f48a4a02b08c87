"""The facts at the top of the report: machine, GPUs, driver, CUDA, what ran."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

from gpu_check.context import Run
from gpu_check.hamicore_build import find_toolkit, read_versions


def _first_line_with(path: str, prefix: str) -> str | None:
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(prefix):
                return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


def _command(args: list[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(
            args, capture_output=True, text=True, timeout=20, cwd=cwd, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def facts(run: Run) -> list[tuple[str, str]]:
    options = run.options
    cpu = _first_line_with("/proc/cpuinfo", "model name") or platform.processor() or "unknown CPU"
    memory = _first_line_with("/proc/meminfo", "MemTotal") or "?"
    rows = [
        (
            "machine",
            f"{platform.node()}: {platform.system()} {platform.release()}, "
            f"{os.cpu_count()} x {cpu}, {memory} memory",
        ),
    ]
    if options.simulated:
        rows.append(
            (
                "backend",
                f"{options.backend}: a simulated machine, no hardware "
                "(GPU-only checks are skipped)",
            )
        )
    else:
        rows.append(("backend", "nvml: the machine's GPUs, through the agent's NVML reader"))
    status = run.status
    if status is not None:
        models = Counter(f"{d.model} ({d.memory_mib} MiB)" for d in status.devices)
        rows.append(("GPUs", ", ".join(f"{n} x {m}" for m, n in models.items()) or "none"))
        rows.append(("driver", status.driver_version or "unknown"))
        rows.append(("CUDA (driver)", status.cuda_version or "unknown"))
    toolkit = find_toolkit(os.environ)
    nvcc = _command([str(toolkit.nvcc), "--version"]) if toolkit else None
    rows.append(
        ("CUDA toolkit", f"{toolkit.root}: {nvcc.splitlines()[-1]}" if toolkit and nvcc else "none")
    )
    rows.append(("C compiler", shutil.which("cc") or shutil.which("gcc") or "none"))
    rows.append(("Python", f"{sys.executable} {platform.python_version()}"))
    try:
        commit = read_versions(options.versions_file).get("HAMI_CORE_COMMIT", "?")
    except OSError:
        commit = "?"
    rows.append(("HAMi-core", f"{commit} (pinned in hack/gpu-check/versions.env)"))
    revision = _command(["git", "rev-parse", "--short", "HEAD"], cwd=options.repo_root)
    rows.append(("vgpu-operator", revision or "unknown revision (no git here)"))
    rows += [("note", note) for note in run.notes]
    return rows
