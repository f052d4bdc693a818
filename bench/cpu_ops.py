"""CPU backend vs plain numpy at LLM sizes, measured side by side in one run.

For each op: polydev's time (a planned graph on the CPU backend, computed repeatedly) divided
by the same computation written directly in numpy (for Q4_K: numpy's matmul on the weight
already dequantized to F32). Also the per-node cost of replaying a planned graph of 1,000
small ops. Prints a table, or with --json one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Callable

import numpy as np

import polydev
from polydev import BufferUsage, Context, GGMLType, alloc_ctx_tensors, build_graph, ops
from polydev.backends.cpu.device import cpu_model

from figures import JSON_HELP  # bench/figures.py

RATIO_TARGET = 1.10
OVERHEAD_TARGET_US = 5.0


def median_time(fn: Callable[[], None], reps: int) -> float:
    fn()                                       # warm-up (and fills the weight cache)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def interleaved(polydev_fn, numpy_fn, reps: int) -> tuple[float, float]:
    """Medians of alternating runs, so both sides see the same machine state."""
    polydev_fn(), numpy_fn()
    a, b = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        polydev_fn()
        a.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        numpy_fn()
        b.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)


class Case:
    """One op graph on the CPU backend plus its numpy twin."""

    def __init__(self, backend, build, inputs: dict, weights: dict | None = None):
        self.backend = backend
        wctx, ctx = Context(), Context()
        self.wtensors = {k: wctx.new_tensor(t, ne) for k, (t, ne, _) in (weights or {}).items()}
        self.tensors = {k: ctx.new_tensor(t, ne) for k, (t, ne, _) in inputs.items()}
        self.out = build(ctx, **self.wtensors, **self.tensors)
        self.wbuf = alloc_ctx_tensors(wctx, backend) if weights else None
        if self.wbuf is not None:
            self.wbuf.usage = BufferUsage.WEIGHTS
        self.buf = alloc_ctx_tensors(ctx, backend)
        for k, (_, _, data) in (weights or {}).items():
            self.wtensors[k].set_data(data)
        for k, (_, _, data) in inputs.items():
            self.tensors[k].set_data(data)
        self.plan = backend.graph_plan_create(build_graph(self.out))

    def __call__(self) -> None:
        self.backend.graph_plan_compute(self.plan)

    def close(self) -> None:
        for b in (self.buf, self.wbuf):
            if b is not None:
                b.close()


def rope_numpy(x, pos, n_dims, base, out):
    half = n_dims // 2
    theta = pos[:, None].astype(np.float32) * (np.float32(base) ** (
        -2.0 * np.arange(half, dtype=np.float32) / n_dims))
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., :half], x[..., half:n_dims]
    out[..., :half] = x0 * cos - x1 * sin
    out[..., half:n_dims] = x0 * sin + x1 * cos


def run_benchmarks(quick: bool) -> list[dict]:
    rng = np.random.default_rng(0)
    backend = polydev.init_backend("CPU")
    K = 1024 if quick else 4096
    N = 64 if quick else 512
    T, H, D = (64, 8, 128) if quick else (512, 32, 128)
    reps = 3 if quick else 7
    figures = []

    def record(name, case, numpy_fn, reps=reps):
        t_pd, t_np = interleaved(case, numpy_fn, reps)
        case.close()
        figures.append({"name": f"{name} vs numpy", "value": round(t_pd / t_np, 3),
                        "unit": "ratio", "target": RATIO_TARGET, "better": "lower",
                        "polydev_ms": round(t_pd * 1e3, 3), "numpy_ms": round(t_np * 1e3, 3)})

    # MUL_MAT F32: [K, K] weight times K x N activations
    w = rng.standard_normal((K, K), dtype=np.float32)
    x = rng.standard_normal((N, K), dtype=np.float32)
    case = Case(backend, lambda ctx, w, x: ops.mul_mat(ctx, w, x),
                {"x": (GGMLType.F32, (K, N), x)}, {"w": (GGMLType.F32, (K, K), w)})
    ref = np.empty((N, K), np.float32)
    record(f"MUL_MAT f32 {K}x{K}x{N}", case, lambda: np.matmul(x, w.T, out=ref))

    # MUL_MAT Q4_K: the same product with a quantized weight, decode (1) and batch (N)
    from polydev.types import dequantize
    q_raw = _random_q4_k(rng, K, K)
    w_f32 = dequantize(q_raw, GGMLType.Q4_K).reshape(K, K)
    for n in (1, N):
        xn = rng.standard_normal((n, K), dtype=np.float32)
        case = Case(backend, lambda ctx, w, x: ops.mul_mat(ctx, w, x),
                    {"x": (GGMLType.F32, (K, n), xn)},
                    {"w": (GGMLType.Q4_K, (K, K), q_raw.tobytes())})
        refn = np.empty((n, K), np.float32)
        record(f"MUL_MAT q4_K {K}x{K}x{n}", case, lambda: np.matmul(xn, w_f32.T, out=refn),
               reps * (5 if n == 1 else 1))

    # ADD
    a = rng.standard_normal((N, K), dtype=np.float32)
    b = rng.standard_normal((N, K), dtype=np.float32)
    case = Case(backend, lambda ctx, a, b: ops.add(ctx, a, b),
                {"a": (GGMLType.F32, (K, N), a), "b": (GGMLType.F32, (K, N), b)})
    out = np.empty_like(a)
    record(f"ADD f32 {K}x{N}", case, lambda: np.add(a, b, out=out))

    # RMS_NORM
    case = Case(backend, lambda ctx, a: ops.rms_norm(ctx, a, 1e-6),
                {"a": (GGMLType.F32, (K, N), a)})
    record(f"RMS_NORM f32 {K}x{N}", case,
           lambda: np.divide(a, np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + 1e-6), out=out))

    # SOFT_MAX over attention scores [kv=T, q=T, heads=H] with an f16 causal mask
    s = rng.standard_normal((H, T, T), dtype=np.float32)
    mask = np.triu(np.full((T, T), -np.inf, np.float32), 1).astype(np.float16)
    case = Case(backend, lambda ctx, s, m: ops.soft_max_ext(ctx, s, m, 0.125, 0.0),
                {"s": (GGMLType.F32, (T, T, H), s), "m": (GGMLType.F16, (T, T), mask)})
    sm_out = np.empty_like(s)

    def softmax_numpy():
        w_ = s * np.float32(0.125) + mask
        w_ -= w_.max(axis=-1, keepdims=True)
        np.exp(w_, out=w_)
        np.divide(w_, w_.sum(axis=-1, keepdims=True), out=sm_out)
    record(f"SOFT_MAX f32 {T}x{T}x{H} masked", case, softmax_numpy)

    # ROPE (NeoX) over [head_dim=D, heads=H, tokens=T]
    q = rng.standard_normal((T, H, D), dtype=np.float32)
    pos = np.arange(T, dtype=np.int32)
    case = Case(backend, lambda ctx, q, p: ops.rope(ctx, q, p, D, polydev.RopeMode.NEOX),
                {"q": (GGMLType.F32, (D, H, T), q), "p": (GGMLType.I32, (T,), pos)})
    r_out = np.empty_like(q)
    record(f"ROPE neox f32 {D}x{H}x{T}", case, lambda: rope_numpy(q, pos, D, 10000.0, r_out))

    _bench_flash_attn(backend, rng, quick, record)
    _bench_mul_mat_id(backend, rng, quick, record)
    figures.append(_replay_overhead(backend))
    return figures


def attention_numpy(q, k, v, mask, scale, out):
    """Plain numpy attention: q (H, n_q, D) f32, k/v (Hkv, n_kv, D) f16, mask (n_q, n_kv)."""
    hkv, group = k.shape[0], q.shape[0] // k.shape[0]
    k32, v32 = k.astype(np.float32), v.astype(np.float32)
    qg = q.reshape(hkv, group * q.shape[1], -1)
    s = np.matmul(qg, k32.transpose(0, 2, 1)).reshape(hkv, group, q.shape[1], -1)
    s *= np.float32(scale)
    s += mask
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    o = np.matmul(s.reshape(hkv, group * q.shape[1], -1), v32)       # (hkv, group*n_q, D)
    out[...] = o.reshape(q.shape[0], q.shape[1], -1).transpose(1, 0, 2)


def causal_attention_case(backend, rng, d: int, heads: int, kv_heads: int, n_q: int,
                          n_kv: int) -> tuple[Case, tuple]:
    """FLASH_ATTN_EXT of the last n_q queries of an n_kv-cell causal prompt (random float32
    queries, an fp16 cache and mask of 0 and -inf) on ``backend``, and its numpy operands
    (q, k, v, mask, scale)."""
    q = rng.standard_normal((heads, n_q, d), dtype=np.float32)
    k = rng.standard_normal((kv_heads, n_kv, d), dtype=np.float32).astype(np.float16)
    v = rng.standard_normal((kv_heads, n_kv, d), dtype=np.float32).astype(np.float16)
    past = n_kv - n_q
    mask = np.where(np.arange(n_kv)[None, :] > past + np.arange(n_q)[:, None], -np.inf,
                    0.0).astype(np.float16)
    scale = 1 / np.sqrt(d)
    case = Case(backend, lambda ctx, q, k, v, m: ops.flash_attn_ext(ctx, q, k, v, m, scale),
                {"q": (GGMLType.F32, (d, n_q, heads), q),
                 "k": (GGMLType.F16, (d, n_kv, kv_heads), k),
                 "v": (GGMLType.F16, (d, n_kv, kv_heads), v),
                 "m": (GGMLType.F16, (n_kv, n_q), mask)})
    return case, (q, k, v, mask, scale)


def _bench_flash_attn(backend, rng, quick: bool, record) -> None:
    """FLASH_ATTN_EXT: head size 128, 32 heads over 8 KV heads, F16 K/V and mask."""
    D, H, HKV = 128, 32, 8
    n_kv = 512 if quick else 4096
    for n_q in ((1, 64) if quick else (1, 512)):
        case, operands = causal_attention_case(backend, rng, D, H, HKV, n_q, n_kv)
        out = np.empty((n_q, H, D), np.float32)
        record(f"FLASH_ATTN_EXT f16 D{D} H{H}/{HKV} kv{n_kv} q{n_q}", case,
               lambda: attention_numpy(*operands, out))


def mul_mat_id_grouped(w, x, ids, out):
    """Plain numpy MoE: sort the (token, slot) pairs by expert, one product per expert."""
    flat = ids.reshape(-1)
    rows = x[:, np.arange(ids.shape[1]) % x.shape[1]].reshape(-1, x.shape[-1])
    order = np.argsort(flat, kind="stable")
    experts, starts = np.unique(flat[order], return_index=True)
    bounds = list(starts[1:]) + [len(order)]
    dst = out.reshape(-1, out.shape[-1])
    for e, lo, hi in zip(experts, starts, bounds):
        sel = order[lo:hi]
        dst[sel] = rows[sel] @ w[e].T


def mul_mat_id_gathered(w, x, ids, out):
    """Plain numpy MoE for few tokens: gather each pair's expert matrix, batched mat-vec."""
    rows = x[:, np.arange(ids.shape[1]) % x.shape[1]]                   # (T, n_used, K)
    np.matmul(w[ids], rows[..., None], out=out[..., None])


def _bench_mul_mat_id(backend, rng, quick: bool, record) -> None:
    """MUL_MAT_ID at a Qwen3-MoE-like size: 64 experts of 768x2048, 8 used per token."""
    n_expert, n_used, m, k = (16, 4, 256, 512) if quick else (64, 8, 768, 2048)
    w = rng.standard_normal((n_expert, m, k), dtype=np.float32)
    for n_tokens in ((1, 64) if quick else (1, 512)):
        x = rng.standard_normal((n_tokens, 1, k), dtype=np.float32)
        ids = np.stack([rng.choice(n_expert, n_used, replace=False)
                        for _ in range(n_tokens)]).astype(np.int32)
        case = Case(backend, lambda ctx, w, x, i: ops.mul_mat_id(ctx, w, x, i),
                    {"x": (GGMLType.F32, (k, 1, n_tokens), x),
                     "i": (GGMLType.I32, (n_used, n_tokens), ids)},
                    {"w": (GGMLType.F32, (k, m, n_expert), w)})
        out = np.empty((n_tokens, n_used, m), np.float32)
        candidates = [lambda: mul_mat_id_grouped(w, x, ids, out)]
        if n_tokens * n_used <= n_expert:         # gathering copies one matrix per pair
            candidates.append(lambda: mul_mat_id_gathered(w, x, ids, out))
        best = min(candidates, key=lambda fn: median_time(fn, 3))
        record(f"MUL_MAT_ID f32 {n_expert}x{m}x{k} top{n_used} n{n_tokens}", case, best)


def _replay_overhead(backend) -> dict:
    """Per-node cost of replaying a planned graph of 1,000 small element-wise ops."""
    ctx = Context()
    x = ctx.new_tensor_1d(GGMLType.F32, 16)
    y = ctx.new_tensor_1d(GGMLType.F32, 16)
    t = x
    for i in range(1000):
        t = (ops.add, ops.mul, ops.scale)[i % 3](ctx, t, y) if i % 3 < 2 else ops.scale(ctx, t, 0.5)
    graph = build_graph(t, size=2048)
    with alloc_ctx_tensors(ctx, backend):
        x.set_data(np.ones(16))
        y.set_data(np.ones(16))
        plan = backend.graph_plan_create(graph)
        per_run = median_time(lambda: backend.graph_plan_compute(plan), 50)
    return {"name": "planned graph replay, 1,000 small ops", "value": round(per_run / 1000 * 1e6, 3),
            "unit": "us/node", "target": OVERHEAD_TARGET_US, "better": "lower"}


def _random_q4_k(rng, rows: int, cols: int) -> np.ndarray:
    """Q4_K blocks with random nibbles and 6-bit scales, and small finite fp16 d/dmin."""
    nb = rows * cols // 256
    raw = rng.integers(0, 256, size=(nb, 144), dtype=np.uint8)
    raw[:, 0:2] = rng.uniform(0.001, 0.01, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    raw[:, 2:4] = rng.uniform(0.001, 0.01, nb).astype(np.float16).view(np.uint8).reshape(nb, 2)
    return raw.reshape(rows, cols // 256 * 144)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--quick", action="store_true", help="small sizes: a smoke test, not figures")
    args = p.parse_args(argv)
    figures = run_benchmarks(args.quick)
    machine = (f"{cpu_model()}, numpy {np.__version__}, devices: " +
        ", ".join(d.name for d in polydev.devices()))
    if args.json:
        print(json.dumps({"bench": "cpu_ops", "machine": machine, "figures": figures}, indent=2))
        return 0
    print(f"cpu_ops on {machine}\n")
    print(f"{'case':<44} {'polydev':>12} {'numpy':>12} {'value':>10} {'target':>8}")
    for f in figures:
        pd_ms = f"{f['polydev_ms']:.3f} ms" if "polydev_ms" in f else ""
        np_ms = f"{f['numpy_ms']:.3f} ms" if "numpy_ms" in f else ""
        unit = "x" if f["unit"] == "ratio" else " us/node"
        ok = "ok" if f["value"] <= f["target"] else "MISS"
        print(f"{f['name']:<44} {pd_ms:>12} {np_ms:>12} {f['value']:>9.3f}{unit} "
              f"{f['target']:>6} {ok}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
