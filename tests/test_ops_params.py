"""The typed op-parameter records of polydev.ops (runtime/ops/params.py): what every builder
packs reads back as the record it was made from, a record refuses another op's node, and no
code outside the op catalogue reads ``op_params`` by position."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from polydev import Context, GGMLType, ops
from polydev.errors import InvalidArgumentError
from polydev.ops import (ArangeParams, ClampParams, ConcatParams, Conv2dParams,
                         ConvTranspose1dParams, ConvTranspose2dParams, DiagMaskParams, FillParams,
                         FlashAttnParams, FlashAttnSources, GluOp, GluParams, GroupNormParams,
                         Im2ColParams, LeakyReluParams, NormParams, PadParams, PadReflect1dParams,
                         PermuteParams, Pool1dParams, Pool2dParams, PoolOp, RollParams, RopeMode,
                         RopeParams, RopeSources, ScaleParams, SoftMaxParams, SoftMaxSources,
                         SortOrder, SortParams, TimestepEmbeddingParams, UnaryOp, UnaryParams,
                         UpscaleParams, ViewParams, WindowParams)

ROOT = Path(__file__).resolve().parent.parent
F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32


def _built():
    """(node, the record its builder was asked for) for every op with parameters."""
    ctx = Context()
    x = ctx.new_tensor(F32, (64, 8, 4))
    rows = ctx.new_tensor(F32, (64, 8))
    pos = ctx.new_tensor(I32, (4,))
    ff = ctx.new_tensor(F32, (16,))
    mask = ctx.new_tensor(F16, (32, 8))
    img = ctx.new_tensor(F32, (16, 16, 3, 1))
    kernel = ctx.new_tensor(F16, (3, 3, 3, 2))
    q, k, v = (ctx.new_tensor(F32, (64, 8, 4)), ctx.new_tensor(F16, (64, 32, 2)),
               ctx.new_tensor(F16, (48, 32, 2)))
    rope = RopeParams(32, RopeMode.NEOX, 4096, 500000.0, 0.25, 1.0, 0.9, 32.0, 1.0)
    mrope = RopeParams(32, RopeMode.MROPE, 0, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0, (4, 6, 6, 0))
    pos4 = ctx.new_tensor(I32, (16,))
    return [
        (ops.unary(ctx, x, UnaryOp.GELU), UnaryParams(UnaryOp.GELU)),
        (ops.glu(ctx, rows, GluOp.GEGLU, swapped=True), GluParams(GluOp.GEGLU, True)),
        (ops.swiglu_oai(ctx, rows, None, 1.5, 7.0), GluParams(GluOp.SWIGLU_OAI, False, 1.5, 7.0)),
        (ops.scale(ctx, x, 0.5, 2.0), ScaleParams(0.5, 2.0)),
        (ops.clamp(ctx, x, -1.0, 3.0), ClampParams(-1.0, 3.0)),
        (ops.leaky_relu(ctx, x, 0.1), LeakyReluParams(0.1)),
        (ops.fill(ctx, x, 4.0), FillParams(4.0)),
        (ops.rms_norm(ctx, x, 1e-5), NormParams(1e-5)),
        (ops.l2_norm(ctx, x, 1e-12), NormParams(1e-12)),
        (ops.group_norm(ctx, img, 3, 1e-6), GroupNormParams(3, 1e-6)),
        (ops.soft_max_ext(ctx, ctx.new_tensor(F32, (32, 8)), mask, 0.125, 8.0),
         SoftMaxParams(0.125, 8.0)),
        (ops.diag_mask_inf(ctx, rows, 3), DiagMaskParams(3)),
        (ops.rope_ext(ctx, x, pos, ff, 32, RopeMode.NEOX, 4096, 500000.0, 0.25, 1.0, 0.9),
         rope),
        (ops.rope_multi(ctx, x, pos4, None, 32, (4, 6, 6, 0)), mrope),
        (ops.flash_attn_ext(ctx, q, k, v, mask, 0.125, 0.0, 30.0),
         FlashAttnParams(0.125, 0.0, 30.0)),
        (ops.im2col(ctx, kernel, img, 2, 1, 1, 0, 1, 2), Im2ColParams(2, 1, 1, 0, 1, 2, True)),
        (ops.conv_2d_direct(ctx, ctx.new_tensor(F32, (3, 3, 3, 2)), img, 1, 2, 1, 1, 2, 1),
         Conv2dParams(1, 2, 1, 1, 2, 1)),
        (ops.conv_transpose_1d(ctx, ctx.new_tensor(F32, (3, 2, 4)),
                               ctx.new_tensor(F32, (16, 4)), 2),
         ConvTranspose1dParams(2)),
        (ops.conv_transpose_2d_p0(ctx, ctx.new_tensor(F32, (3, 3, 2, 3)), img, 2),
         ConvTranspose2dParams(2)),
        (ops.pool_1d(ctx, x, PoolOp.AVG, 3, 2, 1), Pool1dParams(PoolOp.AVG, 3, 2, 1)),
        (ops.pool_2d(ctx, img, PoolOp.MAX, 3, 2, 2, 1, 1, 0),
         Pool2dParams(PoolOp.MAX, 3, 2, 2, 1, 1, 0)),
        (ops.arange(ctx, 1.0, 9.0, 0.5), ArangeParams(1.0, 9.0, 0.5)),
        (ops.timestep_embedding(ctx, ctx.new_tensor(F32, (5,)), 16, 500),
         TimestepEmbeddingParams(16, 500)),
        (ops.argsort(ctx, rows, SortOrder.DESC), SortParams(SortOrder.DESC)),
        (ops.concat(ctx, x, x, 2), ConcatParams(2)),
        (ops.pad_ext(ctx, x, 1, 2, 3, 4, 0, 1, 0, 0, circular=True),
         PadParams((1, 3, 0, 0), (2, 4, 1, 0), True)),
        (ops.pad_reflect_1d(ctx, rows, 2, 3), PadReflect1dParams(2, 3)),
        (ops.roll(ctx, x, 1, -2, 3, 0), RollParams((1, -2, 3, 0))),
        (ops.interpolate(ctx, img, 32, 24, 3, 1, 1), UpscaleParams(1)),
        (ops.acc(ctx, x, rows, x.nb[1], x.nb[2], x.nb[3], 256), WindowParams(
            x.nb[1], x.nb[2], x.nb[3], 256, False)),
        (ops.view_2d(ctx, x, 32, 8, x.nb[1], 128), ViewParams(128)),
        (ops.permute(ctx, x, 1, 0, 2, 3), PermuteParams((1, 0, 2, 3))),
    ]


@pytest.mark.parametrize("case", range(len(_built())))
def test_every_builder_packs_the_record_it_was_given(case):
    node, expected = _built()[case]
    record = type(expected).of(node)
    assert record == expected
    assert record.pack() == tuple(node.op_params)


def test_the_sources_of_attention_ops_by_name():
    ctx = Context()
    q, k, v = (ctx.new_tensor(F32, (64, 8, 4)), ctx.new_tensor(F16, (64, 32, 2)),
               ctx.new_tensor(F16, (64, 32, 2)))
    mask, sinks = ctx.new_tensor(F16, (32, 8)), ctx.new_tensor(F32, (4,))
    fa = ops.flash_attn_ext(ctx, q, k, v, mask, 0.125)
    assert FlashAttnSources.of(fa) == (q, k, v, mask, None)
    ops.flash_attn_ext_add_sinks(fa, sinks)
    assert FlashAttnSources.of(fa).sinks is sinks
    logits = ctx.new_tensor(F32, (32, 8, 4))
    sm = ops.soft_max_ext(ctx, logits, None)
    assert SoftMaxSources.of(sm) == (logits, None, None)
    pos = ctx.new_tensor(I32, (4,))
    assert RopeSources.of(ops.rope(ctx, q, pos, 64)) == (q, pos, None)


def test_a_record_refuses_a_node_of_another_op():
    ctx = Context()
    x = ctx.new_tensor(F32, (8,))
    with pytest.raises(InvalidArgumentError, match="RopeParams describes ROPE, not SCALE"):
        RopeParams.of(ops.scale(ctx, x, 2.0))
    with pytest.raises(InvalidArgumentError, match="L2_NORM, NORM, RMS_NORM, not GROUP_NORM"):
        NormParams.of(ops.group_norm(ctx, ctx.new_tensor(F32, (4, 4, 4)), 2))


def test_no_code_outside_the_catalogue_reads_op_params_by_position():
    """docs/design.md, decision 1: the op catalogue alone says what an op's parameters mean."""
    catalogue = ROOT / "runtime" / "ops"
    found = []
    for folder in ("runtime", "backends", "models", "server", "tools", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            if catalogue in path.parents:
                continue
            text = path.read_text(encoding="utf-8")
            # an index, or the whole tuple unpacked into names (a copy to another node's
            # op_params is no reading)
            for match in re.finditer(r"op_params\s*\[|^\s*[\w, ()]+=\s*\w+\.op_params\b",
                                     text, re.M):
                line = text.count("\n", 0, match.start()) + 1
                found.append(f"{path.relative_to(ROOT)}:{line}")
    assert found == []
