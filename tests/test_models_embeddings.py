"""Embeddings: the final hidden state pooled and normalized as llama.cpp does. On the real
models they equal a float64 evaluation (polydev's exact numerics) and llama.cpp's own vectors
within llama.cpp's error; many inputs batched together equal each alone."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")

from polydev.errors import ContextFullError, InvalidArgumentError  # noqa: E402
from polydev.models import load  # noqa: E402
from polydev.models.embeddings import normalize  # noqa: E402
from polydev.models.kv_cells import MAX_SEQUENCES  # noqa: E402

import llama_process  # noqa: E402
from model_files import GEMMA3, SMOLLM2, model_path, write_test_model  # noqa: E402

TEXTS = ["Hello world", "The capital of France is Paris.",
         "   tabs\tand \u00fcn\u00efc\u00f6d\u00e9 \u2014 \u201cquotes\u201d"]
# llama.cpp's own distance from float64 (its activations are quantized to 8 bits in its
# products): gemma-3's vectors 0.9979-0.9995 cosine from exact ones, SmolLM2's above 0.9995
LLAMA_CPP_COSINE = {SMOLLM2: 0.999, GEMMA3: 0.997}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.mark.parametrize("name", [SMOLLM2, GEMMA3])
def test_real_models_embed_as_float64_and_llama_cpp_do(name):
    path = model_path(name)
    with load(path, devices=[], n_ctx=512, progress=False) as m:
        fast = {p: np.array(m.embed(TEXTS, pooling=p, normalization=-1))
                for p in ("mean", "cls", "last")}
    with load(path, devices=[], n_ctx=512, progress=False, numerics="exact") as m:
        exact = np.array(m.embed(TEXTS, pooling="mean", normalization=-1))
    assert cosines(fast["mean"], exact).min() > 0.99999
    for pooling, code in (("mean", 1), ("cls", 2), ("last", 3)):
        theirs = llama_process.embeddings(path, TEXTS, code)
        assert cosines(fast[pooling], theirs).min() > LLAMA_CPP_COSINE[name], pooling
        assert np.allclose(np.linalg.norm(fast[pooling], axis=1),
                           np.linalg.norm(theirs, axis=1), rtol=0.03)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_test_model(tmp_path_factory.mktemp("embed") / "m.gguf", n_layer=2,
                            weight_type="F16")
    with load(path, devices=[], n_ctx=128, progress=False) as m:
        yield m


def test_inputs_together_equal_each_alone_and_poolings_agree(model):
    rng = np.random.default_rng(3)
    inputs = [list(rng.integers(3, 300, n)) for n in (5, 1, 17, 9, 30, 2)]
    together = model.embed(inputs, pooling="mean")
    for ids, vector in zip(inputs, together):
        assert np.allclose(model.embed([ids], pooling="mean")[0], vector, atol=1e-5)
        assert np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-5)
    rows = model.embed(inputs, pooling="none", normalization=-1)
    for ids, r, mean, cls, last in zip(inputs, rows,
                                       model.embed(inputs, pooling="mean", normalization=-1),
                                       model.embed(inputs, pooling="cls", normalization=-1),
                                       model.embed(inputs, pooling="last", normalization=-1)):
        assert r.shape == (len(ids), model.hparams.n_embd)
        assert np.allclose(r.mean(axis=0), mean, atol=1e-5)
        assert np.allclose(r[0], cls, atol=1e-5) and np.allclose(r[-1], last, atol=1e-5)


def test_more_inputs_than_sequences_and_cells(model):
    rng = np.random.default_rng(4)
    inputs = [list(rng.integers(3, 300, 7)) for _ in range(MAX_SEQUENCES + 5)]   # 483 cells
    vectors = model.embed(inputs)
    assert len(vectors) == len(inputs) and model.memory.cells.used == 0
    assert np.allclose(vectors[-1], model.embed([inputs[-1]])[0], atol=1e-5)
    text = "".join(model.generate("w1 w2", 3, temperature=0))     # the model goes on
    assert isinstance(text, str)


def test_normalizations_are_llama_servers():
    x = np.array([[3.0, -4.0], [0.0, 0.0]], dtype=np.float32)
    assert np.allclose(normalize(x, 2), [[0.6, -0.8], [0, 0]])
    assert np.allclose(normalize(x, 1), [[3 / 7, -4 / 7], [0, 0]])
    assert np.allclose(normalize(x, 0), [[3 * 32760 / 4, -32760], [0, 0]])
    assert np.allclose(normalize(x, -1), x)
    assert np.allclose(normalize(x, 3), x / (27 + 64) ** (1 / 3))


def test_bad_inputs_are_typed_errors(model):
    with pytest.raises(InvalidArgumentError, match="input 1 has no tokens"):
        model.embed([[5], []])
    n = model.n_ctx + 1
    with pytest.raises(ContextFullError, match=f"input 0 has {n} tokens"):
        model.embed([[5] * n])
    with pytest.raises(InvalidArgumentError, match="pooling must be one of"):
        model.embed(["w1"], pooling="max")
