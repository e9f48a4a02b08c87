"""Timings of CEL device selectors: the engine's interpreter (cel-python with Kubernetes'
types and bounds, ``claim_cel``) against the compiled runtimes with Python bindings,
where installed; reports, asserts nothing (docs/dra-engine.md records a run).

Run standalone: ``PYTHONSAFEPATH=1 .venv/bin/python tests/bench/bench_cel.py``. The
compiled runtimes are not dependencies of the project: put them in another environment
and add its site-packages to ``PYTHONPATH`` to time them too (``cel-expr-python``: the
CEL C++ runtime; ``common-expression-language``: a Rust one). They are timed on the
expressions they can evaluate: neither carries Kubernetes' quantity or semver types, so
those rows use plain values there.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from vgpu_operator.scheduling.cel import claim_cel

D = "gpu.vgpu-operator.io"
BIG = "[" + ",".join("0" for _ in range(570)) + "]"
SLOW = f"{BIG}.all(x, {BIG}.all(y, true))"
DEVICE = claim_cel.DeviceView(
    D,
    True,
    {f"{D}/type": ("string", "NVIDIA A100-SXM4-40GB"), f"{D}/index": ("int", 2)},
    {f"{D}/memory": "40Gi", f"{D}/cores": "100"},
)
#: (name, the engine's expression, the same over plain values for the compiled runtimes)
CASES: list[tuple[str, str, str]] = [
    ("driver", f'device.driver == "{D}"', f'device.driver == "{D}"'),
    (
        "attribute",
        f'device.attributes["{D}"].index == 2',
        f'device.attributes["{D}"].index == 2',
    ),
    (
        "use-gputype (webhook)",
        f'["a100", "h100"].exists(t, device.attributes["{D}"].type.lowerAscii().contains(t))',
        f'["a100", "h100"].exists(t, device.attributes["{D}"].type.lowerAscii().contains(t))',
    ),
    (
        "capacity compareTo",
        f'device.capacity["{D}"].memory.compareTo(quantity("10Gi")) >= 0',
        f'device.capacity["{D}"].memory >= 10737418240',
    ),
    ("slow (issue 33)", SLOW, SLOW),
]


def _time(call: Callable[[], Any], budget_s: float = 1.0) -> tuple[float, str]:
    """Seconds per call (median-free: total over runs), and the outcome of one call."""
    try:
        outcome = repr(call())
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {str(exc)[:60]}"
    runs, started = 0, time.perf_counter()
    while True:
        with contextlib.suppress(Exception):
            call()
        runs += 1
        elapsed = time.perf_counter() - started
        if elapsed >= budget_s or runs >= 2000:
            return elapsed / runs, outcome


def _engine(expression: str) -> Callable[[], Any]:
    selector = claim_cel.compile_selector(expression)
    return lambda: selector.matches(DEVICE)


def _plain_device() -> dict[str, Any]:
    return {
        "driver": D,
        "attributes": {D: {"type": "NVIDIA A100-SXM4-40GB", "index": 2}},
        "capacity": {D: {"memory": 40 * 2**30, "cores": 100}},
    }


def _cel_cpp(expression: str) -> Callable[[], Any] | None:
    try:
        from cel_expr_python import cel  # type: ignore[import-not-found]
        from cel_expr_python.ext import ext_strings  # type: ignore[import-not-found]
    except ImportError:
        return None
    env = cel.NewEnv(variables={"device": cel.Type.DYN}, extensions=[ext_strings.ExtStrings()])
    compiled = env.compile(expression)
    data = {"device": _plain_device()}
    return lambda: compiled.eval(data=data).value()


def _cel_rust(expression: str) -> Callable[[], Any] | None:
    try:
        import cel  # type: ignore[import-not-found]
    except ImportError:
        return None
    data = {"device": _plain_device()}
    return lambda: cel.evaluate(expression, data)


def run() -> None:
    print(f"{'selector':<24}{'runtime':<28}{'per evaluation':>16}  outcome")
    for name, expression, plain in CASES:
        rows: list[tuple[str, Callable[[], Any] | None]] = [
            ("cel-python (engine)", _engine(expression)),
            ("cel-expr-python (C++)", _cel_cpp(plain)),
            ("common-expression-language", _cel_rust(plain)),
        ]
        for runtime, call in rows:
            if call is None:
                continue
            seconds, outcome = _time(call)
            print(f"{name:<24}{runtime:<28}{seconds * 1e6:>13.1f} µs  {outcome}")


if __name__ == "__main__":
    run()
