"""The CPU's quantized products under numerics="int8" against "fast" (int16), side by side.

For each weight type, a 5632 x 2048 weight (a 1B-class llama's feed-forward) in a weights
buffer times 1, 8 and 128 activation rows (a decode step, a batch of sequences, a prompt's
chunk), computed by the CPU backend under each numerics in turns: GMAC/s of each and the
ratio int8 / fast (products of several rows are compute-bound, where int8's vpdpbusd makes
twice the products of int16's vpdpwssd). The weight's 3-7 MB stay in the cache between calls,
so one row gains here too; in a model, where a decode step streams every weight from memory,
it reads at memory speed under either. A build without AVX-512 VNNI computes "int8" as
"fast" (ratio about 1). The accuracy side is bench/accuracy.py's. Prints a table, or with
--json one JSON object.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

import polydev
from polydev import GGMLType
from polydev.backends.cpu.device import cpu_model
from polydev.types import random_blocks

from cpu_ops import Case  # bench/
from figures import parse_args, print_figures  # bench/

M, K = 5632, 2048
TYPES = ("Q4_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K")
ROWS = (1, 8, 128)
ROUNDS = 5


def _product(backend, weight: np.ndarray, qtype: GGMLType, x: np.ndarray) -> Case:
    from polydev import ops

    return Case(backend, lambda ctx, w, x: ops.mul_mat(ctx, w, x),
                {"x": (GGMLType.F32, (K, x.shape[0]), x)},
                {"w": (qtype, (K, M), weight)})


def _seconds(case: Case, rows: int) -> float:
    reps = max(3, 256 // rows)
    start = time.perf_counter()
    for _ in range(reps):
        case()
    return (time.perf_counter() - start) / reps


def measure(qtype: GGMLType, rows: int, quick: bool) -> dict[str, float]:
    """Median seconds per product under each numerics, measured in turns."""
    rng = np.random.default_rng(0)
    weight = random_blocks(qtype, M * K // qtype.traits.block_size, rng).reshape(M, -1)
    x = rng.standard_normal((rows, K)).astype(np.float32)
    backends = {n: polydev.init_backend("CPU") for n in ("fast", "int8")}
    cases = {}
    try:
        for numerics, backend in backends.items():
            backend.set_numerics(numerics)
            cases[numerics] = _product(backend, weight, qtype, x)
            cases[numerics]()                      # warm-up: the interleaved copy
        times = {n: [] for n in cases}
        for _ in range(1 if quick else ROUNDS):
            for numerics, case in cases.items():
                times[numerics].append(_seconds(case, rows))
        return {n: statistics.median(t) for n, t in times.items()}
    finally:
        for case in cases.values():
            case.close()
        for backend in backends.values():
            backend.close()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    figures = []
    for name in TYPES[:2] if args.quick else TYPES:
        qtype = GGMLType[name]
        for rows in ROWS:
            t = measure(qtype, rows, args.quick)
            rate = {n: M * K * rows / s / 1e9 for n, s in t.items()}
            figures.append({"name": f"{name} {M}x{K} x {rows} rows: int8 / fast",
                            "value": round(t["fast"] / t["int8"], 2), "unit": "ratio",
                            "target": None, "better": "higher",
                            "detail": f"int8 {rate['int8']:.0f} GMAC/s, fast "
                                      f"{rate['fast']:.0f} GMAC/s"})
    print_figures("numerics", f"{cpu_model()}, CPU backend's default threads", figures,
                  args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
