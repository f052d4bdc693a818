"""llama.cpp's outputs on the two real models, recorded from the installed llama-cpp-python.

The tokenizer and model tests compare polydev with what llama.cpp gives for a few texts and
one prompt: its token ids, its ten best logits after the prompt, and its greedy continuation.
``records(name)`` asks the installed oracle for them the first time (a few seconds per model)
and keeps them as JSON in ``.test-data/llama-cpp/``, under a name of everything they depend on:
the model, llama-cpp-python's version, the model file's sha256, the recipe below and this
file's own text. A new llama-cpp-python, another file, a changed recipe or recording code
records again; nothing outside the repository is read. llama.cpp runs in a process of its own
(``llama_process``: in the test process its ggml may be ggml-python's).

The recipe is the one of the outputs first recorded with llama-cpp-python 0.3.36: CPU, two
threads; ``tokenize(text, add_bos=True, special=True)``; greedy decoding (the best logit at each
step: temperature 0, top-k 1, no repetition penalty) for 32 tokens or to an end-of-generation
token; the ten best logits for the token after the prompt, rounded to 4 decimals.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from polydev.files import write_atomic

import llama_process
from model_files import model_path
from needs import llama_cpp

log = logging.getLogger(__name__)

CACHE = Path(__file__).resolve().parent.parent / ".test-data" / "llama-cpp"
TEXTS = [
    "The capital of France is",
    "Hello, world!  multiple   spaces\nnewline",
    "   \n\n\t tabs\tand \u00fcn\u00efc\u00f6d\u00e9 \u2014 \u201cquotes\u201d don't I'm",
]
PROMPT = "The capital of France is"
RECIPE = {"n_threads": 2, "n_ctx": 512, "tokenize": "add_bos=True, special=True",
          "greedy_tokens": 32, "top": 10, "logit_decimals": 4, "texts": TEXTS, "prompt": PROMPT}

_RECORDS: dict[str, dict] = {}


def records(name: str) -> dict:
    """llama.cpp's outputs on the real model ``name``: ``{"tokenize": {text: ids},
    "generate": [{"prompt", "prompt_ids", "top10_ids", "top10_logits", "greedy_ids",
    "greedy_text"}]}``. Skips (or fails, with POLYDEV_REQUIRE_LLAMA_CPP or
    POLYDEV_REQUIRE_MODELS set) where llama-cpp-python or the model is missing."""
    if name not in _RECORDS:
        oracle = llama_cpp()
        path = model_path(name)
        cached = CACHE / f"{name}.{_key(oracle.__version__, path)}.json"
        try:
            _RECORDS[name] = json.loads(cached.read_text(encoding="utf-8"))["models"][name]
        except (FileNotFoundError, ValueError, KeyError):     # none yet, or not whole
            _RECORDS[name] = _record(oracle.__version__, name, path, cached)
    return _RECORDS[name]


def _key(version: str, path: Path) -> str:
    """A name for everything the records depend on besides the model's name."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    recipe = json.dumps(RECIPE, sort_keys=True).encode() + Path(__file__).read_bytes()
    return (f"llama-cpp-python-{version}.{digest.hexdigest()[:16]}."
            f"{hashlib.sha256(recipe).hexdigest()[:8]}")


def _record(version: str, name: str, path: Path, cached: Path) -> dict:
    """Ask llama.cpp, and keep its answers in ``cached`` (written whole or not at all: two
    test processes may record at once)."""
    log.info("recording llama.cpp's outputs on %s into %s", name, cached)
    model = llama_process.in_child(_outputs, str(path))
    about = (f"llama.cpp's outputs (llama-cpp-python {version}, CPU) on {path}, "
             f"recorded by tests/llama_oracle.py")
    CACHE.mkdir(parents=True, exist_ok=True)
    write_atomic(cached, json.dumps({"about": about, "recipe": RECIPE, "models": {name: model}},
                                    ensure_ascii=False, indent=1))
    return model


def _outputs(path: str) -> dict:
    """What the recipe asks of llama.cpp on the model at ``path`` (in llama_process's child)."""
    import llama_cpp as oracle

    llm = oracle.Llama(path, n_ctx=RECIPE["n_ctx"], n_threads=RECIPE["n_threads"],
                       logits_all=True, verbose=False)
    try:
        return {"tokenize": {text: _tokenize(llm, text) for text in TEXTS},
                "generate": [_generate(oracle, llm, PROMPT)]}
    finally:
        llm.close()


def _tokenize(llm: Any, text: str) -> list[int]:
    return llm.tokenize(text.encode(), add_bos=True, special=True)


def _generate(oracle: Any, llm: Any, prompt: str) -> dict:
    """The ten best logits after ``prompt`` and the greedy continuation."""
    prompt_ids = _tokenize(llm, prompt)
    vocab = oracle.llama_model_get_vocab(llm.model)
    llm.reset()
    llm.eval(prompt_ids)
    first = np.array(llm.scores[llm.n_tokens - 1])
    top = np.argsort(-first, kind="stable")[:RECIPE["top"]]
    greedy: list[int] = []
    while len(greedy) < RECIPE["greedy_tokens"]:
        best = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        if oracle.llama_vocab_is_eog(vocab, best):
            break
        greedy.append(best)
        llm.eval([best])
    return {"prompt": prompt, "prompt_ids": prompt_ids,
            "top10_ids": [int(i) for i in top],
            "top10_logits": [round(float(first[i]), RECIPE["logit_decimals"]) for i in top],
            "greedy_ids": greedy,
            "greedy_text": llm.detokenize(greedy).decode("utf-8", errors="replace")}
