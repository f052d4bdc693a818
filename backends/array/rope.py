"""ROPE: rotary position embedding with YaRN, normal and NeoX modes (ggml_rope_ext).

The angles follow ggml's float32 arithmetic step by step: theta for pair i is the running
product p * theta_scale^i (a cumulative product, as ggml's cache loop), divided by the optional
frequency factor, then mixed between interpolation and extrapolation by YaRN's ramp.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np

from polydev.ops import RopeMode
from polydev.tensor import Tensor

from .env import same_memory

SUPPORTED_MODES = (RopeMode.NORMAL, RopeMode.NEOX)


def _c_min(a: float, b: float) -> float:
    return a if a < b else b      # C's MIN macro, NaN behaviour included


def _c_max(a: float, b: float) -> float:
    return a if a > b else b


def yarn_corr_dims(n_dims: int, n_ctx_orig: int, freq_base: float, beta_fast: float,
                   beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the dimension range where YaRN ramps."""
    def corr_dim(n_rot: float) -> float:
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.float32(n_ctx_orig) / (np.float32(n_rot) * np.float32(2 * math.pi))
            return float(np.float32(n_dims) * np.log(np.float32(ratio))
                         / (np.float32(2) * np.log(np.float32(freq_base))))
    start = math.floor(corr_dim(beta_fast)) if math.isfinite(corr_dim(beta_fast)) else corr_dim(beta_fast)
    end = math.ceil(corr_dim(beta_slow)) if math.isfinite(corr_dim(beta_slow)) else corr_dim(beta_slow)
    return _c_max(0.0, start), _c_min(float(n_dims - 1), end)


def rope_cos_sin(xp, pos, n_dims: int, params: tuple, freq_factors=None):
    """cos and sin of every (token, pair) angle, shape (n_tokens, n_dims // 2), float32."""
    (_, _, _, _, n_ctx_orig, freq_base, freq_scale, ext_factor, attn_factor, beta_fast,
     beta_slow) = params[:11]
    n_pairs = n_dims // 2
    theta_scale = np.float32(freq_base) ** np.float32(-2.0 / n_dims)
    steps = xp.full((pos.shape[0], n_pairs), theta_scale, dtype=xp.float32)
    steps[:, 0] = pos.astype(xp.float32)
    theta_extrap = xp.cumprod(steps, axis=1, dtype=xp.float32)
    if freq_factors is not None:
        theta_extrap /= freq_factors[:n_pairs]
    theta = theta_extrap * xp.float32(freq_scale)
    mscale = np.float32(attn_factor)
    if ext_factor != 0.0:
        low, high = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
        y = (np.arange(n_pairs, dtype=np.float32) - np.float32(low)) \
            / np.float32(_c_max(0.001, high - low))
        ramp_mix = (1 - np.minimum(1, np.maximum(0, y))) * np.float32(ext_factor)
        ramp_mix = xp.asarray(ramp_mix.astype(np.float32))
        theta = theta * (1 - ramp_mix) + theta_extrap * ramp_mix
        mscale = np.float32(mscale * (1.0 + 0.1 * math.log(1.0 / freq_scale)))
    return xp.cos(theta) * mscale, xp.sin(theta) * mscale


def bind_rope(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    params = node.op_params
    n_dims, mode, n_offs = params[1], params[2], params[15]
    d, a = env.view(node), env.view(node.src[0])
    pos = env.view(node.src[1]).reshape(-1)
    ff_t = node.src[2] if len(node.src) > 2 else None
    freq_factors = env.view(ff_t).reshape(-1) if ff_t is not None else None
    half = n_dims // 2
    rot = slice(n_offs, n_offs + n_dims)
    if mode == RopeMode.NEOX:
        x0, x1 = a[..., n_offs:n_offs + half], a[..., n_offs + half:n_offs + n_dims]
        y0, y1 = d[..., n_offs:n_offs + half], d[..., n_offs + half:n_offs + n_dims]
    else:
        x0, x1 = a[..., rot][..., 0::2], a[..., rot][..., 1::2]
        y0, y1 = d[..., rot][..., 0::2], d[..., rot][..., 1::2]
    ne0 = a.shape[-1]
    # the channels outside the rotated range are copied unchanged
    passthrough = [s for s in (slice(0, n_offs), slice(n_offs + n_dims, ne0)) if s.stop > s.start]
    inplace = same_memory(node, node.src[0])

    def run() -> None:
        cos, sin = rope_cos_sin(xp, pos, n_dims, params, freq_factors)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]   # (1, tokens, 1, pairs)
        r0 = x0 * cos - x1 * sin
        r1 = x0 * sin + x1 * cos
        xp.copyto(y0, r0, casting="unsafe")
        xp.copyto(y1, r1, casting="unsafe")
        if not inplace:
            for s in passthrough:
                d[..., s] = a[..., s]
    return run
