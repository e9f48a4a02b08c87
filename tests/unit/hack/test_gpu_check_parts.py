"""The pieces of the GPU-only steps that can be checked without a GPU: the verdicts on the
CUDA program's answers, the container's environment on the host, what Allocate must hand
out, HAMi-core's build recipe, and the pins (versions.env, requirements.txt)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
from gpu_check import cuda_probe
from gpu_check.allocate_check import check_grant, share_pod
from gpu_check.budget import Budget
from gpu_check.context import Grant, Options, Run
from gpu_check.enforcement import (
    bare_environment,
    compute_verdict,
    container_environment,
    memory_sizes,
    memory_verdict,
)
from gpu_check.hamicore_build import (
    OPTIONS,
    direct_build_command,
    find_toolkit,
    library_sources,
    read_versions,
    static_config,
)
from gpu_check_fixtures import REPO, hamicore_grant

from vgpu_operator import names

CARD = "GPU-3a9d1f70-2b4c-4e55-8f10-a1000000d001"
OK = {"code": 0, "name": "CUDA_SUCCESS"}
OOM = {"code": 2, "name": "CUDA_ERROR_OUT_OF_MEMORY"}


def grant(tmp_path: Path) -> Grant:
    return hamicore_grant(tmp_path / "vgpu", CARD, 1, 30, lock_dir=tmp_path / "vgpulock")


# --- memory -------------------------------------------------------------------------------


def memory_answer(
    below: dict[str, Any], above: dict[str, Any], total: int = 4096
) -> dict[str, Any]:
    return {"total_mib": total, "free_mib": total, "below": below, "above": above}


def test_memory_holds_when_below_succeeds_above_is_refused_and_the_limit_is_the_total() -> None:
    assert memory_sizes(4096) == (1024, 5120)
    ok, summary = memory_verdict(4096, memory_answer(OK, OK, 81559), memory_answer(OK, OOM))
    assert ok, summary
    assert summary.startswith("limit 4096 MiB: 1024 MiB allocated, 5120 MiB refused")


@pytest.mark.parametrize(
    ("bare", "limited", "says"),
    [
        (
            memory_answer(OK, OK),
            memory_answer(OK, OK),
            "5120 MiB (above the limit) gave CUDA_SUCCESS",
        ),
        (memory_answer(OK, OK), memory_answer(OOM, OOM), "1024 MiB (below the limit) failed"),
        (memory_answer(OK, OK), memory_answer(OK, OOM, total=81559), "reports 81559 MiB in total"),
        (memory_answer(OK, OOM), memory_answer(OK, OOM), "the card itself refused 5120 MiB"),
        ({"error": "cuInit: 100 CUDA_ERROR_NO_DEVICE"}, {}, "failed without HAMi-core: cuInit"),
        (memory_answer(OK, OK), {"error": "timed out after 90 s"}, "under HAMi-core: timed out"),
    ],
)
def test_memory_fails_saying_what_went_wrong(
    bare: dict[str, Any], limited: dict[str, Any], says: str
) -> None:
    ok, summary = memory_verdict(4096, bare, limited)
    assert not ok
    assert says in summary


def test_compute_needs_half_the_ideal_slowdown() -> None:
    unlimited = {"launches": 300, "elapsed_s": 3.0}
    ok, summary, slowdown = compute_verdict(30, unlimited, {"elapsed_s": 9.0})
    assert ok
    assert slowdown == pytest.approx(3.0)
    assert "3.00 s without the limit, 9.00 s with 30 %: 3.00x slower (ideal 3.33x)" in summary
    ok, summary, _ = compute_verdict(30, unlimited, {"elapsed_s": 3.3})
    assert not ok
    assert "at least 1.67x was expected" in summary


# --- the container's environment, on the host ----------------------------------------------


def test_container_paths_map_through_the_longest_mount(tmp_path: Path) -> None:
    held = grant(tmp_path)
    assert held.host_path("/usr/local/vgpu/libvgpu.so") == held.hook_dir / "libvgpu.so"
    assert held.host_path("/usr/local/vgpu/uid_main.cache") == (
        held.hook_dir / "containers" / "uid_main" / "uid_main.cache"
    )
    assert held.host_path("/usr/local/vgpuX") is None
    assert held.host_path("/opt/elsewhere") is None


def test_the_programs_environment_is_the_containers_on_the_host(tmp_path: Path) -> None:
    held = grant(tmp_path)
    run = Run(Options(repo_root=REPO), Budget(60), tmp_path)
    cache = held.host_path("/usr/local/vgpu/uid_main.cache")
    assert cache is not None
    cache.write_text("a previous run's records")
    env = container_environment(run, held, cache)
    assert not cache.exists()  # a new container starts with an empty cache
    assert env["LD_PRELOAD"] == str(held.hook_dir / "libvgpu.so")
    assert env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] == str(cache)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "4096m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    # The card by its NVML index in PCI order: HAMi-core reads the variable as numbers.
    assert (env["CUDA_VISIBLE_DEVICES"], env["CUDA_DEVICE_ORDER"]) == ("1", "PCI_BUS_ID")
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    assert "CUDA_DEVICE_SM_LIMIT" not in container_environment(run, held, cache, sm_limit=False)
    bare = bare_environment(held)
    assert "LD_PRELOAD" not in bare
    assert not [k for k in bare if k.startswith("CUDA_DEVICE_") and k != "CUDA_DEVICE_ORDER"]


def test_a_grant_is_checked_against_what_hami_core_needs(tmp_path: Path) -> None:
    held = grant(tmp_path)
    pod = share_pod("node-a", CARD, 4096, 30)
    pod["metadata"]["annotations"][names.BIND_PHASE] = "success"
    assert check_grant(held, pod) == []


def test_a_grant_with_wrong_limits_or_mounts_is_refused_naming_them(tmp_path: Path) -> None:
    held = grant(tmp_path)
    pod = share_pod("node-a", CARD, 4096, 30)
    bad = Grant(
        card_uuid=held.card_uuid,
        card_index=held.card_index,
        memory_limit_mib=held.memory_limit_mib,
        sm_limit=held.sm_limit,
        envs={**held.envs, "CUDA_DEVICE_SM_LIMIT": "100"},
        mounts=held.mounts[:1],
        hook_dir=held.hook_dir,
    )
    problems = check_grant(bad, pod)
    assert "CUDA_DEVICE_SM_LIMIT is '100', expected '30'" in problems
    assert any(p.startswith("/usr/local/vgpu/libvgpu.so is mounted from") for p in problems)
    assert "the pod's bind-phase is 'allocating', not success" in problems


# --- HAMi-core's build -----------------------------------------------------------------------


def test_the_direct_build_uses_build_shs_options_and_every_library_source(tmp_path: Path) -> None:
    source = tmp_path / "hami-core"
    for name in ("libvgpu.c", "cuda/memory.c", "multiprocess/shrreg_tool.c", "multiprocess/m.c"):
        (source / "src" / name).parent.mkdir(parents=True, exist_ok=True)
        (source / "src" / name).write_text("")
    assert [p.relative_to(source).as_posix() for p in library_sources(source)] == [
        "src/cuda/memory.c",
        "src/libvgpu.c",
        "src/multiprocess/m.c",
    ]
    config = static_config("5091a2fbe1816df1265490f771346730f29e2c8d")
    assert [f"#define {o}" in config for o in OPTIONS] == [True] * 4
    assert "GIT_HASH_5091a2f" in config
    command = direct_build_command(
        "cc",
        source,
        tmp_path / "cfg",
        tmp_path / "inc",
        tmp_path / "libvgpu.so",
        [Path("/usr/lib/libcuda.so.1")],
    )
    assert command[:3] == ["cc", "-shared", "-fPIC"]
    assert f"-I{tmp_path / 'cfg'}" in command
    assert "src/multiprocess/shrreg_tool.c" not in command
    assert command[-3:] == ["/usr/lib/libcuda.so.1", "-lpthread", "-ldl"]


def test_the_toolkit_is_found_where_nvcc_and_cuda_h_are(tmp_path: Path) -> None:
    root = tmp_path / "cuda-13.0"
    (root / "bin").mkdir(parents=True)
    (root / "include").mkdir()
    assert find_toolkit({"CUDA_HOME": str(root), "PATH": ""}) is None
    (root / "bin" / "nvcc").write_text("")
    (root / "include" / "cuda.h").write_text("")
    found = find_toolkit({"CUDA_HOME": str(root), "PATH": ""})
    assert found is not None
    assert found.include == root / "include"


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_the_prepared_hami_core_source_builds_with_the_carried_headers(tmp_path: Path) -> None:
    """Runs where `make gpu-check-prepare` has filled .gpu-check/ (not in CI, which cannot
    reach HAMi-core's repository): the recipe of the GPU machine, without its driver."""
    source, headers = REPO / ".gpu-check" / "hami-core", REPO / ".gpu-check" / "cuda-headers"
    if not (source / ".commit").exists() or not (headers / "cuda.h").exists():
        pytest.skip("make gpu-check-prepare has not been run here")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "static_config.h").write_text(
        static_config((source / ".commit").read_text())
    )
    output = tmp_path / "libvgpu.so"
    command = direct_build_command("cc", source, tmp_path / "cfg", headers, output, [])
    done = subprocess.run(
        command, cwd=source, capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert output.stat().st_size > 100_000


# --- the pins ----------------------------------------------------------------------------------


def test_the_pinned_hami_core_is_the_one_the_image_builds() -> None:
    pinned = read_versions(REPO / "hack" / "gpu-check" / "versions.env")["HAMI_CORE_COMMIT"]
    dockerfile = (REPO / "Dockerfile").read_text()
    (image,) = re.findall(r"^ARG HAMI_CORE_COMMIT=(\S+)$", dockerfile, re.MULTILINE)
    assert pinned == image
    assert re.fullmatch(r"[0-9a-f]{40}", pinned)


def test_the_carried_packages_are_pinned_within_the_projects_requirements() -> None:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    declared = {
        canonicalize_name(r.name): r
        for r in map(
            Requirement,
            tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"],
        )
    }
    pins = [
        Requirement(line.split("#")[0].strip())
        for line in (REPO / "hack" / "gpu-check" / "requirements.txt").read_text().splitlines()
        if line.split("#")[0].strip()
    ]
    assert pins
    for pin in pins:
        (spec,) = pin.specifier
        assert spec.operator == "==", pin
        project = declared.get(canonicalize_name(pin.name))
        if project is not None:
            assert project.specifier.contains(spec.version), (pin, project)
    needed = {"grpcio", "protobuf", "pydantic", "structlog", "pyyaml", "nvidia-ml-py"}
    assert needed <= {canonicalize_name(p.name) for p in pins}


def test_the_busy_kernel_is_written_for_each_target_it_tries() -> None:
    for version, target in cuda_probe.PTX_TARGETS:
        text = cuda_probe.BUSY_PTX.format(version=version, target=target)
        assert f".version {version}\n.target {target}\n" in text
        assert ".visible .entry busy(" in text
