#!/usr/bin/env bash
# make gpu-check: the hardware check (docs/hardware.md). Needs no network: what it cannot find
# on the machine comes from .gpu-check/, filled beforehand by `make gpu-check-prepare`.
# Arguments go to the check (python -m gpu_check --help lists them).
#
# The Python that runs it, first that works:
#   $GPU_CHECK_PYTHON;
#   .venv/bin/python (make dev) when it imports the agent;
#   python3 (3.11 or later) with the wheels of .gpu-check/wheels installed, without network,
#   into .gpu-check/site-<version>, and the package linked from .gpu-check/src.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
state="$root/.gpu-check"
# operator/ would shadow the standard library's `operator` module for a Python started here.
export PYTHONSAFEPATH=1 PYTHONUNBUFFERED=1

say() { printf '[gpu-check] %s\n' "$*" >&2; }
imports='import vgpu_operator.agent.deviceplugin.server, vgpu_operator.agent.nvml, pynvml, yaml'

if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
    python="$GPU_CHECK_PYTHON"
    extra_path=""
elif [ -x "$root/.venv/bin/python" ] && "$root/.venv/bin/python" -c "$imports" 2>/dev/null; then
    python="$root/.venv/bin/python"
    extra_path=""
else
    python="$(command -v python3 || true)"
    if [ -z "$python" ] || ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
        say "error: the check needs Python 3.11 or later (python3 is ${python:-missing}); set GPU_CHECK_PYTHON"
        exit 2
    fi
    tag="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    site="$state/site-$tag"
    # The package under its import name, without installing it.
    mkdir -p "$state/src"
    ln -sfn "$root/operator" "$state/src/vgpu_operator"
    extra_path="$state/src"
    if [ -d "$state/wheels" ]; then
        if [ ! -f "$site/.installed" ]; then
            say "installing the check's Python packages for Python $tag from .gpu-check/wheels (no network)"
            rm -rf "$site"
            if "$python" -m pip install --quiet --no-index --no-deps --disable-pip-version-check \
                --no-compile --find-links "$state/wheels" --target "$site" \
                -r "$here/requirements.txt"; then
                touch "$site/.installed"
            else
                say "warning: pip could not install .gpu-check/wheels for Python $tag"
            fi
        fi
        extra_path="$site:$extra_path"
    fi
    if ! PYTHONPATH="$extra_path${PYTHONPATH:+:$PYTHONPATH}" "$python" -c "$imports"; then
        say "error: $python cannot import the agent's code and its packages (above)."
        say "Run 'make gpu-check-prepare' on a machine with network and bring .gpu-check/ along"
        say "(its wheels cover Python 3.11 to 3.13), or set GPU_CHECK_PYTHON to a Python that has them."
        exit 2
    fi
fi

export PYTHONPATH="$here${extra_path:+:$extra_path}${PYTHONPATH:+:$PYTHONPATH}"
say "python: $python"
exec "$python" -m gpu_check --repo-root "$root" "$@"
