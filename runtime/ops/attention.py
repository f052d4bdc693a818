"""Attention: masks, soft_max, rotary position embedding and fused flash attention."""

from __future__ import annotations

from typing import Sequence

from ..errors import InvalidArgumentError, TensorTypeError
from ..tensor import Tensor
from ..types import GGMLType
from ._build import _check, _ne, _result, _unary_like
from .catalogue import Op, RopeMode
from .params import DiagMaskParams, FlashAttnParams, RopeParams, SoftMaxParams

__all__ = [
    "diag_mask_inf", "soft_max", "soft_max_ext", "soft_max_add_sinks", "rope", "rope_ext",
    "rope_multi", "flash_attn_ext", "flash_attn_ext_add_sinks",
]


def diag_mask_inf(ctx, a: Tensor, n_past: int, inplace: bool = False) -> Tensor:
    """Set element (i0, i1) to -inf where i0 > n_past + i1 (causal mask)."""
    return _unary_like(ctx, Op.DIAG_MASK_INF, a, DiagMaskParams(int(n_past)).pack(), inplace)


def soft_max(ctx, a: Tensor, inplace: bool = False) -> Tensor:
    """softmax over each row of ``a`` (soft_max_ext without mask, scale 1, no ALiBi)."""
    return soft_max_ext(ctx, a, None, 1.0, 0.0, inplace)


def soft_max_ext(ctx, a: Tensor, mask: Tensor | None, scale: float = 1.0, max_bias: float = 0.0,
                 inplace: bool = False) -> Tensor:
    """softmax(a * scale + slope * mask) over rows; slope is ALiBi's per head when max_bias > 0."""
    _check(a.is_contiguous(), "soft_max", f"{_ne(a)} must be contiguous")
    if mask is not None:
        _check(mask.type in (GGMLType.F16, GGMLType.F32), "soft_max",
               f"mask must be f16 or f32, got {mask.type}", TensorTypeError)
        _check(mask.is_contiguous(), "soft_max", f"mask {_ne(mask)} must be contiguous")
        ok = (mask.ne[0] == a.ne[0] and mask.ne[1] >= a.ne[1] and a.ne[2] % mask.ne[2] == 0
            and a.ne[3] % mask.ne[3] == 0)
        _check(ok, "soft_max", f"mask {_ne(mask)} does not fit {_ne(a)}: ne[0] must match, ne[1] "
               f"must cover a's rows and dims 2-3 must divide a's")
    _check(max_bias <= 0 or mask is not None, "soft_max", "max_bias > 0 (ALiBi) needs a mask",
           InvalidArgumentError)
    params = SoftMaxParams(float(scale), float(max_bias)).pack()
    return _unary_like(ctx, Op.SOFT_MAX, a, params, inplace, srcs=[a, mask])


def soft_max_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """Attach attention sinks (one F32 logit per head, a's dim 2) to a SOFT_MAX result."""
    if sinks is None:
        return
    _check(a.op == Op.SOFT_MAX, "soft_max_add_sinks", f"{_ne(a)} is not a soft_max result",
           InvalidArgumentError)
    _check(sinks.type == GGMLType.F32 and sinks.ne[0] == a.ne[2], "soft_max_add_sinks",
           f"sinks {_ne(sinks)} must be f32 with one value per head ({a.ne[2]})")
    while len(a.src) < 3:
        a.src.append(None)
    a.src[2] = sinks


def rope(ctx, a: Tensor, pos: Tensor, n_dims: int, mode: int = RopeMode.NORMAL,
         inplace: bool = False) -> Tensor:
    """Rotary position embedding of the first ``n_dims`` of each row at positions ``pos``
    (rope_ext with freq_base 10000 and no YaRN scaling)."""
    return rope_ext(ctx, a, pos, None, n_dims, mode, 0, 10000.0, 1.0, 0.0, 1.0, 0.0, 0.0,
                    inplace=inplace)


def rope_ext(ctx, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int,
             mode: int = RopeMode.NORMAL, n_ctx_orig: int = 0, freq_base: float = 10000.0,
             freq_scale: float = 1.0, ext_factor: float = 0.0, attn_factor: float = 1.0,
             beta_fast: float = 32.0, beta_slow: float = 1.0,
             sections: Sequence[int] | None = None, inplace: bool = False) -> Tensor:
    """Rotary position embedding with YaRN scaling (ggml_rope_ext).

    ``a`` is [head_dim, n_head, n_tokens, ...], ``pos`` the I32 positions of the tokens (4 per
    token for M-RoPE), ``freq_factors`` optional F32 per-pair divisors of the frequencies.
    op_params follow ggml: [0, n_dims, mode, 0, n_ctx_orig, freq_base, freq_scale, ext_factor,
    attn_factor, beta_fast, beta_slow, sections[4], n_offs].
    """
    _check(mode & 1 == 0, "rope", f"mode {mode} (mode & 1) is no longer supported by ggml",
           InvalidArgumentError)
    _check(pos.type == GGMLType.I32 and pos.ne[1] == pos.ne[2] == pos.ne[3] == 1, "rope",
           f"positions {_ne(pos)} must be an i32 vector", TensorTypeError)
    per_token = 4 if mode & RopeMode.MROPE else 1
    _check(pos.ne[0] == a.ne[2] * per_token, "rope",
           f"positions {_ne(pos)} must hold {per_token} value(s) per token of {_ne(a)}")
    _check(0 < n_dims <= a.ne[0] and n_dims % 2 == 0, "rope",
           f"n_dims={n_dims} must be even and at most ne[0] of {_ne(a)}", InvalidArgumentError)
    if freq_factors is not None:
        # vision mode rotates n_dims pairs (i, i + n_dims), one factor each; ggml asks for only
        # n_dims/2 values there and then reads past them, so polydev asks for all it reads
        n_factors = n_dims if mode == RopeMode.VISION else n_dims // 2
        _check(freq_factors.type == GGMLType.F32 and freq_factors.ne[0] >= n_factors, "rope",
               f"freq_factors {_ne(freq_factors)} must be f32 with >= {n_factors} values "
               f"(n_dims={n_dims}, mode {mode})")
    secs = (0, 0, 0, 0)
    if mode & RopeMode.MROPE:
        _check(mode in (RopeMode.MROPE, RopeMode.VISION, RopeMode.IMROPE), "rope",
               f"unknown multi-section mode {mode}", InvalidArgumentError)
        _check(sections is not None and len(sections) == 4 and min(sections) >= 0
               and max(sections[:3]) > 0, "rope",
               f"M-RoPE needs 4 non-negative sections, one of the first 3 positive; got {sections}",
               InvalidArgumentError)
        secs = tuple(int(s) for s in sections)
        _check(sum(secs) <= a.ne[0], "rope", f"sections {list(secs)} add up to more than "
               f"ne[0] of {_ne(a)}", InvalidArgumentError)
    if mode == RopeMode.VISION:
        _check(2 * n_dims == a.ne[0], "rope", f"vision RoPE rotates whole rows: n_dims={n_dims} "
               f"must be half of ne[0] of {_ne(a)}", InvalidArgumentError)
    params = RopeParams(n_dims, mode, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor,
                        beta_fast, beta_slow, secs).pack()
    return _unary_like(ctx, Op.ROPE, a, params, inplace, srcs=[a, pos, freq_factors])


def flash_attn_ext(ctx, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, scale: float,
                   max_bias: float = 0.0, logit_softcap: float = 0.0) -> Tensor:
    """Fused attention: softmax(softcap(scale * q.k) + slope * mask) @ v, per head.

    q is [D, n_q, n_head, n_seq], k [D, n_kv, n_head_kv, n_seq] and v [Dv, n_kv, n_head_kv,
    n_seq] (any type with a dequantizer); heads share K/V in groups of n_head / n_head_kv
    (GQA). The F16 mask is [n_kv, >= n_q, ...], repeated over heads and sequences. The F32
    result is permuted as in ggml: [Dv, n_head, n_q, n_seq]. op_params: [scale, max_bias,
    logit_softcap, precision].
    """
    _check(k.ne[0] == q.ne[0], "flash_attn_ext", f"q {_ne(q)} and k {_ne(k)} differ in ne[0]")
    _check(v.ne[1] == k.ne[1], "flash_attn_ext", f"k {_ne(k)} and v {_ne(v)} differ in n_kv")
    _check(q.ne[2] % k.ne[2] == 0 and q.ne[2] % v.ne[2] == 0, "flash_attn_ext",
           f"q {_ne(q)} heads must be a multiple of k {_ne(k)} and v {_ne(v)}'s")
    _check(q.ne[3] == k.ne[3] == v.ne[3], "flash_attn_ext",
           f"q {_ne(q)}, k {_ne(k)} and v {_ne(v)} differ in ne[3] (sequences)")
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _check(t.nb[0] == t.traits.type_size, "flash_attn_ext", f"{name} {_ne(t)} must have "
               f"packed rows")
    _check(q.type == GGMLType.F32, "flash_attn_ext", f"q {_ne(q)} must be f32, got {q.type}",
           TensorTypeError)
    if mask is not None:
        _check(mask.type == GGMLType.F16, "flash_attn_ext", f"mask must be f16, got {mask.type}",
               TensorTypeError)
        _check(mask.is_contiguous(), "flash_attn_ext", f"mask {_ne(mask)} must be contiguous")
        ok = (mask.ne[0] == k.ne[1] and mask.ne[1] >= q.ne[1] and q.ne[2] % mask.ne[2] == 0
            and q.ne[3] % mask.ne[3] == 0)
        _check(ok, "flash_attn_ext", f"mask {_ne(mask)} does not fit q {_ne(q)} and k {_ne(k)}")
    _check(max_bias <= 0 or mask is not None, "flash_attn_ext",
           "max_bias > 0 (ALiBi) needs a mask", InvalidArgumentError)
    return _result(ctx, Op.FLASH_ATTN_EXT, GGMLType.F32, (v.ne[0], q.ne[2], q.ne[1], q.ne[3]),
                   [q, k, v, mask],
                   FlashAttnParams(float(scale), float(max_bias), float(logit_softcap)).pack())


def flash_attn_ext_add_sinks(a: Tensor, sinks: Tensor | None) -> None:
    """Attach attention sinks (one F32 logit per q head) to a FLASH_ATTN_EXT result."""
    if sinks is None:
        return
    _check(a.op == Op.FLASH_ATTN_EXT, "flash_attn_ext_add_sinks",
           f"{_ne(a)} is not a flash_attn_ext result", InvalidArgumentError)
    q = a.src[0]
    _check(sinks.type == GGMLType.F32 and sinks.ne[0] == q.ne[2], "flash_attn_ext_add_sinks",
           f"sinks {_ne(sinks)} must be f32 with one value per head ({q.ne[2]})")
    while len(a.src) < 5:
        a.src.append(None)
    a.src[4] = sinks


def rope_multi(ctx, a: Tensor, pos: Tensor, freq_factors: Tensor | None, n_dims: int,
               sections: Sequence[int], mode: int = RopeMode.MROPE, n_ctx_orig: int = 0,
               freq_base: float = 10000.0, freq_scale: float = 1.0, ext_factor: float = 0.0,
               attn_factor: float = 1.0, beta_fast: float = 32.0, beta_slow: float = 1.0,
               inplace: bool = False) -> Tensor:
    """Multi-section RoPE (Qwen2-VL's M-RoPE, Qwen3-VL's interleaved IMROPE, and the VISION
    encoder mode): each token has 4 positions (time, height, width, extra) in ``pos``, laid out
    as pos[token + n_tokens * section], and ``sections`` says how many rotation pairs follow
    each of them."""
    return rope_ext(ctx, a, pos, freq_factors, n_dims, mode, n_ctx_orig, freq_base, freq_scale,
                    ext_factor, attn_factor, beta_fast, beta_slow, sections, inplace)
