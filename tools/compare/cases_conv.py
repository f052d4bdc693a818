"""Cases for convolution, pooling and the recurrent (state-space and linear-attention) ops."""

from __future__ import annotations

from typing import Iterator

from polydev import GGMLType, Tensor, ops
from polydev.ops import PoolOp, conv_output_size

from .case import Case, CaseContext, case, distinct_per_row, uniform
from .cases_products import PRODUCT_ERR

F32, F16, I32 = GGMLType.F32, GGMLType.F16, GGMLType.I32


def _im2col(type_kernel: GGMLType, type_dst: GGMLType, ne_input, ne_kernel, s0, s1, p0, p1, d0,
            d1, is_2d: bool) -> Case:
    def build(ctx: CaseContext):
        x = ctx.input(F32, ne_input, "input")
        k = ctx.input(type_kernel, ne_kernel, "kernel")
        return ops.im2col(ctx, k, x, s0, s1, p0, p1, d0, d1, is_2d, type_dst)
    return case("IM2COL", build, type_input=F32, type_kernel=type_kernel, dst_type=type_dst,
                ne_input=ne_input, ne_kernel=ne_kernel, s0=s0, s1=s1, p0=p0, p1=p1, d0=d0, d1=d1,
                is_2D=is_2d)


def im2col_cases() -> Iterator[Case]:
    for tk, td in ((F32, F32), (F16, F32), (F16, F16)):
        yield _im2col(tk, td, (3000, 128, 1, 1), (3, 128, 1280, 1), 1, 0, 1, 0, 1, 0, False)
        yield _im2col(tk, td, (10, 10, 3, 1), (3, 3, 3, 1), 1, 1, 1, 1, 1, 1, True)
    for s0 in (1, 3):
        for p0 in (0, 3):
            for d0 in (1, 3):
                yield _im2col(F32, F32, (20, 2, 2, 1), (3, 2, 2, 1), s0, 0, p0, 0, d0, 0, False)
    for s0, s1, p0, p1, d0, d1 in ((1, 1, 0, 0, 1, 1), (3, 1, 0, 3, 1, 3), (1, 3, 3, 0, 3, 1),
                                   (3, 3, 3, 3, 3, 3), (1, 1, 3, 3, 1, 1), (3, 3, 0, 0, 1, 1)):
        yield _im2col(F32, F32, (20, 20, 2, 2), (3, 3, 2, 2), s0, s1, p0, p1, d0, d1, True)
    yield _im2col(F16, F16, (12, 12, 2, 32), (3, 3, 2, 32), 1, 1, 1, 1, 1, 1, True)
    yield _im2col(F16, F16, (5, 5, 1, 32), (3, 4, 1, 32), 1, 1, 0, 0, 1, 1, True)
    yield _im2col(F16, F16, (128, 128, 2, 1), (33, 34, 2, 1), 1, 1, 1, 1, 1, 1, True)


def conv_flops(out: Tensor) -> int:
    kernel = out.src[0]
    return 2 * out.nelements * kernel.ne[0] * kernel.ne[1] * kernel.ne[2]


def _conv_2d(ne_input, ne_kernel, type_kernel: GGMLType, s0, s1, p0, p1, d0, d1) -> Case:
    def build(ctx: CaseContext):
        k = ctx.input(type_kernel, ne_kernel, "kernel")
        x = ctx.input(F32, ne_input, "input")
        return ops.conv_2d_direct(ctx, k, x, s0, s1, p0, p1, d0, d1)
    return case("CONV_2D", build, max_err=PRODUCT_ERR, flops=conv_flops, ne_input=ne_input,
                ne_kernel=ne_kernel, type_kernel=type_kernel, stride0=s0, stride1=s1,
                padding0=p0, padding1=p1, dilation0=d0, dilation1=d1, cwhn=False)


def conv_2d_cases() -> Iterator[Case]:
    s1, p0, d0, d1 = 5, 5, 2, 4            # test-backend-ops' fixed half of the geometry
    for s0 in (1, 3):
        for p1 in (2, 5):
            for cin, cout in ((1, 1), (25, 12)):
                for kh, kw in ((1, 1), (2, 3), (3, 2), (11, 11)):
                    for h, w in ((1, 1), (133, 141), (1, 141)):
                        if (conv_output_size(w, kw, s0, p0, d0) <= 0 or
                                conv_output_size(h, kh, s1, p1, d1) <= 0):
                            continue
                        for type_kernel in (F32, F16):
                            yield _conv_2d((w, h, cin, 2), (kw, kh, cin, cout), type_kernel, s0,
                                           s1, p0, p1, d0, d1)


def _conv_2d_dw(ne_input, ne_kernel, type_kernel: GGMLType, stride: int, padding: int,
                dilation: int) -> Case:
    def build(ctx: CaseContext):
        k = ctx.input(type_kernel, ne_kernel, "kernel")
        x = ctx.input(F32, ne_input, "input")
        return ops.conv_2d_dw_direct(ctx, k, x, stride, stride, padding, padding, dilation,
                                     dilation)
    return case("CONV_2D_DW", build, ne_input=ne_input, ne_kernel=ne_kernel,
                type_kernel=type_kernel, stride=stride, padding=padding, dilation=dilation)


def _conv_transpose_1d(ne_input, ne_kernel, s0: int) -> Case:
    def build(ctx: CaseContext):
        k = ctx.input(F32, ne_kernel, "kernel")
        x = ctx.input(F32, ne_input, "input")
        return ops.conv_transpose_1d(ctx, k, x, s0)
    return case("CONV_TRANSPOSE_1D", build, ne_input=ne_input, ne_kernel=ne_kernel, s0=s0,
                p0=0, d0=1)


def _conv_transpose_2d(ne_input, ne_kernel, stride: int, type_kernel: GGMLType) -> Case:
    def build(ctx: CaseContext):
        k = ctx.input(type_kernel, ne_kernel, "kernel")
        x = ctx.input(F32, ne_input, "input")
        return ops.conv_transpose_2d_p0(ctx, k, x, stride)
    return case("CONV_TRANSPOSE_2D", build, max_err=PRODUCT_ERR, ne_input=ne_input,
                ne_kernel=ne_kernel, stride=stride, kernel_type=type_kernel)


def other_conv_cases() -> Iterator[Case]:
    for type_kernel in (F32, F16):
        yield _conv_2d((256, 64, 32, 1), (3, 3, 32, 48), type_kernel, 1, 1, 1, 1, 1, 1)
        for ne_input, ne_kernel, s, p, d in (((17, 34, 9, 1), (3, 3, 1, 9), 1, 0, 1),
                                             ((32, 8, 64, 1), (3, 3, 1, 64), 2, 1, 1),
                                             ((32, 8, 64, 2), (3, 3, 1, 64), 1, 2, 2)):
            yield _conv_2d_dw(ne_input, ne_kernel, type_kernel, s, p, d)
        for ne_input, ne_kernel, stride in (((3, 2, 3, 1), (2, 2, 1, 3), 1),
                                            ((10, 10, 9, 1), (3, 3, 1, 9), 2),
                                            ((129, 63, 35, 1), (3, 3, 48, 35), 1)):
            yield _conv_transpose_2d(ne_input, ne_kernel, stride, type_kernel)
    for cout in (1, 9):
        for cin in (1, 7):
            for k in (1, 3, 1337):
                for length in (1, 2, 13):
                    for s0 in (1, 2, 3):
                        yield _conv_transpose_1d((length, cin, 1, 1), (k, cout, cin, 1), s0)


def _pool_2d(op: PoolOp, ne, k0, k1, s0, s1, p0, p1) -> Case:
    def build(ctx: CaseContext):
        return ops.pool_2d(ctx, ctx.input(F32, ne, "input"), op, k0, k1, s0, s1, p0, p1)
    return case("POOL_2D", build, pool_type=op, type_input=F32, ne_input=ne, k0=k0, k1=k1,
                s0=s0, s1=s1, p0=p0, p1=p1)


def _pool_1d(op: PoolOp, ne, k0, s0, p0) -> Case:
    def build(ctx: CaseContext):
        return ops.pool_1d(ctx, ctx.input(F32, ne, "input"), op, k0, s0, p0)
    return case("POOL_1D", build, pool_type=op, type_input=F32, ne_input=ne, k0=k0, s0=s0, p0=p0)


def pool_cases() -> Iterator[Case]:
    for op in (PoolOp.AVG, PoolOp.MAX):
        for k0 in (1, 3):
            for k1 in (1, 3):
                for s0 in (1, 2):
                    for s1 in (1, 2):
                        for p0 in (0, 1):
                            for p1 in (0, 1):
                                yield _pool_2d(op, (10, 10, 3, 1), k0, k1, s0, s1, p0, p1)
        for k0 in (1, 2, 3):
            for s0 in (1, 2, 3):
                for p0 in (0, 1, 2, 3):
                    for ne in ((10, 3, 2, 1), (11, 1, 3, 2), (128, 2, 1, 3)):
                        yield _pool_1d(op, ne, k0, s0, p0)


# --- recurrent ------------------------------------------------------------------------------

def _ssm_conv(ne_a, ne_b) -> Case:
    def build(ctx: CaseContext):
        return ops.ssm_conv(ctx, ctx.input(F32, ne_a, "sx"), ctx.input(F32, ne_b, "c"))
    return case("SSM_CONV", build, type=F32, ne_a=ne_a, ne_b=ne_b)


def _ssm_scan(d_state: int, head_dim: int, n_head: int, n_group: int, n_seq_tokens: int,
              n_seqs: int) -> Case:
    def build(ctx: CaseContext):
        s = ctx.input(F32, (d_state, head_dim, n_head, n_seqs), "s")
        x = ctx.input(F32, (head_dim, n_head, n_seq_tokens, n_seqs), "x")
        dt = ctx.input(F32, (n_head, n_seq_tokens, n_seqs), "dt")
        a = ctx.input(F32, (1 if head_dim > 1 else d_state, n_head), "A", uniform(-1.0, -0.5))
        b = ctx.input(F32, (d_state, n_group, n_seq_tokens, n_seqs), "B")
        c = ctx.input(F32, (d_state, n_group, n_seq_tokens, n_seqs), "C")
        ids = ctx.input(I32, (n_seqs,), "ids", distinct_per_row(n_seqs))
        return ops.ssm_scan(ctx, s, x, dt, a, b, c, ids)
    return case("SSM_SCAN", build, max_err=2e-7 if head_dim > 1 else 1e-7, type=F32,
                d_state=d_state, head_dim=head_dim, n_head=n_head, n_group=n_group,
                n_seq_tokens=n_seq_tokens, n_seqs=n_seqs)


def _wkv(op: str, head_count: int, head_size: int, n_seq_tokens: int, n_seqs: int) -> Case:
    def build(ctx: CaseContext):
        n_tokens = n_seq_tokens * n_seqs
        k, v, r = (ctx.input(F32, (head_size, head_count, n_tokens), name) for name in "kvr")
        decay = ctx.input(F32, (head_size, head_count, n_tokens), "w", uniform(0.3, 1.0))
        state = ctx.input(F32, (head_size * head_size * head_count, n_seqs), "s")
        if op == "RWKV_WKV6":
            bonus = ctx.input(F32, (head_size, head_count), "tf")
            return ops.rwkv_wkv6(ctx, k, v, r, bonus, decay, state)
        return ops.gated_linear_attn(ctx, k, v, r, decay, state, 0.5)
    return case(op, build, type=F32, head_count=head_count, head_size=head_size,
                n_seq_tokens=n_seq_tokens, n_seqs=n_seqs)


def recurrent_cases() -> Iterator[Case]:
    for d_conv in (3, 4, 9):
        for d_inner in (1024, 1536):
            for ne_a in ((d_conv, d_inner, 1, 1), (2 * d_conv, d_inner, 1, 1),
                         (d_conv, d_inner, 4, 1), (d_conv - 1 + 64, d_inner, 4, 1)):
                yield _ssm_conv(ne_a, (d_conv, d_inner, 1, 1))
    yield _ssm_scan(16, 1, 1024, 1, 32, 4)        # Mamba-1
    yield _ssm_scan(128, 64, 16, 2, 32, 4)        # Mamba-2
    yield _ssm_scan(256, 64, 8, 2, 32, 4)         # Falcon-H1
    yield _ssm_scan(128, 64, 8, 8, 300, 2)        # Mamba-2, several chunks
    for op in ("RWKV_WKV6", "GATED_LINEAR_ATTN"):
        for n_seq_tokens, n_seqs in ((1, 1), (32, 1), (32, 4), (128, 4)):
            yield _wkv(op, 32, 64, n_seq_tokens, n_seqs)


def cases() -> Iterator[Case]:
    for source in (im2col_cases, conv_2d_cases, other_conv_cases, pool_cases, recurrent_cases):
        yield from source()
