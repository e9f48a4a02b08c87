"""Installing HAMi-core on the host at start, as HAMi's vgpu-init does."""

from __future__ import annotations

import os
from pathlib import Path

from vgpu_operator.agent import hamicore


def _library(tmp_path: Path, content: bytes) -> Path:
    source = tmp_path / "image" / "libvgpu.so"
    source.parent.mkdir(exist_ok=True)
    source.write_bytes(content)
    return source


def test_install_copies_the_library_and_points_the_preload_at_the_container_path(
    tmp_path: Path,
) -> None:
    host = tmp_path / "host" / "vgpu"
    assert hamicore.install(_library(tmp_path, b"v1"), host, "/usr/local/vgpu")
    assert (host / "libvgpu.so").read_bytes() == b"v1"
    assert (host / "ld.so.preload").read_text() == "/usr/local/vgpu/libvgpu.so\n"
    assert (host / "containers").is_dir()


def test_install_leaves_an_identical_library_alone(tmp_path: Path) -> None:
    """A running container may have the library mapped: an unchanged file is not touched."""
    host = tmp_path / "vgpu"
    source = _library(tmp_path, b"v1")
    hamicore.install(source, host, "/usr/local/vgpu")
    inode = os.stat(host / "libvgpu.so").st_ino
    assert not hamicore.install(source, host, "/usr/local/vgpu")
    assert os.stat(host / "libvgpu.so").st_ino == inode


def test_install_replaces_a_different_library(tmp_path: Path) -> None:
    host = tmp_path / "vgpu"
    hamicore.install(_library(tmp_path, b"v1"), host, "/usr/local/vgpu")
    assert hamicore.install(_library(tmp_path, b"v2"), host, "/usr/local/vgpu")
    assert (host / "libvgpu.so").read_bytes() == b"v2"
    assert not any(p.name.endswith(".partial") for p in host.iterdir())
