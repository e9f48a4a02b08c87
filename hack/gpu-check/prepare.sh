#!/usr/bin/env bash
# make gpu-check-prepare: fetch, on a machine with network, everything `make gpu-check` needs
# that a GPU machine without network cannot fetch, into .gpu-check/ (ignored by git; carry it
# to the GPU machine with the working tree). Inputs are pinned in versions.env and
# requirements.txt; a second run only fetches what is missing.
#
#   .gpu-check/hami-core/     HAMi-core's source at HAMI_CORE_COMMIT (docs/ left out)
#   .gpu-check/cuda-headers/  cuda.h and nvml.h, for building it without the CUDA toolkit
#   .gpu-check/wheels/        the check's Python packages, for each of PYTHON_VERSIONS
#
# Environment:
#   HAMI_CORE_GIT_DIR  a local git directory that holds HAMI_CORE_COMMIT (a mirror, say);
#                      without it the commit is fetched from HAMI_CORE_REPO with git
#   PYTHON             the Python whose pip downloads the wheels (default: .venv's, else python3)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
state="$root/.gpu-check"
# shellcheck source=versions.env
source "$here/versions.env"
# The package directory is called operator/, which would shadow the standard library's
# `operator` module for a Python started in the repository root.
export PYTHONSAFEPATH=1

if [ -z "${PYTHON:-}" ]; then
    if [ -x "$root/.venv/bin/python" ]; then PYTHON="$root/.venv/bin/python"; else PYTHON=python3; fi
fi
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$state"

say() { printf '[gpu-check-prepare] %s\n' "$*"; }

# --- HAMi-core's source, at the pinned commit -------------------------------------------
fetch_hami_core() {
    local dest="$state/hami-core" gitdir
    if [ -f "$dest/.commit" ] && [ "$(cat "$dest/.commit")" = "$HAMI_CORE_COMMIT" ]; then
        say "HAMi-core $HAMI_CORE_COMMIT: already there"
        return
    fi
    if [ -n "${HAMI_CORE_GIT_DIR:-}" ]; then
        gitdir="$HAMI_CORE_GIT_DIR"
    else
        gitdir="$scratch/hami-core.git"
        git init --quiet --bare "$gitdir"
        # One commit, no history: hosts that serve any reachable commit answer this directly;
        # otherwise take the whole (small) repository.
        if ! git --git-dir "$gitdir" fetch --quiet --depth 1 "$HAMI_CORE_REPO" "$HAMI_CORE_COMMIT"; then
            say "fetching the commit alone failed; cloning $HAMI_CORE_REPO"
            git --git-dir "$gitdir" fetch --quiet "$HAMI_CORE_REPO" '+refs/heads/*:refs/heads/*'
        fi
    fi
    if ! git --git-dir "$gitdir" cat-file -e "$HAMI_CORE_COMMIT^{commit}" 2>/dev/null; then
        say "error: $gitdir does not hold HAMi-core commit $HAMI_CORE_COMMIT" >&2
        exit 1
    fi
    rm -rf "$dest.partial"
    mkdir -p "$dest.partial"
    # docs/ is pictures: most of the archive's size, none of the build's.
    git --git-dir "$gitdir" archive "$HAMI_CORE_COMMIT" ':(exclude)docs' | tar -x -C "$dest.partial"
    echo "$HAMI_CORE_COMMIT" >"$dest.partial/.commit"
    rm -rf "$dest"
    mv "$dest.partial" "$dest"
    say "HAMi-core $HAMI_CORE_COMMIT: $(du -sh "$dest" | cut -f1) in $dest"
}

# --- cuda.h and nvml.h ---------------------------------------------------------------
fetch_cuda_headers() {
    local dest="$state/cuda-headers" stamp="$CUDA_RUNTIME_HEADERS $NVML_HEADERS"
    if [ -f "$dest/.versions" ] && [ "$(cat "$dest/.versions")" = "$stamp" ]; then
        say "CUDA headers ($stamp): already there"
        return
    fi
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
        -d "$scratch/headers" "$CUDA_RUNTIME_HEADERS" "$NVML_HEADERS"
    rm -rf "$dest"
    mkdir -p "$dest"
    "$PYTHON" - "$scratch/headers" "$dest" <<'EOF'
import pathlib, sys, zipfile
source, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wanted = {"cuda.h", "nvml.h"}
for wheel in sorted(source.glob("*.whl")):
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            path = pathlib.PurePosixPath(name)
            if path.parent.name == "include" and path.name in wanted:
                (dest / path.name).write_bytes(archive.read(name))
                wanted.discard(path.name)
if wanted:
    sys.exit(f"the header wheels lack {sorted(wanted)}")
EOF
    echo "$stamp" >"$dest/.versions"
    say "CUDA headers ($stamp) in $dest"
}

# --- the check's Python packages, as wheels ---------------------------------------------
fetch_wheels() {
    local dest="$state/wheels" version
    mkdir -p "$dest"
    for version in $PYTHON_VERSIONS; do
        "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
            --implementation cp --python-version "$version" \
            --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
            --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
            --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
            -d "$dest" -r "$here/requirements.txt"
    done
    # Only the pinned versions: an older wheel left from an earlier pin would be a second
    # candidate for pip on the GPU machine.
    "$PYTHON" - "$dest" "$here/requirements.txt" <<'EOF'
import pathlib, re, sys
dest, requirements = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()
pins = {}
for line in requirements.read_text().splitlines():
    line = line.split("#", 1)[0].strip()
    if line:
        name, _, version = line.partition("==")
        pins[norm(name)] = version
for wheel in dest.glob("*.whl"):
    name, version = wheel.name.split("-")[:2]
    if pins.get(norm(name)) != version:
        wheel.unlink()
EOF
    say "wheels for Python $PYTHON_VERSIONS: $(du -sh "$dest" | cut -f1) in $dest"
}

fetch_hami_core
fetch_cuda_headers
fetch_wheels
say "ready: $(du -sh "$state" | cut -f1) in $state (the device run carries it; 64 MiB at most)"
