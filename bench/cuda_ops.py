"""The CUDA backend against CuPy and against the GPU's own copy bandwidth, in one run.

- MUL_MAT 4096x4096 by 512, F32 and F16: polydev's TFLOPS, and the ratio to ``cupy.matmul``
  on the same device arrays (target 0.9 or more).
- Quantized matrix-vector products 4096x14336 by 1 (Q4_K and Q8_0, the others for
  information): GB/s over the weight's quantized bytes, and the ratio to the device's
  measured copy bandwidth (a 1 GiB device-to-device copy, bytes read plus bytes written;
  target 0.5 or more).
- Batched quantized products (dequantize then cuBLAS), for information.

Times are medians of CUDA-event timings on the backend's stream after a warm-up. Prints a
table, or with --json one JSON object.
"""

from __future__ import annotations

import statistics
import sys
from typing import Callable

import numpy as np

import polydev
from polydev import Context, GGMLType, alloc_ctx_tensors, build_graph, ops
from polydev.buffer import BufferUsage
from polydev.types import TYPE_TRAITS, random_blocks

from figures import parse_args, print_figures  # bench/figures.py

MAT_VEC_TYPES = [GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0,
                 GGMLType.Q5_1, GGMLType.Q5_K, GGMLType.Q6_K, GGMLType.F16]
TARGETED = {GGMLType.Q4_K, GGMLType.Q8_0}


class GPUTimer:
    """Milliseconds per call of ``fn`` on ``stream``: CUDA events around ``reps`` calls,
    median of ``rounds`` rounds, after a warm-up."""

    def __init__(self, cupy, stream, rounds: int) -> None:
        self.cupy, self.stream, self.rounds = cupy, stream, rounds

    def __call__(self, fn: Callable[[], None], reps: int) -> float:
        cuda = self.cupy.cuda
        fn()
        self.stream.synchronize()
        times = []
        for _ in range(self.rounds):
            start, end = cuda.Event(), cuda.Event()
            start.record(self.stream)
            for _ in range(reps):
                fn()
            end.record(self.stream)
            end.synchronize()
            times.append(cuda.get_elapsed_time(start, end) / reps)
        return statistics.median(times)


def _weights(type_: GGMLType, m: int, k: int, rng) -> np.ndarray:
    tr = TYPE_TRAITS[type_]
    if tr.is_quantized:
        return random_blocks(type_, m * k // tr.block_size, rng).reshape(m, -1)
    return (rng.standard_normal((m, k)) * 0.05).astype(np.float32)


class Product:
    """dst = mul_mat(a, b) with a (k, m) of ``a_type`` and b (k, n) of ``b_type``, allocated
    on ``device`` and bound into a plan of ``backend``."""

    def __init__(self, device, backend, a_type, b_type, k: int, m: int, n: int, rng) -> None:
        self.wctx, self.ctx = Context(), Context()
        self.a = self.wctx.new_tensor(a_type, (k, m), "a")
        self.b = self.ctx.new_tensor(b_type, (k, n), "b")
        self.out = ops.mul_mat(self.ctx, self.a, self.b)
        self.wbuf = alloc_ctx_tensors(self.wctx, device.buffer_type)
        self.wbuf.usage = BufferUsage.WEIGHTS
        self.buf = alloc_ctx_tensors(self.ctx, device.buffer_type)
        self.a.set_data(_weights(a_type, m, k, rng))
        self.b.set_data(rng.standard_normal((n, k)).astype(np.float32))
        self.backend = backend
        self.plan = backend.graph_plan_create(build_graph(self.out))

    def compute(self) -> None:
        self.backend.graph_plan_compute(self.plan)

    def close(self) -> None:
        self.buf.close()
        self.wbuf.close()


def gemm_figures(device, backend, timer: GPUTimer, quick: bool) -> list[dict]:
    cupy = backend.cupy
    k = m = 2048 if quick else 4096
    n = 512
    flop = 2.0 * k * m * n
    figures = []
    rng = np.random.default_rng(0)
    for name, type_ in (("F32", GGMLType.F32), ("F16", GGMLType.F16)):
        p = Product(device, backend, type_, type_, k, m, n, rng)
        a, b = backend.env.view(p.a)[0, 0], backend.env.view(p.b)[0, 0]
        with backend.on_stream():
            ours = timer(p.compute, 10)
            ref = timer(lambda: cupy.matmul(b, a.T), 10)
        p.close()
        tflops, ref_tflops = flop / ours / 1e9, flop / ref / 1e9
        figures.append({"name": f"MUL_MAT {name} {k}x{m} by {n} vs cupy.matmul",
                        "value": round(tflops / ref_tflops, 3), "unit": "ratio",
                        "target": 0.9, "better": "higher",
                        "detail": f"{tflops:.1f} TFLOPS vs {ref_tflops:.1f} TFLOPS"})
    return figures


def copy_bandwidth(backend, timer: GPUTimer, quick: bool) -> float:
    """GB/s of a device-to-device copy, counting the bytes read and the bytes written."""
    cupy = backend.cupy
    nbytes = (256 if quick else 1024) << 20
    with backend.on_stream():
        src, dst = cupy.empty(nbytes, np.uint8), cupy.empty(nbytes, np.uint8)
        src.fill(1)
        ms = timer(lambda: dst.data.copy_from_device_async(src.data, nbytes, backend.stream), 5)
    return 2 * nbytes / ms / 1e6


def mat_vec_figures(device, backend, timer: GPUTimer, copy_gbs: float,
                    quick: bool) -> list[dict]:
    k, m = 4096, 7168 if quick else 14336
    figures = []
    rng = np.random.default_rng(1)
    for type_ in MAT_VEC_TYPES:
        p = Product(device, backend, type_, GGMLType.F32, k, m, 1, rng)
        with backend.on_stream():
            ms = timer(p.compute, 50)
        gbs = p.a.nbytes / ms / 1e6
        p.close()
        figures.append({"name": f"MUL_MAT {type_.name} {k}x{m} by 1, GB/s of weights vs "
                                f"copy bandwidth",
                        "value": round(gbs / copy_gbs, 3), "unit": "ratio",
                        "target": 0.5 if type_ in TARGETED else None, "better": "higher",
                        "detail": f"{gbs:.0f} GB/s vs {copy_gbs:.0f} GB/s, {ms * 1e3:.1f} us"})
    return figures


def batched_quant_figures(device, backend, timer: GPUTimer, quick: bool) -> list[dict]:
    k, m, n = 4096, 4096 if quick else 14336, 512
    figures = []
    rng = np.random.default_rng(2)
    for type_ in (GGMLType.Q4_K, GGMLType.Q8_0, GGMLType.F16):
        p = Product(device, backend, type_, GGMLType.F32, k, m, n, rng)
        with backend.on_stream():
            ms = timer(p.compute, 5)
        p.close()
        figures.append({"name": f"MUL_MAT {type_.name} {k}x{m} by {n} (f32 activations)",
                        "value": round(2.0 * k * m * n / ms / 1e9, 1), "unit": "TFLOPS",
                        "target": None, "better": "higher"})
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    gpus = [d for d in polydev.devices() if d.reg is not None and d.reg.name == "CUDA"]
    if not gpus:
        reg = polydev.registry().reg_by_name("CUDA")
        why = reg.unavailable_reason if reg is not None else "the CUDA backend is not registered"
        print(f"no CUDA device: {why}", file=sys.stderr)
        return 1
    device = gpus[0]
    with device.init_backend() as backend:
        timer = GPUTimer(backend.cupy, backend.stream, 3 if args.quick else 7)
        copy_gbs = copy_bandwidth(backend, timer, args.quick)
        figures = (gemm_figures(device, backend, timer, args.quick)
            + mat_vec_figures(device, backend, timer, copy_gbs, args.quick)
            + batched_quant_figures(device, backend, timer, args.quick))
    figures.append({"name": "device-to-device copy (read + written bytes)",
                    "value": round(copy_gbs), "unit": "GB/s", "target": None,
                    "better": "higher"})
    machine = (f"{polydev.device('CPU').description}; {device.description} "
              f"(compute capability {device.compute_capability})")
    print_figures("cuda_ops", machine, figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
