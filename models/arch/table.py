"""Every architecture polydev runs, as data: llama.cpp's ``load_arch_hparams`` and
``load_arch_tensors`` of each, written down with ``models/arch/schema.py``'s records.

Beyond ``blocks.COMMON_KEYS`` each lists its own keys. The loader checks a file against its
entry (``models/model_check.py``), placement reads each tensor's op from it, ``polydev info``
lists the entries, and the graph builders read weights by the short names it declares.
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
SWA_KEYS = (Key("attention.sliding_window", "sliding_window", "int", 0),
            Key("rope.freq_base_swa", "rope_freq_base_swa", "float", "=rope_freq_base"))


def _arch(name: str, description: str, rope: str, tensors: tuple, keys: tuple = (),
          module: str | None = None, **kw) -> Architecture:
    return Architecture(name=name, module=module or name, description=description, rope=rope,
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
          module="gpt_oss",
          keys=(Key("expert_feed_forward_length", "n_ff_exp"),
                Key("attention.sliding_window", "sliding_window"), SWA_KEYS[1]),
          swa_pattern=2, requires=(HAS_EXPERTS, ROPE_IS_HEAD)),
    _arch("mistral3", "Ministral 3, Mistral Small 3 (text)", "norm",
          head() + qkv(out_bias=True) + rope_factors() + ffn_norm() + ffn() + ffn_biases(),
          keys=(Key("attention.temperature_scale", "attn_temp_scale", "float", 0.0),),
          requires=(DENSE_ONLY, ROPE_IS_HEAD,
                    ("attn_temp_scale == 0", "attention.temperature_scale (llama 4's "
                     "temperature tuning) is not supported yet"))),
)

ARCHITECTURES: dict[str, Architecture] = {a.name: a for a in _ALL}
