"""Models on the CPU: polydev against llama.cpp, prompts (pp512, pp4096) and generation (tg128).

For SmolLM2-135M (Q4_1), gemma-3-270m (Q4_K_M) and, with ``--scale``, random-weight models of
the 1B class (SCALE_MODELS: TinyLlama's widths in Q4_K, Q4_0, Q5_K and Q6_K, qwen3 in Q8_0, a
qwen3 mixture of experts in Q4_K; written once with gguf.GGUFWriter, the K-quants by
polydev's quantizer, with SmolLM2's tokenizer where it is installed, into
$POLYDEV_CACHE_DIR/bench-models), each engine runs in its own process (so its peak RSS is its
own), one after the other for each model:
- polydev t/s / llama.cpp t/s for pp512, pp4096 (one run: a 4096-token prompt in batches of
  512, attention over up to 4096 cells) and tg128 (target 1.0);
- polydev's peak RSS against llama.cpp's (target 1.0), and against the GGUF file plus the KV
  cache (target 1.5);
- polydev's Python time per node of a replayed decode step: the step's time minus the time
  spent inside its kernels, divided by its nodes (target 2 µs);
- polydev's decode (tg128) with half the layers on OpenCL0 (llama.cpp's -ngl counting: the
  output layer is one of them) against all on the CPU backend, both in one process and
  measured in turns (target 0.5); missing, with the reason, where there is no OpenCL device.
``--only TEXT`` keeps the models whose label contains TEXT; ``--cpu-kernels LEVEL`` runs
polydev with the CPU kernels of a lower feature level (``x86-64-v3``: what a processor with
AVX2 alone runs, to compare with the AVX2 wheel of llama.cpp).
llama.cpp is llama-cpp-python (2 threads): the installed one, or the one in the directory
``--llama-cpp DIR`` names (e.g. a build for this machine: ``CMAKE_ARGS="-DGGML_NATIVE=ON" pip
wheel --no-deps llama-cpp-python==0.3.36``, unpacked there); without it the ratios are missing
and say why. Its
wheel has only the CPU backend, so polydev loads only its own (POLYDEV_BACKENDS=cpu: no OpenCL
driver, which would add about 37 MiB of RSS).
Prints a table, or with --json one JSON object.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from polydev.numerics import NUMERICS

from figures import (add_llama_cpp_option, leave_bench_dir, parse_args,  # bench/
                     print_figures, real_models, run_child)

leave_bench_dir()        # bench/gguf.py would stand for the gguf package polydev.models uses

N_PROMPT, N_LONG, N_GEN = 512, 4096, 128
N_CTX = N_LONG + 64


# 1B-class shapes: TinyLlama's widths (8 of its 22 layers) and a qwen3 of the same class
TINYLLAMA = dict(arch="llama", n_layer=8, n_embd=2048, n_head=32, n_head_kv=4, n_ff=5632,
                 n_vocab=49152)
QWEN3 = dict(arch="qwen3", n_layer=6, n_embd=2048, n_head=16, n_head_kv=8, head_dim=128,
             n_ff=6144, n_vocab=49152)
# a mixture of experts of Qwen3-30B-A3B's widths: 16 experts of 768, 2 used per token
QWEN3_MOE = dict(arch="qwen3moe", n_layer=6, n_embd=2048, n_head=16, n_head_kv=4, head_dim=128,
                 n_ff=768, n_expert=16, n_vocab=49152)
SCALE_MODELS = {
    "llama 1B-class Q4_K": dict(TINYLLAMA, weight_type="Q4_K"),
    "llama 1B-class Q4_0": dict(TINYLLAMA, weight_type="Q4_0"),
    "llama 1B-class Q5_K": dict(TINYLLAMA, weight_type="Q5_K"),
    "llama 1B-class Q6_K": dict(TINYLLAMA, weight_type="Q6_K"),
    "qwen3 1B-class Q8_0": dict(QWEN3, weight_type="Q8_0"),
    "qwen3moe 1B-class Q4_K": dict(QWEN3_MOE, weight_type="Q4_K"),
}


# the real model whose tokenizer the 1B-class models take: its 49152 tokens are their
# vocabulary, and its merges give text the tokens a trained model's would (the made-up
# SentencePiece vocabulary of tests/model_files.py makes about a token per character, which
# tripled the prompts bench/serve.py sends)
TOKENIZER_MODEL = "SmolLM2-135M Q4_1"


def scale_model(label: str, shape: dict) -> str:
    """The random-weight model ``label``, written on first use (tests/model_files.py) by a
    child process: Linux carries a process's resident memory over fork and exec into the
    child's peak RSS, so a writer's gigabyte in this process would count in every engine's.
    It has TOKENIZER_MODEL's tokenizer where that model is installed (its file name says so),
    else the made-up one."""
    from polydev.env import cache_dir

    tokenizer = real_models().get(TOKENIZER_MODEL)
    name = label.replace(" ", "-") + ("-smollm2-vocab" if tokenizer else "")
    path = cache_dir("bench-models") / (name + ".gguf")
    if not path.exists():
        print(f"writing {path} ...", file=sys.stderr, flush=True)
        shape = dict(shape, tokenizer_of=tokenizer) if tokenizer else shape
        done = run_child("models", f"write_model({str(path)!r}, {shape!r})")
        if isinstance(done, str):
            raise RuntimeError(f"writing {path} failed: {done}")
    return str(path)


def write_model(path: str, shape: dict) -> dict:
    """Write the random-weight model of ``shape`` to ``path`` (through a temporary file: an
    interrupted run leaves no partial model under its name)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from model_files import write_test_model
    from polydev.files import replacing

    with replacing(Path(path)) as part:
        write_test_model(part, **shape)
    return {"path": path}


def _models(scale: bool, only: str | None = None) -> dict[str, str]:
    """The models to run by label; with ``only``, those whose label contains it."""
    real = real_models()
    labels = [*real, *(SCALE_MODELS if scale else ())]
    return {label: real[label] if label in real else scale_model(label, SCALE_MODELS[label])
            for label in labels if only is None or only.lower() in label.lower()}


# --- what runs in the child processes ------------------------------------------------------------

def _peak_rss() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class RandomTokens:
    """Random token ids for both engines. Python's random, not numpy.random: importing that
    loads OpenSSL's libcrypto (through secrets and hmac), 3.5 MiB of the harness's own that
    would count in polydev's peak RSS."""

    def __init__(self, seed: int) -> None:
        import random

        self._random = random.Random(seed)

    def integers(self, low: int, high: int, n: int) -> list[int]:
        return [self._random.randrange(low, high) for _ in range(n)]


def generation_rate(model, rng) -> float:
    """t/s of N_GEN random tokens decoded one at a time after a reset."""
    model.reset()
    model.evaluator.eval([1])
    start = time.perf_counter()
    for token in rng.integers(0, model.hparams.n_vocab, N_GEN):
        model.evaluator.eval([int(token)])
    return N_GEN / (time.perf_counter() - start)


def polydev_rates(model, rng, reps: int) -> tuple[list[float], list[float]]:
    """A polydev model's pp512 and tg128 t/s, ``reps`` rounds after a warm-up prompt (which
    also binds the kernels)."""
    vocab = model.hparams.n_vocab
    model.evaluator.eval(rng.integers(0, vocab, N_PROMPT))              # warm-up
    pp, tg = [], []
    for _ in range(reps):
        model.reset()
        start = time.perf_counter()
        model.evaluator.eval(rng.integers(0, vocab, N_PROMPT))
        pp.append(N_PROMPT / (time.perf_counter() - start))
        tg.append(generation_rate(model, rng))
    return pp, tg


def polydev_child(path: str, reps: int, numerics: str | None = None) -> dict:
    from polydev.models import load
    from polydev.numerics import DEFAULT_NUMERICS

    rng = RandomTokens(0)
    start_rss = _rss_now()                      # the interpreter, numpy, polydev, tokenizers
    with load(path, devices=[], n_ctx=N_CTX, n_batch=512, progress=False,
              numerics=numerics or DEFAULT_NUMERICS) as model:
        loaded_rss = _rss_now()
        pp, tg = polydev_rates(model, rng, reps)
        model.reset()
        start = time.perf_counter()
        model.evaluator.eval(rng.integers(0, model.hparams.n_vocab, N_LONG))
        pp_long = [N_LONG / (time.perf_counter() - start)]
        overhead = _overhead_per_node(model, rng)
        return {"pp": pp, "pp_long": pp_long, "tg": tg, "rss": _peak_rss(), "start_rss": start_rss,
                "loaded_rss": loaded_rss, "file": os.path.getsize(path),
                "kv": model.kv.nbytes, **overhead}


OVERHEAD_ROUNDS = 5


def _overhead_per_node(model, rng) -> dict:
    """A replayed decode step's time outside its kernels, per node: rounds of 20 steps with
    every bound kernel call timed; a round's steps' time minus its kernels' and minus what the
    timing wrapper itself adds outside its timed span (``_probe_cost``, measured on a no-op in
    warm caches: a lower bound, so the figure still errs high). The median of OVERHEAD_ROUNDS
    rounds: on a shared machine one round that the OS preempts between two kernels would count
    the whole preemption as Python time. The plain step time is kept too."""
    ev = model.evaluator
    steps = 20
    tokens = iter(rng.integers(0, model.hparams.n_vocab, 3 + steps * (1 + OVERHEAD_ROUNDS)))
    for _ in range(3):
        ev.eval([next(tokens)])
    start = time.perf_counter()
    for _ in range(steps):
        ev.eval([next(tokens)])
    step = (time.perf_counter() - start) / steps
    spent = [0.0]

    def timed(call):
        def run():
            t0 = time.perf_counter()
            call()
            spent[0] += time.perf_counter() - t0
        return run

    probe = _probe_cost(timed, spent)
    plans = [p for p in ev.sched._step_plans if p]
    originals = [list(p.calls) for p in plans]
    for plan in plans:
        plan.calls[:] = [timed(c) for c in plan.calls]
    rounds = []
    try:
        for _ in range(OVERHEAD_ROUNDS):
            spent[0] = 0.0
            start = time.perf_counter()
            for _ in range(steps):
                ev.eval([next(tokens)])
            rounds.append(((time.perf_counter() - start) / steps, spent[0] / steps))
    finally:
        for plan, calls in zip(plans, originals):
            plan.calls[:] = calls
    instrumented, kernels = sorted(rounds, key=lambda r: r[0] - r[1])[len(rounds) // 2]
    nodes = ev.sched._allocated_graph.n_nodes
    calls = sum(len(c) for c in originals)
    return {"step_s": step, "instrumented_s": instrumented, "kernel_s": kernels,
            "probe_s": probe * calls, "nodes": nodes}


def _probe_cost(timed, spent: list[float], calls: int = 20000) -> float:
    """Seconds a ``timed`` wrapper adds to one call outside its timed span: a loop of wrapped
    no-ops, less the time inside the spans, less a loop of plain no-ops. Best of 5."""
    def noop():
        pass

    wrapped, best = [timed(noop)] * calls, float("inf")
    plain = [noop] * calls
    for _ in range(5):
        spent[0] = 0.0
        t0 = time.perf_counter()
        for call in wrapped:
            call()
        t1 = time.perf_counter()
        for call in plain:
            call()
        t2 = time.perf_counter()
        best = min(best, ((t1 - t0) - spent[0] - (t2 - t1)) / calls)
    return max(best, 0.0)


def polydev_opencl_child(path: str, reps: int) -> dict:
    """tg128 with half the layers on OpenCL0 and the rest on the CPU backend, and all on the
    CPU backend, loaded side by side and measured in turns: the ratio of two figures taken
    minutes apart on a shared machine swung with its load."""
    from polydev.models import GGUFFile, load

    with GGUFFile(path) as f:
        n_layer = int(f.get(f"{f.get('general.architecture')}.block_count"))
    rng = RandomTokens(0)
    ngl = (n_layer + 1) // 2
    with (load(path, devices=["OpenCL0"], n_gpu_layers=ngl, n_ctx=N_CTX, progress=False) as half,
          load(path, devices=[], n_ctx=N_CTX, progress=False) as cpu):
        tg, tg_cpu = [], []
        for _ in range(reps):
            tg.append(generation_rate(half, rng))
            tg_cpu.append(generation_rate(cpu, rng))
        return {"tg": tg, "tg_cpu": tg_cpu, "ngl": ngl, "n_layer": n_layer}


def llama_cpp_rates(llm, rng, reps: int) -> tuple[list[float], list[float]]:
    """A llama_cpp.Llama's pp512 and tg128 t/s, ``reps`` rounds after a warm-up prompt."""
    vocab = llm.n_vocab()
    llm.eval(rng.integers(0, vocab, N_PROMPT))                            # warm-up
    pp, tg = [], []
    for _ in range(reps):
        llm.reset()
        start = time.perf_counter()
        llm.eval(rng.integers(0, vocab, N_PROMPT))
        pp.append(N_PROMPT / (time.perf_counter() - start))
        llm.reset()
        llm.eval([1])
        start = time.perf_counter()
        for token in rng.integers(0, vocab, N_GEN):
            llm.eval([token])
        tg.append(N_GEN / (time.perf_counter() - start))
    return pp, tg


def llama_cpp_child(path: str, reps: int) -> dict:
    import llama_cpp

    rng = RandomTokens(0)
    llm = llama_cpp.Llama(path, n_ctx=N_CTX, n_batch=512, n_threads=2, verbose=False)
    pp, tg = llama_cpp_rates(llm, rng, reps)
    llm.reset()
    start = time.perf_counter()
    llm.eval(rng.integers(0, llm.n_vocab(), N_LONG))
    pp_long = [N_LONG / (time.perf_counter() - start)]
    llm.close()
    return {"pp": pp, "pp_long": pp_long, "tg": tg, "rss": _peak_rss()}


def _child(engine: str, path: str, reps: int, llama_cpp_dir: str | None = None,
           cpu_kernels: str | None = None, numerics: str | None = None) -> dict | str:
    """Run one engine on one model in a fresh process; its result, or why it failed.
    ``cpu_kernels`` names the level of polydev's CPU kernels (POLYDEV_CPU_KERNELS),
    ``numerics`` polydev's numerics (default: polydev's default)."""
    backends = {"polydev": "cpu", "polydev_opencl": "cpu,opencl"}
    env = dict(os.environ, POLYDEV_BACKENDS=backends[engine]) if engine in backends else None
    if env is not None and cpu_kernels:
        from polydev.backends.cpu.native import VARIANT_ENV

        env[VARIANT_ENV] = cpu_kernels
    if engine == "llama_cpp" and llama_cpp_dir:
        env = with_llama_cpp(llama_cpp_dir)
    # models.py takes bench/ off the path as it is imported (see leave_bench_dir)
    call = (f"{engine}_child({path!r}, {reps}, {numerics!r})" if engine == "polydev"
            else f"{engine}_child({path!r}, {reps})")
    return run_child("models", call, env)


def with_llama_cpp(directory: str) -> dict[str, str]:
    """The environment of a child that imports the llama-cpp-python in ``directory``."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [directory, *filter(None, [os.environ.get("PYTHONPATH")])]))


def _mean(values: list[float]) -> str:
    return f"{statistics.mean(values):.1f} ± {statistics.pstdev(values):.1f} t/s"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, extra=_options)
    reps = 1 if args.quick else 3
    figures = []
    models = _models(args.scale, args.only)
    if not models:
        print(f"no model's label contains {args.only!r}", file=sys.stderr)
        return 2
    for label, path in models.items():
        ours = _child("polydev", path, reps, cpu_kernels=args.cpu_kernels,
                      numerics=args.numerics)
        theirs = _child("llama_cpp", path, reps, args.llama_cpp)
        if isinstance(ours, str):
            print(f"polydev failed on {label}: {ours}", file=sys.stderr)
            return 1
        for test, size in (("pp", N_PROMPT), ("pp_long", N_LONG), ("tg", N_GEN)):
            target = 1.0
            name = f"{label}: {test[:2]}{size} polydev / llama.cpp"
            if isinstance(theirs, str):
                figures.append({"name": name, "value": None, "unit": "ratio", "target": target,
                                "better": "higher",
                                "detail": f"polydev {_mean(ours[test])}; llama.cpp missing: "
                                          f"{theirs}"})
                continue
            ratio = statistics.mean(ours[test]) / statistics.mean(theirs[test])
            figures.append({"name": name, "value": round(ratio, 3), "unit": "ratio",
                            "target": target, "better": "higher",
                            "detail": f"{_mean(ours[test])} vs {_mean(theirs[test])}"})
        if not isinstance(theirs, str):
            figures.append({"name": f"{label}: polydev peak RSS / llama.cpp's",
                            "value": round(ours["rss"] / theirs["rss"], 2), "unit": "ratio",
                            "target": 1.0, "better": "lower",
                            "detail": f"{ours['rss'] / 2**20:.0f} MiB vs "
                                      f"{theirs['rss'] / 2**20:.0f} MiB"})
        budget = ours["file"] + ours["kv"]
        figures.append({"name": f"{label}: polydev peak RSS / (file + KV cache)",
                        "value": round(ours["rss"] / budget, 2), "unit": "ratio",
                        "target": 1.5, "better": "lower",
                        "detail": f"{ours['rss'] / 2**20:.0f} MiB vs {budget / 2**20:.0f} MiB "
                                  f"(at start {ours['start_rss'] / 2**20:.0f} MiB, after load "
                                  f"{ours['loaded_rss'] / 2**20:.0f} MiB)"})
        above = ours["rss"] - ours["start_rss"]
        figures.append({"name": f"{label}: polydev peak RSS above the interpreter's own / "
                                f"(file + KV cache)",
                        "value": round(above / budget, 2), "unit": "ratio", "target": 1.5,
                        "better": "lower",
                        "detail": f"{above / 2**20:.0f} MiB vs {budget / 2**20:.0f} MiB"})
        outside = ours["instrumented_s"] - ours["kernel_s"] - ours["probe_s"]
        per_node = outside / ours["nodes"] * 1e6
        figures.append({"name": f"{label}: Python time per node of a decode step",
                        "value": round(per_node, 2), "unit": "us", "target": 2.0,
                        "better": "lower",
                        "detail": f"{ours['nodes']} nodes, step {ours['step_s'] * 1e3:.1f} ms, "
                                  f"kernels {ours['kernel_s'] * 1e3:.1f} ms, timing probes "
                                  f"{ours['probe_s'] * 1e6:.0f} µs"})
        if label not in SCALE_MODELS:         # OpenCL on PoCL: minutes per 1B-class model
            figures.append(_opencl_figure(label, path, reps))
    engine = f"llama.cpp from {args.llama_cpp}" if args.llama_cpp else "llama.cpp installed"
    kernels = f"; polydev's {args.cpu_kernels} kernels" if args.cpu_kernels else ""
    kernels += f"; numerics={args.numerics}" if args.numerics else ""
    print_figures("models", f"2 threads, CPU; {engine}{kernels}", figures, args.json)
    return 0


def _options(parser) -> None:
    parser.add_argument("--scale", action="store_true",
                        help="also the 1B-class random-weight models (SCALE_MODELS)")
    add_llama_cpp_option(parser)
    parser.add_argument("--only", metavar="TEXT",
                        help="only the models whose label contains TEXT (e.g. Q4_K)")
    parser.add_argument("--cpu-kernels", metavar="LEVEL",
                        help="polydev's CPU kernels of LEVEL (POLYDEV_CPU_KERNELS), e.g. "
                             "x86-64-v3 for an AVX2 processor's figures beside the AVX2 "
                             "llama.cpp wheel")
    parser.add_argument("--numerics", choices=NUMERICS,
                        help="polydev's numerics (polydev.numerics; default: its default)")


def _opencl_figure(label: str, path: str, reps: int) -> dict:
    opencl = _child("polydev_opencl", path, reps)
    figure = {"name": f"{label}: tg{N_GEN} half the layers on OpenCL0 / all on the CPU",
              "value": None, "unit": "ratio", "target": 0.5, "better": "higher"}
    if isinstance(opencl, str):
        return {**figure, "detail": f"no OpenCL figure: {opencl}"}
    ratio = statistics.mean(opencl["tg"]) / statistics.mean(opencl["tg_cpu"])
    return {**figure, "value": round(ratio, 3),
            "detail": f"{_mean(opencl['tg'])} (-ngl {opencl['ngl']}: {opencl['ngl'] - 1} of "
                      f"{opencl['n_layer']} layers and the output) vs "
                      f"{_mean(opencl['tg_cpu'])}, in turns"}


if __name__ == "__main__":
    sys.exit(main())
