"""How far each engine's logits are from a float64 evaluation of the same weights, on real text.

For SmolLM2-135M (Q4_1) and gemma-3-270m (Q4_K_M): the first N_TOKENS tokens of a real English
text (the GNU GPL version 3, /usr/share/common-licenses/GPL-3 on Debian, else the text of this
machine's Python license), evaluated by
- tests/reference_models.py: plain float64 numpy from the GGUF's decoded weights (the truth);
- polydev with ``numerics="exact"``, ``"fast"`` (the default) and ``"int8"``, CPU backend, one
  token at a time (decode steps; a row's products give the same bits in a prompt's batch);
- llama.cpp (llama-cpp-python, its CPU backend), where it is installed.
For each engine: the mean KL divergence KL(float64 || engine) over the positions (target: at
most llama.cpp's for polydev's default), the share of positions whose top token differs from
float64's, and the perplexity of the text relative to float64's.
Prints a table, or with --json one JSON object.
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

import numpy as np

from figures import leave_bench_dir, parse_args, print_figures, real_models  # bench/figures.py

leave_bench_dir()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))   # the oracle

N_TOKENS = 256


def real_text() -> tuple[str, str]:
    """(name, text) of a real English text this machine has."""
    for path in (Path("/usr/share/common-licenses/GPL-3"),
                 Path(sysconfig.get_paths()["stdlib"]).parent / "LICENSE.txt",
                 Path(sysconfig.get_paths()["stdlib"]) / "LICENSE.txt"):
        if path.is_file():
            return str(path), path.read_text(encoding="utf-8", errors="replace")
    raise SystemExit("no real text found (looked for GPL-3 and Python's LICENSE.txt)")


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def compare(truth: np.ndarray, logits: np.ndarray, tokens: list[int]) -> dict:
    """Mean KL(truth || engine), top-1 disagreement and the perplexity ratio."""
    lp, lq = log_softmax(truth), log_softmax(logits)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=-1)
    nxt = np.asarray(tokens[1:])
    nll_p = -lp[np.arange(len(nxt)), nxt].mean()
    nll_q = -lq[np.arange(len(nxt)), nxt].mean()
    return {"kl": float(kl.mean()), "kl_max": float(kl.max()),
            "top1_differs": float((truth.argmax(-1) != logits.argmax(-1)).mean()),
            "ppl_ratio": float(np.exp(nll_q - nll_p))}


def polydev_logits(path: str, tokens: list[int], numerics: str) -> np.ndarray:
    """Every position's logits, the tokens evaluated one at a time as in generation."""
    from polydev.models import load

    with load(path, devices=[], n_ctx=N_TOKENS + 16, numerics=numerics, progress=False) as m:
        rows = []
        for token in tokens:
            m.eval([token])
            rows.append(m.logits())
        return np.stack(rows)


def llama_cpp_logits(path: str, tokens: list[int]) -> np.ndarray | str:
    try:
        import llama_cpp
    except ImportError as e:
        return f"llama-cpp-python is not installed ({e})"
    llm = llama_cpp.Llama(path, n_ctx=N_TOKENS + 16, n_batch=512, n_threads=2,
                          logits_all=True, verbose=False)
    try:
        llm.eval(tokens)
        return np.array(llm.scores[:len(tokens)], dtype=np.float32)
    finally:
        llm.close()


def main(argv: list[str] | None = None) -> int:
    import gguf
    from polydev.models import GGUFFile
    from polydev.models.tokenizer import Tokenizer

    import reference_models

    args = parse_args(__doc__, argv)
    n_tokens = 64 if args.quick else N_TOKENS
    text_name, text = real_text()
    figures = []
    for label, path in real_models().items():
        with GGUFFile(path) as f:
            tokens = Tokenizer.from_gguf(f).encode(text, True, False)[:n_tokens]
        truth = reference_models.forward(gguf.GGUFReader(path), tokens)
        engines = {"polydev exact": polydev_logits(path, tokens, "exact"),
                   "polydev fast (default)": polydev_logits(path, tokens, "fast"),
                   "polydev int8": polydev_logits(path, tokens, "int8"),
                   "llama.cpp": llama_cpp_logits(path, tokens)}
        for engine, logits in engines.items():
            name = f"{label}: {engine}, mean KL from float64"
            if isinstance(logits, str):
                figures.append({"name": name, "value": None, "unit": "nats", "target": None,
                                "better": "lower", "detail": logits})
                continue
            c = compare(truth, logits, tokens)
            figures.append({"name": name, "value": float(f"{c['kl']:.3g}"), "unit": "nats",
                            "target": None, "better": "lower",
                            "detail": f"max {c['kl_max']:.2g}; top token differs at "
                                      f"{100 * c['top1_differs']:.1f}% of positions; "
                                      f"perplexity x{c['ppl_ratio']:.5f}"})
    print_figures("accuracy", f"{n_tokens} tokens of {text_name}", figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
