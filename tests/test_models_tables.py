"""The architecture tables (``polydev.models.arch``) as data: every entry's shapes and
conditions evaluate on test models of it, a mistake in a table raises as the table is made
(naming the architecture and the expression), the names the expressions may use are
``HParams``' own, and each entry has its graph builder (``polydev.models.graphs``); the
import directions between the two are tests/test_import_directions.py's."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from polydev.errors import InvalidArgumentError, UnsupportedError  # noqa: E402
from polydev.models.arch import (ARCHITECTURES, Architecture, Key, TensorSpec,  # noqa: E402
                                 architecture)
from polydev.models.arch.expressions import (HPARAM_FIELDS, PER_LAYER, SYMBOLS,  # noqa: E402
                                             evaluate, evaluate_shape)
from polydev.models.gguf import GGUFFile  # noqa: E402
from polydev.models.graphs import BUILDERS, builder  # noqa: E402
from polydev.models.hparams import HParams  # noqa: E402

from model_files import ARCH_CASES, arch_case_kwargs, write_test_model  # noqa: E402


def _hparams(tmp_path: Path, case: str) -> HParams:
    path = write_test_model(tmp_path / f"{case}.gguf", **arch_case_kwargs(case, "F16"))
    with GGUFFile(path) as f:
        return HParams.from_gguf(f)


def test_the_names_of_the_expressions_are_those_hparams_gives(tmp_path):
    assert HPARAM_FIELDS == {f.name for f in fields(HParams)}
    assert set(_hparams(tmp_path, "llama").symbols(0)) == SYMBOLS == HPARAM_FIELDS | PER_LAYER


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_expression_of_an_entry_evaluates_on_its_test_models(tmp_path, name):
    """Every tensor's condition in every layer of each test model of the architecture,
    its shape wherever the condition holds (positive whole numbers), and every requirement
    (which these valid models meet); each shape evaluated in one model at least."""
    spec = architecture(name)
    cases = [case for case, kw in ARCH_CASES.items() if kw.get("arch", case) == name]
    shaped = set()
    for case in cases:
        hp = _hparams(tmp_path, case)
        for condition, message in spec.requires:
            assert evaluate(condition, hp.symbols(0)) is True, (case, message)
        for tensor in spec.tensors:
            for il in range(hp.n_layer) if tensor.per_layer else [0]:
                symbols = hp.symbols(il)
                if tensor.when and not evaluate(tensor.when, symbols):
                    continue
                shape = evaluate_shape(tensor.shape, symbols)
                assert shape and all(type(n) is int and n > 0 for n in shape), (case, tensor,
                                                                                 il, shape)
                shaped.add(tensor.name)
    assert {t.name for t in spec.tensors} - shaped == set(), f"not shaped in {cases}"


def _entry(**change) -> Architecture:
    """A small architecture "demo", its parts changed by ``change``."""
    parts = dict(name="demo", description="a test", rope="norm",
                 keys=(Key("context_length", "n_ctx_train"),),
                 tensors=(TensorSpec("token_embd.weight", "n_embd, n_vocab", "GET_ROWS", "x"),
                          TensorSpec("blk.{il}.attn_q.weight", "n_embd, n_embd_head_k * n_head",
                                     "MUL_MAT", "q", unless="attn_qkv"),
                          TensorSpec("blk.{il}.attn_qkv.weight", "n_embd, 3 * n_embd", "MUL_MAT",
                                     "qkv", required=False)),
                 requires=(("n_rot == n_embd_head_k", "rope is the head"),))
    return Architecture(**parts | change)


def _tensor(shape: str = "n_embd", when: str = "", unless: str = "") -> tuple[TensorSpec]:
    return (TensorSpec("blk.{il}.x.weight", shape, "MUL", "x", when=when, unless=unless),)


MISTAKES = {
    "unknown name in a shape": (dict(tensors=_tensor("n_embd, n_vocb")),
                                r"demo: tensor blk\.\{il\}\.x\.weight's shape 'n_embd, n_vocb': "
                                r"unknown name 'n_vocb' \(did you mean 'n_vocab'\?\)"),
    "unknown name in a condition": (dict(tensors=_tensor(when="n_experts > 0")),
                                    r"demo: .*condition 'n_experts > 0': unknown name "
                                    r"'n_experts'"),
    "unknown name in a requirement": (dict(requires=(("n_rott == 64", "..."),)),
                                      r"demo: the requirement 'n_rott == 64': unknown name"),
    "not an expression": (dict(tensors=_tensor("n_embd,, 2")),
                          r"demo: .*shape 'n_embd,, 2': invalid syntax"),
    "a call": (dict(tensors=_tensor("max(n_embd, 2)")),
               r"demo: .*'max\(n_embd, 2\)' is not a number, a name or arithmetic"),
    "an attribute": (dict(tensors=_tensor("n_embd.real")), r"demo: .*'n_embd\.real' is not"),
    "text": (dict(tensors=_tensor(when="arch == 'llama'")), r"demo: .*'llama' is not a number"),
    "a comparison as a dimension": (dict(tensors=_tensor("n_embd > 0")),
                                    r"demo: .*'n_embd > 0' is not a number, a name or "
                                    r"arithmetic of them$"),
    "in something not a tuple": (dict(tensors=_tensor(when="n_expert in n_embd")),
                                 r"demo: .*'in' takes a tuple of numbers"),
    "a key read into no field": (dict(keys=(Key("expert_count", "n_experts"),)),
                                 r"demo: key 'expert_count' is read into 'n_experts', which is "
                                 r"no field of HParams"),
    "a key of no kind": (dict(keys=(Key("expert_count", "n_expert", "integer"),)),
                         r"demo: key 'expert_count' has kind 'integer'"),
    "a default of no field": (dict(keys=(Key("rope.freq_base_swa", "rope_freq_base_swa",
                                             "float", "=rope_base"),)),
                              r"demo: key 'rope\.freq_base_swa' defaults to 'rope_base'"),
    "a default read later": (dict(keys=(Key("rope.freq_base_swa", "rope_freq_base_swa",
                                            "float", "=rope_freq_base"),
                                        Key("rope.freq_base", "rope_freq_base", "float"))),
                             r"defaults to 'rope_freq_base', which no key read before it"),
    "an alternative of no tensor": (dict(tensors=_tensor(unless="attn_qkvv")),
                                    r"demo: .*alternative 'attn_qkvv' is no tensor of demo"),
}


@pytest.mark.parametrize("mistake", list(MISTAKES))
def test_a_mistake_in_a_table_raises_as_it_is_made(mistake):
    change, message = MISTAKES[mistake]
    _entry()                                        # the entry itself is sound
    with pytest.raises(InvalidArgumentError, match=message):
        _entry(**change)


def test_every_entry_has_its_builder():
    assert set(BUILDERS) == set(ARCHITECTURES)
    assert builder("gpt-oss") is BUILDERS["gpt-oss"]
    with pytest.raises(UnsupportedError, match=r"architecture 'bert' is not supported"):
        builder("bert")
