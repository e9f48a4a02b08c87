"""A small CUDA program for HAMi-core to govern: the standard library and the driver API
(libcuda through ctypes) only, so it needs no compiler, no CUDA toolkit and no package.

Run as a script, in its own process (HAMi-core is preloaded into it, and a CUDA failure
must not take the check down); it prints one JSON object on stdout:

``mem --below-mib B --above-mib A``
    the memory CUDA reports (HAMi-core answers with the container's limit), then one
    allocation of B MiB and one of A MiB, each freed again: their CUresult codes.
``busy --seconds S`` / ``busy --iterations K --launches N``
    a busy kernel, hand-written PTX loaded through cuModuleLoadData (the driver compiles
    it: no nvcc), launched back to back: calibrated to about 10 ms a launch and run for S
    seconds, or run N times with K iterations; the elapsed time.

Device 0 is the card under test: the caller sets CUDA_VISIBLE_DEVICES.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from typing import Any, Final

CUDA_SUCCESS: Final = 0
CUDA_ERROR_OUT_OF_MEMORY: Final = 2
_MIB: Final = 1024 * 1024
_THREADS: Final = 256
_BLOCKS_PER_SM: Final = 4
_TARGET_LAUNCH_S: Final = 0.010
_BATCH: Final = 10
_MULTIPROCESSOR_COUNT: Final = 16  # CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
_CC_MAJOR: Final = 75  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
_CC_MINOR: Final = 76

#: Every thread runs ``iterations`` dependent multiply-adds and stores the result (so the
#: compiler cannot drop the loop). Written for the oldest target that runs it; the driver
#: compiles PTX for the card it loads on.
BUSY_PTX: Final = """
.version {version}
.target {target}
.address_size 64

.visible .entry busy(
    .param .u64 out,
    .param .u32 iterations
)
{{
    .reg .pred %p<2>;
    .reg .b32 %r<8>;
    .reg .f32 %f<4>;
    .reg .b64 %rd<4>;

    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [iterations];
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %ntid.x;
    mov.u32 %r4, %tid.x;
    mad.lo.u32 %r5, %r2, %r3, %r4;
    cvt.rn.f32.u32 %f1, %r5;
    mov.u32 %r6, 0;
LOOP:
    fma.rn.f32 %f1, %f1, 0f3F7FFFEF, 0f3F800000;
    add.u32 %r6, %r6, 1;
    setp.lt.u32 %p1, %r6, %r1;
    @%p1 bra LOOP;
    cvta.to.global.u64 %rd2, %rd1;
    mul.wide.u32 %rd3, %r5, 4;
    add.u64 %rd2, %rd2, %rd3;
    st.global.f32 [%rd2], %f1;
    ret;
}}
"""
#: (PTX ISA version, target) tried in order: the oldest first (any card since Maxwell),
#: then newer ones for a driver that no longer compiles the old targets.
PTX_TARGETS: Final = (("6.0", "sm_50"), ("7.0", "sm_70"), ("7.8", "sm_90"), ("8.0", "sm_90"))


class CudaError(Exception):
    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call}: {code} {name}")
        self.call = call
        self.code = code
        self.name = name


class Driver:
    """The few driver API calls the probes make."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def error_name(self, code: int) -> str:
        text = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(text)) != CUDA_SUCCESS or not text.value:
            return "unknown"
        return text.value.decode()

    def call(self, name: str, *args: Any) -> None:
        code = getattr(self.lib, name)(*args)
        if code != CUDA_SUCCESS:
            raise CudaError(name, code, self.error_name(code))

    def try_call(self, name: str, *args: Any) -> int:
        return int(getattr(self.lib, name)(*args))

    def open_device(self) -> ctypes.c_int:
        self.call("cuInit", 0)
        device = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(device), 0)
        context = ctypes.c_void_p()
        # The primary context, as the CUDA runtime (and so every framework) uses it.
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        self.call("cuCtxSetCurrent", context)
        return device

    def attribute(self, device: ctypes.c_int, attribute: int) -> int:
        value = ctypes.c_int()
        self.call("cuDeviceGetAttribute", ctypes.byref(value), attribute, device)
        return value.value


def probe_memory(below_mib: int, above_mib: int) -> dict[str, Any]:
    cuda = Driver()
    cuda.open_device()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cuda.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
    result: dict[str, Any] = {"free_mib": free.value // _MIB, "total_mib": total.value // _MIB}
    for label, mib in (("below", below_mib), ("above", above_mib)):
        pointer = ctypes.c_uint64()
        code = cuda.try_call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(mib * _MIB))
        result[label] = {"mib": mib, "code": code, "name": cuda.error_name(code)}
        if code == CUDA_SUCCESS:
            cuda.call("cuMemFree_v2", pointer)
    return result


def _load_busy_kernel(cuda: Driver) -> tuple[ctypes.c_void_p, str]:
    failures = []
    for version, target in PTX_TARGETS:
        image = BUSY_PTX.format(version=version, target=target).encode() + b"\0"
        module = ctypes.c_void_p()
        code = cuda.try_call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(image))
        if code == CUDA_SUCCESS:
            function = ctypes.c_void_p()
            cuda.call("cuModuleGetFunction", ctypes.byref(function), module, b"busy")
            return function, f"PTX {version} {target}"
        failures.append(f"{target}: {code} {cuda.error_name(code)}")
    raise CudaError("cuModuleLoadData", -1, "; ".join(failures))


_MAX_ITERATIONS: Final = 1 << 30


def next_iterations(iterations: int, seconds: float) -> int | None:
    """While one launch is too short to time well, four times the work; None once it is."""
    if seconds >= _TARGET_LAUNCH_S / 4 or iterations >= _MAX_ITERATIONS:
        return None
    return iterations * 4


def scaled_iterations(iterations: int, seconds: float) -> int:
    """The iterations for a launch of about 10 ms, from one of ``seconds``."""
    return max(1, min(_MAX_ITERATIONS, int(iterations * _TARGET_LAUNCH_S / max(seconds, 1e-6))))


def probe_busy(
    seconds: float | None, iterations: int | None, launches: int | None
) -> dict[str, Any]:
    cuda = Driver()
    device = cuda.open_device()
    sms = cuda.attribute(device, _MULTIPROCESSOR_COUNT)
    capability = f"{cuda.attribute(device, _CC_MAJOR)}.{cuda.attribute(device, _CC_MINOR)}"
    function, ptx = _load_busy_kernel(cuda)
    blocks = sms * _BLOCKS_PER_SM
    out = ctypes.c_uint64()
    cuda.call("cuMemAlloc_v2", ctypes.byref(out), ctypes.c_size_t(blocks * _THREADS * 4))
    count = ctypes.c_uint32(iterations or 1 << 16)
    params = (ctypes.c_void_p * 2)(
        ctypes.cast(ctypes.byref(out), ctypes.c_void_p),
        ctypes.cast(ctypes.byref(count), ctypes.c_void_p),
    )

    def launch(times: int) -> float:
        start = time.perf_counter()
        for _ in range(times):
            cuda.call(
                "cuLaunchKernel", function, blocks, 1, 1, _THREADS, 1, 1, 0, None, params, None
            )
        cuda.call("cuCtxSynchronize")
        return time.perf_counter() - start

    launch(1)  # the first launch pays for loading; not measured
    if iterations is None:
        # Calibrate: a launch of about 10 ms, so a limiter that acts between launches can.
        while True:
            once = launch(1)
            grown = next_iterations(count.value, once)
            if grown is None:
                break
            count.value = grown
        count.value = scaled_iterations(count.value, once)
    # Launched in batches of ten, each waited for, in both modes alike: the limited run
    # repeats the unlimited one's batches exactly.
    done, elapsed = 0, 0.0
    while (elapsed < (seconds or 3.0)) if launches is None else (done < launches):
        batch = _BATCH if launches is None else min(_BATCH, launches - done)
        elapsed += launch(batch)
        done += batch
    return {
        "iterations": count.value,
        "launches": done,
        "elapsed_s": elapsed,
        "per_launch_ms": 1000 * elapsed / max(done, 1),
        "blocks": blocks,
        "threads": _THREADS,
        "multiprocessors": sms,
        "compute_capability": capability,
        "kernel": ptx,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    mem = commands.add_parser("mem")
    mem.add_argument("--below-mib", type=int, required=True)
    mem.add_argument("--above-mib", type=int, required=True)
    busy = commands.add_parser("busy")
    busy.add_argument("--seconds", type=float)
    busy.add_argument("--iterations", type=int)
    busy.add_argument("--launches", type=int)
    args = parser.parse_args(argv)
    try:
        if args.command == "mem":
            result = probe_memory(args.below_mib, args.above_mib)
        else:
            result = probe_busy(args.seconds, args.iterations, args.launches)
    except CudaError as exc:
        print(json.dumps({"error": str(exc), "code": exc.code}))
        return 1
    except OSError as exc:  # libcuda.so.1 missing or unloadable
        print(json.dumps({"error": f"cannot load libcuda.so.1: {exc}"}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
