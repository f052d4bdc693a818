"""ROPE: rotary position embedding with YaRN (ggml_rope_ext / ggml_rope_multi), in the normal,
NeoX, multi-section (M-RoPE, interleaved IMROPE) and vision modes.

The angles follow ggml's float32 arithmetic step by step: theta for pair i is the running
product p * theta_scale^i (a cumulative product, as ggml's cache loop), divided by the optional
frequency factor, then mixed between interpolation and extrapolation by YaRN's ramp. The
multi-section modes give each pair one of a token's 4 positions (time, height, width, extra);
the vision mode restarts the running product at each section.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from polydev.ops import (RopeMode, RopeParams, RopeSources, yarn_corr_dims, yarn_mscale,
                         yarn_ramp_width)
from polydev.tensor import Tensor

from .env import same_memory

SUPPORTED_MODES = (RopeMode.NORMAL, RopeMode.NEOX, RopeMode.MROPE, RopeMode.IMROPE,
                   RopeMode.VISION)


def _running_thetas(xp, pos, n_pairs: int, theta_scale):
    """p, p * s, p * s * s, ... for each position (float32 products in ggml's order)."""
    steps = xp.full(pos.shape + (n_pairs,), theta_scale, dtype=xp.float32)
    steps[..., 0] = pos.astype(xp.float32)
    return xp.cumprod(steps, axis=-1, dtype=xp.float32)


def section_plan(mode: int, sections, n_pairs: int) -> tuple[np.ndarray, np.ndarray]:
    """For each rotation pair: which of the 4 positions drives it, and how many steps of the
    running product it is from that position (ggml_mrope_cache_init)."""
    s0, s1, s2, _ = sections
    sector = np.arange(n_pairs) % sum(sections)
    if mode == RopeMode.IMROPE:                  # Qwen3-VL: t, h, w interleaved
        which = np.full(n_pairs, 3)
        which[(sector % 3 == 0) & (sector < 3 * s0)] = 0
        which[(sector % 3 == 2) & (sector < 3 * s2)] = 2
        which[(sector % 3 == 1) & (sector < 3 * s1)] = 1
    else:
        which = np.searchsorted(np.cumsum([s0, s1, s2]), sector, side="right")
    steps = np.arange(n_pairs)
    if mode == RopeMode.VISION:                  # each section restarts its running product
        starts = np.array([0, s0, s0 + s1, s0 + s1 + s2])
        steps = sector - starts[which]
    return which, steps


class RopeTables:
    """What the angles need besides the positions, made once when a ROPE is bound, in the
    array module's memory: a multi-section rope's stream and step per pair, YaRN's ramp. A
    bound call then uploads nothing (a CUDA graph replays a call's kernels, not its host
    work, so an upload from host memory at call time would replay stale)."""

    def __init__(self, xp, mode: int, n_dims: int, n_pairs: int, params: RopeParams) -> None:
        self.sections = None
        if mode & RopeMode.MROPE:
            which, steps = section_plan(mode, params.sections, n_pairs)
            self.sections = (xp.asarray(which), xp.asarray(steps))
        self.ramp_mix = None
        n_ctx_orig, freq_base, _, ext_factor, _, beta_fast, beta_slow = params.yarn
        if ext_factor != 0.0:
            low, high = yarn_corr_dims(n_dims, n_ctx_orig, freq_base, beta_fast, beta_slow)
            width = np.float32(yarn_ramp_width(low, high))
            y = (np.arange(n_pairs, dtype=np.float32) - np.float32(low)) / width
            ramp_mix = (1 - np.minimum(1, np.maximum(0, y))) * np.float32(ext_factor)
            self.ramp_mix = xp.asarray(ramp_mix.astype(np.float32))


def rope_thetas(xp, pos, n_dims: int, n_pairs: int, freq_base: float, tables: RopeTables):
    """The unscaled angle of every (token, pair): (n_tokens, n_pairs) float32."""
    theta_scale = np.float32(freq_base) ** np.float32(-2.0 / n_dims)
    if tables.sections is None:
        return _running_thetas(xp, pos, n_pairs, theta_scale)
    per_stream = _running_thetas(xp, pos.reshape(4, -1), n_pairs, theta_scale)  # (4, tokens, pairs)
    which, steps = tables.sections
    return per_stream[which, :, steps].T


def rope_cos_sin(xp, theta_extrap, params: RopeParams, tables: RopeTables, freq_factors=None):
    """cos and sin of every (token, pair) angle from the unscaled angles, float32."""
    _, _, freq_scale, ext_factor, attn_factor, _, _ = params.yarn
    n_pairs = theta_extrap.shape[-1]
    if freq_factors is not None:
        theta_extrap /= freq_factors[:n_pairs]
    theta = theta_extrap * xp.float32(freq_scale)
    mscale = yarn_mscale(attn_factor, freq_scale, ext_factor)
    if tables.ramp_mix is not None:
        theta = theta * (1 - tables.ramp_mix) + theta_extrap * tables.ramp_mix
    return xp.cos(theta) * mscale, xp.sin(theta) * mscale


def bind_rope(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    params = RopeParams.of(node)
    n_dims, mode, n_offs, sections = params.n_dims, params.mode, params.n_offs, params.sections
    _, pos_t, ff_t = RopeSources.of(node)
    d, a = env.view(node), env.view(node.src[0])
    pos = env.view(pos_t).reshape(-1)
    freq_factors = env.view(ff_t).reshape(-1) if ff_t is not None else None
    if mode == RopeMode.VISION:
        n_offs, n_pairs = 0, n_dims              # pairs (i, i + n_dims) over the whole row
        half = n_dims
    else:
        n_pairs = half = n_dims // 2
    rot = slice(n_offs, n_offs + 2 * half)
    if mode != RopeMode.NORMAL:
        x0, x1 = a[..., n_offs:n_offs + half], a[..., n_offs + half:rot.stop]
        y0, y1 = d[..., n_offs:n_offs + half], d[..., n_offs + half:rot.stop]
    else:
        x0, x1 = a[..., rot][..., 0::2], a[..., rot][..., 1::2]
        y0, y1 = d[..., rot][..., 0::2], d[..., rot][..., 1::2]
    ne0 = a.shape[-1]
    # the channels outside the rotated range are copied unchanged
    passthrough = [s for s in (slice(0, n_offs), slice(rot.stop, ne0)) if s.stop > s.start]
    inplace = same_memory(node, node.src[0])

    tables = RopeTables(xp, mode, n_dims, n_pairs, params)

    def angles():
        thetas = rope_thetas(xp, pos, n_dims, n_pairs, params.freq_base, tables)
        return rope_cos_sin(xp, thetas, params, tables, freq_factors)
    # every ROPE of a step with these parameters reads the same positions: they share one
    # computation of the angles where the backend can tell the inputs are unchanged
    key = ("rope", mode, n_dims, n_pairs, params.yarn, sections)
    inputs = (pos,) if freq_factors is None else (pos, freq_factors)

    def run() -> None:
        cos, sin = env.memo(key, inputs, angles)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]   # (1, tokens, 1, pairs)
        r0 = x0 * cos - x1 * sin
        r1 = x0 * sin + x1 * cos
        xp.copyto(y0, r0, casting="unsafe")
        xp.copyto(y1, r1, casting="unsafe")
        if not inplace:
            for s in passthrough:
                d[..., s] = a[..., s]
    return run
