"""``polydev compare --model MODEL -b DEVICE``: a model's graph for a prompt, computed on the
device and on the CPU node by node (``compare_graph_backend``); prints the first node whose
error passes its op's threshold, with its name, layer and both values. Exit status 1 when
there is one.

Each backend computes the whole graph from its own results, so differences add up along the
graph as they would in a real run; the thresholds are test-backend-ops' per-op ones,
loosened by the depth they accumulate over (products and attention 1e-3, the rest 1e-5).
"""

from __future__ import annotations

import re
import sys

import numpy as np

import polydev
from polydev import GraphAllocator, compare_graph_backend
from polydev.errors import InvalidArgumentError
from polydev.ops import Op

from ..table import format_table

_PRODUCTS = {Op.MUL_MAT, Op.MUL_MAT_ID, Op.FLASH_ATTN_EXT, Op.OUT_PROD}
PRODUCT_NMSE, OTHER_NMSE = 1e-3, 1e-5


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    denom = float(np.sum(b * b))
    err = float(np.sum((a - b) ** 2))
    return err / denom if denom else err


def _values(t) -> np.ndarray | None:
    if t.type not in (polydev.GGMLType.F32, polydev.GGMLType.F16):
        return None
    return np.asarray(t.numpy(), dtype=np.float32)


def compare_model(path: str, device_name: str, prompt: str, out=sys.stdout) -> int:
    """Compare the model's prompt graph on ``device_name`` against the CPU; 0 when every
    node is within its threshold."""
    from polydev.models import UBatch, load

    device = polydev.device(device_name)
    if device is polydev.device("CPU"):
        raise InvalidArgumentError("compare --model needs a device other than the CPU (-b)")
    with load(path, devices=[], n_ctx=256, progress=False) as model:
        ids = model.tokenize(prompt)[:256]
        ub = UBatch.of_sequence(ids, 0)
        step, cells = model.evaluator.prepare(ub)
        cpu = model.evaluator.backends[-1]
        with GraphAllocator(cpu.default_buffer_type) as galloc, device.init_backend() as other:
            galloc.alloc_graph(step.graph)
            step.set_inputs(ub, cells)
            found: list = []
            checked = [0]

            def check(i, t1, t2) -> bool:
                a, b = _values(t2), _values(t1)
                if a is None:
                    return True
                checked[0] += 1
                limit = PRODUCT_NMSE if t1.op in _PRODUCTS else OTHER_NMSE
                err = _nmse(a, b)
                if not np.isfinite(a).all() or err > limit:
                    found.append((i, t1, err, limit, a, b))
                    return False
                return True

            compare_graph_backend(cpu, other, step.graph, check)
    if not found:
        print(f"{device.name} and CPU agree on all {checked[0]} nodes of {len(ids)} tokens' "
              f"graph (NMSE within {PRODUCT_NMSE:g} for products, {OTHER_NMSE:g} otherwise)",
              file=out)
        return 0
    i, t, err, limit, theirs, ours = found[0]
    m = re.search(r"-(\d+)$", t.name or "")
    flat = np.argmax(np.abs(theirs - ours))
    print(format_table(
        ["node", "name", "layer", "op", "NMSE", "threshold", f"{device.name} value", "CPU value"],
        [(i, t.name or "-", m.group(1) if m else "-", t.op.name, f"{err:.3e}", f"{limit:g}",
          f"{theirs.reshape(-1)[flat]:.6g}", f"{ours.reshape(-1)[flat]:.6g}")]), file=out)
    return 1
