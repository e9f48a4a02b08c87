"""The ResourceSlice the agent's DRA driver would publish for the same reading.

The DRA driver (``vgpu_operator.agent.dra``) is being written; until it is in the tree this
step is skipped, saying so. Once it is, the step calls its ``resource_slices(status,
node_name)`` (the inventory status read by the first step and the node's name, returning
the ResourceSlice objects as mappings), prints them, and checks that every card of the
inventory is a device of a slice (by UUID, wherever the slice keeps it).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

import yaml

from gpu_check.context import Run
from gpu_check.outcome import CheckResult, failed, passed, skipped

NAME: Final = "DRA: the ResourceSlice"
MODULE: Final = "vgpu_operator.agent.dra"
ENTRY: Final = "resource_slices"


def resource_slice(run: Run) -> CheckResult:
    try:
        module = importlib.import_module(MODULE)
    except ModuleNotFoundError as exc:
        if exc.name is not None and MODULE.startswith(exc.name):
            return skipped(NAME, f"the DRA driver ({MODULE}) is not in this tree yet")
        return failed(NAME, f"{MODULE} does not import: {exc}")
    entry = getattr(module, ENTRY, None)
    if not callable(entry):
        return skipped(
            NAME,
            f"{MODULE} has no {ENTRY}(status, node_name) yet; the check prints the slices "
            "once it has",
        )
    if run.status is None:
        return skipped(NAME, "no inventory reading (its check failed)")
    slices: Sequence[Mapping[str, Any]] = list(entry(run.status, run.options.node_name))
    document = yaml.safe_dump_all([dict(s) for s in slices], sort_keys=False)
    details = ["```yaml", document.rstrip(), "```"]
    text = json.dumps(slices, default=str)
    missing = [d.uuid for d in run.status.devices if d.uuid not in text]
    if missing:
        return failed(NAME, f"cards of the inventory in no slice: {', '.join(missing)}", details)
    return passed(NAME, f"{len(slices)} slice(s) covering every card", details, slices=slices)
