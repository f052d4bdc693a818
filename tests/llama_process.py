"""llama.cpp's evaluations in a process of their own.

ggml-python, the ggml oracle of tests/test_ggml_oracle*.py, loads its libggml with RTLD_GLOBAL.
From then on every ggml symbol llama.cpp's libllama looks up resolves to ggml-python's build,
another ggml than the one llama-cpp-python ships; and pytest imports every test module before
it runs one, so in a whole-suite run llama.cpp computed on the wrong ggml (seen: deepseek2's
older form 46% of the largest logit away from llama.cpp run alone). Whatever llama.cpp
computes for a test therefore runs here, in one child process started with "spawn", which
imports llama-cpp-python and numpy and never ggml-python.

Tokenizing and chat templates never reach ggml's arithmetic, so tests may still call those in
their own process.
"""

from __future__ import annotations

import atexit
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from needs import llama_cpp

_pool: ProcessPoolExecutor | None = None


def in_child(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` run in the child (a module-level function of a test helper, so the
    child can import it); skips or fails as ``needs.llama_cpp`` where llama.cpp is missing."""
    global _pool
    llama_cpp()
    if _pool is None:
        _pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        atexit.register(_pool.shutdown)
    return _pool.submit(function, *args).result()


def logits(path: str | Path, batches: Sequence[Sequence[int]], n_ctx: int = 64) -> np.ndarray:
    """llama.cpp's logits of every token of ``batches``, evaluated one batch after the other
    (a prompt, then decode steps): float64, [tokens, n_vocab]."""
    return in_child(_logits, str(path), [list(map(int, b)) for b in batches], n_ctx)


def _logits(path: str, batches: list[list[int]], n_ctx: int) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_threads=2, logits_all=True, verbose=False)
    try:
        for batch in batches:
            llm.eval(batch)
        return np.asarray(llm.scores[:llm.n_tokens], dtype=np.float64)
    finally:
        llm.close()


def embeddings(path: str | Path, texts: Sequence[str], pooling: int) -> np.ndarray:
    """llama.cpp's embedding of each text (``pooling``: llama_pooling_type; 1 mean, 2 cls,
    3 last), unnormalized, float64: [texts, n_embd]."""
    return in_child(_embeddings, str(path), list(texts), pooling)


def _embeddings(path: str, texts: list[str], pooling: int) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(path, n_ctx=512, n_threads=2, embedding=True, pooling_type=pooling,
                          verbose=False)
    try:
        return np.asarray([llm.embed(text, normalize=False) for text in texts],
                          dtype=np.float64)
    finally:
        llm.close()
