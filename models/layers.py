"""The blocks architectures share, as llama.cpp's ``llm_graph_context`` builds them: norms,
attention over the KV cache, the gated feed-forward, a mixture of experts, the output head.

Every function takes the ``StepGraph`` (its context, inputs, cache) and weights by name, and
only records ops; backends compute. ``Weights`` is a view of a model's weights for one
architecture: ``w.layer(il, "attn_q")`` is ``blk.{il}.attn_q.weight`` or None.
"""

from __future__ import annotations

import math

from polydev import Tensor, ops

from .kv_shift import KeyRope
from .loader import ModelWeights
from .step import StepGraph

__all__ = ["Weights", "named", "norm", "attention", "feed_forward", "moe", "output_head", "embed",
           "select_outputs", "pre_norm_decoder"]


class Weights:
    """Name lookups over a model's loaded weights."""

    def __init__(self, weights: ModelWeights) -> None:
        self._weights = weights

    def get(self, name: str) -> Tensor | None:
        return self._weights.get(f"{name}.weight")

    def __getitem__(self, name: str) -> Tensor:
        return self._weights[f"{name}.weight"]

    def layer(self, il: int, name: str, suffix: str = "weight") -> Tensor | None:
        return self._weights.get(f"blk.{il}.{name}.{suffix}")


def named(t: Tensor, name: str, il: int | None = None) -> Tensor:
    """Name a node as llama.cpp's graph callback does ("attn_out-3"): traces, debug output
    and ``polydev compare --model`` print these names."""
    t.name = name if il is None else f"{name}-{il}"
    return t


def norm(s: StepGraph, x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    """RMS norm of each row, times ``weight`` (llama.cpp's LLM_NORM_RMS)."""
    y = ops.rms_norm(s.ctx, x, eps)
    return y if weight is None else ops.mul(s.ctx, y, weight)


def embed(s: StepGraph, token_embd: Tensor, scale: float = 1.0) -> Tensor:
    """The rows of the token embedding for the step's tokens, [n_embd, n_tokens]."""
    x = ops.get_rows(s.ctx, token_embd, s.tokens)
    return named(ops.scale(s.ctx, x, scale) if scale != 1.0 else x, "inp_embd")


def select_outputs(s: StepGraph, *xs: Tensor) -> tuple[Tensor, ...]:
    """Keep only the rows whose logits are wanted (before the last layer, as llama.cpp)."""
    if s.out_ids is None:
        return xs
    return tuple(ops.get_rows(s.ctx, x, s.out_ids) for x in xs)


def _project(s: StepGraph, w: Weights, il: int, name: str, x: Tensor) -> Tensor:
    y = ops.mul_mat(s.ctx, w.layer(il, name), x)
    bias = w.layer(il, name, "bias")
    return y if bias is None else ops.add(s.ctx, y, bias)


def attention(s: StepGraph, w: Weights, il: int, x: Tensor, *, rope_mode: int,
              freq_base: float, qk_norm: bool = False, q_scale: float | None = None,
              rope_freqs: Tensor | None = None) -> Tensor:
    """Self-attention of layer ``il`` over the cache: q/k/v projections (with biases when the
    model has them), optional per-head q/k RMS norm, RoPE, the cache write, flash attention
    with the layer's mask, and the output projection."""
    hp, ctx = s.hp, s.ctx
    n_tokens = x.ne[1]
    head_k, head_v = hp.n_embd_head_k, hp.n_embd_head_v
    n_head, n_head_kv = hp.n_head, hp.n_head_kv[il]
    q = ctx.reshape(_project(s, w, il, "attn_q", x), head_k, n_head, n_tokens)
    k = ctx.reshape(_project(s, w, il, "attn_k", x), head_k, n_head_kv, n_tokens)
    v = ctx.reshape(_project(s, w, il, "attn_v", x), head_v, n_head_kv, n_tokens)
    if qk_norm:
        q = norm(s, q, w.layer(il, "attn_q_norm"), hp.rms_eps)
        k = norm(s, k, w.layer(il, "attn_k_norm"), hp.rms_eps)
    rope = dict(n_dims=hp.head_dim_rot, mode=rope_mode, n_ctx_orig=hp.n_ctx_orig,
                freq_base=freq_base, freq_scale=hp.rope_freq_scale)
    q = named(ops.rope_ext(ctx, q, s.positions, rope_freqs, **rope), "Qcur", il)
    k = named(ops.rope_ext(ctx, k, s.positions, rope_freqs, **rope), "Kcur", il)
    s.key_rope[il] = KeyRope(rope_freqs, rope)      # what a K-shift turns the cached keys by
    scale = 1.0 / math.sqrt(head_k) if q_scale is None else q_scale
    k_all, v_all = s.kv.store_and_view(ctx, il, k, v, s.cells, s.shape.n_kv)
    q = ctx.permute(q, 0, 2, 1, 3)                           # [head_k, n_tokens, n_head]
    out = ops.flash_attn_ext(ctx, q, k_all, v_all, s.mask_for(il), scale, 0.0,
                             hp.attn_logit_softcap)          # [head_v, n_head, n_tokens]
    named(out, "kqv_out", il)
    out = ctx.reshape(out, head_v * n_head, n_tokens)
    return named(_project(s, w, il, "attn_output", out), "attn_out", il)


def feed_forward(s: StepGraph, w: Weights, il: int, x: Tensor, act: str = "silu") -> Tensor:
    """down(act(gate(x)) * up(x)): SwiGLU (``"silu"``) or GEGLU with tanh GELU (``"gelu"``)."""
    ctx = s.ctx
    gate = _project(s, w, il, "ffn_gate", x)
    up = _project(s, w, il, "ffn_up", x)
    h = ops.swiglu(ctx, gate, up) if act == "silu" else ops.geglu(ctx, gate, up)
    return named(_project(s, w, il, "ffn_down", named(h, "ffn_act", il)), "ffn_out", il)


def moe(s: StepGraph, w: Weights, il: int, x: Tensor) -> Tensor:
    """A mixture of experts (qwen3moe): router softmax, the top ``n_expert_used`` experts per
    token, their weights renormalised when the model says so, MUL_MAT_ID for gate/up/down,
    and the weighted experts summed."""
    hp, ctx = s.hp, s.ctx
    n_tokens, n_used = x.ne[1], hp.n_expert_used
    logits = ops.mul_mat(ctx, w.layer(il, "ffn_gate_inp"), x)      # [n_expert, n_tokens]
    probs = ops.soft_max(ctx, logits)
    selected = ops.top_k(ctx, probs, n_used)                          # [n_used, n_tokens] i32
    weights = ops.get_rows(ctx, ctx.reshape(probs, 1, hp.n_expert, n_tokens), selected)
    if hp.expert_weights_norm:
        weights = ctx.reshape(weights, n_used, n_tokens)
        total = ops.clamp(ctx, ops.sum_rows(ctx, weights), 6.103515625e-5, math.inf)
        weights = ops.div(ctx, weights, total)
        weights = ctx.reshape(weights, 1, n_used, n_tokens)
    xs = ctx.reshape(x, x.ne[0], 1, n_tokens)
    gate = ops.mul_mat_id(ctx, w.layer(il, "ffn_gate_exps"), xs, selected)
    up = ops.mul_mat_id(ctx, w.layer(il, "ffn_up_exps"), xs, selected)
    h = ops.swiglu(ctx, gate, up)                                     # [n_ff, n_used, n_tokens]
    experts = ops.mul_mat_id(ctx, w.layer(il, "ffn_down_exps"), h, selected)
    experts = ops.mul(ctx, experts, weights)                          # [n_embd, n_used, n_tok]
    out = ctx.view_2d(experts, experts.ne[0], n_tokens, experts.nb[2], 0)
    for i in range(1, n_used):
        out = ops.add(ctx, out, ctx.view_2d(experts, experts.ne[0], n_tokens, experts.nb[2],
                                            i * experts.nb[1]))
    return named(out, "ffn_moe_out", il)


def output_head(s: StepGraph, w: Weights, x: Tensor, softcap: float = 0.0) -> Tensor:
    """Final norm and the output matrix; optional final logit softcapping (gemma)."""
    x = named(norm(s, x, w["output_norm"], s.hp.rms_eps), "result_norm")
    logits = named(ops.mul_mat(s.ctx, w["output"], x), "result_output")
    if softcap > 0:
        logits = ops.scale(s.ctx, ops.tanh(s.ctx, ops.scale(s.ctx, logits, 1.0 / softcap)),
                           softcap)
    return logits



def pre_norm_decoder(s: StepGraph, w: Weights, *, rope_mode: int, qk_norm: bool = False,
                     rope_freqs: Tensor | None = None, use_moe: bool = False) -> Tensor:
    """The llama-family stack (llama, qwen2, qwen3, qwen3moe): per layer, x += attention(
    norm(x)) and x += ffn(norm(x)), the ffn a SwiGLU or a mixture of experts; then the head.
    Biases come with the weights (qwen2's q/k/v) and need no flag."""
    hp = s.hp
    x = embed(s, w["token_embd"])
    for il in range(hp.n_layer):
        h = norm(s, x, w.layer(il, "attn_norm"), hp.rms_eps)
        h = attention(s, w, il, h, rope_mode=rope_mode, freq_base=hp.rope_freq_base,
                      qk_norm=qk_norm, rope_freqs=rope_freqs)
        if il == hp.n_layer - 1:
            h, x = select_outputs(s, h, x)
        x = ops.add(s.ctx, h, x)
        h = norm(s, x, w.layer(il, "ffn_norm"), hp.rms_eps)
        h = moe(s, w, il, h) if use_moe else feed_forward(s, w, il, h, "silu")
        x = named(ops.add(s.ctx, h, x), "l_out", il)
    return output_head(s, w, x)
