"""Recurrent sequence mixers: Mamba's SSM_CONV and SSM_SCAN, RWKV-6's WKV and gated linear
attention. Each scan result packs the outputs followed by the final states, as in ggml."""

from __future__ import annotations

from ..errors import InvalidArgumentError, TensorTypeError
from ..tensor import Tensor
from ..types import GGMLType
from ._build import _check, _ne, _result
from .catalogue import Op
from .params import GatedLinearAttnParams

__all__ = [
    "ssm_conv", "ssm_scan", "rwkv_wkv6", "gated_linear_attn",
]


def _f32(op: str, *tensors: Tensor) -> None:
    for t in tensors:
        _check(t.type == GGMLType.F32, op, f"{_ne(t)} must be f32, got {t.type}", TensorTypeError)


def ssm_conv(ctx, sx: Tensor, c: Tensor) -> Tensor:
    """Mamba's causal depthwise conv: sx [d_conv - 1 + n_t, d_inner, n_s] (the previous
    d_conv - 1 inputs then the new ones), c [d_conv, d_inner] -> [d_inner, n_t, n_s]."""
    _f32("ssm_conv", sx, c)
    d_conv, d_inner = c.ne[0], c.ne[1]
    n_t = sx.ne[0] - d_conv + 1
    _check(sx.ne[3] == 1 and c.ne[2] == c.ne[3] == 1 and sx.ne[1] == d_inner and n_t >= 0,
           "ssm_conv", f"input {_ne(sx)} must be [d_conv - 1 + n_t, d_inner, n_s] for weights "
           f"{_ne(c)}")
    _check(sx.nb[0] == 4 and sx.nb[1] == 4 * sx.ne[0], "ssm_conv", f"{_ne(sx)} rows must be packed")
    return _result(ctx, Op.SSM_CONV, GGMLType.F32, (d_inner, n_t, sx.ne[2]), [sx, c])


def ssm_scan(ctx, s: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor,
             ids: Tensor) -> Tensor:
    """Mamba's selective scan (Mamba-1 when A is [d_state, n_head], Mamba-2 when [1, n_head]).

    s [d_state, head_dim, n_head, >= n_seqs] are the states (sequence i starts from state
    ids[i]), x [head_dim, n_head, n_tokens, n_seqs], dt [n_head, n_tokens, n_seqs],
    B and C [d_state, n_group, n_tokens, n_seqs]. The 1-d F32 result holds y (x's shape)
    then the n_seqs final states.
    """
    _f32("ssm_scan", s, x, dt, A, B, C)
    _check(ids.type == GGMLType.I32, "ssm_scan", f"ids {_ne(ids)} must be i32", TensorTypeError)
    for t in (s, dt, A):
        _check(t.is_contiguous(), "ssm_scan", f"{_ne(t)} must be contiguous")
    d_state, head_dim, n_head, n_tokens, n_seqs = s.ne[0], x.ne[0], x.ne[1], x.ne[2], x.ne[3]
    ok = (dt.ne[:3] == (n_head, n_tokens, n_seqs) and s.ne[1] == head_dim and s.ne[2] == n_head
        and B.same_shape(C) and B.ne[0] == d_state and B.ne[2:] == (n_tokens, n_seqs)
        and n_head % B.ne[1] == 0 and ids.ne[0] == n_seqs and A.ne[1] == n_head
        and A.ne[0] in (1, d_state))
    _check(ok, "ssm_scan", f"shapes do not fit: s {_ne(s)}, x {_ne(x)}, dt {_ne(dt)}, "
           f"A {_ne(A)}, B {_ne(B)}, C {_ne(C)}, ids {_ne(ids)}")
    for t in (x, B, C):
        _check(t.nb[0] == 4 and t.nb[1] == 4 * t.ne[0], "ssm_scan", f"{_ne(t)} rows must be packed")
    size = x.nelements + d_state * head_dim * n_head * n_seqs
    return _result(ctx, Op.SSM_SCAN, GGMLType.F32, (size,), [s, x, dt, A, B, C, ids], (1,))


def _wkv_shapes(op: str, k: Tensor, v: Tensor, others: list[Tensor], state: Tensor) -> None:
    size, heads, n_tokens = k.ne[0], k.ne[1], k.ne[2]
    for t in [k, v, state] + others:
        _check(t.is_contiguous(), op, f"{_ne(t)} must be contiguous")
    for t in [v] + others:
        _check(t.ne[:3] == (size, heads, n_tokens), op, f"{_ne(t)} must match k {_ne(k)}")
    n_seqs = state.ne[1]
    _check(state.nelements == size * size * heads * n_seqs and n_seqs >= 1
           and n_tokens % n_seqs == 0, op, f"state {_ne(state)} must hold {size}x{size}x{heads} "
           f"values per sequence, and the {n_tokens} tokens split evenly over them")


def rwkv_wkv6(ctx, k: Tensor, v: Tensor, r: Tensor, tf: Tensor, td: Tensor,
              state: Tensor) -> Tensor:
    """RWKV-6's WKV: per head, out_t = r_t (S + diag(tf) k_t v_t^T) and S = diag(td_t) S +
    k_t v_t^T. k, v, r, td are [S, H, n_tokens], tf [S, H], state [S*S*H, n_seqs]; the result
    [S*H, n_tokens + S*n_seqs] holds the outputs then the final states."""
    _f32("rwkv_wkv6", k, v, r, tf, td, state)
    _wkv_shapes("rwkv_wkv6", k, v, [r, td], state)
    _check(tf.nelements == k.ne[0] * k.ne[1], "rwkv_wkv6", f"time_first {_ne(tf)} must be "
           f"[S, H]")
    size, heads = k.ne[0], k.ne[1]
    return _result(ctx, Op.RWKV_WKV6, GGMLType.F32,
                   (size * heads, k.ne[2] + size * state.ne[1]), [k, v, r, tf, td, state])


def gated_linear_attn(ctx, k: Tensor, v: Tensor, q: Tensor, g: Tensor, state: Tensor,
                      scale: float) -> Tensor:
    """Gated linear attention: per head S = diag(g_t) S + k_t v_t^T, out_t = scale * q_t S.
    Shapes as rwkv_wkv6 (g in the place of td)."""
    _f32("gated_linear_attn", k, v, q, g, state)
    _check(scale == scale, "gated_linear_attn", "scale is NaN", InvalidArgumentError)
    _wkv_shapes("gated_linear_attn", k, v, [q, g], state)
    size, heads = k.ne[0], k.ne[1]
    return _result(ctx, Op.GATED_LINEAR_ATTN, GGMLType.F32,
                   (size * heads, k.ne[2] + size * state.ne[1]), [k, v, q, g, state],
                   GatedLinearAttnParams(float(scale)).pack())
