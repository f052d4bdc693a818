"""The OpenCL backend against the CPU backend, and OpenCL transfer bandwidth, in one run.

For each case of ``polydev compare perf`` that fits a short run (decode-sized products, the
element-wise and row ops at LLM sizes, flash attention for one token): the OpenCL device's
time divided by the CPU backend's time for the same graph (below 1: OpenCL is faster). Then
host-to-device copies from pageable numpy memory and from the pinned host buffer type, the
copy back, and a device-to-device copy between two OpenCL devices when there are two
(POCL_DEVICES="pthread pthread"). Prints a table, or with --json one JSON object.
"""

from __future__ import annotations

import re
import statistics
import sys
import time

import numpy as np

import polydev
from polydev import Context, GGMLType, alloc_ctx_tensors, tensor_copy, tensor_copy_async
from polydev.tools.compare import runner
from polydev.tools.compare.catalogue import perf_cases

from figures import parse_args, print_figures  # bench/figures.py

# decode-sized cases: the batched products take seconds per run on a CPU OpenCL driver
CASES = re.compile(r"MUL_MAT\(type_a=(f16|q4_0|q8_0|q4_K|q6_K),.*n=1,|MUL_MAT_ID\(.*q4_0.*n=1,"
                   r"|FLASH_ATTN_EXT\(.*nb=1,|^(ADD|MUL|RMS_NORM|SOFT_MAX|ROPE|CPY|GET_ROWS)\(")
COPY_BYTES = 64 << 20


def op_ratios(opencl, cpu, quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    runner.PERF_MIN_SECONDS = 0.2 if quick else 1.0
    figures = []
    with opencl.init_backend() as ocl, cpu.init_backend() as host:
        for case in perf_cases():
            if not CASES.search(case.name):
                continue
            a, b = runner.run_perf(case, ocl, rng), runner.run_perf(case, host, rng)
            if not (a.supported and b.supported):
                continue
            figures.append({"name": f"{case.name}: {opencl.name} / CPU time",
                            "value": round(a.time_us / b.time_us, 3), "unit": "ratio",
                            "target": None, "better": "lower",
                            "detail": f"{a.time_us:.0f} us vs {b.time_us:.0f} us"})
    return figures


def _timed(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _gbs(seconds: float) -> float:
    return round(COPY_BYTES / seconds / 2**30, 2)


def pinned_copy_gibs(device, reps: int = 10) -> float:
    """GiB/s of a 64 MiB copy from the device's pinned host buffer type into its memory."""
    ctx, pinned_ctx = Context(), Context()
    t = ctx.new_tensor(GGMLType.I8, (COPY_BYTES,))
    p = pinned_ctx.new_tensor(GGMLType.I8, (COPY_BYTES,))
    with (alloc_ctx_tensors(ctx, device.buffer_type),
            alloc_ctx_tensors(pinned_ctx, device.host_buffer_type)):
        p.set_data(np.random.default_rng(0).integers(0, 255, COPY_BYTES, dtype=np.uint8))
        return _gbs(_timed(lambda: tensor_copy(p, t), reps))


def transfer_figures(devices, quick: bool) -> list[dict]:
    dev = devices[0]
    reps = 3 if quick else 10
    data = np.random.default_rng(0).integers(0, 255, COPY_BYTES, dtype=np.uint8)
    ctx = Context()
    t = ctx.new_tensor(GGMLType.I8, (COPY_BYTES,))
    out = np.empty_like(data)
    figures = [{"name": f"host to device, pinned host buffer ({COPY_BYTES >> 20} MiB)",
                "value": pinned_copy_gibs(dev, reps), "unit": "GiB/s", "target": None,
                "better": "higher"}]
    with alloc_ctx_tensors(ctx, dev.buffer_type):
        rows = [("host to device, pageable numpy", lambda: t.set_data(data)),
                ("device to host", lambda: polydev.tensor_get(t, out=out))]
        if len(devices) > 1:
            other_ctx = Context()
            u = other_ctx.new_tensor(GGMLType.I8, (COPY_BYTES,))
            b0, b1 = devices[0].init_backend(), devices[1].init_backend()

            def d2d():
                tensor_copy_async(b0, b1, t, u)
                b1.synchronize()
            other = alloc_ctx_tensors(other_ctx, devices[1].buffer_type)
            rows.append((f"{devices[0].name} to {devices[1].name}, device to device", d2d))
        for name, fn in rows:
            figures.append({"name": f"{name} ({COPY_BYTES >> 20} MiB)",
                            "value": _gbs(_timed(fn, reps)), "unit": "GiB/s", "target": None,
                            "better": "higher"})
        if len(devices) > 1:
            other.close()
            b0.close()
            b1.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    opencl = [d for d in polydev.devices() if d.reg is not None and d.reg.name == "OpenCL"]
    if not opencl:
        print("no OpenCL device: pip install 'polydev[opencl]'", file=sys.stderr)
        return 1
    cpu = polydev.device("CPU")
    figures = op_ratios(opencl[0], cpu, args.quick) + transfer_figures(opencl, args.quick)
    machine = f"{cpu.description}; {opencl[0].description}"
    print_figures("opencl_ops", machine, figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
