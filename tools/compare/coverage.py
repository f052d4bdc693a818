"""``polydev compare --show-coverage``: which ops the cases exercise, which ops each device's
kernel table holds, and which ops nothing tests."""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from polydev import Device, Op
from polydev.ops import op_desc

from ..table import format_table
from .case import Case, CaseContext
from .catalogue import all_op_names


def exercised_ops(cases: Sequence[Case]) -> Counter:
    """For each op name, how many cases compute it somewhere in their graphs (views too)."""
    counts: Counter = Counter()
    for c in cases:
        ctx = CaseContext(guards=False)
        c.build(ctx)
        counts.update({op_desc(t) for t in ctx.tensors + ctx.weights.tensors if t.op != Op.NONE})
    return counts


def coverage_report(cases: Sequence[Case], devices: Sequence[Device]) -> str:
    counts = exercised_ops(cases)
    names = all_op_names()
    tables = {d.name: d.supported_op_names() for d in devices}

    def support(device: str, op: str) -> str:
        table = tables[device]
        if table is None:
            return "?"
        return "yes" if op in table else "-"

    rows = [[op, counts.get(op, 0) or "-"] + [support(d, op) for d in tables] for op in names]
    covered = [op for op in names if counts.get(op)]
    untested = [op for op in names if not counts.get(op)]
    lines = [f"Ops with test cases: {len(covered)} of {len(names)} "
             f"({len(cases)} cases in all)", "",
             format_table(["op", "cases"] + list(tables), rows), ""]
    unknown = [d for d, t in tables.items() if t is None]
    if unknown:
        lines.append(f"? = device {', '.join(unknown)} does not list its kernel table")
    lines.append(f"Ops that no case tests ({len(untested)}): " + (", ".join(untested) or "none"))
    for device, table in tables.items():
        if table is not None:
            missing = [op for op in covered if op not in table]
            lines.append(f"Tested ops that {device} has no kernel for ({len(missing)}): "
                         + (", ".join(missing) or "none"))
    return "\n".join(lines)
