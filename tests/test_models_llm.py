"""Running models: every architecture against a float64 numpy implementation (tests/
reference_models.py), the KV cache across its 256-cell boundaries, prompt ubatches, layers
split over devices, and the two real models against the float64 reference and llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("regex")

from polydev.errors import GGUFError, InvalidArgumentError  # noqa: E402
from polydev.models import load  # noqa: E402

import llama_process  # noqa: E402
import reference_models  # noqa: E402
from llama_oracle import PROMPT, records  # noqa: E402
from needs import OPENCL, opencl_devices, opencl_mark  # noqa: E402
from model_files import GEMMA3, SMOLLM2, gguf_reader, model_path, write_test_model  # noqa: E402

needs_opencl = opencl_mark()

ARCHS = {
    "llama": dict(arch="llama"),
    "qwen2": dict(arch="qwen2"),
    "qwen3": dict(arch="qwen3", head_dim=32),
    "qwen3moe": dict(arch="qwen3moe", n_expert=4, head_dim=32),
    "gemma3": dict(arch="gemma3", head_dim=32, sliding_window=4, n_layer=6),
}


@pytest.fixture(scope="module", params=list(ARCHS))
def arch_model(request, tmp_path_factory):
    kwargs = dict(n_layer=3, weight_type="F16") | ARCHS[request.param]
    path = write_test_model(tmp_path_factory.mktemp(request.param) / "m.gguf", **kwargs)
    return request.param, path


def tokens_for(n: int, seed: int = 1, n_vocab: int = 320) -> list[int]:
    return np.random.default_rng(seed).integers(0, n_vocab, n).tolist()


def test_every_architecture_matches_float64(arch_model):
    """All tokens' logits of a prompt against plain float64 numpy (F32 cache: only float32
    rounding separates them)."""
    name, path = arch_model
    ids = tokens_for(12)
    want = reference_models.forward(gguf_reader(path), ids)
    with load(path, devices=[], n_ctx=256, type_k="f32", type_v="f32", progress=False) as m:
        m.eval(ids, all_logits=True)
        got = m.logits()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=2e-3 * np.abs(want).max(), err_msg=name)


def test_f16_cache_and_decode_steps(arch_model):
    """The default F16 cache, a prompt then single-token steps: each step's logits equal the
    float64 logits of the whole sequence at that position."""
    name, path = arch_model
    ids = tokens_for(10, seed=2)
    want = reference_models.forward(gguf_reader(path), ids)
    with load(path, devices=[], n_ctx=256, progress=False) as m:
        m.eval(ids[:6])
        rows = [m.logits()]
        for t in ids[6:]:
            m.eval([t])
            rows.append(m.logits())
    np.testing.assert_allclose(np.stack(rows), want[5:], atol=1e-2 * np.abs(want).max(),
                               err_msg=name)


def _mean_kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    def log_softmax(z):
        z = z - z.max(axis=-1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    lp, lq = log_softmax(p_logits.astype(np.float64)), log_softmax(q_logits.astype(np.float64))
    return float((np.exp(lp) * (lp - lq)).sum(axis=-1).mean())


def _decode_logits(path, ids: list[int], numerics: str) -> np.ndarray:
    """Every position's logits, the tokens decoded one at a time under ``numerics``."""
    with load(path, devices=[], n_ctx=64, type_k="f32", type_v="f32", numerics=numerics,
              progress=False) as m:
        rows = []
        for t in ids:
            m.eval([t])
            rows.append(m.logits())
        return np.stack(rows)


@pytest.mark.parametrize("weight_type", ["Q4_K", "Q6_K", "Q4_0", "Q8_0"])
def test_decode_numerics_fast_and_exact_against_float64(tmp_path, weight_type):
    """Decode steps of a quantized model under both numerics: "exact" is float32 arithmetic
    on the decoded weights, "fast" (the default) multiplies int16 activations. Both stay
    within a KL divergence of 1e-4 of float64 (llama.cpp's 8-bit activations: 5e-3 on the
    real models, bench/accuracy.py), and "fast" does run its own products."""
    path = write_test_model(tmp_path / "m.gguf", n_layer=2, n_embd=256, n_head=4, n_head_kv=2,
                            n_ff=512, weight_type=weight_type)
    ids = tokens_for(8, seed=3)
    want = reference_models.forward(gguf_reader(path), ids)
    got = {}
    for numerics in ("exact", "fast"):
        got[numerics] = _decode_logits(path, ids, numerics)
        assert _mean_kl(want, got[numerics]) < 1e-4, numerics
        np.testing.assert_allclose(got[numerics], want, atol=2e-3 * np.abs(want).max())
    assert not np.array_equal(got["fast"], got["exact"])


@pytest.mark.parametrize("weight_type", ["Q4_K", "Q5_K", "Q6_K", "Q4_1", "Q8_0"])
def test_decode_numerics_int8_against_float64(tmp_path, weight_type):
    """numerics="int8" (llama.cpp's 8-bit activations, where the build has the kernels) stays
    within the KL divergence llama.cpp has on the real models (5e-3; 1e-3 measured here), and
    where the kernels exist its products are its own."""
    from polydev.backends.cpu.native import kernels

    path = write_test_model(tmp_path / "m.gguf", n_layer=2, n_embd=256, n_head=4, n_head_kv=2,
                            n_ff=512, weight_type=weight_type)
    ids = tokens_for(8, seed=3)
    want = reference_models.forward(gguf_reader(path), ids)
    got = {numerics: _decode_logits(path, ids, numerics) for numerics in ("fast", "int8")}
    assert _mean_kl(want, got["int8"]) < 5e-3
    lib = kernels()
    assert (lib is not None and lib.has_int8_products) != np.array_equal(got["int8"], got["fast"])


def test_a_bad_numerics_is_an_error_before_loading(tmp_path):
    with pytest.raises(InvalidArgumentError, match="numerics must be one of exact, fast, int8"):
        load(tmp_path / "absent.gguf", numerics="approximate")


@pytest.mark.parametrize("n_layer, pattern", [
    (3, None),                          # fewer than 6 layers: all slide under the default 6
    (4, [True, True, True, True]),      # a per-layer array with no global layer
    (4, 0),                             # the number 0: every layer slides
    (3, 1),                             # the number 1: no layer slides
    (5, [False, True]),                 # an array shorter than the layers: the rest global
])
def test_gemma3_sliding_window_patterns(tmp_path, n_layer, pattern):
    """gemma3 reads ``attention.sliding_window_pattern`` as llama.cpp does, and a step whose
    graph never reads one of the two masks (all layers slide, or none) still runs: prompt
    and decode logits equal the float64 evaluation."""
    path = write_test_model(tmp_path / "m.gguf", arch="gemma3", head_dim=32, sliding_window=4,
                            n_layer=n_layer, weight_type="F16", swa_pattern=pattern)
    ids = tokens_for(12, seed=5)
    want = reference_models.forward(gguf_reader(path), ids)
    with load(path, devices=[], n_ctx=256, type_k="f32", type_v="f32", progress=False) as m:
        m.eval(ids[:8], all_logits=True)
        rows = list(m.logits())
        for t in ids[8:]:
            m.eval([t])
            rows.append(m.logits())
    np.testing.assert_allclose(np.stack(rows), want, atol=2e-3 * np.abs(want).max())


@pytest.mark.parametrize("n_layer, pattern", [(3, None), (4, [True] * 4), (5, [False, True])])
def test_gemma3_sliding_window_patterns_against_llama_cpp(tmp_path, n_layer, pattern):
    """llama.cpp itself on the same files gives the same logits, within its own F16 rounding
    (1e-3 of the largest logit here, as on gemma3's default pattern; reading the pattern
    wrongly differs by 0.86). Pattern 1 (no sliding layer) is ours alone: llama.cpp aborts on
    a file with a window and no sliding layer."""
    path = write_test_model(tmp_path / "m.gguf", arch="gemma3", head_dim=32, sliding_window=4,
                            n_layer=n_layer, weight_type="F16", swa_pattern=pattern)
    ids = tokens_for(12, seed=5)
    theirs = llama_process.logits(path, [ids])
    with load(path, devices=[], n_ctx=64, progress=False) as m:
        m.eval(ids, all_logits=True)
        ours = m.logits()
    np.testing.assert_allclose(ours, theirs, atol=3e-3 * np.abs(theirs).max())


@pytest.mark.parametrize("pattern, message", [
    ([True] * 5, "at most 4 booleans or integers"),
    ([0.5, 1.0], "at most 4 booleans or integers"),
])
def test_gemma3_bad_sliding_window_pattern_is_a_gguf_error(tmp_path, pattern, message):
    path = write_test_model(tmp_path / "m.gguf", arch="gemma3", head_dim=32, sliding_window=4,
                            n_layer=4, weight_type="F16", swa_pattern=pattern)
    with pytest.raises(GGUFError, match=f"sliding_window_pattern must be {message}"):
        load(path, devices=[], n_ctx=64, progress=False)


def test_decode_across_256_cell_boundaries(tmp_path):
    """300 decode steps (n_kv grows 256 -> 512) give the logits a fresh evaluation of the
    whole sequence gives, and a prompt in ubatches of 7 equals one batch."""
    path = write_test_model(tmp_path / "m.gguf", n_layer=2, weight_type="F16")
    ids = tokens_for(300, seed=3)
    with load(path, devices=[], n_ctx=512, n_batch=512, progress=False) as m:
        m.eval(ids, all_logits=True)
        whole = m.logits()
        m.reset()
        m.eval(ids[:1])
        steps = [m.logits()]
        for t in ids[1:]:
            m.eval([t])
            steps.append(m.logits())
        assert m.timings.graphs_built <= 4      # a prompt, then one decode graph per 256 cells
    np.testing.assert_allclose(np.stack(steps), whole, atol=1e-4 * np.abs(whole).max())
    with load(path, devices=[], n_ctx=512, n_batch=7, progress=False) as m:
        m.eval(ids[:50], all_logits=True)
        np.testing.assert_allclose(m.logits(), whole[:50], atol=1e-4 * np.abs(whole).max())


def test_q8_0_and_f32_caches(tmp_path):
    """type_k/type_v on request: a Q8_0 cache stays close to float64; heads that are not whole
    Q8_0 blocks are refused by name."""
    path = write_test_model(tmp_path / "m.gguf", n_layer=2, head_dim=32, weight_type="F16")
    ids = tokens_for(20, seed=6)
    want = reference_models.forward(gguf_reader(path), ids)
    with load(path, devices=[], n_ctx=256, type_k="q8_0", type_v="q8_0", progress=False) as m:
        m.eval(ids, all_logits=True)
        np.testing.assert_allclose(m.logits(), want, atol=3e-2 * np.abs(want).max())
    small_heads = write_test_model(tmp_path / "s.gguf", n_layer=1)          # 16-value heads
    with pytest.raises(InvalidArgumentError, match="multiple of 32"):
        load(small_heads, devices=[], type_k="q8_0", progress=False)
    with pytest.raises(InvalidArgumentError, match="type_v must be one of"):
        load(small_heads, devices=[], type_v="q4_0", progress=False)


def test_generate_reuses_the_cached_prefix(tmp_path):
    """A second prompt that begins with the first one's context evaluates only what is new,
    and generates what a fresh model generates for it."""
    path = write_test_model(tmp_path / "m.gguf", n_layer=2)
    first, second = tokens_for(12, seed=7), tokens_for(12, seed=7) + tokens_for(5, seed=8)
    with load(path, devices=[], n_ctx=256, progress=False) as fresh:
        want = list(fresh.generate(second, 6, temperature=0))
        want_ids = fresh.generated
    with load(path, devices=[], n_ctx=256, progress=False) as m:
        list(m.generate(first, 3, temperature=0))
        t = m.timings
        before = t.prompt_tokens + t.eval_tokens
        assert list(m.generate(second, 6, temperature=0)) == want
        assert m.generated == want_ids and len(want_ids) == 6
        evaluated = t.prompt_tokens + t.eval_tokens - before
        assert evaluated == len(second) - 12 + 5       # the 5 new prompt tokens, 5 decode steps
        list(m.generate(tokens_for(4, seed=9), 2, temperature=0))   # nothing shared: starts over
        assert m.tokens[:4] == tokens_for(4, seed=9)


def test_context_limits_and_bad_tokens(tmp_path):
    path = write_test_model(tmp_path / "m.gguf", n_layer=1)
    with load(path, devices=[], n_ctx=256, progress=False) as m:
        with pytest.raises(InvalidArgumentError, match="token id 320 is outside the vocabulary"):
            m.eval([1, 320])
        with pytest.raises(InvalidArgumentError, match="token id -1 is outside"):
            m.eval(tokens_for(20) + [-1])        # more than a few: checked by numpy
        with pytest.raises(InvalidArgumentError, match="do not fit"):
            m.eval(tokens_for(257))
        with pytest.raises(InvalidArgumentError, match="no logits"):
            m.logits()
        m.eval([1, 2, 3])
        assert m.tokens == [1, 2, 3]


# --- layers over several devices -------------------------------------------------------------

@needs_opencl
@pytest.mark.parametrize("knobs", [
    dict(n_gpu_layers=2),                                      # the last layer and the output
    dict(n_gpu_layers=-1, tensor_split=[1, 1]),                # over two OpenCL devices
    dict(n_gpu_layers=-1, override_tensor=["ffn_(up|down)=CPU"]),
], ids=["ngl", "tensor_split", "override"])
def test_layers_over_devices_give_the_cpu_ids(tmp_path, knobs):
    path = write_test_model(tmp_path / "m.gguf", n_layer=3)
    ids = tokens_for(16, seed=4)
    devices = opencl_devices(2 if "tensor_split" in knobs else 1)
    with load(path, devices=[], progress=False) as cpu_model:
        want = list(cpu_model.generate(ids, 12, temperature=0))
        cpu_model.eval(ids, all_logits=True)
        want_logits = cpu_model.logits()
    with load(path, devices=devices, progress=False, **knobs) as m:
        assert {d.name for d in m.placement.layer_devices} > {"CPU"} or knobs.get("n_gpu_layers")
        assert len(m.evaluator.backends) >= 2
        got = list(m.generate(ids, 12, temperature=0))
        m.eval(ids, all_logits=True)
        np.testing.assert_allclose(m.logits(), want_logits, atol=1e-3 * np.abs(want_logits).max())
    assert got == want


@needs_opencl
def test_experts_on_the_cpu_with_cpu_moe(tmp_path):
    path = write_test_model(tmp_path / "moe.gguf", arch="qwen3moe", n_expert=4, head_dim=32,
                            n_layer=2)
    ids = tokens_for(10, seed=5)
    with load(path, devices=[], progress=False) as cpu_model:
        cpu_model.eval(ids, all_logits=True)
        want = cpu_model.logits()
    with load(path, devices=OPENCL[:1], cpu_moe=True, progress=False) as m:
        experts = [t for n, t in m.placement.tensors.items() if "_exps" in n]
        assert experts and all(t.device.name == "CPU" for t in experts)
        m.eval(ids, all_logits=True)
        np.testing.assert_allclose(m.logits(), want, atol=1e-3 * np.abs(want).max())


# --- the real models --------------------------------------------------------------------------

_REAL: dict[str, object] = {}


@pytest.fixture(scope="module")
def real_models():
    yield _REAL
    for m in _REAL.values():
        m.close()
    _REAL.clear()


def real(name: str, cache: dict):
    if name not in cache:
        cache[name] = load(model_path(name), devices=[], n_ctx=512, progress=False)
    model = cache[name]
    model.reset()
    return model


@pytest.mark.parametrize("name", [SMOLLM2, GEMMA3])
def test_real_model_matches_float64(real_models, name):
    """The prompt's next-token logits equal a float64 evaluation of the same weights."""
    m = real(name, real_models)
    prompt_ids = m.tokenize(PROMPT)
    m.eval(prompt_ids)
    got = m.logits()
    want = reference_models.forward(gguf_reader(model_path(name)), prompt_ids)[-1]
    assert int(np.argmax(got)) == int(np.argmax(want))
    np.testing.assert_allclose(got, want, atol=0.05)


@pytest.mark.parametrize("name", [SMOLLM2, GEMMA3])
def test_real_model_against_llama_cpp(real_models, name):
    """llama.cpp's recorded top-10 and logits, within the distance between llama.cpp's own
    CPU arithmetic and exact arithmetic (measured: up to 0.3 on these top logits): the same
    top-5 set, each top-10 logit within 0.35, and the greedy text the same up to the first
    step whose two best tokens llama.cpp itself separates by less than that (where the two
    arithmetics may choose differently)."""
    g = records(name)["generate"][0]
    m = real(name, real_models)
    m.eval(g["prompt_ids"])
    logits = m.logits()
    ours = np.argsort(-logits)[:10].tolist()
    assert set(ours[:5]) <= set(g["top10_ids"])
    assert np.abs(logits[g["top10_ids"]] - np.array(g["top10_logits"])).max() < 0.35
    text = "".join(m.generate(g["prompt_ids"], len(g["greedy_ids"]), temperature=0))
    ours = m.generated
    theirs = g["greedy_ids"]
    diverge = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if diverge is None:
        assert len(ours) == len(theirs) and text == g["greedy_text"]
        return
    margins = _llama_cpp_margins(name, g)
    assert margins[diverge] < NOISE, (
        f"step {diverge}: we chose {ours[diverge]}, llama.cpp {theirs[diverge]} with a margin "
        f"of {margins[diverge]:.3f}")


NOISE = 0.35     # measured distance of llama.cpp's CPU logits from exact arithmetic


def _llama_cpp_margins(name: str, g: dict) -> np.ndarray:
    """llama.cpp's margin between its two best tokens at each step of its greedy path (its
    own logits): whether llama.cpp itself chose there by less than its rounding noise."""
    ids = g["prompt_ids"] + g["greedy_ids"]
    scores = llama_process.logits(model_path(name), [ids], n_ctx=512)[len(g["prompt_ids"]) - 1:-1]
    top2 = np.sort(scores, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]
