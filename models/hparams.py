"""A model's hyperparameters, read from its GGUF metadata under ``<architecture>.*`` keys
(llama.cpp's ``llama_hparams``): the keys every architecture has, then those its table entry
(``models/arch/table.py``) lists, each with llama.cpp's default where it is optional.

Every value is checked as it is read, before anything is sized by it: a key of the wrong type
or out of range (no heads, heads that do not divide, 10^9 layers, more experts used than
there are) is a ``ModelFileError`` naming the key, never a traceback or a huge allocation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from polydev.errors import GGUFError, ModelFileError, UnsupportedError

from .arch import REQUIRED, Architecture, architecture
from .arch.expressions import evaluate
from .gguf import GGUFFile

__all__ = ["HParams", "MAX_LAYERS", "MAX_EXPERTS"]

MAX_LAYERS = 512                  # llama.cpp's LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024                # llama.cpp's LLAMA_MAX_EXPERTS


@dataclass(frozen=True)
class HParams:
    """What placement, memory estimates and graph builders need to know of a model."""

    arch: str
    n_layer: int
    n_ctx_train: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: tuple[int, ...]        # per layer (GGUF allows a scalar or an array)
    n_embd_head_k: int
    n_embd_head_v: int
    n_vocab: int
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0                 # feed-forward width of one expert
    n_ff_shexp: int = 0               # of the shared expert
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()  # per layer: attends over the sliding window
    rms_eps: float = 1e-6
    n_rot: int = 0                    # dimensions rotated by RoPE (0: the head size)
    rope_freq_base: float = 10000.0
    rope_freq_base_swa: float = 10000.0
    rope_freq_scale: float = 1.0
    rope_attn_factor: float = 1.0     # RoPE's magnitude scale (LongRoPE's, YaRN's mscale)
    rope_ext_factor: float = 0.0      # YaRN's extrapolation mix (1 with YaRN scaling)
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    rope_yarn_log_mul: float = 0.0
    rope_finetuned: bool = True       # granite: False means no RoPE at all
    n_ctx_orig: int = 0
    final_logit_softcap: float = 0.0
    attn_logit_softcap: float = 0.0
    expert_weights_norm: bool = False
    expert_weights_scale: float = 0.0  # 0 or 1: the weights as they are
    expert_gating_func: int = 1       # llama.cpp's: 1 softmax, 2 sigmoid, 3 softmax of the chosen
    n_expert_shared: int = 0
    n_expert_groups: int = 0          # grouped routing: experts in groups, the best groups kept
    n_group_used: int = 0
    n_layer_dense_lead: int = 0       # deepseek2: the first layers are dense
    n_lora_q: int = 0                 # multi-head latent attention: q and kv compression ranks
    n_lora_kv: int = 0
    n_embd_head_k_mla: int = 0        # the head sizes decompressed (key/value_length_mla, or
    n_embd_head_v_mla: int = 0        # key/value_length in the older form: _decompressed_heads)
    is_mla: bool = False              # deepseek2 in llama.cpp's MLA form (attn_k_b, attn_v_b)
    embedding_scale: float = 0.0      # granite's multipliers (0: none)
    residual_scale: float = 0.0
    attention_scale: float = 0.0      # 0: 1/sqrt(head size)
    logit_scale: float = 0.0
    attn_temp_scale: float = 0.0

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "HParams":
        """Read and check the hyperparameters of ``f``."""
        name = f.get("general.architecture")
        if name is None:
            raise ModelFileError(f"{f.path}: general.architecture is missing")
        if not isinstance(name, str):
            raise ModelFileError(f"{f.path}: general.architecture must be a string; it is "
                                 f"{_show(name)}")
        spec = architecture(name)
        reader = _KeyReader(f, name)
        values = _structure(reader, f)
        for key in spec.keys:
            values[key.field] = reader.read(key.name, key.kind, key.default, values)
        _derive(values, spec, f, reader)
        hp = cls(arch=name, **values)
        _check(hp, spec, reader)
        return hp

    def n_embd_k_gqa(self, il: int) -> int:
        """Width of one token's K in layer ``il`` (all its KV heads)."""
        return self.n_embd_head_k * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        """Width of one token's V in layer ``il``."""
        return self.n_embd_head_v * self.n_head_kv[il]

    @property
    def head_dim_rot(self) -> int:
        """Dimensions RoPE rotates."""
        return self.n_rot or self.n_embd_head_k

    @property
    def v_in_k(self) -> bool:
        """Whether the cache keeps no values of its own: in llama.cpp's MLA form a value is
        the first ``n_lora_kv`` values of each cached key row (deepseek2; its older form
        caches every head's K and V as other architectures do)."""
        return self.is_mla

    def is_swa(self, il: int) -> bool:
        """Whether layer ``il`` attends over a sliding window."""
        return il < len(self.swa_layers) and self.swa_layers[il]

    def symbols(self, il: int) -> dict[str, Any]:
        """The values of the names the architecture tables' shapes and conditions use
        (``arch.expressions.SYMBOLS``: every field, and layer ``il``'s own values)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out.update(n_head_kv=self.n_head_kv[il], n_embd_k_gqa=self.n_embd_k_gqa(il),
                   n_embd_v_gqa=self.n_embd_v_gqa(il), n_rot=self.head_dim_rot, il=il)
        return out


class _KeyReader:
    """Typed reads of ``<arch>.<name>`` keys; a wrong type is a ModelFileError naming it."""

    def __init__(self, f: GGUFFile, arch: str) -> None:
        self.f, self.arch = f, arch

    def fail(self, name: str, what: str) -> ModelFileError:
        return ModelFileError(f"{self.f.path}: {self.arch}.{name} {what}")

    def read(self, name: str, kind: str, default: Any = REQUIRED,
             values: dict[str, Any] | None = None) -> Any:
        value = self.f.get(f"{self.arch}.{name}")
        if value is None:
            if default is REQUIRED:
                raise self.fail(name, "is missing")
            if isinstance(default, str) and default.startswith("="):
                return (values or {})[default[1:]]
            return default
        return self.convert(name, kind, value)

    def convert(self, name: str, kind: str, value: Any) -> Any:
        if kind == "int_or_array" and isinstance(value, np.ndarray):
            if value.ndim != 1 or value.dtype.kind not in "iu":
                raise self.fail(name, f"must be an integer or integer array; it holds "
                                      f"{value.dtype}")
            return tuple(int(v) for v in value)
        if kind in ("int", "int_or_array"):
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
                raise self.fail(name, f"must be an integer; it is {_show(value)}")
            return int(value)
        if kind == "float":
            if isinstance(value, (bool, np.bool_)) or not isinstance(
                    value, (int, float, np.integer, np.floating)) or not math.isfinite(value):
                raise self.fail(name, f"must be a finite number; it is {_show(value)}")
            return float(value)
        if kind == "bool":
            if not isinstance(value, (bool, np.bool_)):
                raise self.fail(name, f"must be a boolean; it is {_show(value)}")
            return bool(value)
        raise AssertionError(kind)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _structure(reader: _KeyReader, f: GGUFFile) -> dict[str, Any]:
    """The keys that size everything else, checked before anything is sized by them."""
    n_layer = reader.read("block_count", "int")
    if not 1 <= n_layer <= MAX_LAYERS:
        raise reader.fail("block_count", f"is {n_layer}: must be 1 to {MAX_LAYERS}")
    n_embd = reader.read("embedding_length", "int")
    if n_embd <= 0:
        raise reader.fail("embedding_length", f"is {n_embd}: must be above 0")
    n_head = _uniform(reader, "attention.head_count", reader.read(
        "attention.head_count", "int_or_array"), n_layer)
    if n_head <= 0:
        raise reader.fail("attention.head_count", f"is {n_head}: must be above 0")
    head_kv = reader.read("attention.head_count_kv", "int_or_array", n_head)
    n_head_kv = head_kv if isinstance(head_kv, tuple) else (head_kv,) * n_layer
    if len(n_head_kv) != n_layer:
        raise reader.fail("attention.head_count_kv", f"has {len(n_head_kv)} entries for "
                                                     f"{n_layer} layers")
    for kv in set(n_head_kv):
        if kv <= 0 or n_head % kv:
            raise reader.fail("attention.head_count_kv", f"is {kv}: must be above 0 and "
                                                         f"divide head_count ({n_head})")
    return dict(n_layer=n_layer, n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv,
                **_head_sizes(reader, n_embd, n_head), n_vocab=_vocab_size(reader, f))


def _uniform(reader: _KeyReader, name: str, value: int | tuple[int, ...], n_layer: int) -> int:
    """A per-layer array whose entries agree (polydev's models have one value), or a
    scalar."""
    if not isinstance(value, tuple):
        return value
    if len(value) != n_layer:
        raise reader.fail(name, f"has {len(value)} entries for {n_layer} layers")
    if len(set(value)) > 1:
        raise UnsupportedError(f"{reader.f.path}: {reader.arch}.{name} differs between layers "
                               f"({min(value)} to {max(value)}); polydev runs models whose "
                               "layers agree")
    return value[0]


def _head_sizes(reader: _KeyReader, n_embd: int, n_head: int) -> dict[str, int]:
    default = n_embd // n_head if n_embd % n_head == 0 else REQUIRED
    sizes = {}
    for name, field in (("attention.key_length", "n_embd_head_k"),
                        ("attention.value_length", "n_embd_head_v")):
        try:
            sizes[field] = reader.read(name, "int", default)
        except ModelFileError:
            raise reader.fail(name, f"is missing, and embedding_length ({n_embd}) is not a "
                                    f"multiple of head_count ({n_head})") from None
        if sizes[field] <= 0:
            raise reader.fail(name, f"is {sizes[field]}: must be above 0")
    n_rot = reader.read("rope.dimension_count", "int", sizes["n_embd_head_k"])
    if n_rot <= 0 or n_rot % 2 or n_rot > sizes["n_embd_head_k"]:
        raise reader.fail("rope.dimension_count", f"is {n_rot}: must be even and 2 to the head "
                                                  f"size ({sizes['n_embd_head_k']})")
    return dict(sizes, n_rot=n_rot)


def _vocab_size(reader: _KeyReader, f: GGUFFile) -> int:
    """The ``vocab_size`` key, else the token list's length (as llama.cpp)."""
    tokens = f.get("tokenizer.ggml.tokens")
    n_tokens = len(tokens) if tokens is not None and not isinstance(tokens, str) else 0
    n_vocab = reader.read("vocab_size", "int", n_tokens)
    if n_vocab <= 0:
        raise ModelFileError(f"{f.path}: the model has no vocabulary (tokenizer.ggml.tokens is "
                             "missing or empty)")
    if n_tokens > n_vocab:
        raise reader.fail("vocab_size", f"is {n_vocab}, fewer than the {n_tokens} tokens of "
                                        "tokenizer.ggml.tokens")
    return n_vocab


def _derive(values: dict[str, Any], spec: Architecture, f: GGUFFile,
            reader: _KeyReader) -> None:
    """What follows from the keys read: per-layer values made one, the experts' widths
    llama.cpp falls back to, the sliding-window layers, RoPE scaling."""
    n_layer = values["n_layer"]
    values["n_ff"] = _uniform(reader, "feed_forward_length", values["n_ff"], n_layer)
    if values.get("n_expert_used") and not values.get("n_ff_exp"):
        values["n_ff_exp"] = values["n_ff"] // values["n_expert_used"]
    if "n_ff_shexp" in values and not values["n_ff_shexp"]:
        values["n_ff_shexp"] = values["n_ff"]
    values["swa_layers"] = _swa_layers(f, spec, n_layer, values.get("sliding_window", 0))
    if spec.name == "deepseek2":      # the converter stores 0.1 * mscale_all_dim
        values["rope_yarn_log_mul"] = values.get("rope_yarn_log_mul", 0.0) / 0.1
        values.update(_decompressed_heads(values, reader))
    values["n_ctx_orig"] = reader.read("rope.scaling.original_context_length", "int",
                                       values["n_ctx_train"])
    values.update(_rope_scaling(f, spec.name, reader, values))
    # build_moe_ffn's norm_w: the chosen experts' weights renormalised to sum 1
    values.setdefault("expert_weights_norm", spec.name in ("llama", "qwen3moe"))


def _decompressed_heads(values: dict[str, Any], reader: _KeyReader) -> dict[str, Any]:
    """deepseek2's form and its heads' sizes once decompressed, as llama.cpp's ``is_mla()``
    and ``n_embd_head_k_mla()`` read them: with ``attention.key_length_mla`` and
    ``value_length_mla`` the file is in the MLA form (its cache rows are compressed, and
    these keys give the decompressed sizes); with neither (or 0) it is the older form with
    ``attn_kv_b``, whose cache holds the decompressed heads themselves, so ``key_length``
    and ``value_length`` are their sizes. One without the other is a ModelFileError."""
    head_k, head_v = values["n_embd_head_k_mla"], values["n_embd_head_v_mla"]
    if (head_k == 0) != (head_v == 0):
        absent, given, size = (("value_length_mla", "key_length_mla", head_k) if head_k
                               else ("key_length_mla", "value_length_mla", head_v))
        raise reader.fail(f"attention.{absent}", f"is missing or 0 while {given} is {size}: "
                          "llama.cpp's MLA form needs both, the older form (attn_kv_b) "
                          "neither")
    if head_k:
        return dict(is_mla=True)
    return dict(is_mla=False, n_embd_head_k_mla=values["n_embd_head_k"],
                n_embd_head_v_mla=values["n_embd_head_v"])


def _check(hp: HParams, spec: Architecture, reader: _KeyReader) -> None:
    """The ranges llama.cpp asserts, and the architecture's own conditions."""
    if hp.n_ctx_train <= 0:
        raise reader.fail("context_length", f"is {hp.n_ctx_train}: must be above 0")
    if hp.n_ff < 0:
        raise reader.fail("feed_forward_length", f"is {hp.n_ff}: must be 0 or more")
    if not hp.rms_eps > 0:
        raise reader.fail("attention.layer_norm_rms_epsilon", f"is {hp.rms_eps}: must be above 0")
    if not 0 <= hp.n_expert <= MAX_EXPERTS:
        raise reader.fail("expert_count", f"is {hp.n_expert}: must be 0 to {MAX_EXPERTS}")
    if not 0 <= hp.n_expert_used <= hp.n_expert or (hp.n_expert and not hp.n_expert_used):
        raise reader.fail("expert_used_count", f"is {hp.n_expert_used}: must be 1 to "
                                               f"expert_count ({hp.n_expert})"
                          if hp.n_expert else f"is {hp.n_expert_used} without experts")
    if hp.n_expert_groups > 1 and (hp.n_expert % hp.n_expert_groups
                                   or not 0 < hp.n_group_used < hp.n_expert_groups):
        raise reader.fail("expert_group_used_count", f"is {hp.n_group_used} with "
                          f"{hp.n_expert_groups} groups of {hp.n_expert} experts: the groups "
                          "must divide the experts and 1 to groups - 1 be used")
    if hp.sliding_window < 0:
        raise reader.fail("attention.sliding_window", f"is {hp.sliding_window}: must be 0 or "
                                                      "more")
    symbols = hp.symbols(0)
    for condition, message in spec.requires:
        if not evaluate(condition, symbols):
            raise (UnsupportedError if "not supported" in message else ModelFileError)(
                f"{reader.f.path}: {spec.name}: {message}")


def _swa_layers(f: GGUFFile, spec: Architecture, n_layer: int,
                window: int) -> tuple[bool, ...]:
    """Which layers attend over the sliding window, as llama.cpp reads it: none without a
    window; else ``<arch>.attention.sliding_window_pattern``, either a per-layer array (true
    or nonzero: sliding; layers past its end: global) or a number n (layer il slides when
    il % n < n - 1, so n = 0 makes every layer slide and n = 1 none), by default the
    architecture's own n."""
    if window <= 0 or not spec.swa_pattern:
        return (False,) * n_layer
    key = f"{spec.name}.attention.sliding_window_pattern"
    value = f.get(key, spec.swa_pattern)
    if isinstance(value, np.ndarray):
        if value.ndim != 1 or value.size > n_layer or value.dtype.kind not in "biu":
            raise GGUFError(f"{f.path}: {key} must be at most {n_layer} booleans or integers, "
                            f"one per layer; it holds {value.size} of {value.dtype}")
        return tuple(bool(v) for v in value) + (False,) * (n_layer - value.size)
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0:
        raise GGUFError(f"{f.path}: {key} must be a whole number of layers (0 or more) or a "
                        f"per-layer array; it is {value!r}")
    n = int(value)
    return tuple(n == 0 or il % n < n - 1 for il in range(n_layer))


def _rope_scaling(f: GGUFFile, arch: str, reader: _KeyReader,
                  values: dict[str, Any]) -> dict[str, float]:
    """RoPE's frequency scale, YaRN's extrapolation factor and the magnitude factor, as
    llama.cpp's context sets them up (``llama_context``'s yarn_attn_factor): linear and
    LongRoPE scale the frequencies by 1/factor; YaRN also mixes in extrapolation and
    corrects the magnitude (with DeepSeek-V2's ``yarn_log_multiplier``); other types are
    refused by name."""
    kind = f.get(f"{arch}.rope.scaling.type", "linear")
    if kind not in ("none", "linear", "longrope", "yarn"):
        raise UnsupportedError(f"{f.path}: RoPE scaling {kind!r} is not supported (polydev "
                               "runs none, linear, longrope and yarn)")
    factor = reader.read("rope.scaling.factor", "float", 0.0)
    if factor == 0.0:
        factor = reader.read("rope.scale_linear", "float", 0.0)
    if factor < 0:
        raise reader.fail("rope.scaling.factor", f"is {factor}: must be 0 or more")
    freq_scale = 1.0 if kind == "none" or factor == 0.0 else 1.0 / factor
    ext_factor = reader.read("rope.scaling.yarn_ext_factor", "float",
                             1.0 if kind == "yarn" else 0.0)
    attn_factor = reader.read("rope.scaling.yarn_attn_factor", "float", 1.0)
    if ext_factor != 0.0:
        scale, log_mul = 1.0 / freq_scale, values.get("rope_yarn_log_mul", 0.0)
        if log_mul:
            mscale = log_mul if arch == "deepseek2" and log_mul != 1.0 else 1.0
            attn_factor = _yarn_mscale(scale, mscale) / _yarn_mscale(scale, log_mul)
        else:
            attn_factor = _yarn_mscale(scale, 1.0)
        # ggml's rope multiplies by this mscale itself when ext_factor is set
        attn_factor /= 1.0 + 0.1 * math.log(scale)
    return dict(rope_freq_scale=freq_scale, rope_ext_factor=ext_factor,
                rope_attn_factor=attn_factor * values.get("rope_attn_factor", 1.0))


def _yarn_mscale(scale: float, mscale: float) -> float:
    return 1.0 if scale <= 1.0 else 0.1 * mscale * math.log(scale) + 1.0
