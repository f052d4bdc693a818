"""SSM_CONV, SSM_SCAN, RWKV_WKV6 and GATED_LINEAR_ATTN on every device against float64
references that run the recurrences token by token, as their definitions read."""

from __future__ import annotations

import numpy as np
import pytest

from polydev import ops
from polydev.errors import OutOfBoundsError, ShapeError

from conftest import assert_close, compute
from test_ops import f32


def test_ssm_conv(backend, rng):
    n_s, d_inner, d_conv, n_t = 2, 6, 4, 5
    sx, c = f32(rng, (1, n_s, d_inner, d_conv - 1 + n_t)), f32(rng, (1, 1, d_inner, d_conv))
    out = compute(backend, lambda ctx, a, b: ops.ssm_conv(ctx, a, b), sx, c)
    ref = np.empty((n_s, n_t, d_inner))
    for t in range(n_t):
        ref[:, t] = (sx[0, :, :, t:t + d_conv].astype(np.float64) * c[0, 0]).sum(-1)
    assert_close(out[0], ref)


def _softplus(x):
    return np.where(x > 20, x, np.log1p(np.exp(np.minimum(x, 20))))


def _ssm_scan_ref(s, x, dt, a, b, c, ids):
    """s (slots, nh, nr, nc), x (ns, nt, nh, nr), dt (ns, nt, nh), a (nh, 1|nc),
    b/c (ns, nt, ng, nc)."""
    ns, nt, nh, nr = x.shape
    groups = np.arange(nh) // (nh // b.shape[2])
    y = np.empty_like(x)
    state = s[ids].copy()
    for t in range(nt):
        dsp = _softplus(dt[:, t])                                   # (ns, nh)
        decay = np.exp(dsp[..., None] * a[None])                    # (ns, nh, 1|nc)
        bt, ct = b[:, t][:, groups], c[:, t][:, groups]             # (ns, nh, nc)
        state = (state * decay[:, :, None, :]
            + bt[:, :, None, :] * (x[:, t] * dsp[..., None])[..., None])
        y[:, t] = (state * ct[:, :, None, :]).sum(-1)
    return y, state


@pytest.mark.parametrize("mamba", [1, 2])
@pytest.mark.parametrize("nt", [1, 7, 100])
def test_ssm_scan(backend, rng, mamba, nt):
    ns, nh, nr, nc, ng = 2, 4, 3, 8, 2 if mamba == 2 else 4
    s = f32(rng, (3, nh, nr, nc))
    x, dt = f32(rng, (ns, nt, nh, nr)), f32(rng, (1, ns, nt, nh), -3, 1)
    a = -rng.uniform(0.5, 2, size=(1, 1, nh, 1 if mamba == 2 else nc)).astype(np.float32)
    b, c = f32(rng, (ns, nt, ng, nc)), f32(rng, (ns, nt, ng, nc))
    ids = np.array([2, 0], np.int32)
    out = compute(backend, lambda ctx, *t: ops.ssm_scan(ctx, *t), s, x, dt, a, b, c, ids)
    y, state = _ssm_scan_ref(*(v.astype(np.float64) for v in (s, x, dt[0], a[0, 0], b, c)), ids)
    assert_close(out.reshape(-1), np.concatenate([y.reshape(-1), state.reshape(-1)]))
    with pytest.raises(OutOfBoundsError):
        compute(backend, lambda ctx, *t: ops.ssm_scan(ctx, *t), s, x, dt, a, b, c, ids + 2)


def _wkv_ref(k, v, r, w, state, bonus=None, scale=1.0):
    """Token by token: k, v, r, w (n_seqs, T, H, S); state (n_seqs, H, S, S)."""
    out = np.empty_like(v)
    state = state.copy()
    for t in range(k.shape[1]):
        kv = k[:, t, :, :, None] * v[:, t, :, None, :]                       # (ns, H, S, S)
        if bonus is not None:                                                  # RWKV-6
            out[:, t] = np.einsum("nhi,nhij->nhj", r[:, t], state + bonus[None, :, :, None] * kv)
            state = state * w[:, t, :, :, None] + kv
        else:                                                                  # GLA
            state = state * w[:, t, :, :, None] + kv
            out[:, t] = np.einsum("nhi,nhij->nhj", r[:, t] * scale, state)
    return out, state


@pytest.mark.parametrize("op", ["rwkv_wkv6", "gated_linear_attn"])
@pytest.mark.parametrize("n_seqs,per_seq", [(1, 1), (2, 9), (1, 150)])
def test_wkv(backend, rng, op, n_seqs, per_seq):
    size, heads = 8, 3
    n_tokens = n_seqs * per_seq
    k, v, r = (f32(rng, (1, n_tokens, heads, size)) for _ in range(3))
    w = rng.uniform(0.3, 1.0, size=(1, n_tokens, heads, size)).astype(np.float32)
    state = f32(rng, (1, 1, n_seqs, heads * size * size))
    tf = f32(rng, (1, 1, heads, size))
    if op == "rwkv_wkv6":
        out = compute(backend, lambda ctx, *t: ops.rwkv_wkv6(ctx, *t), k, v, r, tf, w, state)
    else:
        out = compute(backend, lambda ctx, *t: ops.gated_linear_attn(ctx, *t, 0.7),
                      k, v, r, w, state)
    split = lambda a: a.reshape(n_seqs, per_seq, heads, size).astype(np.float64)   # noqa: E731
    ref_out, ref_state = _wkv_ref(split(k), split(v), split(r), split(w),
                                  state.reshape(n_seqs, heads, size, size).astype(np.float64),
                                  tf.reshape(heads, size) if op == "rwkv_wkv6" else None, 0.7)
    assert_close(out.reshape(-1), np.concatenate([ref_out.reshape(-1), ref_state.reshape(-1)]))


def test_wkv_validates(rng):
    from polydev import Context, GGMLType
    ctx = Context()
    k = ctx.new_tensor(GGMLType.F32, (8, 2, 5))
    state = ctx.new_tensor(GGMLType.F32, (8 * 8 * 2, 2))        # 5 tokens over 2 sequences
    with pytest.raises(ShapeError):
        ops.gated_linear_attn(ctx, k, k, k, k, state, 1.0)
