"""A prompt's attention on the CPU backend: FLASH_ATTN_EXT of the last queries of a long causal
prompt, per head shape, in ms and GFLOP/s.

    python bench/attention.py [--queries 512] [--cells 4096] [--reps 5]

Each shape (head size, query heads over KV heads: SmolLM2's, a 1B-class llama's, qwen3's,
gemma-3's) attends its last ``--queries`` queries over ``--cells`` cells of an fp16 cache
under a causal mask of 0 and -inf, as a prompt's last batch does; the figure is the median of
``--reps`` runs after a warm-up. GFLOP/s counts the two products over the cells each query
sees (4 D flops per query, head and cell), so it reads against the host's multiply-add peak.
At 4096 cells attention is most of a small model's prompt time (SmolLM2's pp4096).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import polydev
from polydev.tools.table import format_table

from cpu_ops import causal_attention_case  # bench/

SHAPES = {  # label: head size, query heads, KV heads
    "SmolLM2 D64 9/3": (64, 9, 3),
    "llama-1B D64 32/4": (64, 32, 4),
    "qwen3 D128 16/8": (128, 16, 8),
    "gemma-3 D256 4/1": (256, 4, 1),
}


def time_shape(backend, d: int, heads: int, kv_heads: int, n_q: int, n_kv: int,
               reps: int) -> tuple[float, float]:
    """(median seconds, GFLOP/s) of one FLASH_ATTN_EXT of the last n_q of n_kv causal cells."""
    case, _ = causal_attention_case(backend, np.random.default_rng(0), d, heads, kv_heads, n_q,
                                    n_kv)
    try:
        case()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            case()
            times.append(time.perf_counter() - t0)
    finally:
        case.close()
    seconds = statistics.median(times)
    past = n_kv - n_q
    seen = n_q * (past + 1) + n_q * (n_q - 1) // 2           # cells the queries see
    return seconds, 4 * d * heads * seen / seconds / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=512, help="queries (default 512)")
    parser.add_argument("--cells", type=int, default=4096, help="KV cells (default 4096)")
    parser.add_argument("--reps", type=int, default=5, help="timed runs (default 5)")
    args = parser.parse_args()
    if not 0 < args.queries <= args.cells:
        parser.error("--queries must be in [1, --cells]")
    backend = polydev.init_backend("CPU")
    rows = []
    with backend:
        for label, (d, heads, kv_heads) in SHAPES.items():
            seconds, gflops = time_shape(backend, d, heads, kv_heads, args.queries, args.cells,
                                         args.reps)
            rows.append([label, f"{seconds * 1e3:.2f}", f"{gflops:.0f}"])
    print(f"{args.queries} causal queries over {args.cells} cells, fp16 cache, "
          f"{backend.env.n_threads} threads")
    print(format_table(["heads", "ms", "GFLOP/s"], rows))


if __name__ == "__main__":
    main()
