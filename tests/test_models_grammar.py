"""Constrained sampling (llguidance) and log-probabilities: every reply a grammar constrains
matches it, whatever the model's weights want; a bad grammar is a GrammarError naming the
fault; a token's log-probability is the float64 log-softmax of the model's own logits."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from polydev.models import SamplingParams, load  # noqa: E402
from polydev.models.engine import BatchEngine, Piece  # noqa: E402
from polydev.models.grammar import Grammar, GrammarError  # noqa: E402

from model_files import write_test_model  # noqa: E402

SCHEMAS = [
    {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "role": {"enum": ["admin", "viewer"]},
        "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 3}},
     "required": ["name", "age", "role", "tags"], "additionalProperties": False},
    {"type": "array", "items": {"anyOf": [{"type": "null"}, {"type": "number"}]},
     "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"point": {"type": "object", "properties": {
        "x": {"type": "integer"}, "y": {"type": "integer"}}, "required": ["x", "y"],
        "additionalProperties": False}}, "required": ["point"], "additionalProperties": False},
]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = write_test_model(tmp_path_factory.mktemp("grammar") / "m.gguf", n_layer=2,
                            weight_type="F16")
    with load(path, devices=[], n_ctx=256, progress=False) as m:
        yield m


@pytest.mark.parametrize("schema", SCHEMAS, ids=["object", "array", "nested"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_constrained_reply_validates(model, schema, temperature):
    for seed in range(3 if temperature else 1):
        text = "".join(model.generate("w1 w2", 120, temperature=temperature, seed=seed,
                                      min_p=0.0, grammar=Grammar.json_schema(schema)))
        jsonschema.validate(json.loads(text), schema)


def test_gbnf_lark_and_regex_grammars(model):
    gbnf = Grammar("gbnf", 'root ::= ("yes" | "no") " " [0-9]{2}')
    assert re.fullmatch(r"(yes|no) [0-9]{2}", "".join(model.generate("w1", 20, grammar=gbnf)))
    lark = Grammar("lark", 'start: "a" B+\nB: "b"')
    assert re.fullmatch(r"ab+", "".join(model.generate("w1", 8, temperature=0, grammar=lark)))
    regex = Grammar("regex", r"[A-Z][a-z]{1,3}\.")
    assert re.fullmatch(r"[A-Z][a-z]{1,3}\.", "".join(model.generate("w2", 10, grammar=regex)))


@pytest.mark.parametrize("grammar, fault", [
    (Grammar("json_schema", "{not json"), "JSON schema is not valid"),
    (Grammar("json_schema", '{"type": "frobnicate"}'), "frobnicate"),
    (Grammar("json_schema", "[1, 2]"), "must be an object"),
    (Grammar("gbnf", 'root ::= "a" undefined_rule'), "undefined_rule"),
    (Grammar("regex", "([a-z]"), "regular expression is not valid"),
])
def test_a_bad_grammar_names_its_fault(model, grammar, fault):
    with pytest.raises(GrammarError, match=re.escape(fault)):
        model.grammar_vocabulary.compile(grammar)
    assert len(list(model.generate("w1", 2, temperature=0))) <= 2    # still generates


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    return x - (x.max() + np.log(np.exp(x - x.max()).sum()))


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_logprobs_are_the_log_softmax_of_the_models_logits(model, temperature):
    prompt = model.tokenize("w3 w4 w5")
    engine = BatchEngine(model, n_slots=1)
    pieces = []
    engine.submit(prompt, lambda e: pieces.append(e) if isinstance(e, Piece) else None,
                  max_tokens=4, logprobs=5,
                  params=SamplingParams(temperature=temperature, seed=1))
    engine.run_until_done()
    logprobs = [lp for p in pieces for lp in p.logprobs]
    tokens = [t for p in pieces for t in p.tokens]
    assert [lp.token for lp in logprobs] == tokens and len(tokens) >= 1
    context = list(prompt)
    for lp in logprobs:                      # each step's distribution, recomputed apart
        model.reset()
        model.eval(context)
        want = log_softmax64(model.logits() / (temperature or 1.0))
        assert lp.logprob == pytest.approx(want[lp.token], abs=2e-4)
        top = [t for t, _ in lp.top]
        assert top == list(np.argsort(-want, kind="stable")[:5])
        assert [v for _, v in lp.top] == pytest.approx(want[top], abs=2e-4)
        if temperature == 0:
            assert lp.token == top[0]
        context.append(lp.token)
    model.reset()
