"""Shared test setup: where the test helpers live, and the hypothesis profiles.

Profiles: ``ci`` (derandomized, so a red build is reproducible), ``dev`` (quick, for
local runs) and ``nightly`` (many examples). ``ci`` is loaded when the ``CI`` variable
is set, ``dev`` otherwise; ``--hypothesis-profile=nightly`` picks another one.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

# The helpers (builders, strategies) sit next to this file. Tests are imported with
# --import-mode=importlib, which puts nothing on sys.path; the directory is appended,
# never prepended, so that it cannot shadow an installed module.
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.append(_HERE)

settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    max_examples=150,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", deadline=None, max_examples=60)
settings.register_profile(
    "nightly",
    deadline=None,
    max_examples=2000,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
