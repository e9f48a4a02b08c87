"""The CDI spec files of prepared claims: written whole or not at all, removed by name.

The container runtime reads every spec in its CDI directory when it creates a container,
so a spec must never be seen half-written: it is written beside its final name and
renamed into place.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def write_spec(directory: Path, file_name: str, spec: Mapping[str, Any]) -> Path:
    """Write (or rewrite, identically for the same claim) one spec; returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / file_name
    partial = directory / f".{file_name}.partial"
    partial.write_text(json.dumps(spec, indent=2, sort_keys=True) + "\n")
    os.chmod(partial, 0o644)
    os.replace(partial, target)
    return target


def read_specs(directory: Path, prefix: str) -> dict[str, dict[str, Any]]:
    """The specs whose file names start with ``prefix`` (file name -> spec); a file that
    is not a JSON object is skipped (it is not one this driver wrote whole)."""
    specs: dict[str, dict[str, Any]] = {}
    for path in sorted(directory.glob(f"{prefix}*.json")):
        try:
            spec = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(spec, dict):
            specs[path.name] = spec
    return specs


def remove_spec(directory: Path, file_name: str) -> bool:
    """Remove one spec; False when it was not there (Unprepare is idempotent)."""
    try:
        (directory / file_name).unlink()
    except FileNotFoundError:
        return False
    return True


def ensure_cache_dir(path: Path) -> None:
    """The claim's HAMi-core cache directory, writable by the container's user. Kept as it
    is when it exists: a Prepare repeated for a claim whose containers run must not wipe
    the usage records they share."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o777)


def remove_cache_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
