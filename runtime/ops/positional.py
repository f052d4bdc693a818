"""The maths that defines the positional ops, shared by every backend's kernels: YaRN's
correction range for ROPE and ALiBi's per-head slopes for SOFT_MAX and FLASH_ATTN_EXT.

Both follow ggml's float32 arithmetic step by step, so kernels that use them agree with ggml
to the last bit of these parameters.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["yarn_corr_dims", "yarn_ramp_width", "yarn_mscale", "alibi_params", "alibi_slopes"]


def _c_min(a: float, b: float) -> float:
    return a if a < b else b      # C's MIN macro, NaN behaviour included


def _c_max(a: float, b: float) -> float:
    return a if a > b else b


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the range of rotation dimensions where YaRN ramps from
    extrapolation to interpolation, clamped to [0, n_dims - 1]."""
    def corr_dim(n_rot: float) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.float32(n_ctx_orig) / (np.float32(n_rot) * np.float32(2 * math.pi))
            return float(np.float32(n_dims) * np.log(np.float32(ratio))
                         / (np.float32(2) * np.log(np.float32(freq_base))))
    fast, slow = corr_dim(beta_fast), corr_dim(beta_slow)
    start = math.floor(fast) if math.isfinite(fast) else fast
    end = math.ceil(slow) if math.isfinite(slow) else slow
    return _c_max(0.0, start), _c_min(float(n_dims - 1), end)


def yarn_ramp_width(low: float, high: float) -> float:
    """The ramp's denominator, ggml's MAX(0.001f, high - low) (a zero-width range stays finite)."""
    return _c_max(0.001, high - low)


def yarn_mscale(attn_factor: float, freq_scale: float, ext_factor: float) -> np.float32:
    """The factor rope_yarn multiplies cos and sin by: attn_factor, times
    1 + 0.1 ln(1 / freq_scale) when YaRN extrapolates (ext_factor != 0)."""
    mscale = np.float32(attn_factor)
    if ext_factor != 0.0:
        mscale = np.float32(mscale * (1.0 + 0.1 * math.log(1.0 / freq_scale)))
    return mscale


def alibi_params(n_head: int, max_bias: float) -> tuple[np.float32, np.float32, int]:
    """ALiBi's m0, m1 and n_head_log2, from which ggml derives the per-head slopes: head h
    has m0^(h+1) below n_head_log2, m1^(2(h - n_head_log2) + 1) from there on."""
    n_head_log2 = 1 << int(math.floor(math.log2(n_head)))
    m0 = np.float32(2.0) ** np.float32(-max_bias / n_head_log2)
    m1 = np.float32(2.0) ** np.float32(-(max_bias / 2.0) / n_head_log2)
    return np.float32(m0), np.float32(m1), n_head_log2


def alibi_slopes(n_head: int, max_bias: float) -> np.ndarray:
    """ALiBi's per-head slope (1 for every head when max_bias is 0), as ggml computes it."""
    if max_bias <= 0.0:
        return np.ones(n_head, dtype=np.float32)
    m0, m1, n_head_log2 = alibi_params(n_head, max_bias)
    h = np.arange(n_head)
    slopes = np.where(h < n_head_log2, m0 ** (h + 1), m1 ** (2 * (h - n_head_log2) + 1))
    return slopes.astype(np.float32)
