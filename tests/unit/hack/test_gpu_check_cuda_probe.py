"""The CUDA program of the HAMi-core checks, against a stand-in libcuda.so.1 (built here
with the C compiler): the driver calls it makes through ctypes, with the arguments the
driver reads, and what it concludes from the answers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gpu_check import cuda_probe, enforcement
from gpu_check.budget import Budget
from gpu_check.context import Options, Run
from gpu_check.outcome import CheckResult, Status
from gpu_check_fixtures import REPO, hamicore_grant

from vgpu_operator.agent import hamicore

PROBE = REPO / "hack" / "gpu-check" / "gpu_check" / "cuda_probe.py"

#: The driver API calls the probe makes, answering as a card with 4 multiprocessors and
#: FAKE_TOTAL_MIB of memory would; allocations above FAKE_LIMIT_MIB fail as out of memory
#: (HAMi-core's answer); a kernel takes FAKE_NS_PER_ITERATION per iteration, paid at
#: cuCtxSynchronize; PTX is accepted only for FAKE_PTX_TARGET. Every launch's shape and
#: parameters are checked, as the driver would read them. With something preloaded it
#: also plays HAMi-core, from HAMi-core's variables (unless FAKE_NO_LIMITS is set): the
#: memory limit is the total and refuses more, the SM limit stretches the kernels, and the
#: shared cache's directory must exist. Without CUDA_VISIBLE_DEVICES it sees no card.
FAKE_LIBCUDA = r"""
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <time.h>

static long long pending_ns = 0;
static int launches = 0;
static long env(const char *name, long fallback) {
    const char *v = getenv(name);
    return v ? atol(v) : fallback;
}
static int governed(const char *variable) {
    const char *preload = getenv("LD_PRELOAD");
    return preload && *preload && !getenv("FAKE_NO_LIMITS") && getenv(variable);
}
static long limit_mib(void) {
    if (governed("CUDA_DEVICE_MEMORY_LIMIT_0")) return atol(getenv("CUDA_DEVICE_MEMORY_LIMIT_0"));
    return env("FAKE_LIMIT_MIB", 1 << 20);
}
static void record(void) {
    const char *path = getenv("FAKE_RECORD");
    if (!path) return;
    FILE *f = fopen(path, "w");
    if (f) { fprintf(f, "%d\n", launches); fclose(f); }
}
int cuInit(unsigned int flags) {
    if (!getenv("CUDA_VISIBLE_DEVICES")) return 100;
    if (governed("CUDA_DEVICE_MEMORY_SHARED_CACHE")) {
        char directory[4096];
        snprintf(directory, sizeof directory, "%s", getenv("CUDA_DEVICE_MEMORY_SHARED_CACHE"));
        char *slash = strrchr(directory, '/');
        if (slash) *slash = 0;
        FILE *probe = fopen(strcat(directory, "/.probe"), "w");
        if (!probe) return 999;
        fclose(probe);
    }
    return flags == 0 ? 0 : 1;
}
int cuDeviceGet(int *device, int ordinal) { *device = ordinal; return ordinal == 0 ? 0 : 101; }
int cuDevicePrimaryCtxRetain(void **ctx, int device) { *ctx = (void *)0x10; return 0; }
int cuCtxSetCurrent(void *ctx) { return ctx == (void *)0x10 ? 0 : 201; }
int cuDeviceGetAttribute(int *value, int attribute, int device) {
    switch (attribute) {
    case 16: *value = 4; return 0;
    case 75: *value = 9; return 0;
    case 76: *value = 0; return 0;
    }
    return 1;
}
int cuGetErrorName(int code, const char **name) {
    *name = code == 0 ? "CUDA_SUCCESS" : code == 2 ? "CUDA_ERROR_OUT_OF_MEMORY"
          : code == 218 ? "CUDA_ERROR_INVALID_PTX" : "CUDA_ERROR_UNKNOWN";
    return 0;
}
int cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    long mib = governed("CUDA_DEVICE_MEMORY_LIMIT_0") ? limit_mib() : env("FAKE_TOTAL_MIB", 8192);
    *total = (size_t)mib << 20;
    *free_bytes = *total;
    return 0;
}
int cuMemAlloc_v2(uint64_t *pointer, size_t bytes) {
    if (bytes > ((size_t)limit_mib() << 20)) return 2;
    *pointer = 0x1000;
    return 0;
}
int cuMemFree_v2(uint64_t pointer) { return pointer == 0x1000 ? 0 : 1; }
int cuModuleLoadData(void **module, const void *image) {
    const char *target = getenv("FAKE_PTX_TARGET");
    if (!strstr(image, ".visible .entry busy(")) return 218;
    if (target && !strstr(image, target)) return 218;
    *module = (void *)0x20;
    return 0;
}
int cuModuleGetFunction(void **function, void *module, const char *name) {
    if (module != (void *)0x20 || strcmp(name, "busy") != 0) return 500;
    *function = (void *)0x30;
    return 0;
}
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    if (f != (void *)0x30 || gx != 16 || gy != 1 || gz != 1 || bx != 256 || by != 1 || bz != 1
        || shared != 0 || stream != 0 || extra != 0) return 1;
    if (*(uint64_t *)params[0] != 0x1000) return 1;
    long long ns = (long long)*(uint32_t *)params[1] * env("FAKE_NS_PER_ITERATION", 10);
    if (governed("CUDA_DEVICE_SM_LIMIT")) ns = ns * 100 / atol(getenv("CUDA_DEVICE_SM_LIMIT"));
    pending_ns += ns;
    launches++;
    record();
    return 0;
}
int cuCtxSynchronize(void) {
    struct timespec t = {pending_ns / 1000000000, pending_ns % 1000000000};
    nanosleep(&t, 0);
    pending_ns = 0;
    return 0;
}
"""


@pytest.fixture(scope="module")
def libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    directory = tmp_path_factory.mktemp("fake-driver")
    (directory / "libcuda.c").write_text(FAKE_LIBCUDA)
    subprocess.run(
        [
            compiler,
            "-shared",
            "-fPIC",
            "-o",
            str(directory / "libcuda.so.1"),
            str(directory / "libcuda.c"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return directory


def probe(libcuda: Path, *args: str, **fake: str) -> dict[str, Any]:
    env = {
        "CUDA_VISIBLE_DEVICES": "0",
        **os.environ,
        "LD_LIBRARY_PATH": str(libcuda),
        **{f"FAKE_{k.upper()}": v for k, v in fake.items()},
    }
    done = subprocess.run(
        [sys.executable, str(PROBE), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    answer: dict[str, Any] = json.loads(done.stdout)
    return answer


def test_memory_allocations_below_and_above_a_limit(libcuda: Path) -> None:
    answer = probe(
        libcuda,
        "mem",
        "--below-mib",
        "1024",
        "--above-mib",
        "5120",
        limit_mib="4096",
        total_mib="4096",
    )
    assert answer == {
        "free_mib": 4096,
        "total_mib": 4096,
        "below": {"mib": 1024, "code": 0, "name": "CUDA_SUCCESS"},
        "above": {"mib": 5120, "code": 2, "name": "CUDA_ERROR_OUT_OF_MEMORY"},
    }


def test_the_busy_kernel_runs_four_blocks_a_multiprocessor_for_the_seconds_asked(
    libcuda: Path,
) -> None:
    answer = probe(libcuda, "busy", "--seconds", "0.5", ns_per_iteration="10")
    assert answer["multiprocessors"] == 4
    assert answer["compute_capability"] == "9.0"
    assert answer["blocks"] == 16  # four per multiprocessor, which the stand-in checks
    assert answer["kernel"] == "PTX 6.0 sm_50"
    assert answer["launches"] % 10 == 0
    assert answer["elapsed_s"] >= 0.5


def test_calibration_grows_the_work_until_a_launch_can_be_timed_then_aims_at_10_ms() -> None:
    assert cuda_probe.next_iterations(1 << 16, 0.0005) == 1 << 18
    assert cuda_probe.next_iterations(1 << 18, 0.003) is None  # over a quarter of 10 ms
    assert cuda_probe.next_iterations(1 << 30, 0.0) is None  # no further
    assert cuda_probe.scaled_iterations(1 << 20, 0.005) == 1 << 21
    assert cuda_probe.scaled_iterations(1 << 20, 0.04) == 1 << 18
    assert cuda_probe.scaled_iterations(10, 100.0) == 1
    assert cuda_probe.scaled_iterations(1 << 29, 0.0) == 1 << 30


def test_a_fixed_run_launches_exactly_what_it_is_told(libcuda: Path, tmp_path: Path) -> None:
    record = tmp_path / "launches"
    answer = probe(
        libcuda,
        "busy",
        "--iterations",
        "1000",
        "--launches",
        "25",
        ns_per_iteration="10",
        record=str(record),
    )
    assert (answer["iterations"], answer["launches"]) == (1000, 25)
    assert int(record.read_text()) == 26  # and the one warm-up launch before


def test_ptx_falls_back_to_a_newer_target_when_the_driver_refuses_the_old_one(
    libcuda: Path,
) -> None:
    answer = probe(libcuda, "busy", "--iterations", "10", "--launches", "1", ptx_target="sm_90")
    assert answer["kernel"] == "PTX 7.8 sm_90"
    refused = probe(libcuda, "busy", "--iterations", "10", "--launches", "1", ptx_target="sm_999")
    assert refused["error"].startswith("cuModuleLoadData")
    assert "sm_50: 218 CUDA_ERROR_INVALID_PTX" in refused["error"]


# --- the HAMi-core checks end to end, the stand-in driver playing HAMi-core --------------------


@pytest.fixture
def governed_run(libcuda: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Run:
    """A run as the GPU machine's would be after Allocate and the build: an empty library
    stands in for libvgpu.so (installed by the agent's installer), the driver stand-in on
    the library path plays the card and HAMi-core."""
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libcuda))
    monkeypatch.setattr(enforcement, "_UNLIMITED_SECONDS", 0.3)
    empty = tmp_path / "empty.c"
    empty.write_text("int vgpu_stand_in;\n")
    library = tmp_path / "libvgpu.so"
    subprocess.run(
        [shutil.which("cc") or "gcc", "-shared", "-fPIC", "-o", str(library), str(empty)],
        check=True,
        timeout=120,
    )
    hook = tmp_path / "host" / "vgpu"
    hamicore.install(library, hook, "/usr/local/vgpu")
    run = Run(Options(repo_root=REPO, backend="nvml"), Budget(120), tmp_path)
    run.library = library
    # 10 %: the stand-in stretches kernels tenfold, the verdict wants fivefold, and a run
    # without the limit is about even: wide margins for a loaded machine.
    run.grant = hamicore_grant(hook, "GPU-a", 0, sm_limit=10)
    return run


def test_the_memory_check_passes_when_the_limit_holds(governed_run: Run) -> None:
    result = enforcement.memory_limit(governed_run)
    assert result.status is Status.PASS, result.summary
    assert result.summary == (
        "limit 4096 MiB: 1024 MiB allocated, 5120 MiB refused (out of memory; 5120 MiB fits "
        "without HAMi-core), total shown 4096 MiB"
    )
    assert result.data["bare"]["total_mib"] == 8192


def test_the_compute_check_measures_the_slowdown_of_the_same_launches(governed_run: Run) -> None:
    result = enforcement.sm_limit(governed_run)
    assert result.status is Status.PASS, result.summary
    assert result.data["limited"]["launches"] == result.data["unlimited"]["launches"]
    assert result.data["limited"]["iterations"] == result.data["unlimited"]["iterations"]
    assert result.data["ideal"] == pytest.approx(10)


@pytest.mark.parametrize(
    ("check", "reasons"),
    [
        pytest.param(
            enforcement.memory_limit,
            (
                "5120 MiB (above the limit) gave CUDA_SUCCESS",
                "reports 8192 MiB in total, not the limit 4096 MiB",
            ),
            id="memory",
        ),
        pytest.param(enforcement.sm_limit, ("at least 5.00x was expected",), id="compute"),
    ],
)
def test_a_check_fails_when_nothing_enforces_its_limit(
    governed_run: Run,
    monkeypatch: pytest.MonkeyPatch,
    check: Callable[[Run], CheckResult],
    reasons: tuple[str, ...],
) -> None:
    monkeypatch.setenv("FAKE_NO_LIMITS", "1")
    result = check(governed_run)
    assert result.status is Status.FAIL
    for reason in reasons:
        assert reason in result.summary
