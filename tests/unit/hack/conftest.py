"""Tests of the hardware check (hack/gpu-check): its package is put on sys.path (appended,
as tests/conftest.py does for the helpers), and the recorded nvidia-smi outputs under
fixtures/ are served to it, parsed or through a stand-in nvidia-smi."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
CHECK_DIR = REPO / "hack" / "gpu-check"
for _path in (str(CHECK_DIR), str(Path(__file__).resolve().parent)):
    if _path not in sys.path:
        sys.path.append(_path)
