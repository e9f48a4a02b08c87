"""The process that evaluates CEL selectors for the operator (``cel_offload``).

One JSON request a line on stdin (an expression and a device), one JSON answer a line on
stdout, in order. A separate process because the interpreter is pure Python: a thread
would hold the GIL the operator's event loop needs, and only a process can be stopped
at its deadline whatever it is doing (a backtracking regular expression, say). Its
address space is capped, so an expression that builds huge values fails here, not in
the operator.
"""

from __future__ import annotations

import json
import resource
import sys
import time
from collections.abc import Mapping
from typing import Any, Final, TextIO

from vgpu_operator.scheduling.cel import claim_cel

#: The address space the evaluator may use (the interpreter itself takes ~60 MiB).
MEMORY_LIMIT_BYTES: Final = 1 << 30


def device_to_wire(device: claim_cel.DeviceView) -> dict[str, Any]:
    return {
        "driver": device.driver,
        "multi": device.allow_multiple,
        "attributes": {k: [kind, value] for k, (kind, value) in device.attributes.items()},
        "capacity": dict(device.capacity),
    }


def device_from_wire(raw: Mapping[str, Any]) -> claim_cel.DeviceView:
    return claim_cel.DeviceView(
        str(raw["driver"]),
        bool(raw["multi"]),
        {str(k): (str(v[0]), v[1]) for k, v in raw["attributes"].items()},
        {str(k): str(v) for k, v in raw["capacity"].items()},
    )


def answer(cache: claim_cel.SelectorCache, request: Mapping[str, Any]) -> dict[str, Any]:
    """One request's answer: ``{"match": bool}``, or ``{"error": str, "costly": bool}``."""
    try:
        selector = cache.compile(str(request["expression"]))
        return {"match": selector.matches(device_from_wire(request["device"]))}
    except claim_cel.CelTooCostly as exc:
        return {"error": str(exc), "costly": True}
    except (claim_cel.CelRuntimeError, claim_cel.CelRefused) as exc:
        return {"error": str(exc), "costly": False}


def serve(lines_in: TextIO, lines_out: TextIO) -> None:
    cache = claim_cel.SelectorCache()  # compiles each expression once; evaluates at once
    # Imports done: deadlines start now. The CPU spent so far is the baseline against which
    # the operator measures what a request that ran past its deadline cost.
    lines_out.write(json.dumps({"ready": True, "cpu_s": time.process_time()}) + "\n")
    lines_out.flush()
    for line in lines_in:
        try:
            reply = answer(cache, json.loads(line))
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            reply = {"error": f"unreadable request: {exc}", "costly": False}
        reply["cpu_s"] = time.process_time()  # the child's CPU so far (for the logs)
        lines_out.write(json.dumps(reply) + "\n")
        lines_out.flush()


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    serve(sys.stdin, sys.stdout)


if __name__ == "__main__":
    main()
