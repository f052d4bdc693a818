"""Every architecture polydev runs, as data: llama.cpp's ``load_arch_hparams`` and
``load_arch_tensors`` of each, written down with ``models/arch/schema.py``'s records.

Beyond ``blocks.COMMON_KEYS`` each lists its own keys. The loader checks a file against its
entry (``models/model_check.py``), placement reads each tensor's op from it, ``polydev info``
lists the entries, and the graph builders (``models/graphs``) read weights by the short names
it declares.
"""

from __future__ import annotations

from .blocks import (COMMON_KEYS, experts, ffn, ffn_biases, ffn_norm, head, qkv, rope_factors,
                     shared_expert)
from .schema import Architecture, Key, TensorSpec

__all__ = ["ARCHITECTURES"]


def _norm(name: str, shape: str, role: str) -> TensorSpec:
    return TensorSpec(f"blk.{{il}}.{name}.weight", shape, "MUL", role)


QK_NORMS = (_norm("attn_q_norm", "n_embd_head_k", "per-head q norm"),
            _norm("attn_k_norm", "n_embd_head_k", "per-head k norm"))
POST_NORMS = (_norm("post_attention_norm", "n_embd", "norm after attention"),
              _norm("post_ffw_norm", "n_embd", "norm after the feed-forward"))
DENSE = "n_expert == 0"
DENSE_ONLY = ("n_expert == 0", "its experts (expert_count > 0) are not supported yet: polydev "
              "runs the dense form of this architecture")
HAS_EXPERTS = ("n_expert > 0 and n_expert_used > 0",
               "expert_count and expert_used_count must be above 0")
ROPE_IS_HEAD = ("n_rot == n_embd_head_k", "rope.dimension_count must equal the head size "
                "(attention.key_length)")
DENSE_LEAD = "il < n_layer_dense_lead"
MOE_LAYER = "il >= n_layer_dense_lead"
# multi-head latent attention as llama.cpp converts it: q (optionally through a low-rank
# compression), one compressed kv row plus the shared rope part of k per token, then each
# head's k and v decompressed, in one of two forms (``is_mla``, from the keys): llama.cpp's
# MLA form has per-head matrices that absorb k's decompression into q and recover v's
# (attn_k_b, attn_v_b), the older form one matrix that decompresses both (attn_kv_b).
# n_embd_head_k_mla and n_embd_head_v_mla are the decompressed heads' sizes in either form.
MLA = "is_mla"
KV_B = "not is_mla"
LATENT_ATTENTION = (
    TensorSpec("blk.{il}.attn_norm.weight", "n_embd", "MUL", "attention norm"),
    TensorSpec("blk.{il}.attn_q_a_norm.weight", "n_lora_q", "MUL", "compressed q norm",
               when="n_lora_q > 0"),
    TensorSpec("blk.{il}.attn_q_a.weight", "n_embd, n_lora_q", "MUL_MAT", "q compression",
               when="n_lora_q > 0"),
    TensorSpec("blk.{il}.attn_q_b.weight", "n_lora_q, n_head * n_embd_head_k_mla", "MUL_MAT",
               "q decompression", when="n_lora_q > 0"),
    TensorSpec("blk.{il}.attn_q.weight", "n_embd, n_head * n_embd_head_k_mla", "MUL_MAT",
               "q projection", when="n_lora_q == 0"),
    TensorSpec("blk.{il}.attn_kv_a_norm.weight", "n_lora_kv", "MUL", "compressed kv norm"),
    TensorSpec("blk.{il}.attn_kv_a_mqa.weight", "n_embd, n_lora_kv + n_rot", "MUL_MAT",
               "kv compression and the shared rope part of k"),
    TensorSpec("blk.{il}.attn_k_b.weight", "n_embd_head_k_mla - n_rot, n_lora_kv, n_head",
               "MUL_MAT", "k decompression, absorbed into q (MLA form)", when=MLA),
    TensorSpec("blk.{il}.attn_v_b.weight", "n_lora_kv, n_embd_head_v_mla, n_head", "MUL_MAT",
               "v decompression (MLA form)", when=MLA),
    TensorSpec("blk.{il}.attn_kv_b.weight",
               "n_lora_kv, n_head * (n_embd_head_k_mla - n_rot + n_embd_head_v_mla)", "MUL_MAT",
               "k and v decompression (the older form, without attention.key_length_mla)",
               when=KV_B),
    TensorSpec("blk.{il}.attn_output.weight", "n_head * n_embd_head_v_mla, n_embd", "MUL_MAT",
               "attention output projection"))
MLA_FORM = ("not is_mla or (n_head_kv == 1 and n_embd_head_k == n_lora_kv + n_rot and "
            "n_embd_head_v == n_lora_kv)",
            "in llama.cpp's MLA form (attention.key_length_mla set) the cache holds one "
            "compressed row per token: head_count_kv must be 1, key_length kv_lora_rank + "
            "rope.dimension_count and value_length kv_lora_rank")
KV_B_FORM = ("is_mla or n_head_kv == n_head",
             "in the older form (attn_kv_b, no attention.key_length_mla) the cache holds every "
             "head's K and V: head_count_kv must equal head_count")
NOPE_PART = ("n_embd_head_k_mla > n_rot",
             "a decompressed k head (attention.key_length_mla, or key_length in the older form) "
             "must be longer than its rope part (rope.dimension_count)")
# YaRN's settings that some architectures read (llama.cpp's deepseek2 and mistral3)
YARN_KEYS = (Key("rope.scaling.yarn_log_multiplier", "rope_yarn_log_mul", "float", 0.0),
             Key("rope.scaling.yarn_beta_fast", "yarn_beta_fast", "float", 32.0),
             Key("rope.scaling.yarn_beta_slow", "yarn_beta_slow", "float", 1.0))
SWA_KEYS = (Key("attention.sliding_window", "sliding_window", "int", 0),
            Key("rope.freq_base_swa", "rope_freq_base_swa", "float", "=rope_freq_base"))


def _arch(name: str, description: str, rope: str, tensors: tuple, keys: tuple = (),
          **kw) -> Architecture:
    return Architecture(name=name, description=description, rope=rope,
                        keys=COMMON_KEYS + keys, tensors=tensors, **kw)


_ALL = (
    _arch("llama", "Llama 1-3, SmolLM2, TinyLlama, Mistral 7B, Mixtral", "norm",
          head() + qkv(out_bias=True) + rope_factors() + ffn_norm() + ffn(DENSE)
          + ffn_biases(DENSE) + experts("n_ff", when="n_expert > 0"),
          requires=(ROPE_IS_HEAD,)),
    _arch("qwen2", "Qwen2, Qwen2.5", "neox",
          head(bias=True) + qkv("n_embd", out="n_embd") + ffn_norm() + ffn()),
    _arch("qwen3", "Qwen3", "neox", head() + qkv() + QK_NORMS + ffn_norm() + ffn()),
    _arch("qwen3moe", "Qwen3 MoE (30B-A3B, ...)", "neox",
          head() + qkv() + QK_NORMS + ffn_norm() + experts(),
          keys=(Key("expert_feed_forward_length", "n_ff_exp", "int", 0),),
          requires=(HAS_EXPERTS,)),
    _arch("gemma3", "Gemma 3", "neox",
          head() + qkv() + QK_NORMS + POST_NORMS + ffn_norm() + ffn(),
          keys=SWA_KEYS[:1] + (Key("rope.freq_base_swa", "rope_freq_base_swa", "float", 10000.0),
                               Key("final_logit_softcapping", "final_logit_softcap", "float",
                                   0.0)),
          swa_pattern=6),
    _arch("gemma2", "Gemma 2", "neox",
          head(tied="always") + qkv() + POST_NORMS + ffn_norm() + ffn(),
          keys=(Key("attention.sliding_window", "sliding_window", "int", 4096),
                SWA_KEYS[1],
                Key("attn_logit_softcapping", "attn_logit_softcap", "float", 50.0),
                Key("final_logit_softcapping", "final_logit_softcap", "float", 30.0)),
          swa_pattern=2),
    _arch("smollm3", "SmolLM3 (no RoPE on every fourth layer)", "norm",
          head() + qkv() + ffn_norm() + ffn()),
    _arch("granite", "IBM Granite 3 (dense)", "norm",
          head() + qkv(out_bias=True) + rope_factors() + ffn_norm() + ffn() + ffn_biases(),
          keys=(Key("logit_scale", "logit_scale", "float"),
                Key("residual_scale", "residual_scale", "float", 0.0),
                Key("embedding_scale", "embedding_scale", "float", 0.0),
                Key("attention.scale", "attention_scale", "float", 0.0),
                Key("rope.scaling.finetuned", "rope_finetuned", "bool", True)),
          requires=(DENSE_ONLY, ROPE_IS_HEAD)),
    _arch("olmo2", "OLMo 2, OLMo 3", "neox",
          head(tied="never") + qkv("n_embd", out="n_embd", norm=False)
          + (_norm("attn_q_norm", "n_embd", "q norm over the whole projection"),
             _norm("attn_k_norm", "n_embd_k_gqa", "k norm over the whole projection"))
          + POST_NORMS + ffn(),
          keys=SWA_KEYS, swa_pattern=4, requires=(ROPE_IS_HEAD,)),
    _arch("qwen2moe", "Qwen1.5 MoE, Qwen2 MoE", "neox",
          head(tied="never") + qkv("n_embd", out="n_embd") + ffn_norm() + experts()
          + shared_expert(gated=True),
          keys=(Key("expert_feed_forward_length", "n_ff_exp", "int", 0),
                Key("expert_shared_feed_forward_length", "n_ff_shexp", "int", 0)),
          requires=(HAS_EXPERTS,)),
    _arch("phi3", "Phi-3, Phi-3.5, Phi-4-mini", "neox",
          head() + qkv("n_embd", out="n_embd") + rope_factors(long_short=True) + ffn_norm()
          + (TensorSpec("blk.{il}.ffn_up.weight", "n_embd, 2 * n_ff", "MUL_MAT",
                        "gate and up projections, fused"),
             TensorSpec("blk.{il}.ffn_down.weight", "n_ff, n_embd", "MUL_MAT",
                        "down projection")),
          requires=(DENSE_ONLY,)),
    _arch("gpt-oss", "OpenAI gpt-oss (20B, 120B)", "neox",
          head(tied="never") + qkv()
          + (TensorSpec("blk.{il}.attn_output.bias", "n_embd", "ADD", "attention output bias"),
             TensorSpec("blk.{il}.attn_sinks.weight", "n_head", "FLASH_ATTN_EXT",
                        "attention sinks, one logit per head"),
             _norm("post_attention_norm", "n_embd", "norm before the experts"),
             TensorSpec("blk.{il}.ffn_gate_inp.bias", "n_expert", "ADD", "router bias"))
          + experts()
          + tuple(TensorSpec(f"blk.{{il}}.ffn_{part}_exps.bias", f"{width}, n_expert",
                             "GET_ROWS", f"experts' {part} biases")
                  for part, width in (("gate", "n_ff_exp"), ("up", "n_ff_exp"),
                                      ("down", "n_embd"))),
          keys=(Key("expert_feed_forward_length", "n_ff_exp"),
                Key("attention.sliding_window", "sliding_window"), SWA_KEYS[1]),
          swa_pattern=2, requires=(HAS_EXPERTS, ROPE_IS_HEAD)),
    _arch("deepseek2", "DeepSeek-V2, V2-Lite, V2.5 (multi-head latent attention, "
          "MLA or attn_kv_b files)", "norm",
          head() + LATENT_ATTENTION + ffn_norm() + ffn(DENSE_LEAD) + experts(when=MOE_LAYER)
          + (TensorSpec("blk.{il}.exp_probs_b.bias", "n_expert", "ADD",
                        "experts' selection bias", required=False, when=MOE_LAYER),)
          + shared_expert("n_ff_exp * n_expert_shared", when=MOE_LAYER),
          keys=(Key("leading_dense_block_count", "n_layer_dense_lead", "int", 0),
                Key("attention.q_lora_rank", "n_lora_q", "int", 0),
                Key("attention.kv_lora_rank", "n_lora_kv"),
                Key("attention.key_length_mla", "n_embd_head_k_mla", "int", 0),
                Key("attention.value_length_mla", "n_embd_head_v_mla", "int", 0),
                Key("expert_feed_forward_length", "n_ff_exp"),
                Key("expert_shared_count", "n_expert_shared"),
                Key("expert_weights_scale", "expert_weights_scale", "float", 0.0),
                Key("expert_weights_norm", "expert_weights_norm", "bool", False),
                Key("expert_gating_func", "expert_gating_func", "int", 1),
                Key("expert_group_count", "n_expert_groups", "int", 0),
                Key("expert_group_used_count", "n_group_used", "int", 0)) + YARN_KEYS,
          requires=(HAS_EXPERTS, MLA_FORM, KV_B_FORM, NOPE_PART,
                    ("expert_gating_func in (0, 1, 2)", "expert_gating_func must be 1 "
                     "(softmax), 2 (sigmoid) or 0 (unset: softmax)"))),
    _arch("mistral3", "Ministral 3, Mistral Small 3 (text)", "norm",
          head() + qkv(out_bias=True) + rope_factors() + ffn_norm() + ffn() + ffn_biases(),
          keys=(Key("attention.temperature_scale", "attn_temp_scale", "float", 0.0),)
          + YARN_KEYS,
          requires=(DENSE_ONLY, ROPE_IS_HEAD,
                    ("attn_temp_scale == 0 or n_ctx_orig > 0", "attention.temperature_scale "
                     "needs rope.scaling.original_context_length"))),
)

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in _ALL}
