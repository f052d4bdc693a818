"""Where a decode step's time goes on a CUDA GPU, per op: GPU time, bytes and GB/s.

    python bench/cuda_profile.py MODEL [--steps 32] [--ngl N]

MODEL is a GGUF file, or the label of one of bench/cuda_model.py's random-weight models
("llama 1B-class Q4_K"), written on first use.

Loads the model with its layers on CUDA0 (``--ngl``: llama.cpp's count, default all) and
decodes a few warm-up tokens, which captures the step's CUDA graph. Then:
- a decode step's wall time with the graph, and with the plans replayed call by call from
  Python (``POLYDEV_CUDA_GRAPHS=0``'s path), and how long the host takes to enqueue the calls;
- each bound call of the CUDA plans on its own, captured ``REPEATS`` times into a graph of its
  own so that its time is the GPU's alone (no launch gaps), grouped by op and by the name of
  the tensor it computes (a product: its weight's) with the layer number taken out, as
  bench/decode_profile.py groups the CPU's (a norm fused with its MUL counts the MUL's work);
  bytes are what the call reads and writes (a product: its weight and the rest; MUL_MAT_ID:
  the whole expert stack), GB/s bytes over time.
Without a CUDA device it stops at once with one line.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict

from polydev.backends.cuda.fusion import fused_away
from polydev.device import computing_nodes
from polydev.tools.table import format_table

from decode_profile import _group  # bench/ (before models.py, which takes bench/ off the path)
from cuda_model import MODELS
from models import RandomTokens, scale_model

REPEATS = 20


def _cuda_plans(model) -> list:
    from polydev.backends.cuda.graphs import CapturedPlan

    return [p for p in model.evaluator.sched._step_plans if isinstance(p, CapturedPlan)]


def _step_time(model, rng, steps: int) -> float:
    vocab = model.hparams.n_vocab
    times = []
    for token in rng.integers(0, vocab, steps):
        start = time.perf_counter()
        model.evaluator.eval([int(token)])
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _during_step(model, plans, compute) -> None:
    """One decode step whose CUDA plans run through ``compute(plan)`` instead of their graph:
    the scheduler copies the step's inputs first, and each call finds what the calls before
    it wrote (a call replayed after the step could read memory the allocator reused)."""
    backends = {p.backend for p in plans}
    for backend in backends:
        backend.graphs.compute = compute              # this instance's, for one step
    try:
        model.evaluator.eval([1])
    finally:
        for backend in backends:
            del backend.graphs.compute


def _enqueue_time(model, plans) -> float:
    """The host's time to make every call of the plans (the GPU's finish not waited for)."""
    took = []

    def enqueue(plan) -> None:
        start = time.perf_counter()
        for call in plan.calls:
            call()
        took.append(time.perf_counter() - start)
    _during_step(model, plans, enqueue)
    return sum(took)


def _gpu_time(backend, call) -> float:
    """Seconds of GPU time of one ``call``: REPEATS of it captured into a graph and launched
    between two events (call by call where the capture fails)."""
    import cupy

    stream = backend.stream
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    try:
        graph, _memory = backend.graphs.capture([call] * REPEATS)
    except Exception:
        graph = None
    start.record(stream)
    if graph is not None:
        graph.launch(stream)
    else:
        for _ in range(REPEATS):
            call()
    end.record(stream)
    end.synchronize()
    return cupy.cuda.get_elapsed_time(start, end) / 1e3 / REPEATS


def _bytes(node) -> int:
    return node.nbytes + sum(s.nbytes for s in node.src if s is not None)


def _per_call(model, plans) -> dict[str, list[float]]:
    """By group: [calls, seconds, bytes] of every call of the CUDA plans, in a decode step."""
    groups: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0])

    def profile(plan) -> None:
        for node, call in zip(computing_nodes(plan.graph), plan.calls):
            if call is fused_away:                   # its time is the node before it's
                continue
            row = groups[_group(node)]
            row[0] += 1
            row[1] += _gpu_time(plan.backend, call)
            row[2] += _bytes(node)
    _during_step(model, plans, profile)
    return groups


def _model_path(name: str) -> str:
    if os.path.exists(name) or name not in MODELS:
        return name                                  # load() names what is wrong with it
    return scale_model(name, MODELS[name])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a GGUF file, or a label of bench/cuda_model.py's models")
    parser.add_argument("--steps", type=int, default=32, help="decode steps timed (32)")
    parser.add_argument("--ngl", type=int, default=-1, help="layers on CUDA0 (default all)")
    args = parser.parse_args(argv)
    import polydev
    from polydev.models import load

    if not any(d.reg is not None and d.reg.name == "CUDA" for d in polydev.devices()):
        raise SystemExit("no CUDA device here")
    path = _model_path(args.model)
    rng = RandomTokens(0)
    with load(path, devices=["CUDA0"], n_gpu_layers=args.ngl, n_ctx=1024,
              progress=False) as model:
        model.evaluator.eval(rng.integers(0, model.hparams.n_vocab, 64))
        _step_time(model, rng, 4)                        # warm-up: the graphs are captured
        plans = _cuda_plans(model)
        captured = sum(p.cuda_graph is not None for p in plans)
        n_calls = sum(len(p.calls) for p in plans)
        with_graphs = _step_time(model, rng, args.steps)
        for plan in plans:                               # from now on call by call
            plan.release()
            plan.capturable = False
        by_call = _step_time(model, rng, args.steps)
        enqueue = _enqueue_time(model, plans)
        groups = _per_call(model, plans)
    total = sum(row[1] for row in groups.values())
    print(f"{path}: {len(plans)} CUDA plans, {captured} captured, {n_calls} calls")
    print(f"decode step: {with_graphs * 1e3:.3f} ms with CUDA graphs ({1 / with_graphs:.0f} "
          f"t/s), {by_call * 1e3:.3f} ms call by call ({1 / by_call:.0f} t/s); the host "
          f"enqueues the calls in {enqueue * 1e3:.3f} ms; the kernels alone take "
          f"{total * 1e3:.3f} ms\n")
    rows = sorted(groups.items(), key=lambda kv: -kv[1][1])
    print(format_table(["op", "calls", "µs a step", "share", "µs a call", "GB/s"],
                       [(name, int(n), f"{t * 1e6:.1f}", f"{t / total:.1%}",
                         f"{t / n * 1e6:.2f}", f"{b / max(t, 1e-9) / 1e9:.0f}")
                        for name, (n, t, b) in rows]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
