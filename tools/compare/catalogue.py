"""The case lists of ``polydev compare``: every op's sweeps for ``test`` and ``support``, and
realistic LLM sizes for ``perf``; plus the filters ``-o`` and ``-p``."""

from __future__ import annotations

import difflib
import re
from typing import Iterable, Iterator

from polydev import GGMLType, GluOp, Op, RopeMode, UnaryOp, ops
from polydev.errors import InvalidArgumentError

from . import cases_conv, cases_layout, cases_math, cases_products
from .case import Case
from .cases_conv import _conv_2d, _ssm_scan
from .cases_layout import _cpy, _get_rows
from .cases_math import _binary, _norm, _reduce
from .cases_products import _flash_attn, _mul_mat, _mul_mat_id, _rope, _soft_max

F32, F16 = GGMLType.F32, GGMLType.F16

# ops that are not computations of their own: a graph's leaves, the views, and the two
# families that test-backend-ops lists by their functions' names
_NOT_OPS = {Op.NONE, Op.UNARY, Op.GLU}


def all_op_names() -> list[str]:
    """Every op, unary and glu name (``--list-ops``)."""
    names = [op.name for op in Op if op not in _NOT_OPS]
    return names + [fn.name for fn in UnaryOp] + [fn.name for fn in GluOp]


def eval_cases() -> list[Case]:
    """The cases of ``test`` and ``support`` mode, each name once (sweeps may overlap)."""
    cases: dict[str, Case] = {}
    for module in (cases_math, cases_layout, cases_products, cases_conv):
        for c in module.cases():
            cases.setdefault(c.name, c)
    return list(cases.values())


def perf_cases() -> list[Case]:
    """Realistic sizes of a 7-8B language model (decode and prompt batches) and friends."""
    cases: list[Case] = []
    for type_a in (F32, F16, GGMLType.Q4_0, GGMLType.Q8_0, GGMLType.Q4_K, GGMLType.Q6_K):
        for n in (1, 8, 512):
            cases.append(_mul_mat(type_a, F32, 4096, n, 4096, weight=True))
    for type_a in (F16, GGMLType.Q4_0):
        for n in (1, 512):
            cases.append(_mul_mat_id(type_a, 64, 8, False, 768, n, 2048, weight=True))
    for nb in (1, 512):
        cases.append(_flash_attn(128, 128, 8, (4, 1), 4096, nb, True, False, 0.0, 0.0, F16))
    cases += [
        _binary("ADD", F32, (4096, 512, 1, 1), (1, 1, 1, 1)),
        _binary("MUL", F32, (4096, 512, 1, 1), (1, 1, 1, 1)),
        _norm("RMS_NORM", (4096, 512, 1, 1), False, 1e-6),
        _soft_max((512, 512, 32, 1), True, False, F16, (1, 1), 0.1, 0.0),
        _rope(F32, (128, 32, 512, 1), 128, RopeMode.NEOX),
        _cpy(F32, F16, (4096, 512, 1, 1)),
        _cpy(F16, F32, (4096, 512, 1, 1)),
        _get_rows(GGMLType.Q4_K, 4096, 32000, 512, 1, False),
        _reduce("CUMSUM", ops.cumsum, F32, (4096, 512, 1, 1)),
        _conv_2d((64, 64, 320, 1), (3, 3, 320, 320), F16, 1, 1, 1, 1, 1, 1),
        _ssm_scan(128, 64, 48, 1, 512, 1),
    ]
    return cases


def parse_op_filter(text: str) -> list[str]:
    """Split ``-o`` at the commas between items: op names or full ``OP(vars)`` case names,
    whose own commas sit inside parentheses."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    items.append(text[start:])
    return [item.strip() for item in items if item.strip()]


def check_op_filter(op_filter: Iterable[str]) -> list[str]:
    """The filter with op names in their canonical (upper) case, case names' op part too;
    an unknown op name is an error that suggests the closest (a typo would silently match
    nothing)."""
    known = all_op_names()
    checked = []
    for item in op_filter:
        op, paren, rest = item.partition("(")
        op = op.strip().upper()
        if op not in known:
            close = difflib.get_close_matches(op, known, n=3, cutoff=0.6)
            hint = f"did you mean {' or '.join(close)}? " if close else ""
            raise InvalidArgumentError(f"unknown op {item!r} in -o; {hint}`polydev compare "
                                       f"--list-ops` lists the op names")
        checked.append(op + paren + rest)
    return checked


def select(cases: Iterable[Case], op_filter: list[str] | None,
           params_regex: str | None) -> Iterator[Case]:
    """The cases whose op name or full name is in ``op_filter`` and whose parameters match
    ``params_regex`` (searched, as ``std::regex_search``)."""
    pattern = re.compile(params_regex) if params_regex else None
    wanted = set(op_filter or ())
    for c in cases:
        if wanted and c.op not in wanted and c.name not in wanted:
            continue
        if pattern is not None and not pattern.search(c.vars):
            continue
        yield c
