"""The blocks architectures share, as llama.cpp's ``llm_graph_context`` builds them: norms,
attention over the KV cache, the gated feed-forward, a mixture of experts, the output head.

Every function takes the ``StepGraph`` (its context, inputs, cache) and weights by name, and
only records ops; backends compute. ``Weights`` is a view of a model's weights for one
architecture: ``w.layer(il, "attn_q")`` is ``blk.{il}.attn_q.weight`` or None.
"""

from __future__ import annotations

import math
from typing import Callable

from polydev import RopeMode, Tensor, ops

from .arch import Architecture
from .hparams import HParams
from .kv_shift import KeyRope
from .loader import ModelWeights
from .step import StepGraph

__all__ = ["Weights", "named", "norm", "qkv", "rope_params", "attention", "feed_forward", "moe",
           "shared_expert", "output_head", "embed", "select_outputs", "residual",
           "pre_norm_decoder", "sandwich_decoder"]


class Weights:
    """Name lookups over a model's loaded weights, by the short names of its architecture's
    table (``"attn_q"``, ``"attn_q.bias"``, ``"output"``). The file was checked against the
    table when it was placed, so a required weight is always there and an optional one is
    None when the file lacks it; a name the table does not list is a KeyError (a builder
    reading a weight its architecture never declared)."""

    def __init__(self, weights: ModelWeights, arch: Architecture) -> None:
        self._weights = weights
        self.arch = arch
        self._known = {spec.short for spec in arch.tensors} | {"output"}

    def _lookup(self, short: str, name: str) -> Tensor | None:
        if short not in self._known:
            raise KeyError(f"{self.arch.name}'s table has no tensor {short!r}")
        return self._weights.get(name)

    def get(self, name: str, suffix: str = "weight") -> Tensor | None:
        """A file-wide weight (``"rope_freqs"``), or None."""
        short = name if suffix == "weight" else f"{name}.{suffix}"
        return self._lookup(short, f"{name}.{suffix}")

    def declares(self, short: str) -> bool:
        """Whether the architecture's table lists ``short`` at all."""
        return short in self._known

    def __getitem__(self, name: str) -> Tensor:
        """A file-wide weight the table requires (``"token_embd"``, ``"output"``)."""
        return self._weights[f"{name}.weight"]

    def layer(self, il: int, name: str, suffix: str = "weight") -> Tensor | None:
        """Layer ``il``'s ``name`` (its ``suffix`` tensor), or None where it is optional and
        absent."""
        short = name if suffix == "weight" else f"{name}.{suffix}"
        return self._lookup(short, f"blk.{il}.{name}.{suffix}")

    def bias(self, il: int, name: str) -> Tensor | None:
        """Layer ``il``'s bias of ``name`` where the table declares one and the file has it."""
        return self.layer(il, name, "bias") if self.declares(f"{name}.bias") else None

    def has(self, name: str, il: int = 0) -> bool:
        """Whether the file holds layer ``il``'s ``name`` (an optional or fused weight)."""
        return self.layer(il, name) is not None


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
    return _with_bias(s, w, il, name, ops.mul_mat(s.ctx, w.layer(il, name), x))


def _with_bias(s: StepGraph, w: Weights, il: int, name: str, y: Tensor) -> Tensor:
    bias = w.bias(il, name)
    return y if bias is None else ops.add(s.ctx, y, bias)


def _projections(s: StepGraph, w: Weights, il: int, names: tuple[str, ...],
                 x: Tensor) -> tuple[Tensor, ...]:
    """Layer ``il``'s projections ``names`` of one activation ``x``: the products next to each
    other in the graph (``StepGraph.together``), then their biases."""
    products = [ops.mul_mat(s.ctx, w.layer(il, name), x) for name in names]
    s.together(*products)
    return tuple(_with_bias(s, w, il, name, y) for name, y in zip(names, products))


def qkv(s: StepGraph, w: Weights, il: int, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Layer ``il``'s q, k and v, [width, n_tokens] each: three projections, or one fused
    ``attn_qkv`` (phi3) split into contiguous parts (llama.cpp's ``build_qkv``)."""
    hp, ctx = s.hp, s.ctx
    if not w.has("attn_qkv", il):
        return _projections(s, w, il, ("attn_q", "attn_k", "attn_v"), x)
    fused = _project(s, w, il, "attn_qkv", x)
    widths = (hp.n_embd_head_k * hp.n_head, hp.n_embd_k_gqa(il), hp.n_embd_v_gqa(il))
    offsets = (0, widths[0], widths[0] + widths[1])
    return tuple(ops.cont(ctx, ctx.view_2d(fused, n, x.ne[1], fused.nb[1],
                                           fused.traits.row_size(offset)))
                 for n, offset in zip(widths, offsets))


def rope_params(hp: HParams, mode: int, freq_base: float, n_dims: int,
                scaled: bool = True) -> dict:
    """``ops.rope_ext``'s keyword arguments for this model: its base, dimensions and YaRN
    betas, and (``scaled``) its frequency scale, YaRN mix and magnitude factor."""
    rope = dict(n_dims=n_dims, mode=mode, n_ctx_orig=hp.n_ctx_orig, freq_base=freq_base,
                beta_fast=hp.yarn_beta_fast, beta_slow=hp.yarn_beta_slow)
    if scaled:
        rope.update(freq_scale=hp.rope_freq_scale, ext_factor=hp.rope_ext_factor,
                    attn_factor=hp.rope_attn_factor)
    return rope


def attention(s: StepGraph, w: Weights, il: int, x: Tensor, *, rope_mode: int,
              freq_base: float, rope_scaling: bool = True, qk_norm: str = "",
              q_scale: float | None = None, rope_freqs: Tensor | None = None,
              use_rope: bool = True, sinks: Tensor | None = None,
              q_factor: Tensor | None = None) -> Tensor:
    """Self-attention of layer ``il`` over the cache: q/k/v projections (with biases when the
    model has them), an optional q/k RMS norm (``qk_norm``: "head" per head, "whole" over
    the whole projection as olmo2), RoPE (unless ``use_rope`` is False: smollm3's NoPE
    layers; ``rope_scaling`` False leaves out the model's RoPE scaling, as olmo2's
    sliding-window layers), the cache write, flash attention with the layer's mask,
    ``q_scale`` (default 1/sqrt(head size)), a per-token ``q_factor`` after RoPE (mistral3's
    temperature tuning) and attention ``sinks`` (gpt-oss), and the output projection."""
    hp, ctx = s.hp, s.ctx
    n_tokens = x.ne[1]
    head_k, head_v = hp.n_embd_head_k, hp.n_embd_head_v
    n_head, n_head_kv = hp.n_head, hp.n_head_kv[il]
    q, k, v = qkv(s, w, il, x)
    if qk_norm == "whole":
        q = norm(s, q, w.layer(il, "attn_q_norm"), hp.rms_eps)
        k = norm(s, k, w.layer(il, "attn_k_norm"), hp.rms_eps)
    q = ctx.reshape(q, head_k, n_head, n_tokens)
    k = ctx.reshape(k, head_k, n_head_kv, n_tokens)
    v = ctx.reshape(v, head_v, n_head_kv, n_tokens)
    if qk_norm == "head":
        q = norm(s, q, w.layer(il, "attn_q_norm"), hp.rms_eps)
        k = norm(s, k, w.layer(il, "attn_k_norm"), hp.rms_eps)
    if use_rope:
        rope = rope_params(hp, rope_mode, freq_base, hp.head_dim_rot, rope_scaling)
        q = ops.rope_ext(ctx, q, s.positions, rope_freqs, **rope)
        k = ops.rope_ext(ctx, k, s.positions, rope_freqs, **rope)
        s.key_rope[il] = KeyRope(rope_freqs, rope)  # what a K-shift turns the cached keys by
    if q_factor is not None:
        q = ops.mul(ctx, q, q_factor)
    named(q, "Qcur", il)
    named(k, "Kcur", il)
    scale = 1.0 / math.sqrt(head_k) if q_scale is None else q_scale
    k_all, v_all = s.kv.store_and_view(ctx, il, k, v, s.cells, s.shape.n_kv)
    q = ctx.permute(q, 0, 2, 1, 3)                           # [head_k, n_tokens, n_head]
    out = ops.flash_attn_ext(ctx, q, k_all, v_all, s.mask_for(il), scale, 0.0,
                             hp.attn_logit_softcap)          # [head_v, n_head, n_tokens]
    ops.flash_attn_ext_add_sinks(out, sinks)
    named(out, "kqv_out", il)
    out = ctx.reshape(out, head_v * n_head, n_tokens)
    return named(_project(s, w, il, "attn_output", out), "attn_out", il)


def feed_forward(s: StepGraph, w: Weights, il: int, x: Tensor, act: str = "silu") -> Tensor:
    """down(act(gate(x)) * up(x)): SwiGLU (``"silu"``) or GEGLU with tanh GELU (``"gelu"``).
    A model without ``ffn_gate`` (phi3) has gate and up fused in ``ffn_up``, gate first."""
    ctx = s.ctx
    glu = ops.swiglu if act == "silu" else ops.geglu
    if w.declares("ffn_gate"):
        h = glu(ctx, *_projections(s, w, il, ("ffn_gate", "ffn_up"), x))
    else:
        h = glu(ctx, _project(s, w, il, "ffn_up", x))
    return named(_project(s, w, il, "ffn_down", named(h, "ffn_act", il)), "ffn_out", il)


def moe(s: StepGraph, w: Weights, il: int, x: Tensor, *, gating: str = "softmax",
        act: str = "silu") -> Tensor:
    """A mixture of experts (llama.cpp's ``build_moe_ffn``): the router (and its bias), the top
    ``n_expert_used`` experts per token by softmax probability (``gating`` "softmax"), by
    sigmoid ("sigmoid") or by raw logit with a softmax over the chosen ones
    ("softmax_weight", gpt-oss); a selection bias and the best expert groups first where the
    model has them (deepseek2); the chosen weights renormalised and scaled when the model
    says so; MUL_MAT_ID for gate/up/down with the experts' biases where the model has them,
    SwiGLU (``act`` "silu") or gpt-oss's clamped SwiGLU ("swiglu_oai"), and the weighted
    experts summed; plus the shared expert where the architecture has one."""
    hp, ctx = s.hp, s.ctx
    n_tokens, n_used = x.ne[1], hp.n_expert_used
    logits = _project(s, w, il, "ffn_gate_inp", x)                   # [n_expert, n_tokens]
    probs = (ops.soft_max(ctx, logits) if gating == "softmax" else
             ops.sigmoid(ctx, logits) if gating == "sigmoid" else logits)
    selection = probs
    if w.declares("exp_probs_b.bias") and w.bias(il, "exp_probs_b") is not None:
        selection = ops.add(ctx, probs, w.bias(il, "exp_probs_b"))
    if hp.n_expert_groups > 1:
        selection = _best_groups(s, selection)
    selected = ops.top_k(ctx, selection, n_used)                      # [n_used, n_tokens] i32
    weights = ops.get_rows(ctx, ctx.reshape(probs, 1, hp.n_expert, n_tokens), selected)
    if gating == "softmax_weight":
        weights = ops.soft_max(ctx, ctx.reshape(weights, n_used, n_tokens))
        weights = ctx.reshape(weights, 1, n_used, n_tokens)
    if hp.expert_weights_norm:
        weights = ctx.reshape(weights, n_used, n_tokens)
        total = ops.clamp(ctx, ops.sum_rows(ctx, weights), 6.103515625e-5, math.inf)
        weights = ops.div(ctx, weights, total)
        weights = ctx.reshape(weights, 1, n_used, n_tokens)
    if hp.expert_weights_scale not in (0.0, 1.0):
        weights = ops.scale(ctx, weights, hp.expert_weights_scale)
    xs = ctx.reshape(x, x.ne[0], 1, n_tokens)
    gate = _project_experts(s, w, il, "ffn_gate_exps", xs, selected)
    up = _project_experts(s, w, il, "ffn_up_exps", xs, selected)
    h = (ops.swiglu(ctx, gate, up) if act == "silu"               # [n_ff, n_used, n_tokens]
         else ops.swiglu_oai(ctx, gate, up, alpha=1.702, limit=7.0))
    experts = _project_experts(s, w, il, "ffn_down_exps", h, selected)
    experts = ops.mul(ctx, experts, weights)                          # [n_embd, n_used, n_tok]
    out = ctx.view_2d(experts, experts.ne[0], n_tokens, experts.nb[2], 0)
    for i in range(1, n_used):
        out = ops.add(ctx, out, ctx.view_2d(experts, experts.ne[0], n_tokens, experts.nb[2],
                                            i * experts.nb[1]))
    named(out, "ffn_moe_out", il)
    if w.declares("ffn_up_shexp"):
        out = ops.add(ctx, out, shared_expert(s, w, il, x))
    return out


def _best_groups(s: StepGraph, selection: Tensor) -> Tensor:
    """Grouped routing (DeepSeek): the experts in ``n_expert_groups`` groups, each scored by
    its two best; the ``n_group_used`` best groups keep their scores, the others get -inf."""
    hp, ctx = s.hp, s.ctx
    n_tokens, n_groups = selection.ne[1], hp.n_expert_groups
    per = hp.n_expert // n_groups
    groups = ctx.reshape(selection, per, n_groups, n_tokens)
    best2 = ops.get_rows(ctx, ctx.reshape(groups, 1, per, n_groups, n_tokens),
                         ops.top_k(ctx, groups, 2))                    # [1, 2, groups, tokens]
    scores = ops.sum_rows(ctx, ctx.reshape(best2, 2, n_groups, n_tokens))
    kept = ops.top_k(ctx, ctx.reshape(scores, n_groups, n_tokens), hp.n_group_used)
    masked = ops.set_rows(ctx, ops.fill(ctx, groups, -math.inf),
                          ops.get_rows(ctx, groups, kept), kept)
    return ctx.reshape(masked, hp.n_expert, n_tokens)


def _project_experts(s: StepGraph, w: Weights, il: int, name: str, x: Tensor,
                     selected: Tensor) -> Tensor:
    """MUL_MAT_ID by the chosen experts, plus each chosen expert's bias where the model has
    them (ggml's ADD_ID, here as GET_ROWS of the bias rows and an ADD)."""
    ctx = s.ctx
    y = ops.mul_mat_id(ctx, w.layer(il, name), x, selected)          # [n, n_used, n_tokens]
    bias = w.bias(il, name)
    if bias is None:
        return y
    rows = ops.get_rows(ctx, bias, ctx.reshape(selected, selected.ne[0] * selected.ne[1]))
    return ops.add(ctx, y, ctx.reshape(rows, *y.ne[:3]))


def shared_expert(s: StepGraph, w: Weights, il: int, x: Tensor) -> Tensor:
    """The feed-forward every token takes beside its experts, times its sigmoid gate where
    the model has one (qwen2moe's ``ffn_gate_inp_shexp``)."""
    ctx = s.ctx
    gate = ops.mul_mat(ctx, w.layer(il, "ffn_gate_shexp"), x)
    up = ops.mul_mat(ctx, w.layer(il, "ffn_up_shexp"), x)
    out = ops.mul_mat(ctx, w.layer(il, "ffn_down_shexp"), ops.swiglu(ctx, gate, up))
    if w.declares("ffn_gate_inp_shexp"):
        router = ops.mul_mat(ctx, w.layer(il, "ffn_gate_inp_shexp"), x)    # [1, n_tokens]
        out = ops.mul(ctx, out, ops.sigmoid(ctx, router))
    return named(out, "ffn_shexp_out", il)


def output_head(s: StepGraph, w: Weights, x: Tensor, softcap: float = 0.0) -> Tensor:
    """Final norm, the output matrix and its bias where the model has one; granite's logit
    scale (logits / logit_scale) and optional final logit softcapping (gemma). A step of
    embeddings (``s.shape.embeddings``) ends at the norm, as llama.cpp's ``t_embd``."""
    ctx = s.ctx
    x = named(norm(s, x, w["output_norm"], s.hp.rms_eps), "result_norm")
    if s.shape.embeddings:
        return x
    logits = ops.mul_mat(ctx, w["output"], x)
    bias = w.get("output", "bias") if w.declares("output.bias") else None
    if bias is not None:
        logits = ops.add(ctx, logits, bias)
    if s.hp.logit_scale:
        logits = ops.scale(ctx, logits, 1.0 / s.hp.logit_scale)
    if softcap > 0:
        logits = ops.scale(ctx, ops.tanh(ctx, ops.scale(ctx, logits, 1.0 / softcap)), softcap)
    return named(logits, "result_output")



def residual(s: StepGraph, h: Tensor) -> Tensor:
    """A block's output before it joins the residual stream: times granite's
    ``residual_scale`` where the model has one."""
    return ops.scale(s.ctx, h, s.hp.residual_scale) if s.hp.residual_scale else h


def sandwich_decoder(s: StepGraph, w: Weights, *, q_scale: float, qk_norm: str = "") -> Tensor:
    """Gemma's stack (gemma2, gemma3): embeddings scaled by sqrt(n_embd); per layer, NeoX
    attention on the layer's RoPE base (sliding-window layers have their own) and a GEGLU
    feed-forward, each between a norm before and a norm after, inside the residual branch;
    then the head with the final logit soft-cap."""
    hp = s.hp
    x = embed(s, w["token_embd"], math.sqrt(hp.n_embd))
    for il in range(hp.n_layer):
        base = hp.rope_freq_base_swa if hp.is_swa(il) else hp.rope_freq_base
        h = norm(s, x, w.layer(il, "attn_norm"), hp.rms_eps)
        h = attention(s, w, il, h, rope_mode=RopeMode.NEOX, freq_base=base, qk_norm=qk_norm,
                      q_scale=q_scale)
        h = norm(s, h, w.layer(il, "post_attention_norm"), hp.rms_eps)
        if il == hp.n_layer - 1:
            h, x = select_outputs(s, h, x)
        x = ops.add(s.ctx, h, x)
        h = norm(s, x, w.layer(il, "ffn_norm"), hp.rms_eps)
        h = feed_forward(s, w, il, h, "gelu")
        h = norm(s, h, w.layer(il, "post_ffw_norm"), hp.rms_eps)
        x = named(ops.add(s.ctx, h, x), "l_out", il)
    return output_head(s, w, x, hp.final_logit_softcap)


def pre_norm_decoder(s: StepGraph, w: Weights, *, rope_mode: int, qk_norm: bool = False,
                     rope_freqs: Tensor | None = None, use_moe: bool = False,
                     use_rope: Callable[[int], bool] = lambda il: True,
                     q_scale: float | None = None, q_factor: Tensor | None = None) -> Tensor:
    """The llama-family stack (llama, qwen2, qwen3, qwen3moe, smollm3, granite, mistral3,
    qwen2moe): per layer, x += attention(norm(x)) and x += ffn(norm(x)), the ffn a SwiGLU or
    a mixture of experts; then the head. Biases come with the weights (qwen2's q/k/v) and
    need no flag; granite's embedding, residual and logit multipliers come with the
    hyperparameters (0 where a model has none)."""
    hp = s.hp
    x = embed(s, w["token_embd"], hp.embedding_scale or 1.0)
    for il in range(hp.n_layer):
        h = norm(s, x, w.layer(il, "attn_norm"), hp.rms_eps)
        h = attention(s, w, il, h, rope_mode=rope_mode, freq_base=hp.rope_freq_base,
                      qk_norm="head" if qk_norm else "", rope_freqs=rope_freqs,
                      use_rope=use_rope(il), q_scale=q_scale, q_factor=q_factor)
        if il == hp.n_layer - 1:
            h, x = select_outputs(s, h, x)
        x = ops.add(s.ctx, residual(s, h), x)
        h = norm(s, x, w.layer(il, "ffn_norm"), hp.rms_eps)
        h = moe(s, w, il, h) if use_moe else feed_forward(s, w, il, h, "silu")
        x = named(ops.add(s.ctx, residual(s, h), x), "l_out", il)
    return output_head(s, w, x)
