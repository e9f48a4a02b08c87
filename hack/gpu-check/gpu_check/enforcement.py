"""HAMi-core enforcing what Allocate returned, measured with a small CUDA program.

The program (``cuda_probe.py``) runs as a container's process would: HAMi-core's library
preloaded, the environment Allocate returned, its container paths turned into the host
paths of the mounts. Outside a container the driver shows every card, so the card is
chosen with ``CUDA_VISIBLE_DEVICES`` set to its NVML index (HAMi-core maps that variable's
numbers to NVML indexes; a UUID there would be read as card 0) in PCI order.

- memory: without HAMi-core the card takes an allocation above the limit (so a refusal
  under HAMi-core is the limit's doing); under it, an allocation below the limit succeeds,
  one above fails with CUDA_ERROR_OUT_OF_MEMORY, and CUDA reports the limit as the
  card's total memory;
- compute: the same busy kernel launches, under HAMi-core without and with the SM limit;
  with the limit they take longer. HAMi-core throttles launches towards the limit's share
  of the card, so the ideal slowdown is 100 / limit; the check asks for at least half of it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from gpu_check import cuda_probe
from gpu_check.context import Grant, Run
from gpu_check.outcome import CheckResult, failed, passed, skipped

MEMORY: Final = "HAMi-core: memory limit"
COMPUTE: Final = "HAMi-core: SM limit on a busy kernel"
_PROBE: Final = Path(cuda_probe.__file__)
_PROBE_TIMEOUT_S: Final = 90.0
_UNLIMITED_SECONDS: Final = 3.0
#: The share of the ideal slowdown (100 / limit) a pass needs.
_SLOWDOWN_SHARE: Final = 0.5


def _grant_to_test(run: Run, name: str) -> Grant | CheckResult:
    """The grant whose limits the check ``name`` runs under, or the skip that says why it
    cannot run."""
    if run.options.simulated:
        return skipped(name, "simulated backend: there is no GPU to run a CUDA program on")
    if run.grant is None:
        return skipped(name, "no settings from Allocate (its check did not pass)")
    if run.library is None:
        return skipped(name, "no libvgpu.so (the HAMi-core build did not pass)")
    return run.grant


def container_environment(
    run: Run, grant: Grant, cache: Path, sm_limit: bool = True
) -> dict[str, str]:
    """The process environment of the grant's container, on the host."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(grant.envs)
    del env["NVIDIA_VISIBLE_DEVICES"]
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = str(grant.card_index)
    cache.unlink(missing_ok=True)  # a fresh container starts with an empty one
    env["CUDA_DEVICE_MEMORY_SHARED_CACHE"] = str(cache)
    library = grant.host_path("/usr/local/vgpu/libvgpu.so")
    env["LD_PRELOAD"] = str(library)
    if not sm_limit:
        env.pop("CUDA_DEVICE_SM_LIMIT", None)
    return env


def bare_environment(grant: Grant) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k != "LD_PRELOAD" and not k.startswith("CUDA_DEVICE_")
    }
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env["CUDA_VISIBLE_DEVICES"] = str(grant.card_index)
    return env


def probe(
    run: Run, args: list[str], env: Mapping[str, str], cap_s: float = _PROBE_TIMEOUT_S
) -> tuple[dict[str, Any], str]:
    """Run the probe; its JSON answer (``{"error": ...}`` when it could not give one) and
    its stderr (HAMi-core's messages)."""
    timeout = run.budget.timeout(cap_s)
    try:
        done = subprocess.run(
            [sys.executable, str(_PROBE), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=dict(env),
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s", "timeout": True}, ""
    except OSError as exc:
        return {"error": str(exc)}, ""
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        return {
            "error": f"no answer (exit {done.returncode}): {done.stdout.strip()[-300:]}"
        }, done.stderr
    try:
        answer: dict[str, Any] = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        return {"error": f"unreadable answer {lines[-1]!r}: {exc}"}, done.stderr
    return answer, done.stderr


def _stderr(text: str, lines: int = 15) -> list[str]:
    kept = text.strip().splitlines()[-lines:]
    return ["HAMi-core said (last lines):", "```", *kept, "```"] if kept else []


def memory_sizes(limit_mib: int) -> tuple[int, int]:
    """An allocation well below the limit, and one well above it."""
    return max(1, limit_mib // 4), limit_mib + max(256, limit_mib // 4)


def memory_verdict(
    limit: int, bare: Mapping[str, Any], limited: Mapping[str, Any]
) -> tuple[bool, str]:
    """Whether the two probe answers (without and under HAMi-core) show the limit held;
    a sentence saying what they show."""
    below, above = memory_sizes(limit)
    if "error" in bare:
        return False, f"the CUDA program failed without HAMi-core: {bare['error']}"
    if bare["above"]["code"] != cuda_probe.CUDA_SUCCESS:
        return False, (
            f"the card itself refused {above} MiB ({bare['above']['name']}), so a refusal "
            "under HAMi-core would prove nothing"
        )
    if "error" in limited:
        return False, f"the CUDA program failed under HAMi-core: {limited['error']}"
    problems = []
    if limited["below"]["code"] != cuda_probe.CUDA_SUCCESS:
        problems.append(f"{below} MiB (below the limit) failed: {limited['below']['name']}")
    if limited["above"]["code"] != cuda_probe.CUDA_ERROR_OUT_OF_MEMORY:
        problems.append(
            f"{above} MiB (above the limit) gave {limited['above']['name']}, "
            "not CUDA_ERROR_OUT_OF_MEMORY"
        )
    if limited["total_mib"] != limit:
        problems.append(
            f"CUDA reports {limited['total_mib']} MiB in total, not the limit {limit} MiB"
        )
    if problems:
        return False, "; ".join(problems)
    return True, (
        f"limit {limit} MiB: {below} MiB allocated, {above} MiB refused (out of memory; "
        f"{above} MiB fits without HAMi-core), total shown {limited['total_mib']} MiB"
    )


def memory_limit(run: Run) -> CheckResult:
    grant = _grant_to_test(run, MEMORY)
    if isinstance(grant, CheckResult):
        return grant
    limit = grant.memory_limit_mib
    below, above = memory_sizes(limit)
    args = ["mem", "--below-mib", str(below), "--above-mib", str(above)]
    setting = grant.envs["CUDA_DEVICE_MEMORY_LIMIT_0"]
    details = [f"- CUDA_DEVICE_MEMORY_LIMIT_0={setting}; allocations of {below} and {above} MiB"]
    bare, _ = probe(run, args, bare_environment(grant))
    details.append(f"- without HAMi-core: {json.dumps(bare)}")
    limited, said = probe(run, args, container_environment(run, grant, _cache_path(grant)))
    details.append(f"- under HAMi-core: {json.dumps(limited)}")
    ok, summary = memory_verdict(limit, bare, limited)
    data = {"limitMiB": limit, "bare": bare, "limited": limited}
    if not ok:
        return failed(MEMORY, summary, details + _stderr(said), **data)
    return passed(MEMORY, summary, details, **data)


def _cache_path(grant: Grant) -> Path:
    container_path = grant.envs["CUDA_DEVICE_MEMORY_SHARED_CACHE"]
    host = grant.host_path(container_path)
    if host is None:  # check_grant refused such a grant already
        raise ValueError(f"{container_path} is on no mount")
    return host


def sm_limit(run: Run) -> CheckResult:
    grant = _grant_to_test(run, COMPUTE)
    if isinstance(grant, CheckResult):
        return grant
    limit = grant.sm_limit
    if not 0 < limit < 100:
        return skipped(COMPUTE, f"the share's SM limit is {limit} %: nothing to throttle")
    free_run = run.work_dir / "unlimited.cache"
    unlimited, said = probe(
        run,
        ["busy", "--seconds", str(_UNLIMITED_SECONDS)],
        container_environment(run, grant, free_run, sm_limit=False),
    )
    details = [f"- without the SM limit: {json.dumps(unlimited)}"]
    if "error" in unlimited:
        return failed(
            COMPUTE,
            f"the busy kernel failed under HAMi-core: {unlimited['error']}",
            details + _stderr(said),
        )
    ideal = 100 / limit
    cap = min(_PROBE_TIMEOUT_S * 2, 3 * ideal * unlimited["elapsed_s"] + 30)
    limited, said = probe(
        run,
        [
            "busy",
            "--iterations",
            str(unlimited["iterations"]),
            "--launches",
            str(unlimited["launches"]),
        ],
        container_environment(run, grant, _cache_path(grant)),
        cap_s=cap,
    )
    details.append(f"- with CUDA_DEVICE_SM_LIMIT={limit}: {json.dumps(limited)}")
    data = {"limit": limit, "unlimited": unlimited, "limited": limited, "ideal": ideal}
    if "error" in limited:
        return failed(
            COMPUTE,
            f"the busy kernel under the SM limit: {limited['error']}",
            details + _stderr(said),
            **data,
        )
    ok, summary, slowdown = compute_verdict(limit, unlimited, limited)
    data["slowdown"] = slowdown
    if not ok:
        return failed(COMPUTE, summary, details + _stderr(said), **data)
    return passed(COMPUTE, summary, details, **data)


def compute_verdict(
    limit: int, unlimited: Mapping[str, Any], limited: Mapping[str, Any]
) -> tuple[bool, str, float]:
    """Whether the same launches took long enough longer under the SM limit; a sentence
    with both times; the slowdown."""
    ideal = 100 / limit
    slowdown = float(limited["elapsed_s"]) / max(float(unlimited["elapsed_s"]), 1e-9)
    summary = (
        f"{unlimited['launches']} launches: {unlimited['elapsed_s']:.2f} s without the limit, "
        f"{limited['elapsed_s']:.2f} s with {limit} %: {slowdown:.2f}x slower "
        f"(ideal {ideal:.2f}x)"
    )
    wanted = _SLOWDOWN_SHARE * ideal
    if slowdown < wanted:
        return False, f"{summary}; at least {wanted:.2f}x was expected", slowdown
    return True, summary, slowdown
