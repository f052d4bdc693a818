"""Linear recurrences with a diagonal decay: SSM_SCAN (Mamba-1 and -2), RWKV_WKV6 and
GATED_LINEAR_ATTN, plus Mamba's SSM_CONV.

All three scans are one recurrence over a state S (K x V per sequence and head):

    S_t = diag(w_t) S_{t-1} + k_t v_t^T,    out_t = q_t S_t   (or q_t S_{t-1} for RWKV)

solved chunk by chunk (the chunkwise-parallel form of gated linear attention): inside a chunk
the cumulative log-decay b_t turns the recurrence into a masked attention-like product
(q_t . k_s weighted by exp(b_t - b_s)) plus the contribution of the chunk's incoming state;
the state then jumps to the chunk's end in one product. The Python loop is over chunks of up
to 64 tokens, each a few batched products over all sequences and heads.
"""

from __future__ import annotations

import math
from typing import Callable

from polydev.tensor import Tensor
from polydev.ops import GatedLinearAttnParams

from .conv import slide
from .movement import check_indices

# elements of the (chunk x chunk x decay-channels) weight tensor per chunk
CHUNK_BUDGET = 1 << 22


def _chunk_length(batch: int, n_tokens: int, decay_channels: int) -> int:
    fit = int(math.sqrt(CHUNK_BUDGET / max(1, batch * decay_channels)))
    return max(1, min(64, n_tokens, fit))


def chunked_scan(xp, q, k, v, log_w, state, inclusive: bool):
    """Run the recurrence. q, k: (..., T, K); v: (..., T, V); log_w: (..., T, K or 1), the log
    of the decay; state: (..., K, V) float32, updated in place. ``inclusive``: out_t reads
    S_t (SSM, GLA) rather than S_{t-1} (RWKV). Returns out (..., T, V) float32."""
    n_tokens = q.shape[-2]
    batch = math.prod(q.shape[:-2])
    size = _chunk_length(batch, n_tokens, log_w.shape[-1])
    out = xp.empty(q.shape[:-1] + (v.shape[-1],), dtype=xp.float32)
    for c0 in range(0, n_tokens, size):
        c1 = min(n_tokens, c0 + size)
        qc, kc, vc = q[..., c0:c1, :], k[..., c0:c1, :], v[..., c0:c1, :]
        lw = log_w[..., c0:c1, :].astype(xp.float64)
        b = xp.cumsum(lw, axis=-2)                       # decay from chunk start through t
        bq = b if inclusive else b - lw                  # ... through t, or through t - 1
        # the incoming state's share of each output
        out[..., c0:c1, :] = xp.matmul(qc * xp.exp(bq).astype(xp.float32), state)
        # tokens s of this chunk seen by token t: s <= t (inclusive) or s < t
        n = c1 - c0
        seen = xp.tril(xp.ones((n, n), dtype=bool), 0 if inclusive else -1)
        diff = bq[..., :, None, :] - b[..., None, :, :]              # (..., t, s, K or 1)
        weight = xp.exp(xp.where(seen[:, :, None], diff, -xp.inf)).astype(xp.float32)
        if weight.shape[-1] == 1:
            scores = xp.matmul(qc, xp.swapaxes(kc, -1, -2)) * weight[..., 0]
        else:
            scores = xp.einsum("...tk,...sk,...tsk->...ts", qc, kc, weight)
        out[..., c0:c1, :] += xp.matmul(scores, vc)
        # jump the state to the chunk's end
        tail = b[..., -1:, :]
        state *= xp.swapaxes(xp.exp(tail), -1, -2).astype(xp.float32)
        state += xp.matmul(xp.swapaxes(kc * xp.exp(tail - b).astype(xp.float32), -1, -2), vc)
    return out


def bind_ssm_conv(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    sx, c = env.view(node.src[0])[0], env.view(node.src[1])[0, 0]    # (n_s, d_inner, ncs)
    d = env.view(node)[0]                                             # (n_s, n_t, d_inner)
    n_t, d_conv = node.ne[1], c.shape[1]

    def run() -> None:
        windows = slide(xp, sx, 2, n_t, d_conv, 1, 1)               # (n_s, d_inner, n_t, k)
        acc = windows[..., 0] * c[None, :, 0, None]
        for j in range(1, d_conv):
            acc += windows[..., j] * c[None, :, j, None]
        xp.copyto(d, xp.swapaxes(acc, 1, 2))
    return run


def _softplus(xp, x):
    return xp.where(x > 20.0, x, xp.log1p(xp.exp(xp.minimum(x, 20.0))))


def bind_ssm_scan(env, node: Tensor) -> Callable[[], None]:
    xp = env.xp
    s_t, x_t, dt_t, a_t, b_t, c_t, ids_t = node.src[:7]
    states = env.view(s_t)                       # (n_state_slots, nh, nr, nc)
    x = env.view(x_t)                            # (ns, nt, nh, nr)
    dt = env.view(dt_t)[0]                       # (ns, nt, nh)
    a = env.view(a_t)[0, 0]                      # (nh, 1 or nc)
    bm, cm = env.view(b_t), env.view(c_t)        # (ns, nt, ng, nc)
    ids = env.view(ids_t).reshape(-1)
    ns, nt, nh, nr = x.shape
    nc = states.shape[-1]
    flat = env.view(node).reshape(-1)
    y = flat[:x.size].reshape(ns, nt, nh, nr)
    final = flat[x.size:].reshape(ns, nh, nr, nc)
    group_of_head = xp.arange(nh) // (nh // bm.shape[2])

    def run() -> None:
        check_indices(xp, ids, states.shape[0], "ssm_scan")
        dt_sp = _softplus(xp, dt)                                    # (ns, nt, nh)
        k, q = (xp.moveaxis(m[:, :, group_of_head], 1, 2) for m in (bm, cm))   # (ns, nh, nt, nc)
        v = xp.moveaxis(x * dt_sp[..., None], 1, 2)                  # (ns, nh, nt, nr)
        log_w = xp.moveaxis(dt_sp[..., None] * a[None, None], 1, 2)  # (ns, nh, nt, 1 or nc)
        state = xp.swapaxes(states[ids], -1, -2).astype(xp.float32)  # (ns, nh, nc, nr)
        out = chunked_scan(xp, q, k, v, log_w, state, inclusive=True)
        xp.copyto(y, xp.moveaxis(out, 2, 1))
        xp.copyto(final, xp.swapaxes(state, -1, -2))
    return run


def _bind_wkv(env, node: Tensor, inclusive: bool) -> Callable[[], None]:
    """RWKV_WKV6 (src k, v, r, tf, td, state) and GATED_LINEAR_ATTN (k, v, q, g, state)."""
    xp = env.xp
    rwkv = not inclusive
    k_t = node.src[0]
    size, heads, n_tokens = k_t.ne[0], k_t.ne[1], k_t.ne[2]
    state_t = node.src[5] if rwkv else node.src[4]
    n_seqs = state_t.ne[1]
    per_seq = n_tokens // n_seqs

    def heads_first(t: Tensor):                   # (n_tokens, H, S) -> (n_seqs, H, T, S)
        return xp.moveaxis(env.view(t).reshape(n_seqs, per_seq, heads, size), 1, 2)
    k, v, q, w = (heads_first(node.src[i]) for i in (0, 1, 2, 4 if rwkv else 3))
    bonus = env.view(node.src[3]).reshape(1, heads, 1, size) if rwkv else None
    scale = 1.0 if rwkv else GatedLinearAttnParams.of(node).scale
    state_in = env.view(state_t).reshape(n_seqs, heads, size, size)
    flat = env.view(node).reshape(-1)
    out = flat[:n_tokens * heads * size].reshape(n_seqs, per_seq, heads, size)
    state_out = flat[n_tokens * heads * size:].reshape(n_seqs, heads, size, size)

    def run() -> None:
        state = state_in.astype(xp.float32)       # a copy: the input state stays as it was
        with_scale = q * xp.float32(scale) if scale != 1.0 else q
        result = chunked_scan(xp, with_scale, k, v, xp.log(w), state, inclusive)
        if bonus is not None:                     # RWKV's time-first term for the current token
            result += (q * bonus * k).sum(axis=-1, keepdims=True) * v
        xp.copyto(out, xp.moveaxis(result, 2, 1))
        xp.copyto(state_out, state)
    return run


def bind_rwkv_wkv6(env, node: Tensor) -> Callable[[], None]:
    return _bind_wkv(env, node, inclusive=False)


def bind_gated_linear_attn(env, node: Tensor) -> Callable[[], None]:
    return _bind_wkv(env, node, inclusive=True)
