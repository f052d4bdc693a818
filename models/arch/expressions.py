"""The small language of the architecture tables: shapes and conditions written as Python
expressions over the hyperparameters (``"n_embd, n_ff"``, ``"n_expert > 0"``), checked when a
table entry is made and evaluated against ``HParams.symbols(il)``.

Checked means the text parses, uses only numbers and arithmetic (a shape's dimensions) or also
comparisons, ``and``/``or``/``not`` and a tuple of numbers after ``in`` (a condition), and
names only ``SYMBOLS``: a typo in a table
raises as the table is imported, naming the architecture and the expression, not when a model
of that architecture first loads. The expressions are this package's own constants, never
text from a file.
"""

from __future__ import annotations

import ast
import difflib
from functools import lru_cache
from types import CodeType
from typing import Any, Mapping

from polydev.errors import InvalidArgumentError

__all__ = ["HPARAM_FIELDS", "PER_LAYER", "SYMBOLS", "check", "evaluate", "evaluate_shape",
           "names"]

HPARAM_FIELDS = frozenset({
    "arch", "n_layer", "n_ctx_train", "n_embd", "n_ff", "n_head", "n_head_kv", "n_embd_head_k",
    "n_embd_head_v", "n_vocab", "n_expert", "n_expert_used", "n_ff_exp", "n_ff_shexp",
    "sliding_window", "swa_layers", "rms_eps", "n_rot", "rope_freq_base", "rope_freq_base_swa",
    "rope_freq_scale", "rope_attn_factor", "rope_ext_factor", "yarn_beta_fast",
    "yarn_beta_slow", "rope_yarn_log_mul", "rope_finetuned", "n_ctx_orig",
    "final_logit_softcap", "attn_logit_softcap", "expert_weights_norm", "expert_weights_scale",
    "expert_gating_func", "n_expert_shared", "n_expert_groups", "n_group_used",
    "n_layer_dense_lead", "n_lora_q", "n_lora_kv", "n_embd_head_k_mla", "n_embd_head_v_mla",
    "is_mla", "embedding_scale", "residual_scale", "attention_scale", "logit_scale",
    "attn_temp_scale",
})
"""The fields of ``HParams`` (``models/hparams.py``): what a ``Key`` reads into. Written out
here so that the tables import nothing of the model code (which imports them);
``tests/test_models_tables.py`` holds it equal to the dataclass's fields."""

PER_LAYER = frozenset({"il", "n_embd_k_gqa", "n_embd_v_gqa"})
"""The names ``HParams.symbols(il)`` adds for layer ``il``: the layer, and its K and V widths
(there ``n_head_kv`` is that layer's count, and ``n_rot`` the dimensions RoPE turns)."""

SYMBOLS = HPARAM_FIELDS | PER_LAYER
"""Every name an expression may use."""

_ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod)
_MEMBERSHIP = (ast.In, ast.NotIn)


def check(text: str, where: str, *, shape: bool = False) -> None:
    """Raise an InvalidArgumentError naming ``where`` (the architecture and the field) and
    ``text`` unless ``text`` is a well-formed expression: a shape (``shape``: numbers separated
    by commas) or a condition."""
    try:
        _checked_tree(text, shape)
    except (SyntaxError, InvalidArgumentError) as e:
        problem = e.msg if isinstance(e, SyntaxError) else str(e)
        raise InvalidArgumentError(f"{where} {text!r}: {problem}") from None


def evaluate(text: str, symbols: Mapping[str, Any]) -> Any:
    """The value of the condition or number ``text`` with the names ``symbols`` gives."""
    return eval(_compiled(text, False), {"__builtins__": {}}, dict(symbols))  # noqa: S307


def evaluate_shape(text: str, symbols: Mapping[str, Any]) -> tuple[int, ...]:
    """The ``ne`` the shape ``text`` gives with the names ``symbols`` gives."""
    ne = eval(_compiled(text, True), {"__builtins__": {}}, dict(symbols))  # noqa: S307
    return tuple(int(n) for n in ne)


def names(text: str) -> list[str]:
    """The names ``text`` uses, each once, in order (for messages that show their values)."""
    found = [node.id for node in ast.walk(ast.parse(text.strip(), mode="eval"))
             if isinstance(node, ast.Name)]
    return sorted(set(found), key=found.index)


@lru_cache(maxsize=None)
def _compiled(text: str, shape: bool) -> CodeType:
    tree = _checked_tree(text, shape)
    if shape and not isinstance(tree.body, ast.Tuple):      # "n_embd" is the 1-tuple
        tree.body = ast.Tuple(elts=[tree.body], ctx=ast.Load())
        ast.fix_missing_locations(tree)
    return compile(tree, f"<{'shape' if shape else 'condition'} {text}>", "eval")


def _checked_tree(text: str, shape: bool) -> ast.Expression:
    tree = ast.parse(text.strip(), mode="eval")
    body = tree.body
    if shape:
        for dim in body.elts if isinstance(body, ast.Tuple) else [body]:
            _check_arithmetic(dim)
    else:
        _check_condition(body)
    return tree


def _check_condition(node: ast.AST) -> None:
    """A condition: arithmetic, or comparisons and and/or/not of it (``in`` a tuple)."""
    match node:
        case ast.BoolOp(values=values):
            for value in values:
                _check_condition(value)
        case ast.UnaryOp(op=ast.Not(), operand=operand):
            _check_condition(operand)
        case ast.Compare(left=left, ops=ops, comparators=comparators):
            _check_arithmetic(left)
            for op, right in zip(ops, comparators):
                if isinstance(op, _MEMBERSHIP):
                    _check_tuple(right)
                else:
                    _check_arithmetic(right)
        case _:
            _check_arithmetic(node, "a comparison or and/or/not of them")


def _check_tuple(node: ast.AST) -> None:
    if not isinstance(node, ast.Tuple):
        raise InvalidArgumentError(f"{ast.unparse(node)!r}: 'in' takes a tuple of numbers")
    for item in node.elts:
        _check_arithmetic(item)


def _check_arithmetic(node: ast.AST, or_else: str = "") -> None:
    """A number: names, numbers and arithmetic of them, or an InvalidArgumentError."""
    match node:
        case ast.Name(id=name):
            if name not in SYMBOLS:
                raise InvalidArgumentError(f"unknown name {name!r}{_did_you_mean(name)}")
        case ast.Constant(value=value):
            if not isinstance(value, (bool, int, float)):
                raise InvalidArgumentError(f"{value!r} is not a number")
        case ast.BinOp(left=left, op=op, right=right) if isinstance(op, _ARITHMETIC):
            _check_arithmetic(left)
            _check_arithmetic(right)
        case ast.UnaryOp(op=ast.USub(), operand=operand):
            _check_arithmetic(operand)
        case _:
            raise InvalidArgumentError(f"{ast.unparse(node)!r} is not a number, a name or "
                                       f"arithmetic of them{', ' + or_else if or_else else ''}")


def _did_you_mean(name: str) -> str:
    close = difflib.get_close_matches(name, SYMBOLS, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
