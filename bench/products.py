"""A decode step's products on the CPU backend: how fast a chain of mat-vecs reads its weights,
per type, against the host's read loop.

    python bench/products.py [--mib 384] [--rounds 3] [--types Q4_K,Q6_K] [--threads 2]

A decode step multiplies one activation row by every weight once, so its products should read
their weights at the host's memory bandwidth. Per type and per shape (a 1B-class llama's
feed-forward, 5632 x 2048, and its attention's, 2048 x 2048), a planned graph of as many
products as make about ``--mib`` MiB of weights (far beyond the caches), each weight its own,
runs as a decode step's replay does (one run of compiled calls, checked); the figure is its
bytes (the file's layout) over its best time of several, beside bench/bandwidth.py's read loop
(its best pass, median of 3) with as many threads, measured in turns with it (``--rounds``: a
shared host's bandwidth moves between minutes). The issue's target for a decode step is 0.85
of the loop. This is the bench that found a Zen 4's products at 16-22 GB/s of its 32 with
software prefetches, 23-29 without.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import polydev
from polydev import BufferUsage, Context, GGMLType, alloc_ctx_tensors, build_graph, ops
from polydev.backends.cpu.replay import NativeRun
from polydev.tools.table import format_table
from polydev.types import random_blocks

from bandwidth import median_bandwidth  # bench/

SHAPES = {"ffn 5632x2048": (5632, 2048), "attn 2048x2048": (2048, 2048),   # label: M, K
          "kv 512x2048": (512, 2048)}
TYPES = ("Q4_0", "Q4_K", "Q5_K", "Q6_K", "Q8_0")
REPS = 9


class ProductChain:
    """``n`` products of M x K weights of ``type_`` with one activation row, summed (so each
    is computed), planned once on ``backend``."""

    def __init__(self, backend, type_: GGMLType, m: int, k: int, n: int) -> None:
        rng = np.random.default_rng(0)
        wctx, ctx = Context(), Context()
        self.weights = [wctx.new_tensor_2d(type_, k, m, name=f"w{i}") for i in range(n)]
        x = ctx.new_tensor_2d(GGMLType.F32, k, 1, name="x")
        total = ops.mul_mat(ctx, self.weights[0], x)
        for w in self.weights[1:]:
            total = ops.add(ctx, total, ops.mul_mat(ctx, w, x))
        self.backend = backend
        self.wbuf = alloc_ctx_tensors(wctx, backend)
        self.wbuf.usage = BufferUsage.WEIGHTS
        self.buf = alloc_ctx_tensors(ctx, backend)
        blocks = random_blocks(type_, m * k // type_.traits.block_size, rng).reshape(m, -1)
        for w in self.weights:
            w.set_data(blocks)
        x.set_data(rng.standard_normal((1, k)).astype(np.float32))
        self.plan = backend.graph_plan_create(build_graph(total))
        if not any(isinstance(step, NativeRun) for step in self.plan.steps):
            raise RuntimeError(f"{type_.name}: the products are not compiled calls here (no "
                               "CPU kernels?); this bench times the compiled kernels")

    @property
    def nbytes(self) -> int:
        return sum(w.nbytes for w in self.weights)

    def seconds(self) -> float:
        """The best time of REPS computes after a warm-up (which makes the weights' copies), as
        the read loop takes its best pass."""
        for _ in range(2):
            self.backend.graph_plan_compute(self.plan)
        times = []
        for _ in range(REPS):
            t0 = time.perf_counter()
            self.backend.graph_plan_compute(self.plan)
            times.append(time.perf_counter() - t0)
        return min(times)

    def close(self) -> None:
        self.backend.graph_plan_free(self.plan)
        self.buf.close()
        self.wbuf.close()


def measure(backend, types: list[str], mib: int, rounds: int, threads: int) -> list[list[str]]:
    """The table's rows: per type and shape, the median over rounds of the chain's GB/s and
    of its share of the read loop measured just before it."""
    rows = []
    for name in types:
        type_ = GGMLType[name]
        for label, (m, k) in SHAPES.items():
            one = Context().new_tensor_2d(type_, k, m).nbytes
            chain = ProductChain(backend, type_, m, k, max(2, mib * 2**20 // one))
            try:
                rates, shares = [], []
                for _ in range(rounds):
                    loop = median_bandwidth(threads)
                    rate = chain.nbytes / chain.seconds()
                    rates.append(rate)
                    shares.append(rate / loop)
                per_product = chain.nbytes / statistics.median(rates) / len(chain.weights)
            finally:
                chain.close()
            rows.append([name, label, f"{per_product * 1e6:.0f}",
                         f"{statistics.median(rates) / 1e9:.1f}",
                         f"{statistics.median(shares):.2f}"])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=384,
                        help="MiB of weights per chain (default 384: beyond any L3 here)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of read loop and chain in turns (default 3)")
    parser.add_argument("--types", default=",".join(TYPES),
                        help=f"weight types, comma-separated (default {','.join(TYPES)})")
    parser.add_argument("--threads", type=int, default=2, help="threads (default 2)")
    args = parser.parse_args()
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    unknown = [t for t in types if t not in TYPES]
    if unknown:
        parser.error(f"{', '.join(unknown)}: not one of {', '.join(TYPES)}")
    with polydev.init_backend("CPU") as backend:
        backend.set_n_threads(args.threads)
        rows = measure(backend, types, args.mib, args.rounds, args.threads)
    print(f"mat-vecs over about {args.mib} MiB of weights, {args.threads} threads; "
          f"'of loop': GB/s over bench/bandwidth.py's read loop, in turns (the issue's "
          f"target for a decode step: 0.85)")
    print(format_table(["type", "weight", "µs/product", "GB/s", "of loop"], rows))


if __name__ == "__main__":
    main()
