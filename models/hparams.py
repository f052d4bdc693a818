"""A model's hyperparameters, read from its GGUF metadata under ``<architecture>.*`` keys
(llama.cpp's ``llama_hparams``), with llama.cpp's defaults where a key is optional."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from polydev.errors import GGUFError, UnsupportedError

from .gguf import GGUFFile

__all__ = ["HParams"]


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
    sliding_window: int = 0
    swa_layers: tuple[bool, ...] = ()  # per layer: attends over the sliding window
    rms_eps: float = 1e-6
    n_rot: int = 0                    # dimensions rotated by RoPE (0: the head size)
    rope_freq_base: float = 10000.0
    rope_freq_base_swa: float = 10000.0
    rope_freq_scale: float = 1.0
    n_ctx_orig: int = 0
    final_logit_softcap: float = 0.0
    attn_logit_softcap: float = 0.0
    expert_weights_norm: bool = False

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> "HParams":
        """Read the hyperparameters of ``f``; a missing required key is a GGUFError."""
        arch = f.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{f.path}: general.architecture is missing")

        def key(name: str, default=None):
            value = f.get(f"{arch}.{name}", default)
            if value is None:
                raise GGUFError(f"{f.path}: {arch}.{name} is missing")
            return value

        n_layer = int(key("block_count"))
        n_embd = int(key("embedding_length"))
        n_head = _first(key("attention.head_count"))
        head_kv = key("attention.head_count_kv", n_head)
        n_head_kv = (tuple(int(h) for h in head_kv) if isinstance(head_kv, np.ndarray)
                     else (int(head_kv),) * n_layer)
        if len(n_head_kv) != n_layer:
            raise GGUFError(f"{f.path}: {arch}.attention.head_count_kv has {len(n_head_kv)} "
                            f"entries for {n_layer} layers")
        sliding_window = int(key("attention.sliding_window", 0))
        head_dim = n_embd // n_head if n_head else 0
        tokens = f.get("tokenizer.ggml.tokens")
        n_vocab = int(f.get(f"{arch}.vocab_size", len(tokens) if tokens is not None else 0))
        return cls(
            arch=arch, n_layer=n_layer, n_ctx_train=int(key("context_length", 0)),
            n_embd=n_embd, n_ff=_first(key("feed_forward_length", 0)), n_head=n_head,
            n_head_kv=n_head_kv,
            n_embd_head_k=int(key("attention.key_length", head_dim)),
            n_embd_head_v=int(key("attention.value_length", head_dim)),
            n_vocab=n_vocab, n_expert=int(key("expert_count", 0)),
            n_expert_used=int(key("expert_used_count", 0)),
            n_ff_exp=int(key("expert_feed_forward_length", 0)),
            sliding_window=sliding_window,
            swa_layers=_swa_layers(f, arch, n_layer, sliding_window),
            rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
            n_rot=int(key("rope.dimension_count", 0)),
            rope_freq_base=float(key("rope.freq_base", 10000.0)),
            # llama.cpp's default for gemma3's sliding-window layers
            rope_freq_base_swa=float(key("rope.freq_base_swa", 10000.0)),
            rope_freq_scale=_freq_scale(f, arch),
            n_ctx_orig=int(key("rope.scaling.original_context_length",
                               key("context_length", 0))),
            final_logit_softcap=float(key("final_logit_softcapping", 0.0)),
            attn_logit_softcap=float(key("attn_logit_softcapping", 0.0)),
            expert_weights_norm=bool(key("expert_weights_norm", arch == "qwen3moe")))

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

    def is_swa(self, il: int) -> bool:
        """Whether layer ``il`` attends over a sliding window (gemma3: 5 of every 6 layers
        unless its file says otherwise)."""
        return il < len(self.swa_layers) and self.swa_layers[il]


# The architectures with sliding-window layers and their default pattern (llama.cpp's
# ``load_swa_pattern(ml, n)`` in each architecture's ``load_arch_hparams``).
SWA_PATTERNS = {"gemma3": 6}


def _swa_layers(f: GGUFFile, arch: str, n_layer: int, window: int) -> tuple[bool, ...]:
    """Which layers attend over the sliding window, as llama.cpp reads it: none without a
    window; else ``<arch>.attention.sliding_window_pattern``, either a per-layer array (true
    or nonzero: sliding; layers past its end: global) or a number n (layer il slides when
    il % n < n - 1, so n = 0 makes every layer slide and n = 1 none), by default the
    architecture's own n."""
    if window <= 0 or arch not in SWA_PATTERNS:
        return (False,) * n_layer
    key = f"{arch}.attention.sliding_window_pattern"
    value = f.get(key, SWA_PATTERNS[arch])
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


def _freq_scale(f: GGUFFile, arch: str) -> float:
    """1 / the linear RoPE scaling factor; other scaling types are refused by name."""
    kind = f.get(f"{arch}.rope.scaling.type", "none")
    factor = float(f.get(f"{arch}.rope.scaling.factor", 0.0) or 0.0)
    if kind in ("none", "") or factor in (0.0, 1.0):
        return 1.0
    if kind != "linear":
        raise UnsupportedError(f"{f.path}: RoPE scaling {kind!r} is not supported (polydev "
                               "runs none and linear)")
    return 1.0 / factor


def _first(value) -> int:
    """A scalar, or the first entry of a per-layer array."""
    return int(value[0]) if isinstance(value, np.ndarray) else int(value)
