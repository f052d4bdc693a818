"""Contexts, views and graphs: shapes, topological order, validation errors."""

from __future__ import annotations

import numpy as np
import pytest

from polydev import Context, GGMLType, Op, TensorFlag, build_graph, ops
from polydev.errors import (GraphError, InvalidArgumentError, OutOfBoundsError, ShapeError,
                            TensorTypeError)


def test_tensor_fields_and_repr():
    ctx = Context()
    t = ctx.new_tensor_3d(GGMLType.F16, 8, 3, 2, name="x").set_input()
    assert t.ne == (8, 3, 2, 1) and t.nb == (2, 16, 48, 96) and t.shape == (1, 2, 3, 8)
    assert t.nbytes == 96 and t.n_dims == 3 and t.is_contiguous()
    assert t.flags & TensorFlag.INPUT
    assert "x" in repr(t) and "f16" in repr(t) and "unallocated" in repr(t)
    q = ctx.new_tensor_2d(GGMLType.Q4_K, 512, 3)
    assert q.nb == (144, 288, 864, 864) and q.nbytes == 864


def test_views_permute_transpose():
    ctx = Context()
    a = ctx.new_tensor_4d(GGMLType.F32, 2, 3, 4, 5)
    p = ctx.permute(a, 1, 2, 0, 3)
    assert p.ne == (4, 2, 3, 5) and p.view_src is a and p.op == Op.PERMUTE
    t = ctx.transpose(a)
    assert t.ne == (3, 2, 4, 5) and t.is_transposed() and not t.is_contiguous()
    v = ctx.view_2d(a, 2, 3, a.nb[1], a.nb[2])
    vv = ctx.view_1d(v, 2, 4)
    assert vv.view_src is a and vv.view_offs == a.nb[2] + 4    # views of views reach the root
    with pytest.raises(OutOfBoundsError, match="spans bytes"):
        ctx.view_1d(a, 200, 0)
    with pytest.raises(ShapeError, match="not contiguous"):
        ctx.reshape(t, 24, 5)
    with pytest.raises(ShapeError, match="elements"):
        ctx.reshape(a, 7)
    with pytest.raises(InvalidArgumentError, match="permutation"):
        ctx.permute(a, 0, 0, 1, 2)


def test_graph_order_leafs_and_views():
    ctx = Context()
    x, w = ctx.new_tensor_2d(GGMLType.F32, 4, 2), ctx.new_tensor_2d(GGMLType.F32, 4, 3)
    y = ops.mul_mat(ctx, w, x)
    z = ops.add(ctx, y, ops.scale(ctx, y, 2.0))
    g = build_graph(z)
    assert g.leafs == [x, w] or set(map(id, g.leafs)) == {id(x), id(w)}
    assert g.nodes[-1] is z and g.nodes.index(y) < g.nodes.index(z)
    assert len(g.nodes) == 3
    g.build_forward_expand(z)            # visiting again adds nothing
    assert len(g.nodes) == 3
    sub = g.view(1, 3)
    assert sub.nodes == g.nodes[1:3] and sub.n_leafs == 0
    with pytest.raises(GraphError):
        g.view(2, 9)
    g.add_node(x)                        # ggml_graph_add_node: appended as a node, as it is
    assert g.nodes[-1] is x and len(g.nodes) == 4 and len(g.leafs) == 2
    with pytest.raises(GraphError, match="capacity"):
        build_graph(z, size=3).add_node(x)


def test_deep_graph_has_no_recursion_limit():
    ctx = Context()
    t = ctx.new_tensor_1d(GGMLType.F32, 4)
    for _ in range(5000):
        t = ops.scale(ctx, t, 1.0)
    g = build_graph(t, size=6000)
    assert g.n_nodes == 5000
    with pytest.raises(GraphError, match="capacity"):
        build_graph(t, size=100)


@pytest.mark.parametrize("build,error,match", [
    (lambda c, a, b: ops.add(c, b, a), ShapeError, "cannot be broadcast"),
    (lambda c, a, b: ops.mul_mat(c, a, c.new_tensor_2d(GGMLType.F32, 5, 2)), ShapeError, "ne\\[0\\]"),
    (lambda c, a, b: ops.get_rows(c, a, c.new_tensor_1d(GGMLType.F32, 2)), TensorTypeError, "i32"),
    (lambda c, a, b: ops.concat(c, a, b, 4), InvalidArgumentError, "dim"),
    (lambda c, a, b: ops.soft_max_ext(c, a, None, 1.0, 8.0), InvalidArgumentError, "ALiBi"),
    (lambda c, a, b: ops.rope(c, a, c.new_tensor_1d(GGMLType.I32, 3), 3), InvalidArgumentError,
     "n_dims"),
    (lambda c, a, b: ops.glu(c, c.new_tensor_1d(GGMLType.F32, 5), 2), ShapeError, "even"),
    (lambda c, a, b: ops.cpy(c, a, b), ShapeError, "element counts"),
])
def test_builders_raise_typed_errors_with_shapes(build, error, match):
    ctx = Context()
    a = ctx.new_tensor_4d(GGMLType.F32, 8, 4, 3, 1)
    b = ctx.new_tensor_4d(GGMLType.F32, 8, 2, 1, 1)
    with pytest.raises(error, match=match):
        build(ctx, a, b)


def test_error_message_names_the_shapes():
    ctx = Context()
    a = ctx.new_tensor_2d(GGMLType.F32, 8, 4, name="act")
    b = ctx.new_tensor_2d(GGMLType.F32, 3, 4, name="bias")
    with pytest.raises(ShapeError) as e:
        ops.add(ctx, a, b)
    assert "act ne=[8, 4, 1, 1]" in str(e.value) and "bias ne=[3, 4, 1, 1]" in str(e.value)


def test_unsupported_op_is_a_clear_error(cpu):
    from polydev import alloc_ctx_tensors
    from polydev.errors import UnsupportedOpError
    ctx = Context()
    a = ctx.new_tensor_1d(GGMLType.I32, 4)
    y = ops.exp(ctx, a)
    assert not cpu.supports_op(y)
    with alloc_ctx_tensors(ctx, cpu):
        with pytest.raises(UnsupportedOpError, match="EXP"):
            cpu.graph_compute(build_graph(y))
    np.testing.assert_array_equal(np.zeros(1), np.zeros(1))
