"""Speculative decoding: a draft model's or the text's own n-grams' guesses, checked by the
target in one batch. Whatever the drafts, every request yields the tokens it yields without
them: greedy and seeded sampling alike (each kept token is one the sampler drew from the
target's logits, one draw per token as without drafts), grammars included."""

from __future__ import annotations

import pytest

pytest.importorskip("gguf")

from polydev.errors import InvalidArgumentError  # noqa: E402
from polydev.models import SamplingParams, load  # noqa: E402
from polydev.models.engine import BatchEngine, Piece  # noqa: E402
from polydev.models.speculative import (ModelDrafter, NgramDrafter,  # noqa: E402
                                        SpeculativeSettings)

from model_files import write_test_model  # noqa: E402
from test_models_batch import tokens_for  # noqa: E402

N_CTX = 256


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    return (write_test_model(root / "target.gguf", n_layer=2, weight_type="F16"),
            write_test_model(root / "draft.gguf", n_layer=1, weight_type="F16", seed=7))


def run(model, prompts, params, drafter=None, max_tokens=24, grammar=None):
    """Every prompt's tokens, generated together over three slots."""
    engine = BatchEngine(model, n_slots=3, drafter=drafter)
    tokens = {i: [] for i in range(len(prompts))}
    for i, prompt in enumerate(prompts):
        def on_event(event, i=i):
            if isinstance(event, Piece):
                tokens[i] += event.tokens
        constraint = None if grammar is None else model.grammar_vocabulary.matcher(grammar)
        engine.submit(prompt, on_event, max_tokens=max_tokens, params=params,
                      constraint=constraint)
    engine.run_until_done()
    return [tokens[i] for i in range(len(prompts))], engine


def repetitive(seed: int) -> list[int]:
    phrase = tokens_for(6, seed)
    return phrase * 4 + phrase[:3]


PROMPTS = [repetitive(1), tokens_for(9, 2), repetitive(3), tokens_for(4, 4)]
PARAMS = [SamplingParams(temperature=0),
          SamplingParams(temperature=1.0, min_p=0.0, top_k=0, seed=11)]


@pytest.mark.parametrize("params", PARAMS, ids=["greedy", "sampled"])
def test_drafts_change_nothing_but_the_speed(files, params):
    target, draft = files
    with load(target, devices=[], n_ctx=N_CTX, progress=False) as m:
        plain, _ = run(m, PROMPTS, params)
        ngram, engine = run(m, PROMPTS, params, NgramDrafter(SpeculativeSettings(draft_max=5)))
        assert ngram == plain
        assert engine.drafted_tokens > 0 or params.temperature > 0   # sampled text may not repeat
        with load(draft, devices=[], n_ctx=N_CTX, progress=False) as d:
            drafter = ModelDrafter(d, m.hparams.n_vocab, SpeculativeSettings(p_min=0.0))
            drafted, engine = run(m, PROMPTS, params, drafter)
        assert drafted == plain and engine.drafted_tokens > 0


def test_the_model_drafting_for_itself_is_kept(files):
    target, _ = files
    with (load(target, devices=[], n_ctx=N_CTX, progress=False) as m,
          load(target, devices=[], n_ctx=N_CTX, progress=False) as same):
        plain, _ = run(m, PROMPTS, PARAMS[0], max_tokens=40)
        drafter = ModelDrafter(same, m.hparams.n_vocab,
                               SpeculativeSettings(draft_max=6, p_min=0.0))
        drafted, engine = run(m, PROMPTS, PARAMS[0], drafter, max_tokens=40)
    assert drafted == plain
    assert engine.accepted_tokens / engine.drafted_tokens > 0.9
    assert engine.accepted_tokens > 40          # tokens that took no step of their own


def test_a_grammar_holds_under_drafts(files):
    from polydev.models.grammar import Grammar

    pytest.importorskip("llguidance")
    target, _ = files
    grammar = Grammar("regex", r"(w[0-9] ){3,12}")
    with load(target, devices=[], n_ctx=N_CTX, progress=False) as m:
        plain, _ = run(m, PROMPTS, PARAMS[1], grammar=grammar)
        ngram, _ = run(m, PROMPTS, PARAMS[1], NgramDrafter(SpeculativeSettings(draft_max=4)),
                       grammar=grammar)
        assert ngram == plain


def test_settings_and_vocabularies_are_checked(files, tmp_path):
    for bad in (dict(draft_max=0), dict(draft_min=20), dict(p_min=1.5)):
        with pytest.raises(InvalidArgumentError):
            SpeculativeSettings(**bad)
    target, _ = files
    other = write_test_model(tmp_path / "v.gguf", n_layer=1, n_vocab=288, weight_type="F16")
    with (load(target, devices=[], n_ctx=N_CTX, progress=False) as m,
          load(other, devices=[], n_ctx=N_CTX, progress=False) as d):
        with pytest.raises(InvalidArgumentError, match="must be the same"):
            ModelDrafter(d, m.hparams.n_vocab)


def test_drafts_near_the_end_of_the_context_change_nothing(files):
    """A prompt that leaves a few cells: drafts are cut to the room, and the request ends
    where it ends without them."""
    target, _ = files
    with load(target, devices=[], n_ctx=N_CTX, progress=False) as m:
        prompt = (repetitive(5) * 12)[:m.n_ctx - 9]
        plain, _ = run(m, [prompt], PARAMS[0], max_tokens=50)
        ngram, engine = run(m, [prompt], PARAMS[0],
                            NgramDrafter(SpeculativeSettings(draft_max=16)), max_tokens=50)
    assert ngram == plain and len(plain[0]) < 12      # ended by the context, both
