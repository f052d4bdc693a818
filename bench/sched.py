"""The scheduler's own cost on a llama-style graph split over a device and the CPU.

16 layers (attention with RoPE and flash attention, SwiGLU feed-forward, Q4_0 weights), the
weights alternating between the device (``--device``, OpenCL0 by default: a CPU-side device
under PoCL; CUDA0 on a GPU) and the CPU by layer; batch 1 and 64. For each batch: the first
compute's scheduling (placement passes, splits and allocation) in ms, the same for a new
graph of the same structure (the reuse path, a loop that builds its graph each step), the
whole step (scheduling + compute), the reuse path's share of the step (target: 5% or less at
batch 1), and what the scheduler itself spends per split when the same graph object is
computed again (polydev's own decode loop): the step's time less the time inside the
backends' computes, copies and waits, in µs a split. Prints a table, or with --json one
JSON object; --trace FILE writes a Chrome trace of one step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager

import numpy as np

import polydev
from polydev import BufferUsage, Context, GGMLType, Scheduler, alloc_ctx_tensors, build_graph
from polydev import ops
from polydev import sched as sched_module
from polydev.tools.table import format_table

from figures import JSON_HELP  # bench/figures.py

N_LAYERS, N_EMBD, N_HEAD, N_FF = 16, 512, 8, 1536
HEAD_DIM = N_EMBD // N_HEAD
OVERHEAD_TARGET = 0.05


def make_weights(backends, rng):
    """Per layer, its weights in a WEIGHTS buffer on OpenCL0 (even layers) or the CPU."""
    layers, buffers = [], []
    for i in range(N_LAYERS):
        ctx = Context()
        w = {name: ctx.new_tensor(GGMLType.Q4_0, shape, f"blk{i}.{name}")
             for name, shape in (("wq", (N_EMBD, N_EMBD)), ("wk", (N_EMBD, N_EMBD)),
                                 ("wv", (N_EMBD, N_EMBD)), ("wo", (N_EMBD, N_EMBD)),
                                 ("gate", (N_EMBD, N_FF)), ("up", (N_EMBD, N_FF)),
                                 ("down", (N_FF, N_EMBD)))}
        w["attn_norm"] = ctx.new_tensor(GGMLType.F32, (N_EMBD,), f"blk{i}.attn_norm")
        w["ffn_norm"] = ctx.new_tensor(GGMLType.F32, (N_EMBD,), f"blk{i}.ffn_norm")
        buf = alloc_ctx_tensors(ctx, backends[i % 2])
        buf.usage = BufferUsage.WEIGHTS
        for t in w.values():
            t.set_data(rng.standard_normal(t.shape).astype(np.float32) * 0.05)
        layers.append(w)
        buffers.append(buf)
    return layers, buffers


def build(layers, n_tokens: int):
    ctx = Context()
    x = ctx.new_tensor(GGMLType.F32, (N_EMBD, n_tokens), "inp").set_input()
    pos = ctx.new_tensor(GGMLType.I32, (n_tokens,), "pos").set_input()
    mask = ctx.new_tensor(GGMLType.F16, (n_tokens, n_tokens), "mask").set_input()
    cur = x
    for w in layers:
        h = ops.mul(ctx, ops.rms_norm(ctx, cur, 1e-5), w["attn_norm"])
        q = ctx.reshape(ops.mul_mat(ctx, w["wq"], h), HEAD_DIM, N_HEAD, n_tokens)
        k = ctx.reshape(ops.mul_mat(ctx, w["wk"], h), HEAD_DIM, N_HEAD, n_tokens)
        v = ops.mul_mat(ctx, w["wv"], h)
        q = ops.rope_ext(ctx, q, pos, None, HEAD_DIM, polydev.RopeMode.NEOX)
        k = ops.rope_ext(ctx, k, pos, None, HEAD_DIM, polydev.RopeMode.NEOX)
        q, k = ctx.permute(q, 0, 2, 1, 3), ctx.permute(k, 0, 2, 1, 3)
        v = ctx.permute(ctx.reshape(v, HEAD_DIM, N_HEAD, n_tokens), 0, 2, 1, 3)
        attn = ops.flash_attn_ext(ctx, q, ops.cont(ctx, k), ops.cont(ctx, v), mask,
                                  1 / HEAD_DIM ** 0.5)
        attn = ctx.reshape(attn, N_EMBD, n_tokens)
        cur = ops.add(ctx, cur, ops.mul_mat(ctx, w["wo"], attn))
        h = ops.mul(ctx, ops.rms_norm(ctx, cur, 1e-5), w["ffn_norm"])
        ff = ops.swiglu(ctx, ops.mul_mat(ctx, w["gate"], h), ops.mul_mat(ctx, w["up"], h))
        cur = ops.add(ctx, cur, ops.mul_mat(ctx, w["down"], ff))
    out = cur.set_output()
    return (x, pos, mask), build_graph(out, size=8192)


def set_inputs(inputs, n_tokens: int, rng) -> None:
    x, pos, mask = inputs
    x.set_data(rng.standard_normal((n_tokens, N_EMBD)).astype(np.float32))
    pos.set_data(np.arange(n_tokens, dtype=np.int32))
    causal = np.triu(np.full((n_tokens, n_tokens), -np.inf, np.float32), 1)
    mask.set_data(causal.astype(np.float16))


@contextmanager
def time_in_backends(backends):
    """Yield a list whose first item grows by the seconds spent inside the backends' computes,
    copies and waits (instrumented for the bench: the backends' methods and the scheduler's
    copy functions wrapped, and put back after)."""
    spent, depth = [0.0], [0]

    def timed(fn):
        def call(*args, **kwargs):
            depth[0] += 1
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1
                if depth[0] == 0:          # a copy that waits counts once
                    spent[0] += time.perf_counter() - start
        return call
    patched = [(b, name) for b in backends
               for name in ("graph_plan_compute", "graph_compute_async", "synchronize")]
    patched += [(sched_module, "tensor_copy"), (sched_module, "tensor_copy_async")]
    # (owner, name, what it had, whether that was the owner's own attribute)
    saved = [(owner, name, getattr(owner, name), name in vars(owner)) for owner, name in patched]
    try:
        for owner, name, fn, _ in saved:
            setattr(owner, name, timed(fn))
        yield spent
    finally:
        for owner, name, fn, own in saved:
            if own:
                setattr(owner, name, fn)
            else:
                delattr(owner, name)         # a backend's method again


def same_graph_us_per_split(sched, graph, reps: int) -> float:
    """The scheduler's own µs per split for computing the allocated graph object again."""
    samples = []
    with time_in_backends(sched.backends) as spent:
        for _ in range(reps):
            spent[0] = 0.0
            start = time.perf_counter()
            sched.alloc_graph(graph)
            sched.compute(graph)
            samples.append(time.perf_counter() - start - spent[0])
    return statistics.median(samples) * 1e6 / max(sched.n_splits, 1)


def measure(backends, layers, n_tokens: int, reps: int, rng, trace_path: str | None):
    sched = Scheduler(backends, graph_size=8192)
    inputs, graph = build(layers, n_tokens)
    t0 = time.perf_counter()
    sched.alloc_graph(graph)
    first_ms = (time.perf_counter() - t0) * 1e3
    set_inputs(inputs, n_tokens, rng)
    sched.compute(graph)
    reuse, step = [], []
    for _ in range(reps):
        inputs, graph = build(layers, n_tokens)        # a new graph, same structure
        t0 = time.perf_counter()
        sched.alloc_graph(graph)
        t1 = time.perf_counter()
        set_inputs(inputs, n_tokens, rng)
        t2 = time.perf_counter()
        sched.compute(graph)
        t3 = time.perf_counter()
        reuse.append(t1 - t0)
        step.append((t1 - t0) + (t3 - t2))
    same_us = same_graph_us_per_split(sched, graph, 3 * reps)
    if trace_path:
        with sched.trace():
            sched.compute(graph)
        sched.write_trace(trace_path)
    n_splits = sched.n_splits
    sched.close()
    reuse_ms, step_ms = statistics.median(reuse) * 1e3, statistics.median(step) * 1e3
    return first_ms, reuse_ms, step_ms, n_splits, same_us


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help=JSON_HELP)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--trace", metavar="FILE", help="write a Chrome trace of a batch-1 step")
    parser.add_argument("--device", default="OpenCL0",
                        help="the device sharing the layers with the CPU (default OpenCL0)")
    args = parser.parse_args(argv)
    try:
        device = polydev.init_backend(args.device)
    except polydev.errors.DeviceNotFoundError:
        print(f"no device {args.device} here (OpenCL: pip install 'polydev[opencl]'; "
              f"`polydev devices` lists them)", file=sys.stderr)
        return 1
    cpu = polydev.init_backend("CPU")
    rng = np.random.default_rng(0)
    layers, buffers = make_weights([device, cpu], rng)
    figures, rows = [], []
    for n_tokens in (1, 64):
        first, reuse, step, n_splits, same_us = measure(
            [device, cpu], layers, n_tokens, 3 if args.quick else 10, rng,
            args.trace if n_tokens == 1 else None)
        share = reuse / step
        rows.append((n_tokens, n_splits, f"{first:.1f}", f"{reuse:.2f}", f"{step:.1f}",
                     f"{share:.1%}", f"{same_us:.0f}"))
        figures += [
            {"name": f"batch {n_tokens}: first scheduling (split + alloc)",
             "value": round(first, 2), "unit": "ms", "target": None, "better": "lower"},
            {"name": f"batch {n_tokens}: reuse-path scheduling", "value": round(reuse, 3),
             "unit": "ms", "target": None, "better": "lower"},
            {"name": f"batch {n_tokens}: reuse-path share of the step", "value": round(share, 4),
             "unit": "fraction", "target": OVERHEAD_TARGET if n_tokens == 1 else None,
             "better": "lower"},
            {"name": f"batch {n_tokens}: the same graph again, scheduler per split",
             "value": round(same_us, 1), "unit": "us", "target": None, "better": "lower"}]
    for b in buffers:
        b.close()
    machine = f"{cpu.device.description}; {device.device.description}"
    if args.json:
        print(json.dumps({"bench": "sched", "machine": machine, "figures": figures}, indent=1))
        return 0
    print(f"{machine}\n{N_LAYERS} layers, weights alternating {device.name} / CPU\n")
    print(format_table(["batch", "splits", "first sched ms", "reuse sched ms", "step ms",
                        "reuse share", "same graph sched us/split"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
