"""Sampling (llama.cpp's chain, written out independently here), UTF-8 streaming, chat
templates, and ``polydev run`` as people use it."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("regex")

from polydev.errors import InvalidArgumentError  # noqa: E402
from polydev.models.chat_template import CHATML, render_chat  # noqa: E402
from polydev.models import sampling  # noqa: E402
from polydev.models.sampling import Sampler, SamplingParams  # noqa: E402
from polydev.models.streaming import Utf8Stream  # noqa: E402
from polydev.tools.cli import main  # noqa: E402

from model_files import SMOLLM2, gguf_reader, model_path, write_test_model  # noqa: E402
from needs import OPENCL, opencl_mark  # noqa: E402


def survivors(logits: np.ndarray, top_k: int, top_p: float, min_p: float) -> set[int]:
    """llama.cpp's top-k, top-p, min-p in order, over sorted (logit, id) pairs."""
    order = sorted(range(len(logits)), key=lambda i: -logits[i])
    if top_k > 0:
        order = order[:top_k]
    probs = np.exp(np.array([logits[i] for i in order]) - logits[order[0]])
    probs /= probs.sum()
    cum, kept = 0.0, []
    for i, p in zip(order, probs):
        kept.append(i)
        cum += p
        if cum >= top_p:
            break
    best = logits[kept[0]]
    return {i for i in kept if logits[i] >= best + np.log(min_p)} if min_p > 0 else set(kept)


@pytest.mark.parametrize("top_k, top_p, min_p", [(40, 0.95, 0.05), (5, 1.0, 0.0), (0, 0.5, 0.0),
                                                 (0, 1.0, 0.2), (3, 0.9, 0.1)])
def test_the_chain_draws_only_survivors(top_k, top_p, min_p):
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(300) * 2).astype(np.float32)
    allowed = survivors(logits, top_k, top_p, min_p)
    sampler = Sampler(SamplingParams(temperature=1.5, top_k=top_k, top_p=top_p, min_p=min_p,
                                     seed=7))
    drawn = {sampler.sample(logits) for _ in range(400)}
    assert drawn <= allowed
    assert len(drawn) > 1 or len(allowed) == 1


def _k_largest(values: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest values, by value descending then id ascending."""
    return np.lexsort((np.arange(len(values)), -values))[:k]


def _vocabulary_logits(rng, n: int, case: str) -> np.ndarray:
    logits = (rng.standard_normal(n) * 3).astype(np.float32)
    if case == "ties":                     # a few values, each many times
        logits = np.round(logits).astype(np.float32)
    elif case == "masked":                 # a grammar's mask: all but a few at minus infinity
        logits[rng.random(n) < 0.999] = -np.inf
    elif case == "flat":
        logits[:] = 1.0
    elif case == "one block":              # the largest values crowded into one block
        logits[1000:1256] += 100.0
    elif case == "nan":
        logits[777] = np.nan
    return logits


@pytest.mark.parametrize("n", [262144, 49152, 32000 + 77, 5000])
@pytest.mark.parametrize("case", ["random", "ties", "masked", "flat", "one block", "nan"])
def test_top_k_over_a_vocabulary_is_the_k_largest_with_lower_ids_first(n, case):
    """The top-k step bounds the k-th largest value by blocks' maxima before selecting: the
    ids, their order and the ties are those of a full sort."""
    rng = np.random.default_rng(n)
    logits = _vocabulary_logits(rng, n, case)
    for k in (1, 5, 40, 200, n - 1):
        ids, values = sampling._top_k(logits, k)
        as_numbers = np.where(np.isnan(logits), -np.inf, logits)     # a NaN is the least
        np.testing.assert_array_equal(ids, _k_largest(as_numbers, k))
        np.testing.assert_array_equal(values, as_numbers[ids])


def test_a_nan_logit_is_never_drawn_while_a_number_is_left():
    logits = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    logits[[3, 500]] = np.nan
    numbers = np.where(np.isnan(logits), -np.inf, logits)
    assert Sampler(SamplingParams(temperature=0)).sample(logits) == int(np.argmax(numbers))
    drawn = {Sampler(SamplingParams(seed=s, top_k=0, top_p=1.0, min_p=0.0)).sample(logits)
             for s in range(50)}
    assert not drawn & {3, 500}


def test_temperature_zero_is_greedy_and_seeds_repeat():
    logits = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    assert Sampler(SamplingParams(temperature=0)).sample(logits) == int(np.argmax(logits))
    a = [Sampler(SamplingParams(seed=3)).sample(logits) for _ in range(5)]
    assert len(set(a)) == 1
    s1, s2 = Sampler(SamplingParams(seed=11)), Sampler(SamplingParams(seed=11))
    assert [s1.sample(logits) for _ in range(20)] == [s2.sample(logits) for _ in range(20)]


def test_repeat_penalty_as_llama_cpp():
    logits = np.array([2.0, -1.0, 1.5, 0.5], np.float32)
    s = Sampler(SamplingParams(temperature=0, repeat_penalty=2.0, repeat_last_n=2))
    for t in (0, 1, 3):                  # only the last two (1, 3) count
        s.accept(t)
    penalized = s._penalize(logits.copy())
    np.testing.assert_allclose(penalized, [2.0, -2.0, 1.5, 0.25])
    assert s.sample(logits) == 0
    with pytest.raises(InvalidArgumentError):
        SamplingParams(top_p=1.5)


@pytest.mark.parametrize("text", ["héllo wörld", "日本語テキスト", "emoji 🦙🚀 done", "plain"])
def test_utf8_stream_holds_back_split_characters(text):
    data = text.encode()
    for size in (1, 2, 3):
        stream = Utf8Stream()
        out = [stream.feed(data[i:i + size]) for i in range(0, len(data), size)]
        assert all("\ufffd" not in piece for piece in out)
        assert "".join(out) + stream.flush() == text


def test_chat_templates_render_as_transformers():
    messages = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": "2+2?"}]
    assert render_chat(CHATML, messages) == (
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")
    template = str(gguf_reader(model_path(SMOLLM2)).fields["tokenizer.chat_template"].contents())
    prompt = render_chat(template, messages[:1])
    assert prompt.startswith("<|im_start|>system\n") and prompt.endswith(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(InvalidArgumentError, match="'role' and 'content'"):
        render_chat(CHATML, [{"content": "no role"}])
    with pytest.raises(InvalidArgumentError, match="refused"):
        render_chat("{{ raise_exception('only user turns') }}", messages)


def test_tojson_beside_text_stays_text():
    """Templates join markup and JSON (gpt-oss's tool turns, Qwen's tool lists): jinja2's own
    ``tojson`` returns markup, and the text beside it came out HTML-escaped."""
    template = ("{%- set ns = namespace(n=0) -%}{%- for m in messages -%}{%- set ns.n = ns.n + 1 "
                "-%}{{ '<|start|>' + m.role + '<|message|>' + m.content|tojson + '<|end|>' }}"
                "{%- endfor -%}{{ ns.n }}")
    messages = [{"role": "tool", "content": {"city": "Zürich", "t": [1, 2]}}]
    assert render_chat(template, messages) == (
        '<|start|>tool<|message|>{"city": "Zürich", "t": [1, 2]}<|end|>1')


# --- polydev run ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    return str(write_test_model(tmp_path_factory.mktemp("run") / "m.gguf", n_layer=2))


def test_run_streams_text_and_prints_a_summary(capsys, small_model):
    assert main(["run", "-m", small_model, "-p", "w1 w2", "-n", "8", "--temp", "0",
                 "--no-progress", "--show-placement", "--device", "none"]) == 0
    out, err = capsys.readouterr()
    assert out.strip()                                    # some text
    assert "prompt eval time" in err and "eval time" in err and "splits per step" in err
    assert "0-1, output" in err                           # the placement table
    assert "system_info: CPU kernels = " in err and "numerics = fast" in err


def test_run_is_deterministic_when_greedy(capsys, small_model):
    texts = []
    for _ in range(2):
        assert main(["run", "-m", small_model, "-p", "w5", "-n", "6", "--temp", "0",
                     "--no-progress"]) == 0
        texts.append(capsys.readouterr().out)
    assert texts[0] == texts[1]


def test_run_ends_at_a_stop_string(capsys, small_model):
    argv = ["run", "-m", small_model, "-p", "w5", "-n", "12", "--temp", "0", "--no-progress"]
    assert main(argv) == 0
    text = capsys.readouterr().out.rstrip("\n")
    stop = text[4:6]
    assert main([*argv, "--stop", "no such text", "--stop", stop]) == 0
    assert capsys.readouterr().out.rstrip("\n") == text[:text.index(stop)]


@pytest.mark.parametrize("argv, message", [
    (["-n", "-1"], "-n must be 0 or more"),
    (["-f", "/no/such/prompt.txt"], "cannot read the prompt file"),
    (["-p", "x", "-f", "y"], "not both"),
    (["--top-p", "2"], "top_p"),
    (["-c", "0"], "positive"),
])
def test_run_mistakes_are_one_line(capsys, small_model, argv, message):
    assert main(["run", "-m", small_model, "--no-progress", *argv]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


# --- polydev compare --model --------------------------------------------------------------------

@opencl_mark()
def test_compare_model_on_opencl(capsys, small_model, monkeypatch):
    assert main(["compare", "--model", small_model, "-b", OPENCL[0].name, "--prompt",
                 "w1 w2 w3"]) == 0
    assert "agree on all" in capsys.readouterr().out
    from polydev.tools.compare import model as compare_model
    monkeypatch.setattr(compare_model, "OTHER_NMSE", -1.0)   # every node now "differs"
    monkeypatch.setattr(compare_model, "PRODUCT_NMSE", -1.0)
    assert main(["compare", "--model", small_model, "-b", OPENCL[0].name]) == 1
    out = capsys.readouterr().out
    assert "NMSE" in out and "CPU value" in out and OPENCL[0].name in out


def test_compare_model_needs_a_device(capsys, small_model):
    assert main(["compare", "--model", small_model]) == 1
    assert "-b" in capsys.readouterr().err


# --- polydev bench ------------------------------------------------------------------------------

def test_bench_rows_in_every_format(capsys, small_model):
    assert main(["bench", "-m", small_model, "-p", "16", "-n", "4", "-pg", "8,2", "-r", "2",
                 "-o", "json", "--device", "none"]) == 0
    rows = __import__("json").loads(capsys.readouterr().out)
    assert [r["test"] for r in rows] == ["pp16", "tg4", "pp8+tg2"]
    assert all(r["t_s"] > 0 and r["reps"] == 2 and r["devices"] == "CPU" for r in rows)
    assert main(["bench", "-m", small_model, "-p", "8", "-n", "0", "-r", "1", "-o", "jsonl"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and '"test": "pp8"' in lines[0]
    assert main(["bench", "-m", small_model, "-p", "8", "-n", "2", "-r", "1"]) == 0
    table = capsys.readouterr().out
    assert table.startswith("| model |") and "| pp8 |" in table and "| tg2 |" in table
    assert main(["bench", "-m", small_model, "-p", "8", "-n", "0", "-r", "1", "-o", "csv"]) == 0
    assert capsys.readouterr().out.startswith("model,size_mib,params_m")


@pytest.mark.parametrize("argv, message", [(["-p", "0", "-n", "0"], "nothing to measure"),
                                           (["-r", "0"], "-r must be"),
                                           (["-pg", "5"], "expected P,N"),
                                           (["-p", "x"], "expected numbers")])
def test_bench_mistakes_are_one_line(capsys, small_model, argv, message):
    assert main(["bench", "-m", small_model, *argv]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "".join(err)
