"""The tensor groups architectures share, as llama.cpp creates them (``create_tensor_qkv``, the
output head with its tied fallback, the gated feed-forward, experts): each function returns
``TensorSpec``s for ``models/arch/table.py``."""

from __future__ import annotations

from .schema import Key, TensorSpec

__all__ = ["head", "qkv", "ffn_norm", "ffn", "ffn_biases", "experts", "shared_expert",
           "rope_factors", "COMMON_KEYS"]

Q = "n_embd_head_k * n_head"
"""The query projection's width in most architectures (qwen2, olmo2, phi3: ``n_embd``)."""


# The keys every architecture reads (llama_model_base::load_hparams and the per-architecture
# rms epsilon); HParams reads block_count, embedding_length and the head counts itself.
COMMON_KEYS = (
    Key("context_length", "n_ctx_train"),
    Key("attention.layer_norm_rms_epsilon", "rms_eps", "float"),
    Key("feed_forward_length", "n_ff", "int_or_array", 0),
    Key("rope.freq_base", "rope_freq_base", "float", 10000.0),
    Key("rope.scaling.attn_factor", "rope_attn_factor", "float", 1.0),
    Key("expert_count", "n_expert", "int", 0),
    Key("expert_used_count", "n_expert_used", "int", 0),
)


def head(tied: str = "optional", bias: bool = False) -> tuple[TensorSpec, ...]:
    """The token embedding, the final norm and the output matrix. ``tied``: "optional" (a
    model without ``output.weight`` reads the token embedding there), "never" (the file must
    carry it) or "always" (gemma2: it never does)."""
    specs = [TensorSpec("token_embd.weight", "n_embd, n_vocab", "GET_ROWS", "token embedding"),
             TensorSpec("output_norm.weight", "n_embd", "MUL", "final norm")]
    if tied != "always":
        specs.append(TensorSpec("output.weight", "n_embd, n_vocab", "MUL_MAT", "output matrix",
                                required=tied == "never"))
    if bias:
        specs.append(TensorSpec("output.bias", "n_vocab", "ADD", "output bias", required=False))
    return tuple(specs)


def qkv(q: str = Q, *, fused: bool = True, required: bool = True, out_bias: bool = False,
        out: str | None = None, norm: bool = True) -> tuple[TensorSpec, ...]:
    """The attention norm (unless ``norm`` is False), q/k/v projections (separate, or
    ``attn_qkv`` fused, each with an optional bias) and the output projection."""
    qkv_width = f"{q} + n_embd_k_gqa + n_embd_v_gqa"
    specs = [TensorSpec("blk.{il}.attn_norm.weight", "n_embd", "MUL", "attention norm")][
        :int(norm)]
    if fused:
        specs += [TensorSpec("blk.{il}.attn_qkv.weight", f"n_embd, {qkv_width}", "MUL_MAT",
                             "fused q/k/v projection", required=False),
                  TensorSpec("blk.{il}.attn_qkv.bias", qkv_width, "ADD", "fused q/k/v bias",
                             required=False)]
    unless = "attn_qkv" if fused else ""
    for part, width in (("q", q), ("k", "n_embd_k_gqa"), ("v", "n_embd_v_gqa")):
        specs += [TensorSpec(f"blk.{{il}}.attn_{part}.weight", f"n_embd, {width}", "MUL_MAT",
                             f"{part} projection", required=required, unless=unless),
                  TensorSpec(f"blk.{{il}}.attn_{part}.bias", width, "ADD", f"{part} bias",
                             required=False)]
    specs.append(TensorSpec("blk.{il}.attn_output.weight", f"{out or q}, n_embd", "MUL_MAT",
                            "attention output projection"))
    if out_bias:
        specs.append(TensorSpec("blk.{il}.attn_output.bias", "n_embd", "ADD",
                                "attention output bias", required=False))
    return tuple(specs)


def ffn_norm() -> tuple[TensorSpec, ...]:
    """The norm before the feed-forward (dense or experts)."""
    return (TensorSpec("blk.{il}.ffn_norm.weight", "n_embd", "MUL", "feed-forward norm"),)


def ffn(when: str = "") -> tuple[TensorSpec, ...]:
    """The gated feed-forward: gate, up and down projections."""
    return _gate_up_down("", "n_ff", "", "MUL_MAT", "", when)


def _gate_up_down(kind: str, width: str, stacked: str, op: str, whose: str,
                  when: str) -> tuple[TensorSpec, ...]:
    """``ffn_gate{kind}``, ``ffn_up{kind}`` and ``ffn_down{kind}`` of width ``width`` (with
    ``stacked`` dimensions after, the experts')."""
    return tuple(TensorSpec(f"blk.{{il}}.ffn_{part}{kind}.weight", shape + stacked, op,
                            f"{whose}{part} projection{'s' if stacked else ''}", when=when)
                 for part, shape in (("gate", f"n_embd, {width}"), ("up", f"n_embd, {width}"),
                                     ("down", f"{width}, n_embd")))


def ffn_biases(when: str = "") -> tuple[TensorSpec, ...]:
    """Optional feed-forward biases (llama's MLP bias)."""
    return tuple(TensorSpec(f"blk.{{il}}.ffn_{part}.bias", width, "ADD", f"{part} bias",
                            required=False, when=when)
                 for part, width in (("gate", "n_ff"), ("up", "n_ff"), ("down", "n_embd")))


def experts(width: str = "n_ff_exp", when: str = "") -> tuple[TensorSpec, ...]:
    """The router and the experts' gate, up and down matrices (MUL_MAT_ID)."""
    router = TensorSpec("blk.{il}.ffn_gate_inp.weight", "n_embd, n_expert", "MUL_MAT", "router",
                        when=when)
    return (router,) + _gate_up_down("_exps", width, ", n_expert", "MUL_MAT_ID", "experts' ",
                                     when)


def shared_expert(width: str = "n_ff_shexp", gated: bool = False,
                  when: str = "") -> tuple[TensorSpec, ...]:
    """A feed-forward every token goes through beside its experts (with a sigmoid gate of
    its own in qwen2moe)."""
    specs = _gate_up_down("_shexp", width, "", "MUL_MAT", "shared expert's ", when)
    if gated:
        specs += (TensorSpec("blk.{il}.ffn_gate_inp_shexp.weight", "n_embd", "MUL_MAT",
                             "shared expert's gate", when=when),)
    return specs


def rope_factors(long_short: bool = False) -> tuple[TensorSpec, ...]:
    """RoPE frequency factors, one file-wide tensor (llama3's ``rope_freqs``; phi3's LongRoPE
    short and long factors)."""
    if long_short:
        return (TensorSpec("rope_factors_long.weight", "n_rot // 2", "ROPE",
                           "LongRoPE factors past the original context", required=False),
                TensorSpec("rope_factors_short.weight", "n_rot // 2", "ROPE",
                           "LongRoPE factors within the original context", required=False))
    return (TensorSpec("rope_freqs.weight", "n_rot // 2", "ROPE",
                       "RoPE frequency factors", required=False),)
