"""Build HAMi-core's ``libvgpu.so`` from the pinned source that came with the working tree.

Two ways, the first that works:

1. HAMi-core's own CMake build (what its build.sh and our Dockerfile run), where the CUDA
   toolkit (``nvcc``, ``include/cuda.h``) and cmake are there. Only the library target is
   built; ``CMAKE_POLICY_VERSION_MINIMUM`` lets CMake 4 read its old minimum version.
2. The same sources and options straight through the C compiler, with the toolkit's
   headers or the carried CUDA 12.9 ones (``.gpu-check/cuda-headers``), linked against the
   driver's own libcuda and libnvidia-ml: no toolkit needed.

The library's options are build.sh's: the dlsym hook, the multi-process limit, the memory
info and NVML hooks.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from gpu_check.context import Run
from gpu_check.outcome import CheckResult, failed, passed, skipped

NAME: Final = "HAMi-core: build libvgpu.so"
#: build.sh's options.
OPTIONS: Final = (
    "DLSYM_HOOK_ENABLE",
    "MULTIPROCESS_LIMIT_ENABLE",
    "HOOK_MEMINFO_ENABLE",
    "HOOK_NVML_ENABLE",
)
#: A source of src/ that is a tool of its own, not part of the library.
_NOT_LIBRARY: Final = frozenset({"shrreg_tool.c"})
_LIBRARY_DIRS: Final = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
    "/usr/lib/wsl/lib",
)
_CONFIGURE_TIMEOUT_S: Final = 60.0
_BUILD_TIMEOUT_S: Final = 120.0


def read_versions(path: Path) -> dict[str, str]:
    """versions.env's ``KEY=value`` lines (quotes removed, comments skipped)."""
    values: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        values[key.strip()] = value.strip().strip('"')
    return values


@dataclass(frozen=True, slots=True)
class Toolkit:
    root: Path
    nvcc: Path

    @property
    def include(self) -> Path:
        return self.root / "include"


def find_toolkit(env: Mapping[str, str]) -> Toolkit | None:
    """The CUDA toolkit: $CUDA_HOME, /usr/local/cuda, or where nvcc is on PATH."""
    candidates = [env.get("CUDA_HOME"), env.get("CUDA_PATH"), "/usr/local/cuda"]
    nvcc_on_path = shutil.which("nvcc", path=env.get("PATH"))
    if nvcc_on_path:
        candidates.append(str(Path(nvcc_on_path).resolve().parent.parent))
    for candidate in candidates:
        if not candidate:
            continue
        root = Path(candidate)
        nvcc = root / "bin" / "nvcc"
        if nvcc.is_file() and (root / "include" / "cuda.h").is_file():
            return Toolkit(root, nvcc)
    return None


def find_driver_library(soname: str) -> Path | None:
    """The driver's ``libcuda.so.1`` / ``libnvidia-ml.so.1``: from ldconfig's cache, else
    the usual directories."""
    for ldconfig in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            listing = subprocess.run(
                [ldconfig, "-p"], capture_output=True, text=True, timeout=20, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            continue
        for line in listing.splitlines():
            match = re.match(rf"^\s*{re.escape(soname)} \(([^)]*)\) => (\S+)$", line)
            if match and "x86-64" in match.group(1) and Path(match.group(2)).exists():
                return Path(match.group(2))
        break
    for directory in _LIBRARY_DIRS:
        path = Path(directory) / soname
        if path.exists():
            return path
    return None


def library_sources(source: Path) -> list[Path]:
    """Every C file under src/ that HAMi-core's CMake links into libvgpu.so."""
    return sorted(p for p in (source / "src").rglob("*.c") if p.name not in _NOT_LIBRARY)


def static_config(commit: str) -> str:
    """What CMake's configure_file makes of src/static_config.h.in with build.sh's options."""
    lines = [f"#define {option}" for option in OPTIONS]
    lines.append(f"extern size_t GIT_HASH_{commit[:7]};")
    lines.append("extern size_t GIT_BRANCH_unknown;")
    return "\n".join(lines) + "\n"


def direct_build_command(
    compiler: str,
    source: Path,
    config_dir: Path,
    headers: Path,
    output: Path,
    libraries: Sequence[Path],
) -> list[str]:
    return [
        compiler,
        "-shared",
        "-fPIC",
        "-g",
        "-D_GNU_SOURCE",
        "-Wall",
        f"-I{headers}",
        f"-I{source}",
        f"-I{source / 'src'}",
        f"-I{config_dir}",
        *(str(p.relative_to(source)) for p in library_sources(source)),
        "-o",
        str(output),
        *(str(p) for p in libraries),
        "-lpthread",
        "-ldl",
    ]


def _tail(text: str, lines: int = 25) -> list[str]:
    kept = text.strip().splitlines()[-lines:]
    return ["```", *kept, "```"] if kept else []


def build_hami_core(run: Run) -> CheckResult:
    options = run.options
    source = options.hami_core_dir
    versions = read_versions(options.versions_file)
    pinned = versions.get("HAMI_CORE_COMMIT", "")
    marker = source / ".commit"
    if not marker.is_file():
        return skipped(
            NAME,
            f"no HAMi-core source at {source} (run 'make gpu-check-prepare' where there is "
            "network, and bring .gpu-check/ along)",
        )
    found = marker.read_text().strip()
    if found != pinned:
        return failed(NAME, f"{source} holds HAMi-core {found}, versions.env pins {pinned}")
    compiler = shutil.which("cc") or shutil.which("gcc")
    toolkit = find_toolkit(os.environ)
    libcuda = find_driver_library("libcuda.so.1")
    libnvml = find_driver_library("libnvidia-ml.so.1")
    facts = [
        f"- source: {source} at {pinned}",
        f"- CUDA toolkit: {toolkit.root if toolkit else 'none'}",
        f"- C compiler: {compiler or 'none'}; cmake: {shutil.which('cmake') or 'none'}",
        f"- driver libraries: {libcuda or 'no libcuda.so.1'}, {libnvml or 'no libnvidia-ml.so.1'}",
    ]
    if compiler is None:
        return skipped(NAME, "no C compiler (cc or gcc) on this machine", facts)
    build_dir = run.work_dir / "hami-core-build"
    attempts: list[str] = []
    if toolkit is not None and shutil.which("cmake"):
        library, log = _cmake_build(run, source, build_dir / "cmake", toolkit)
        if library is not None:
            return _built(run, library, "HAMi-core's CMake build with the CUDA toolkit", facts)
        attempts += ["CMake build failed:", *_tail(log)]
    # The toolkit's headers first (the machine's own CUDA), then the carried CUDA 12.9 ones
    # (the release HAMi-core's CI builds with) if the pinned source does not build with them.
    candidates = [toolkit.include] if toolkit else []
    candidates.append(options.cuda_headers_dir)
    header_dirs = [h for h in candidates if (h / "cuda.h").is_file() and (h / "nvml.h").is_file()]
    if not header_dirs:
        return skipped(
            NAME,
            f"no CUDA toolkit and no cuda.h/nvml.h in {options.cuda_headers_dir} "
            "(make gpu-check-prepare fetches them)",
            facts + attempts,
        )
    libraries = [p for p in (libcuda, libnvml) if p is not None]
    if len(libraries) < 2 and not options.simulated:
        return failed(
            NAME, "the driver's libcuda.so.1 / libnvidia-ml.so.1 are not found", facts + attempts
        )
    for number, headers in enumerate(header_dirs):
        library, log = _direct_build(
            run, compiler, source, build_dir / f"direct-{number}", headers, libraries, pinned
        )
        if library is not None:
            how = f"the C compiler with the headers of {headers}"
            if len(libraries) < 2:
                how += " (not linked to the driver: none here; the library cannot be preloaded)"
            return _built(run, library, how, facts + attempts)
        attempts += [f"The C compiler with the headers of {headers} failed:", *_tail(log)]
    return failed(NAME, "the library did not build", facts + attempts)


def _built(run: Run, library: Path, how: str, details: list[str]) -> CheckResult:
    digest = hashlib.sha256(library.read_bytes()).hexdigest()
    run.library = library
    return passed(
        NAME,
        f"built with {how}",
        [
            *details,
            f"- library: {library} ({library.stat().st_size} bytes, sha256 {digest[:16]}...)",
        ],
        library=str(library),
        sha256=digest,
        how=how,
    )


def _run(
    run: Run, command: Sequence[str], cwd: Path, cap_s: float, env: Mapping[str, str] | None = None
) -> tuple[bool, str]:
    try:
        done = subprocess.run(
            list(command),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=run.budget.timeout(cap_s),
            env=dict(env) if env is not None else None,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        return False, f"{' '.join(command[:3])}...: timed out after {exc.timeout:.0f} s"
    except OSError as exc:
        return False, f"{command[0]}: {exc}"
    return done.returncode == 0, f"$ {' '.join(command)}\n{done.stdout}\n{done.stderr}"


def _cmake_build(
    run: Run, source: Path, build_dir: Path, toolkit: Toolkit
) -> tuple[Path | None, str]:
    shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir(parents=True)
    env = {**os.environ, "CUDA_HOME": str(toolkit.root)}
    configure = [
        "cmake",
        "-S",
        str(source),
        "-B",
        str(build_dir),
        *(f"-D{option}=1" for option in OPTIONS),
        "-DCMAKE_BUILD_TYPE=Debug",
        "-DTEST_DEVICE_ID=0",
        f"-DCUDA_TOOLKIT_ROOT_DIR={toolkit.root}",
        "-DCMAKE_POLICY_VERSION_MINIMUM=3.5",
    ]
    ok, log = _run(run, configure, build_dir, _CONFIGURE_TIMEOUT_S, env)
    if not ok:
        return None, log
    jobs = str(max(1, (os.cpu_count() or 2) // 2))
    ok, build_log = _run(
        run,
        ["cmake", "--build", str(build_dir), "--target", "vgpu", "-j", jobs],
        build_dir,
        _BUILD_TIMEOUT_S,
        env,
    )
    library = build_dir / "libvgpu.so"
    if not ok or not library.is_file():
        return None, log + build_log
    return library, build_log


def _direct_build(
    run: Run,
    compiler: str,
    source: Path,
    build_dir: Path,
    headers: Path,
    libraries: Sequence[Path],
    commit: str,
) -> tuple[Path | None, str]:
    shutil.rmtree(build_dir, ignore_errors=True)
    (build_dir / "config").mkdir(parents=True)
    (build_dir / "config" / "static_config.h").write_text(static_config(commit))
    output = build_dir / "libvgpu.so"
    command = direct_build_command(
        compiler, source, build_dir / "config", headers, output, libraries
    )
    ok, log = _run(run, command, source, _BUILD_TIMEOUT_S)
    return (output if ok and output.is_file() else None), log
