"""Float64 numpy implementations of the architectures polydev runs, written from the papers
and llama.cpp's graph builders with plain numpy (no polydev ops): the tests' oracle.

``forward(path, tokens)`` returns the logits of every token, [n_tokens, n_vocab].
"""

from __future__ import annotations

import numpy as np


def _weights(reader) -> dict[str, np.ndarray]:
    import gguf

    out = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        out[t.name] = np.asarray(values, dtype=np.float64).reshape([int(n) for n in t.shape[::-1]])
    if "output.weight" not in out:
        out["output.weight"] = out["token_embd.weight"]
    return out


def _field(reader, key, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, pos, n_rot, base, neox, freq_factors=None):
    """x [n_tokens, n_head, head_dim]; rotate the first n_rot dims."""
    half = n_rot // 2
    inv = base ** (-np.arange(half, dtype=np.float64) * 2 / n_rot)
    if freq_factors is not None:
        inv = inv / freq_factors[:half]
    theta = pos[:, None, None] * inv[None, None, :]          # [n_tokens, 1, half]
    cos, sin = np.cos(theta), np.sin(theta)
    out = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        out[..., :half] = a * cos - b * sin
        out[..., half:n_rot] = a * sin + b * cos
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = a * cos - b * sin
        out[..., 1:n_rot:2] = a * sin + b * cos
    return out


def gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x / (1 + np.exp(-x))


def forward(reader, tokens) -> np.ndarray:
    """Logits of every token of ``tokens`` (one sequence from position 0)."""
    arch = str(_field(reader, "general.architecture"))
    W = _weights(reader)

    def key(name, default=None):
        return _field(reader, f"{arch}.{name}", default)

    n_layer = int(key("block_count"))
    n_embd = int(key("embedding_length"))
    n_head = int(key("attention.head_count"))
    n_head_kv = int(key("attention.head_count_kv", n_head))
    head_k = int(key("attention.key_length", n_embd // n_head))
    head_v = int(key("attention.value_length", n_embd // n_head))
    eps = float(key("attention.layer_norm_rms_epsilon"))
    n_rot = int(key("rope.dimension_count", head_k))
    base = float(key("rope.freq_base", 10000.0))
    base_swa = float(key("rope.freq_base_swa", 10000.0))
    window = int(key("attention.sliding_window", 0))
    # gemma3's sliding layers: a per-layer array, or a number n (il % n < n - 1 slides; 0: all)
    pattern = key("attention.sliding_window_pattern", 6)
    n_used = int(key("expert_used_count", 0))
    softcap = float(key("final_logit_softcapping", 0.0) or 0.0)
    gemma = arch == "gemma3"
    neox = arch in ("qwen2", "qwen3", "qwen3moe", "gemma3")
    qk_norm = arch in ("qwen3", "qwen3moe", "gemma3")
    tokens = np.asarray(tokens)
    n = len(tokens)
    pos = np.arange(n, dtype=np.float64)
    x = W["token_embd.weight"][tokens]
    if gemma:
        x = x * np.sqrt(n_embd)
    freq_factors = W.get("rope_freqs.weight")
    for il in range(n_layer):
        p = f"blk.{il}."
        if not (gemma and window > 0):
            swa = False
        elif isinstance(pattern, (list, np.ndarray)):
            swa = il < len(pattern) and bool(pattern[il])
        else:
            swa = int(pattern) == 0 or il % int(pattern) < int(pattern) - 1
        h = rms_norm(x, W[p + "attn_norm.weight"], eps)

        def proj(name, h=h):
            y = h @ W[p + name + ".weight"].T
            return y + W[p + name + ".bias"] if p + name + ".bias" in W else y
        q = proj("attn_q").reshape(n, n_head, head_k)
        k = proj("attn_k").reshape(n, n_head_kv, head_k)
        v = proj("attn_v").reshape(n, n_head_kv, head_v)
        if qk_norm:
            q = rms_norm(q, W[p + "attn_q_norm.weight"], eps)
            k = rms_norm(k, W[p + "attn_k_norm.weight"], eps)
        b = base_swa if swa else base
        q = rope(q, pos, n_rot, b, neox, freq_factors)
        k = rope(k, pos, n_rot, b, neox, freq_factors)
        group = n_head // n_head_kv
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.sqrt(head_k)
        mask = pos[None, :] > pos[:, None]
        if swa:
            mask |= (pos[:, None] - pos[None, :]) >= window
        scores = np.where(mask[None], -np.inf, scores)
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        scores /= scores.sum(-1, keepdims=True)
        attn = np.einsum("hts,shd->thd", scores, v).reshape(n, n_head * head_v)
        h = attn @ W[p + "attn_output.weight"].T
        if gemma:
            h = rms_norm(h, W[p + "post_attention_norm.weight"], eps)
        x = x + h
        h = rms_norm(x, W[p + "ffn_norm.weight"], eps)
        if p + "ffn_gate_exps.weight" in W:
            h = _moe(h, W, p, n_used, arch == "qwen3moe")
        else:
            act = gelu_tanh if gemma else silu
            gated = act(h @ W[p + "ffn_gate.weight"].T) * (h @ W[p + "ffn_up.weight"].T)
            h = gated @ W[p + "ffn_down.weight"].T
        if gemma:
            h = rms_norm(h, W[p + "post_ffw_norm.weight"], eps)
        x = x + h
    x = rms_norm(x, W["output_norm.weight"], eps)
    logits = x @ W["output.weight"].T
    if softcap:
        logits = np.tanh(logits / softcap) * softcap
    return logits


def _moe(h, W, p, n_used, norm_weights):
    logits = h @ W[p + "ffn_gate_inp.weight"].T                  # [n, n_expert]
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    top = np.argsort(-probs, axis=-1, kind="stable")[:, :n_used]
    weights = np.take_along_axis(probs, top, -1)
    if norm_weights:
        weights = weights / weights.sum(-1, keepdims=True)
    gate, up, down = (W[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        for j, e in enumerate(top[t]):
            y = silu(gate[e] @ h[t]) * (up[e] @ h[t])
            out[t] += weights[t, j] * (down[e] @ y)
    return out
