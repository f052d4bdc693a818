"""Where a decode step's time goes, per op, on the CPU backend: time, bytes read and GB/s.

    python bench/decode_profile.py MODEL.gguf [--steps 64]

Loads the model on the CPU backend alone (its threads: one per physical core) and decodes a
few warm-up tokens; then ``--steps`` plain decode steps (the plan replays its compiled calls
from C), and as many with every bound kernel call made and timed one by one. Calls are
grouped by op and by the name of the tensor they compute (a product: its weight's) with the
layer number taken out (``MUL_MAT blk.*.ffn_up.weight``), so a row is one kind of work summed
over the layers. Bytes are what the op reads from its sources (a product: its weight, the
bytes of the file's layout; MUL_MAT_ID: the experts it uses); GB/s is bytes over time. The
last rows: all products, and the plain step's time outside the kernels (Python, the replay,
what the scheduler does around the plan); the header gives the host's read bandwidth with
as many threads (bench/bandwidth.py), which the products' GB/s reads against.
"""

from __future__ import annotations

import argparse
import re
import time
from collections import defaultdict

from polydev.backends.cpu.env import physical_cores
from polydev.ops import VIEW_OPS, Op
from polydev.tools.table import format_table

from bandwidth import median_bandwidth  # bench/
from figures import leave_bench_dir

LAYER = re.compile(r"\.\d+\.|-\d+$|_\d+$")


def _group(node) -> str:
    """A product by its weight's name, any other op by its own, the layer number left out."""
    named = node.src[0] if node.op in (Op.MUL_MAT, Op.MUL_MAT_ID) else node
    name = LAYER.sub(".*.", named.name or "?").strip(".")
    return f"{node.op.name} {name}"


def _bytes_read(node) -> int:
    """What ``node`` reads from its sources: a product its weight (MUL_MAT_ID: the experts it
    uses), any other op all its sources."""
    if node.op == Op.MUL_MAT:
        return node.src[0].nbytes
    if node.op == Op.MUL_MAT_ID:
        experts, ids = node.src[0], node.src[2]
        used = min(experts.ne[2], ids.ne[0] * ids.ne[1])
        return experts.nbytes * used // experts.ne[2]
    return sum(s.nbytes for s in node.src if s is not None)


def _compute_nodes(plan) -> list:
    """A plan's compute nodes, one per bound call."""
    nodes = [n for n in plan.graph.nodes if n.op not in VIEW_OPS and n.op != Op.NONE]
    assert len(nodes) == len(plan.calls), "a plan's calls are its compute nodes"
    return nodes


def weight_bytes_per_token(model) -> int:
    """The weight bytes (the file's layout) that ``model``'s last replayed decode step read."""
    return sum(_bytes_read(n) for plan in model.evaluator.sched._step_plans if plan
               for n in _compute_nodes(plan) if n.op in (Op.MUL_MAT, Op.MUL_MAT_ID))


def profile(path: str, steps: int, n_ctx: int) -> tuple[list[tuple], float, float]:
    """Per group (name, calls per step, seconds per step, bytes per step); the plain step's
    time and its time outside the kernels (the plain step less the kernels timed one by
    one)."""
    leave_bench_dir()       # bench/gguf.py would stand for the gguf package polydev.models uses
    from polydev.models import load

    with load(path, devices=[], n_ctx=n_ctx, progress=False) as model:
        ev = model.evaluator
        vocab = model.hparams.n_vocab
        for t in range(8):
            ev.eval([(t * 7919) % vocab])
        plans = [p for p in ev.sched._step_plans if p]
        spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0, 0])
        originals = [list(p.calls) for p in plans]

        def timed(call, group: str, nbytes: int):
            entry = spent[group]

            def run() -> None:
                t0 = time.perf_counter()
                call()
                entry[0] += time.perf_counter() - t0
                entry[1] += 1
                entry[2] += nbytes
            return run

        # the plain steps first (a plan replays its compiled calls from C), then the same
        # number with every call made and timed one by one
        start = time.perf_counter()
        for t in range(steps):
            ev.eval([(t * 15485863) % vocab])
        plain = (time.perf_counter() - start) / steps
        for plan in plans:
            plan.calls[:] = [timed(c, _group(n), _bytes_read(n))
                             for c, n in zip(plan.calls, _compute_nodes(plan))]
            plan.replayed = False
        try:
            for t in range(steps):
                ev.eval([(t * 104729) % vocab])
        finally:
            for plan, calls in zip(plans, originals):
                plan.calls[:] = calls
                plan.replayed = True
    rows = [(g, n / steps, s / steps, b / steps) for g, (s, n, b) in spent.items()]
    return rows, plain, plain - sum(r[2] for r in rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a GGUF file")
    parser.add_argument("--steps", type=int, default=64, help="decode steps timed (64)")
    parser.add_argument("--ctx", type=int, default=4096,
                        help="context cells (4096): attention reads the cells in use")
    parser.add_argument("--top", type=int, default=20, help="rows shown, by time (20)")
    args = parser.parse_args()
    rows, step, outside = profile(args.model, args.steps, args.ctx)
    threads = physical_cores()
    rows.sort(key=lambda r: -r[2])
    bandwidth = median_bandwidth(threads)
    table = [(g, f"{n:.0f}", f"{s * 1e3:.3f}", f"{100 * s / step:.1f}",
              f"{b / 2**20:.1f}", f"{b / s / 1e9:.1f}" if s else "")
             for g, n, s, b in rows[:args.top]]
    products = [r for r in rows if r[0].startswith(("MUL_MAT ", "MUL_MAT_ID "))]
    p_time, p_bytes = sum(r[2] for r in products), sum(r[3] for r in products)
    table.append(("all products", "", f"{p_time * 1e3:.3f}", f"{100 * p_time / step:.1f}",
                  f"{p_bytes / 2**20:.1f}", f"{p_bytes / p_time / 1e9:.1f}"))
    table.append(("outside the kernels", "", f"{outside * 1e3:.3f}",
                  f"{100 * outside / step:.1f}", "", ""))
    print(f"decode step {step * 1e3:.2f} ms ({1 / step:.1f} t/s), {threads} threads; "
          f"read bandwidth {bandwidth / 1e9:.1f} GB/s\n")
    print(format_table(["op", "calls", "ms/step", "% step", "MiB read", "GB/s"], table))


if __name__ == "__main__":
    main()
