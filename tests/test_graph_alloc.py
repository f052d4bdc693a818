"""The graph allocator, in the spirit of llama.cpp's test-alloc.

A recording buffer type (configurable max size and alignment) counts the bytes the allocator
really allocates; the checks are that every node got memory, that no chunk passes the max size,
and that tensors sharing memory are never alive at the same time.
"""

from __future__ import annotations

import numpy as np
import pytest
from polydev import (Buffer, BufferType, BufferUsage, Context, GGMLType, Graph, GraphAllocator,
                     TensorFlag, alloc_ctx_tensors, build_graph, ops)
from polydev.errors import AllocationError, ClosedError, InvalidArgumentError
from polydev.ops import INPLACE_OPS
from polydev.tensor import Tensor

F32 = GGMLType.F32
UNBOUNDED = 1 << 62


class RecordingBuffer(Buffer):
    def __init__(self, buft: RecordingBufferType, size: int) -> None:
        super().__init__(buft, size)

    def _clear(self, value: int) -> None:
        pass

    def _free(self) -> None:
        self.buft.live.remove(self)


class RecordingBufferType(BufferType):
    """Memory that does not exist: it records what is allocated and freed."""

    def __init__(self, max_size: int, alignment: int = 8, fail: bool = False) -> None:
        super().__init__("recording", alignment=alignment, max_size=max_size)
        self.live: list[RecordingBuffer] = []
        self.alloc_calls = 0
        self.fail = fail

    def _alloc(self, size: int) -> Buffer:
        self.alloc_calls += 1
        if self.fail:
            raise AllocationError(f"{self.name}: refusing {size} bytes")
        buf = RecordingBuffer(self, size)
        self.live.append(buf)
        return buf

    @property
    def allocated_total(self) -> int:
        return sum(b.size for b in self.live)


def input_of_size(ctx: Context, nbytes: int) -> Tensor:
    assert nbytes % 4 == 0
    return ctx.new_tensor_1d(F32, nbytes // 4).set_input()


def name_all(ctx: Context, prefix: str = "x") -> None:
    for i, t in enumerate(ctx.tensors):
        t.name = f"{prefix}{i}"


def allocate(out: Tensor, buft: BufferType) -> tuple[Graph, GraphAllocator]:
    out.set_output()
    graph = build_graph(out)
    galloc = GraphAllocator(buft)
    assert galloc.alloc_graph(graph)
    return graph, galloc


# --- checks -------------------------------------------------------------------------------------

def check_all_allocated(graph: Graph) -> None:
    for t in graph.nodes:
        assert t.buffer is not None, f"{t.name} has no memory"


def check_max_size(ctx: Context) -> None:
    for t in ctx.tensors:
        assert t.offset + t.nbytes <= t.buffer.max_size, f"{t.name} passes the max size"


def _root(t: Tensor) -> Tensor:
    return t.view_src if t.view_src is not None else t


def _overlap(a: Tensor, b: Tensor) -> bool:
    return a.buffer is b.buffer and a.offset < b.offset + b.nbytes and b.offset < a.offset + a.nbytes


def _dead_or_reused(graph: Graph, i: int, current: Tensor, other: Tensor) -> bool:
    """``other`` may share memory with node i if no node from i on still reads it (node i
    itself may, when it runs in place)."""
    if other.flags & TensorFlag.OUTPUT:
        return False
    for t in graph.nodes[i:]:
        if t is current and t.op in INPLACE_OPS:
            continue
        if any(s is other or (s is not None and s.view_src is other) for s in t.src):
            return False
    return True


def check_no_overlap(graph: Graph) -> None:
    for i, t in enumerate(graph.nodes):
        for o in graph.nodes[:i]:
            if _root(t) is _root(o) or not _overlap(t, o):
                continue
            assert _dead_or_reused(graph, i, t, o), f"{t.name} overwrites live {o.name}"


def check_inputs_apart(graph: Graph) -> None:
    inputs = [t for t in graph.leafs + graph.nodes
              if t.flags & TensorFlag.INPUT and t.view_src is None]
    for i, t in enumerate(inputs):
        for o in inputs[:i]:
            assert not _overlap(t, o), f"inputs {t.name} and {o.name} overlap"


def check(graph: Graph, ctx: Context | None = None) -> None:
    check_all_allocated(graph)
    check_no_overlap(graph)
    check_inputs_apart(graph)
    if ctx is not None:
        check_max_size(ctx)


# --- llama.cpp test-alloc's cases -------------------------------------------------------------

def test_max_size_too_many_tensors():
    buft = RecordingBufferType(16)
    ctx = Context()
    x0, x1, x2 = (input_of_size(ctx, 8) for _ in range(3))
    x3 = ops.mul(ctx, x0, x1)
    x4 = ops.add(ctx, x1, x2)
    x5 = ops.add(ctx, x3, x0)
    x6 = ops.add(ctx, x4, x5)
    name_all(ctx)
    graph, galloc = allocate(x6, buft)
    check(graph, ctx)
    assert len(galloc.chunk_buffers(0)) == 2           # the first chunk is full
    assert buft.allocated_total <= 16 + 16


def test_max_size_tensor_too_large():
    buft = RecordingBufferType(32)
    ctx = Context()
    x0, x1 = input_of_size(ctx, 16), input_of_size(ctx, 8)   # chunk 0: [0, 16), [16, 24)
    x2 = ops.concat(ctx, x0, x1, 0)                           # 24 bytes: chunk 1
    name_all(ctx)
    graph, _ = allocate(x2, buft)
    check(graph, ctx)
    assert x2.buffer is not x0.buffer
    assert buft.allocated_total <= 32 + 24


def test_tensor_larger_than_max_size():
    buft = RecordingBufferType(16)
    ctx = Context()
    x0 = input_of_size(ctx, 24)
    x1 = ops.scale(ctx, x0, 2.0)
    name_all(ctx)
    graph, _ = allocate(x1, buft)
    check(graph)
    assert buft.allocated_total == 24                         # one oversize chunk, reused
    assert (x1.buffer, x1.offset) == (x0.buffer, x0.offset)


def test_not_enough_chunks():
    max_chunks, max_size = 16, 8
    buft = RecordingBufferType(max_size)
    ctx = Context()
    xs = [input_of_size(ctx, max_size) for _ in range(max_chunks + 1)]
    acc = xs[0]
    for x in xs[1:]:
        acc = ops.add(ctx, acc, x)
    name_all(ctx)
    graph, galloc = allocate(acc, buft)
    check(graph)
    chunks = galloc.chunk_buffers(0)
    assert len(chunks) == max_chunks
    assert chunks[-1].size > max_size                         # the last chunk grows
    assert buft.allocated_total > max_chunks * max_size


def test_fill_leftover_space():
    buft = RecordingBufferType(16)
    ctx = Context()
    x0 = input_of_size(ctx, 8)
    x1 = ops.pad(ctx, x0, 2)                                  # 16 bytes: a new chunk
    x2 = ops.mean(ctx, x1)                                    # fits after x0 in chunk 0
    name_all(ctx)
    graph, _ = allocate(x2, buft)
    check(graph, ctx)
    assert buft.allocated_total <= 12 + 16


def test_view_inplace():
    buft = RecordingBufferType(32)
    ctx = Context()
    x0 = ctx.new_tensor_1d(F32, 4).set_input()                # [0, 16)
    x1 = ctx.reshape(x0, 2, 2)
    x2 = ctx.permute(x1, 1, 0, 2, 3)
    x3 = ctx.view_1d(x2, 2, 4)
    x4 = ctx.new_tensor_1d(F32, 2).set_input()                # [16, 24)
    x5 = ops.add(ctx, x3, x4)                                 # in place of x4
    name_all(ctx)
    graph, _ = allocate(x5, buft)
    check(graph, ctx)
    assert all(v.buffer is x0.buffer for v in (x1, x2, x3))
    assert (x3.offset, x2.offset) == (x0.offset + 4, x0.offset)
    assert buft.allocated_total <= 24


def test_reuse_and_free():
    buft = RecordingBufferType(40)
    ctx = Context()
    x0 = input_of_size(ctx, 24)
    x1, x2 = input_of_size(ctx, 8), input_of_size(ctx, 8)
    x3 = ops.add(ctx, x1, x2)                                 # reuses x1, frees x2
    x4 = ops.pad(ctx, x0, 2)                                  # new chunk, frees x0
    x5 = ops.scale(ctx, x4, 2.0)                              # from a free block
    x6 = ops.add(ctx, x4, x5)                                 # reuses x4, frees x5
    x7 = ctx.view_1d(x6, 2, 8)
    x8 = ops.add(ctx, x3, x7)                                 # reuses x3
    name_all(ctx)
    graph, _ = allocate(x8, buft)
    check(graph, ctx)
    assert (x3.buffer, x3.offset) == (x1.buffer, x1.offset)
    assert (x8.buffer, x8.offset) == (x3.buffer, x3.offset)
    assert buft.allocated_total <= 40 + 32 + 32


@pytest.mark.parametrize("max_size", [32, UNBOUNDED])
def test_merge_free_block(max_size):
    buft = RecordingBufferType(max_size)
    ctx = Context()
    x0, x1, x2 = (input_of_size(ctx, 16) for _ in range(3))
    x3 = ops.mean(ctx, x0)
    x4 = ops.mean(ctx, x1)
    x5 = ops.pad(ctx, x2, 2)
    x6 = ops.add(ctx, x3, x4)
    x7 = ops.pad(ctx, x6, 5)                                  # needs x0's and x1's merged space
    x8 = ops.add(ctx, x5, x7)
    name_all(ctx)
    graph, _ = allocate(x8, buft)
    check(graph, ctx)
    assert buft.allocated_total <= 32 + 32 + 24


def test_prefer_already_allocated_memory():
    buft = RecordingBufferType(32, alignment=4)
    ctx = Context()
    x0 = input_of_size(ctx, 24)                               # [24 used][8 free]
    x1 = ops.mean(ctx, x0)                                    # [24 free][4][4 free]
    x2 = ops.mean(ctx, x1)                                    # into the 24 free bytes
    name_all(ctx)
    graph, _ = allocate(x2, buft)
    check(graph)
    assert buft.allocated_total <= 28


def test_multiple_buffer_types():
    buft_a, buft_b = RecordingBufferType(32), RecordingBufferType(UNBOUNDED)
    ctx_a, ctx_b, ctx = Context(), Context(), Context()
    a0, a1 = input_of_size(ctx_a, 16), input_of_size(ctx_a, 16)
    name_all(ctx_a, "a")
    b0, b1 = input_of_size(ctx_b, 24), input_of_size(ctx_b, 4)
    name_all(ctx_b, "b")
    x0 = input_of_size(ctx, 16)
    x1 = ops.mul(ctx, x0, a0)
    x2 = ops.pad(ctx, x1, 2)
    x3 = ops.mul(ctx, x2, b0)
    x4 = ops.mean(ctx, x3)
    x5 = ops.add(ctx, x4, b1)
    x6 = ops.pad(ctx, x5, 3)
    x7 = ops.add(ctx, x6, a1)
    x8 = ops.scale(ctx, x7, 2.0)
    name_all(ctx, "x")
    with alloc_ctx_tensors(ctx_a, buft_a), alloc_ctx_tensors(ctx_b, buft_b):
        placed_a = [(t.buffer, t.offset) for t in (a0, a1, b0, b1)]
        x8.set_output()
        graph = build_graph(x8)
        assert graph.n_leafs == 5 and graph.n_nodes == 8
        leaf_ids = [1 if t.name.startswith("b") else 0 for t in graph.leafs]
        on_b = {"x3", "x4", "x5", "x6"}
        node_ids = [1 if t.name in on_b else 0 for t in graph.nodes]
        galloc = GraphAllocator([buft_a, buft_b])
        galloc.reserve(graph, node_ids, leaf_ids)
        assert galloc.alloc_graph(graph)
        check(graph, ctx)
        assert [(t.buffer, t.offset) for t in (a0, a1, b0, b1)] == placed_a   # untouched
        # x3 runs in place only within its own buffer type, so it does not take x2's memory
        assert all(t.buffer in galloc.chunk_buffers(1) for t in (x3, x4, x5, x6))
        assert buft_a.allocated_total <= 32 + 32 + 24
        # ggml's bound is 32 + 24 because it lets x3 run in place of x2 in buffer type a
        assert buft_b.allocated_total <= 32 + 32


def test_buffer_size_zero():
    buft_a, buft_b = RecordingBufferType(UNBOUNDED), RecordingBufferType(UNBOUNDED)
    ctx = Context()
    x0 = input_of_size(ctx, 16)
    x1 = ops.scale(ctx, x0, 2.0).set_output()
    graph = build_graph(x1)
    galloc = GraphAllocator([buft_a, buft_b])
    galloc.reserve(graph, [0], [0])
    assert galloc.alloc_graph(graph)
    check_all_allocated(graph)
    assert buft_a.allocated_total == 16 and buft_b.allocated_total == 0
    assert (galloc.buffer_size(0), galloc.buffer_size(1)) == (16, 0)


def test_reallocation():
    buft = RecordingBufferType(32, alignment=4)
    ctx = Context()
    x0, x1 = input_of_size(ctx, 24), input_of_size(ctx, 16)
    x3 = ops.add(ctx, ctx.view_1d(x0, 4, 0), x1)
    name_all(ctx)
    graph, galloc = allocate(x3, buft)
    check_all_allocated(graph)
    assert buft.allocated_total == 40
    calls = buft.alloc_calls

    ctx2 = Context()
    y0, y1 = input_of_size(ctx2, 20), input_of_size(ctx2, 20)
    y2 = ops.add(ctx2, y0, y1).set_output()
    name_all(ctx2, "y")
    graph2 = build_graph(y2)
    assert galloc.alloc_graph(graph2)     # same total, but the second chunk must grow
    check_all_allocated(graph2)
    assert buft.alloc_calls > calls
    assert buft.allocated_total == 40


# --- further guarantees ---------------------------------------------------------------------------

def test_chunk_buffers_are_compute_buffers():
    buft = RecordingBufferType(16)
    ctx = Context()
    x = input_of_size(ctx, 24)
    _, galloc = allocate(ops.sqr(ctx, ops.pad(ctx, x, 1)), buft)
    assert galloc.chunk_buffers(0)
    assert all(b.usage == BufferUsage.COMPUTE for b in galloc.chunk_buffers(0))


def test_outputs_are_never_freed_or_reused():
    buft = RecordingBufferType(UNBOUNDED)
    ctx = Context()
    x = input_of_size(ctx, 64)
    y = ops.scale(ctx, x, 2.0).set_output()
    z = ops.sqr(ctx, y)                      # in-place op, but y is an output
    w = ops.sqr(ctx, z)
    graph, _ = allocate(w, buft)
    check(graph)
    for t in (z, w):
        assert not _overlap(t, y)


def test_an_output_view_keeps_its_source_alive():
    # ggml frees the source once the output view's consumers ran; we must not
    buft = RecordingBufferType(UNBOUNDED)
    ctx = Context()
    x = input_of_size(ctx, 64)
    c = ops.concat(ctx, x, x, 0)
    v = ctx.view_1d(c, 16, 64).set_output()
    y = ops.concat(ctx, ops.neg(ctx, v), x, 0)
    z = ops.concat(ctx, y, y, 0)
    graph, _ = allocate(z, buft)
    check(graph)
    for t in (y, z):
        assert not _overlap(t, c)


def test_a_node_runs_in_place_of_a_view_at_its_sources_start():
    buft = RecordingBufferType(UNBOUNDED)
    ctx = Context()
    x = input_of_size(ctx, 64)
    m = ops.concat(ctx, x, x, 0)                     # 128 bytes
    v = ctx.view_1d(m, 16, 0)                        # its first 64 bytes, m's only use
    y = ops.neg(ctx, v)                              # may take m's memory
    graph, _ = allocate(ops.concat(ctx, y, y, 0), buft)
    check(graph)
    assert (y.buffer, y.offset) == (m.buffer, m.offset)


def test_buffers_only_grow_and_a_smaller_graph_reuses_them():
    buft = RecordingBufferType(UNBOUNDED)
    galloc = GraphAllocator(buft)

    def chain(nbytes: int) -> Graph:
        ctx = Context()
        x = input_of_size(ctx, nbytes)
        return build_graph(ops.sqr(ctx, ops.concat(ctx, x, x, 0)).set_output())

    galloc.reserve(chain(256))
    size, calls = galloc.buffer_size(0), buft.alloc_calls
    small = chain(64)
    assert galloc.alloc_graph(small)
    check(small)
    assert (galloc.buffer_size(0), buft.alloc_calls) == (size, calls)


def test_reserve_sizes_measures_without_allocating():
    buft = RecordingBufferType(UNBOUNDED)
    ctx = Context()
    x = input_of_size(ctx, 64)
    graph = build_graph(ops.sqr(ctx, ops.concat(ctx, x, x, 0)).set_output())
    galloc = GraphAllocator([buft, buft])
    assert galloc.reserve_sizes(graph) == [64 + 128, 0]     # buffer 1 shares buffer 0's type
    assert buft.alloc_calls == 0 and x.buffer is None
    galloc.reserve(graph)
    assert galloc.buffer_size(0) == 192 and galloc.buffer_size(1) == 0


def test_several_buffer_types_need_an_explicit_reserve():
    buft_a, buft_b = RecordingBufferType(UNBOUNDED), RecordingBufferType(UNBOUNDED)
    ctx = Context()
    x = input_of_size(ctx, 16)
    graph = build_graph(ops.sqr(ctx, x).set_output())
    galloc = GraphAllocator([buft_a, buft_b])
    assert not galloc.alloc_graph(graph)
    assert x.buffer is None
    galloc.reserve(graph, [1], [1])
    assert galloc.alloc_graph(graph)
    assert x.buffer in galloc.chunk_buffers(1)


def test_the_same_graph_can_be_allocated_again():
    buft = RecordingBufferType(UNBOUNDED)
    ctx = Context()
    x = input_of_size(ctx, 16)
    y = ops.sqr(ctx, ops.pad(ctx, x, 3))
    graph, galloc = allocate(y, buft)
    placement = [(t.buffer, t.offset) for t in graph.leafs + graph.nodes]
    calls = buft.alloc_calls
    assert galloc.alloc_graph(graph)
    assert [(t.buffer, t.offset) for t in graph.leafs + graph.nodes] == placement
    galloc.reserve(graph)                      # planning again sees its own tensors as movable
    assert buft.alloc_calls == calls
    assert [(t.buffer, t.offset) for t in graph.leafs + graph.nodes] == placement


def test_a_tensor_that_grows_triggers_a_new_reservation():
    buft = RecordingBufferType(UNBOUNDED)
    galloc = GraphAllocator(buft)
    for n in (16, 16, 48):
        ctx = Context()
        x = input_of_size(ctx, 4 * n)
        graph = build_graph(ops.sqr(ctx, ops.pad(ctx, x, 1)).set_output())
        assert galloc.alloc_graph(graph)
        check(graph)
    assert galloc.buffer_size(0) >= 4 * 48 + 4 * 49


def test_bad_buffer_ids_are_rejected():
    galloc = GraphAllocator([RecordingBufferType(64), RecordingBufferType(64)])
    ctx = Context()
    graph = build_graph(ops.sqr(ctx, input_of_size(ctx, 16)))
    with pytest.raises(InvalidArgumentError, match="2 node buffer ids for a graph of 1 nodes"):
        galloc.reserve(graph, [0, 0], [0])
    with pytest.raises(InvalidArgumentError, match="buffer id 2"):
        galloc.reserve(graph, [2], [0])
    with pytest.raises(InvalidArgumentError):
        GraphAllocator([])


def test_a_failed_allocation_leaves_no_reservation():
    buft = RecordingBufferType(UNBOUNDED, fail=True)
    ctx = Context()
    x = input_of_size(ctx, 16)
    graph = build_graph(ops.sqr(ctx, x).set_output())
    galloc = GraphAllocator(buft)
    with pytest.raises(AllocationError, match="recording compute buffers"):
        galloc.alloc_graph(graph)
    assert x.buffer is None and galloc.buffer_size(0) == 0
    buft.fail = False
    assert galloc.alloc_graph(graph)
    check(graph)


def test_close_frees_every_chunk():
    buft = RecordingBufferType(16)
    ctx = Context()
    xs = [input_of_size(ctx, 8) for _ in range(5)]
    out = xs[0]
    for x in xs[1:]:
        out = ops.add(ctx, out, x)
    with allocate(out, buft)[1] as galloc:
        assert buft.live
    assert not buft.live
    with pytest.raises(ClosedError, match="closed"):
        galloc.reserve(build_graph(out))


# --- with real memory: values ---------------------------------------------------------------------

def test_weights_and_outputs_keep_their_values(cpu):
    ctx_w = Context()
    w = ctx_w.new_tensor_2d(F32, 8, 4)
    ctx = Context()
    x = ctx.new_tensor_2d(F32, 8, 4).set_input()
    h = ops.add(ctx, w, x)                            # could run in place of w: must not
    h2 = ops.mul(ctx, h, h).set_output()
    out = ops.scale(ctx, ops.silu(ctx, h2), 0.5).set_output()
    rng = np.random.default_rng(0)
    wv, xv = (rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2))
    with alloc_ctx_tensors(ctx_w, cpu) as wbuf, GraphAllocator(cpu.default_buffer_type) as galloc:
        wbuf.usage = BufferUsage.WEIGHTS
        w.set_data(wv)
        graph = build_graph(out)
        assert galloc.alloc_graph(graph)
        x.set_data(xv)
        cpu.graph_compute(graph)
        h2_ref = (wv.astype(np.float64) + xv) ** 2
        np.testing.assert_array_equal(w.numpy()[0, 0], wv)
        np.testing.assert_allclose(h2.numpy()[0, 0], h2_ref, rtol=1e-6)
        np.testing.assert_allclose(out.numpy()[0, 0], 0.5 * h2_ref / (1 + np.exp(-h2_ref)),
                                   rtol=1e-5)


# --- property: sharing memory never changes a result ---------------------------------------------

N = 6   # every value in a random graph is an N x N matrix (some of them strided views)

def _padded_view(ctx: Context, a: Tensor) -> Tensor:
    """An N x N strided view into a padded copy (rows longer than N, offset one row)."""
    p = ops.pad(ctx, a, 2, 1)
    return ops.view_2d(ctx, p, N, N, p.nb[1], p.nb[1])


def _second_half_view(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """The rows of ``b`` in ``concat(a, b)``: a view at a non-zero offset."""
    t = ops.concat(ctx, a, b, 1)
    return ops.view_2d(ctx, t, N, N, t.nb[1], N * t.nb[1])


_UNARY = {"scale": lambda c, a: ops.scale(c, a, 0.5, 0.25), "sqr": ops.sqr,
          "silu": ops.silu, "tanh": ops.tanh, "neg": ops.neg, "rms_norm": ops.rms_norm,
          "soft_max": ops.soft_max, "transpose": lambda c, a: ops.cont(c, ops.transpose(c, a)),
          "reshape": lambda c, a: ops.reshape(c, ops.reshape(c, a, N * N), N, N),
          "pad_view": _padded_view}
_BINARY = {"add": ops.add, "sub": ops.sub, "mul": ops.mul, "mul_mat": ops.mul_mat,
           "concat_view": _second_half_view,
           "sum_rows_repeat": lambda c, a, b: ops.repeat(c, ops.sum_rows(c, a), b)}
_INPLACE = {"add": ops.add, "mul": ops.mul, "scale": lambda c, a, inplace: ops.scale(
    c, a, 1.5, inplace=inplace), "sqr": ops.sqr, "soft_max": ops.soft_max}


def _build(ctx: Context, w: Tensor, program) -> tuple[list[Tensor], list[Tensor]]:
    """The graph a program describes; returns (leafs to fill, outputs)."""
    from polydev.errors import ShapeError
    x0 = ctx.new_tensor_2d(F32, N, N).set_input()
    x1 = ctx.new_tensor_2d(F32, N, N).set_input()
    c0 = ctx.new_tensor_2d(F32, N, N)                 # a leaf without the INPUT flag
    leafs = [x0, x1, c0]
    pool = [x0, x1, c0, w]
    computed: set[Tensor] = set()      # memory that nodes wrote (safe to update in place)
    for kind, name, i, j, output in program:
        a, b = pool[i % len(pool)], pool[j % len(pool)]
        try:
            if kind == "unary":
                t = _UNARY[name](ctx, a)
            elif kind == "binary":
                t = _BINARY[name](ctx, a, b)
            elif _root(a) in computed:                # in place, never over a leaf or weight
                fn = _INPLACE[name]
                t = (fn(ctx, a, b, inplace=True) if name in ("add", "mul") else
                    fn(ctx, a, inplace=True))
            else:
                continue
        except ShapeError:
            continue                                  # an op that does not take this view
        if output:
            t.set_output()
        if t.view_src is None:
            computed.add(t)
        pool.append(t)
    out = pool[-1]
    outputs = [t for t in pool[4:] if t.flags & TensorFlag.OUTPUT]
    return leafs, outputs + [out.set_output()]


st_program = None
try:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    _step = st.one_of(
        st.tuples(st.just("unary"), st.sampled_from(sorted(_UNARY))),
        st.tuples(st.just("binary"), st.sampled_from(sorted(_BINARY))),
        st.tuples(st.just("inplace"), st.sampled_from(sorted(_INPLACE))),
    ).flatmap(lambda op: st.tuples(st.just(op[0]), st.just(op[1]), st.integers(0, 99),
                                   st.integers(0, 99), st.sampled_from([False, False, True])))
    st_program = st.lists(_step, min_size=1, max_size=24)
except ImportError:   # pragma: no cover - hypothesis is a dev dependency
    pass


def _values(rng_seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(rng_seed)
    return [rng.uniform(-1, 1, (N, N)).astype(np.float32) for _ in range(4)]


def _run_separately(cpu, program, values) -> list[np.ndarray]:
    ctx = Context()
    w = ctx.new_tensor_2d(F32, N, N)
    leafs, outputs = _build(ctx, w, program)
    with alloc_ctx_tensors(ctx, cpu):
        for t, v in zip(leafs + [w], values):
            t.set_data(v)
        cpu.graph_compute(build_graph(*outputs))
        return [t.numpy().copy() for t in outputs]


@pytest.mark.skipif(st_program is None, reason="hypothesis is not installed")
def test_random_graphs_compute_the_same_with_shared_memory(cpu):
    from polydev.backends.cpu.buffer import CPUBufferType

    @settings(max_examples=60, deadline=None)
    @given(program=st_program, seed=st.integers(0, 2**16),
           max_size=st.sampled_from([128, 512, 4096, UNBOUNDED]),
           alignment=st.sampled_from([4, 16, 64]))
    def run(program, seed, max_size, alignment):
        values = _values(seed)
        expected = _run_separately(cpu, program, values)
        buft = CPUBufferType(cpu.device)
        buft.max_size, buft.alignment = max_size, alignment
        ctx_w, ctx = Context(), Context()
        w = ctx_w.new_tensor_2d(F32, N, N)
        leafs, outputs = _build(ctx, w, program)
        graph = build_graph(*outputs)
        with alloc_ctx_tensors(ctx_w, cpu) as wbuf, GraphAllocator(buft) as galloc:
            wbuf.usage = BufferUsage.WEIGHTS
            w.set_data(values[3])
            for _ in range(2):                        # allocate and compute twice: same values
                assert galloc.alloc_graph(graph)
                check(graph)
                for t, v in zip(leafs, values):
                    if t in graph.leafs:                # unused leafs are not allocated
                        t.set_data(v)
                cpu.graph_compute(graph)
                for t, e in zip(outputs, expected):
                    np.testing.assert_allclose(t.numpy(), e, rtol=1e-5, atol=1e-6,
                                               equal_nan=True, err_msg=t.name)
            np.testing.assert_array_equal(w.numpy()[0, 0], values[3])
    run()
