"""The graph allocator on a llama-style transformer: memory against the liveness bound, and speed.

Builds the compute graph of a llama-style model (token embedding, N layers of grouped-query
attention with RoPE and a KV cache, SwiGLU FFN, output head) for a batch of 1 (decode) and 512
(prompt) and reports:

- the compute buffer the GraphAllocator reserved;
- the liveness lower bound: the largest total size of compute tensors alive at once when the
  nodes run in order (a tensor lives from the node that makes it to its last reader, or to the
  end for outputs; inputs from the start; views cost nothing and keep their source alive);
- their ratio (target 1.15 or less; in-place reuse can take it below 1);
- the ratio against a tighter bound where a node that may run in place of its last-read
  source shares its bytes;
- the time ``alloc_graph`` takes on an already reserved graph, per node: a decode loop's steady
  state, as the median of repeated calls: for the same graph again (its placements are
  replayed) and for a graph rebuilt each step as llama.cpp does (checked against the plan).

Weights and the KV cache live in a buffer type without memory (the allocator only needs to see
that they are pre-allocated); compute buffers are real CPU memory.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np
import polydev
from polydev import (Buffer, BufferType, Context, GGMLType, Graph, GraphAllocator, TensorFlag,
                     alloc_ctx_tensors, ops)
from polydev.backends.cpu.device import cpu_model
from polydev.ops import INPLACE_OPS
from polydev.tensor import Tensor
from polydev.tools.table import format_table

from figures import JSON_HELP  # bench/figures.py

RATIO_TARGET = 1.15
F32, F16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.I64


@dataclass(frozen=True)
class Hparams:
    n_vocab: int = 32000
    n_embd: int = 2048
    n_head: int = 32
    n_head_kv: int = 8
    n_ff: int = 5632
    n_layer: int = 16
    n_ctx: int = 2048
    weight_type: GGMLType = GGMLType.Q4_K

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


class _Unbacked(Buffer):
    def _clear(self, value: int) -> None:
        pass


class UnbackedBufferType(BufferType):
    """Buffers with a size and no memory: enough to mark weights as pre-allocated."""

    def __init__(self) -> None:
        super().__init__("unbacked", alignment=32)

    def _alloc(self, size: int) -> Buffer:
        return _Unbacked(self, size)


class Weights:
    """The model's tensors, pre-allocated (without memory)."""

    def __init__(self, hp: Hparams) -> None:
        ctx, wt, e = Context(), hp.weight_type, hp.n_embd
        kv = hp.head_dim * hp.n_head_kv
        self.tok_embd = ctx.new_tensor_2d(wt, e, hp.n_vocab)
        self.layers = [{
            "attn_norm": ctx.new_tensor_1d(F32, e), "wq": ctx.new_tensor_2d(wt, e, e),
            "wk": ctx.new_tensor_2d(wt, e, kv), "wv": ctx.new_tensor_2d(wt, e, kv),
            "wo": ctx.new_tensor_2d(wt, e, e), "ffn_norm": ctx.new_tensor_1d(F32, e),
            "gate": ctx.new_tensor_2d(wt, e, hp.n_ff), "up": ctx.new_tensor_2d(wt, e, hp.n_ff),
            "down": ctx.new_tensor_2d(wt, hp.n_ff, e),
            "k_cache": ctx.new_tensor_2d(F16, kv, hp.n_ctx),
            "v_cache": ctx.new_tensor_2d(F16, kv, hp.n_ctx),
        } for _ in range(hp.n_layer)]
        self.out_norm = ctx.new_tensor_1d(F32, e)
        self.output = ctx.new_tensor_2d(wt, e, hp.n_vocab)
        self.buffer = alloc_ctx_tensors(ctx, UnbackedBufferType())


def build_llama_graph(hp: Hparams, w: Weights, n_tokens: int, n_kv: int) -> Graph:
    """One forward pass over ``n_tokens`` new tokens attending to ``n_kv`` cached positions."""
    ctx = Context()
    graph = Graph(size=16384)
    hd, n_head, n_head_kv = hp.head_dim, hp.n_head, hp.n_head_kv
    tokens = ctx.new_tensor_1d(I32, n_tokens).set_input()
    pos = ctx.new_tensor_1d(I32, n_tokens).set_input()
    slots = ctx.new_tensor_1d(I64, n_tokens).set_input()          # KV cache rows to write
    mask = ctx.new_tensor_2d(F32, n_kv, n_tokens).set_input()
    x = ops.get_rows(ctx, w.tok_embd, tokens)
    for layer in w.layers:
        h = ops.mul(ctx, ops.rms_norm(ctx, x, 1e-5), layer["attn_norm"])
        q = ops.rope_ext(ctx, ops.reshape(ctx, ops.mul_mat(ctx, layer["wq"], h), hd, n_head,
                                          n_tokens), pos, None, hd, 2)
        k = ops.rope_ext(ctx, ops.reshape(ctx, ops.mul_mat(ctx, layer["wk"], h), hd, n_head_kv,
                                          n_tokens), pos, None, hd, 2)
        v = ops.mul_mat(ctx, layer["wv"], h)
        for cache, cur in ((layer["k_cache"], k), (layer["v_cache"], v)):
            graph.build_forward_expand(
                ops.set_rows(ctx, cache, ops.reshape(ctx, cur, hd * n_head_kv, n_tokens), slots))
        k_all = ops.view_3d(ctx, layer["k_cache"], hd, n_head_kv, n_kv, hd * 2,
                            layer["k_cache"].nb[1])
        v_all = ops.view_3d(ctx, layer["v_cache"], hd, n_head_kv, n_kv, hd * 2,
                            layer["v_cache"].nb[1])
        kq = ops.mul_mat(ctx, ops.permute(ctx, k_all, 0, 2, 1, 3),
                         ops.permute(ctx, q, 0, 2, 1, 3))                 # [n_kv, n_tok, head]
        kq = ops.soft_max_ext(ctx, kq, mask, hd ** -0.5)
        v_t = ops.cont(ctx, ops.permute(ctx, v_all, 1, 2, 0, 3))          # [n_kv, hd, head_kv]
        kqv = ops.mul_mat(ctx, v_t, kq)                                    # [hd, n_tok, head]
        attn = ops.cont(ctx, ops.permute(ctx, kqv, 0, 2, 1, 3), hp.n_embd, n_tokens)
        x = ops.add(ctx, ops.mul_mat(ctx, layer["wo"], attn), x)
        h = ops.mul(ctx, ops.rms_norm(ctx, x, 1e-5), layer["ffn_norm"])
        ffn = ops.swiglu(ctx, ops.mul_mat(ctx, layer["gate"], h), ops.mul_mat(ctx, layer["up"], h))
        x = ops.add(ctx, ops.mul_mat(ctx, layer["down"], ffn), x)
    x = ops.mul(ctx, ops.rms_norm(ctx, x, 1e-5), w.out_norm)
    graph.build_forward_expand(ops.mul_mat(ctx, w.output, x).set_output())
    return graph


def liveness_bound(graph: Graph, in_place: bool = False) -> int:
    """The largest total nbytes of compute tensors alive at once in node order (call it
    before the graph is allocated: tensors with a buffer count as pre-allocated).

    With ``in_place``, a node that may run in place of a same-layout source it reads last
    shares that source's bytes (the memory in-place reuse saves), so the bound is lower.
    """
    index = {id(t): i for i, t in enumerate(graph.nodes)}
    born: dict[int, int] = {}
    last: dict[int, int] = {}
    size: dict[int, int] = {}

    def owner(t: Tensor) -> Tensor | None:
        root = t.view_src if t.view_src is not None else t
        return None if root.buffer is not None else root

    for t in graph.leafs:
        if owner(t) is t:
            born[id(t)], last[id(t)], size[id(t)] = 0, 0, t.nbytes
    for i, node in enumerate(graph.nodes):
        if owner(node) is node:
            born[id(node)], last[id(node)], size[id(node)] = i, i, node.nbytes
            if node.flags & TensorFlag.OUTPUT:
                last[id(node)] = len(graph.nodes)
        for src in node.src:
            r = owner(src) if src is not None else None
            if r is not None:
                born.setdefault(id(r), index.get(id(r), 0))
                size.setdefault(id(r), r.nbytes)
                last[id(r)] = max(last.get(id(r), 0), i)
    if in_place:
        for i, node in enumerate(graph.nodes):
            if node.op in INPLACE_OPS and node.view_src is None:
                for src in node.src:
                    if (src is not None and owner(src) is src and last[id(src)] == i and
                            src.same_layout(node) and not src.flags & TensorFlag.OUTPUT):
                        last[id(src)] = i - 1
                        break
    delta = np.zeros(len(graph.nodes) + 2, dtype=np.int64)
    keys = list(size)
    np.add.at(delta, [born[k] for k in keys], [size[k] for k in keys])
    np.add.at(delta, [last[k] + 1 for k in keys], [-size[k] for k in keys])
    return int(np.cumsum(delta).max())


def median_seconds(fn, reps: int, setup=lambda: None) -> float:
    times = []
    for _ in range(reps):
        arg = setup()
        t0 = time.perf_counter()
        fn(arg)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(hp: Hparams, weights: Weights, n_tokens: int, reps: int) -> list[dict]:
    build = lambda: build_llama_graph(hp, weights, n_tokens, hp.n_ctx)
    graph = build()
    bound, bound_in_place = liveness_bound(graph), liveness_bound(graph, in_place=True)
    cpu = polydev.device("CPU")
    with GraphAllocator(cpu.buffer_type) as galloc:
        galloc.reserve(graph)
        reserved = galloc.buffer_size(0)
        assert galloc.alloc_graph(graph)
        same = median_seconds(lambda g: galloc.alloc_graph(g), reps, lambda: graph)
        # as llama.cpp does: a new graph of the same shape each step, checked against the plan
        rebuilt = median_seconds(lambda g: galloc.alloc_graph(g), max(reps // 5, 3), build)
        assert galloc.buffer_size(0) == reserved
    label = f"batch {n_tokens}, {hp.n_layer} layers, n_kv {hp.n_ctx}"
    per_node = 1e6 / graph.n_nodes
    mib = 2 ** 20
    return [
        {"name": f"compute buffer, {label}", "value": round(reserved / mib, 2), "unit": "MiB",
         "target": None, "better": "lower"},
        {"name": f"liveness lower bound, {label}", "value": round(bound / mib, 2),
         "unit": "MiB", "target": None, "better": "lower"},
        {"name": f"reserved / lower bound, {label}", "value": round(reserved / bound, 3),
         "unit": "ratio", "target": RATIO_TARGET, "better": "lower"},
        {"name": f"reserved / bound with in-place sharing, {label}",
         "value": round(reserved / bound_in_place, 3), "unit": "ratio",
         "target": RATIO_TARGET, "better": "lower"},
        {"name": f"alloc_graph, same graph again, {label} ({graph.n_nodes} nodes)",
         "value": round(same * per_node, 3), "unit": "us/node", "target": None,
         "better": "lower"},
        {"name": f"alloc_graph, rebuilt graph, {label}", "value": round(rebuilt * per_node, 3),
         "unit": "us/node", "target": None, "better": "lower"},
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", action="store_true", help=JSON_HELP)
    p.add_argument("--quick", action="store_true", help="a 2-layer model: a smoke test")
    p.add_argument("--reps", type=int, default=50, help="alloc_graph repetitions (default 50)")
    args = p.parse_args(argv)
    hp = Hparams(n_layer=2, n_ctx=1024) if args.quick else Hparams()
    weights = Weights(hp)
    figures = [f for n in (1, 512) for f in measure(hp, weights, n, args.reps)]
    machine = f"{cpu_model()}, numpy {np.__version__}"
    if args.json:
        print(json.dumps({"bench": "alloc", "machine": machine, "figures": figures}, indent=2))
        return 0
    print(f"alloc on {machine}\n")
    rows = [[f["name"], f"{f['value']} {f['unit']}",
             "" if f["target"] is None else
             f"{f['target']} {'ok' if f['value'] <= f['target'] else 'MISS'}"] for f in figures]
    print(format_table(["figure", "value", "target"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
