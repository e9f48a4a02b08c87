"""HAMi-core's files on the host: the library and its preload file, installed at start,
and the directories each container's share needs, made before Allocate answers.

The agent sees the host's HAMi-core directory at the same path it has on the host (the
DaemonSet mounts it so, as HAMi's does), so a path written here is the path kubelet mounts
into the container. The container runtime would create a missing host directory itself,
but owned by root with mode 0755: HAMi-core, running as the container's user, could not
write its shared cache or lock files there, so both are made here, writable by all.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Final

import structlog

log = structlog.get_logger(__name__)

LIBRARY: Final = "libvgpu.so"
PRELOAD: Final = "ld.so.preload"
CONTAINERS: Final = "containers"
#: Anyone may write: the container's process runs as whatever user its image says.
_SHARED_MODE: Final = 0o777


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def install(source: Path, hook_dir: Path, container_hook_dir: str) -> bool:
    """Copy HAMi-core's library from the image into ``hook_dir`` on the host (only when it
    differs: a running container may hold the old file open) and point ``ld.so.preload``
    at the library's path inside containers. Returns True when anything was written."""
    hook_dir.mkdir(parents=True, exist_ok=True)
    target = hook_dir / LIBRARY
    wrote = False
    if not target.exists() or _digest(target) != _digest(source):
        # Copy beside it and rename: a container starting now sees the old or the new
        # library, never half of one.
        partial = hook_dir / f".{LIBRARY}.partial"
        shutil.copyfile(source, partial)
        os.chmod(partial, 0o755)
        os.replace(partial, target)
        wrote = True
    preload = hook_dir / PRELOAD
    wanted = f"{container_hook_dir}/{LIBRARY}\n"
    if not preload.exists() or preload.read_text() != wanted:
        preload.write_text(wanted)
        os.chmod(preload, 0o644)
        wrote = True
    (hook_dir / CONTAINERS).mkdir(exist_ok=True)
    log.info("hami_core_installed", directory=str(hook_dir), changed=wrote)
    return wrote


def prepare_container_dir(path: Path) -> None:
    """The container's own cache directory, empty: a container restarted under the same
    pod and name must not inherit its predecessor's usage records."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    os.chmod(path, _SHARED_MODE)


def prepare_lock_dir(path: Path) -> None:
    """HAMi-core's lock directory, shared by every container on the node."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, _SHARED_MODE)
