"""The whole check, as `make gpu-check` runs it, on simulated machines: the steps a GPU
needs are skipped and say so, the others run the agent's real code (the NVML reader over
the simulation, the gRPC device plugin driven by the kubelet stand-in, MIG through NVML's
calls), and nvidia-smi is a stand-in answering with recorded outputs."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gpu_check import cli
from gpu_check.budget import Budget
from gpu_check.context import Options, Run
from gpu_check.outcome import Status, passed
from gpu_check.report import BEGIN, END
from gpu_check_fixtures import REPO, fake_nvidia_smi

RUN_SH = REPO / "hack" / "gpu-check" / "run.sh"


def check(tmp_path: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    """run.sh with this interpreter; exit status, the JSON report, the Markdown one."""
    report, body = tmp_path / "report.md", tmp_path / "report.json"
    done = subprocess.run(
        [
            str(RUN_SH),
            "--hami-core-src",
            str(tmp_path / "no-source-here"),
            "--report",
            str(report),
            "--json",
            str(body),
            *args,
        ],
        env={**os.environ, "GPU_CHECK_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert report.exists(), done.stderr
    return done.returncode, json.loads(body.read_text()), report.read_text()


def statuses(body: dict[str, Any]) -> dict[str, str]:
    return {c["name"]: c["status"] for c in body["checks"]}


def summary_of(body: dict[str, Any], name: str) -> str:
    (found,) = [c["summary"] for c in body["checks"] if c["name"] == name]
    return str(found)


def test_a_simulated_a100_passes_what_runs_without_a_gpu_and_skips_the_rest(tmp_path: Path) -> None:
    smi = fake_nvidia_smi(tmp_path, "a100-mig")
    code, body, text = check(tmp_path, "--backend", "sim:a100-mig", "--nvidia-smi", str(smi))
    assert code == 0, text
    assert statuses(body) == {
        "inventory: the agent reads the machine": "pass",
        "inventory: fields against nvidia-smi": "pass",
        "DRA: the ResourceSlice": "pass",
        "HAMi-core: build libvgpu.so": "skip",
        "device plugin: Allocate a share": "pass",
        "HAMi-core: memory limit": "skip",
        "HAMi-core: SM limit on a busy kernel": "skip",
        "MIG: the instances the agent lists": "pass",
        "MIG: create and remove one instance": "skip",
    }
    assert "simulated backend" in summary_of(body, "HAMi-core: memory limit")
    assert "no HAMi-core source" in summary_of(body, "HAMi-core: build libvgpu.so")
    # The A100 pair: the first card is in MIG mode, which the driver does not publish yet.
    assert summary_of(body, "DRA: the ResourceSlice").startswith("1 device(s)")
    assert "left out" in summary_of(body, "DRA: the ResourceSlice")
    assert "--mig-reconfigure" in summary_of(body, "MIG: create and remove one instance")
    # The settings Allocate returned, for the second card (the first is in MIG mode).
    (allocate,) = [c for c in body["checks"] if c["name"] == "device plugin: Allocate a share"]
    envs = allocate["data"]["envs"]
    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d001"
    assert envs["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "30"
    # The report names the machine, says it is simulated, and prints the inventory.
    assert "| backend | sim:a100-mig: a simulated machine, no hardware" in text
    assert "kind: DeviceInventory" in text


def test_a_mismatch_with_nvidia_smi_fails_the_run_with_both_values(tmp_path: Path) -> None:
    smi = fake_nvidia_smi(tmp_path, "a100-mig-mismatch")
    code, body, text = check(tmp_path, "--backend", "sim:a100-mig", "--nvidia-smi", str(smi))
    assert code == 1
    assert statuses(body)["inventory: fields against nvidia-smi"] == "fail"
    assert "agent 40960, nvidia-smi 40536" in summary_of(
        body, "inventory: fields against nvidia-smi"
    )
    assert "**MISMATCH**" in text


def test_mig_reconfigure_creates_and_removes_an_instance_then_puts_the_old_ones_back(
    tmp_path: Path,
) -> None:
    code, body, text = check(tmp_path, "--backend", "sim:a100-mig", "--mig-reconfigure")
    assert code == 0, text
    assert statuses(body)["MIG: create and remove one instance"] == "pass"
    assert statuses(body)["inventory: fields against nvidia-smi"] == "skip"  # none on PATH
    assert "put back: 3g.20gb" in text


def test_the_report_lands_between_the_markers_of_the_document(tmp_path: Path) -> None:
    doc = tmp_path / "hardware.md"
    doc.write_text(f"# Hardware\n\nHow to run it.\n\n{BEGIN}\nno run yet\n{END}\n")
    code, _, text = check(tmp_path, "--backend", "sim:t4-legacy", "--update-doc", str(doc))
    assert code == 0, text
    updated = doc.read_text()
    assert updated.startswith("# Hardware\n\nHow to run it.\n\n")
    assert "no run yet" not in updated
    assert text.strip() in updated


def test_a_spent_budget_skips_every_step_saying_why(tmp_path: Path) -> None:
    code, body, _ = check(tmp_path, "--backend", "sim:a100-mig", "--budget", "0")
    assert code == 0
    assert set(statuses(body).values()) == {"skip"}
    assert all("time budget" in c["summary"] for c in body["checks"])


def test_a_step_that_raises_is_a_failure_with_its_traceback_not_a_crash(tmp_path: Path) -> None:
    run = Run(Options(repo_root=REPO, backend="sim:a100-mig"), Budget(60), tmp_path)

    def broken(run: Run) -> Any:
        raise RuntimeError("NVML went away")

    result = cli.run_step(run, "broken step", broken, 1)
    assert result.status is Status.FAIL
    assert result.summary == "RuntimeError: NVML went away"
    assert any("raise RuntimeError" in line for line in result.details)
    fine = cli.run_step(run, "fine", lambda run: passed("fine", "ok"), 1)
    assert fine.status is Status.PASS


def test_a_run_cut_short_reports_the_step_in_flight_as_not_finished(tmp_path: Path) -> None:
    options = Options(repo_root=REPO, backend="sim:a100-mig", report=tmp_path / "r.md")
    run = Run(options, Budget(60), tmp_path)
    writer = cli._Writer(run, cli.datetime.now(cli.UTC), [passed("first", "ok")])
    writer.current = "HAMi-core: SM limit on a busy kernel"
    report = writer.write(cut_short="still running 30 s past the 540 s budget")
    assert [r.status for r in report.results] == [Status.PASS, Status.FAIL]
    assert report.results[1].summary.startswith("did not finish: still running")
    assert not report.ok
    assert "**The run was cut short:**" in (tmp_path / "r.md").read_text()


@pytest.mark.parametrize("args", [["mem", "--below-mib", "1", "--above-mib", "2"], ["busy"]])
def test_the_cuda_program_answers_in_json_where_there_is_no_driver(args: list[str]) -> None:
    probe = REPO / "hack" / "gpu-check" / "gpu_check" / "cuda_probe.py"
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        pass
    else:
        pytest.skip("this machine has a CUDA driver")
    done = subprocess.run(
        [sys.executable, str(probe), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 1
    assert "libcuda.so.1" in json.loads(done.stdout)["error"]
