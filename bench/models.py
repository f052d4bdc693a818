"""Models on the CPU: polydev against llama.cpp, prompts (pp512, pp4096) and generation (tg128).

    bash bench/anchors.sh        # once: llama-bench of mainline llama.cpp and ik_llama.cpp
    python bench/models.py --scale $(bash bench/anchors.sh --flags)

For SmolLM2-135M (Q4_1), gemma-3-270m (Q4_K_M) and, with ``--scale``, random-weight models of
the 1B class (SCALE_MODELS: TinyLlama's widths in Q4_K, Q4_0, Q5_K and Q6_K, qwen3 in Q8_0, a
qwen3 mixture of experts in Q4_K; written once with gguf.GGUFWriter, the K-quants by
polydev's quantizer, with SmolLM2's tokenizer where it is installed, into
$POLYDEV_CACHE_DIR/bench-models), each engine runs in its own process (so its peak RSS is its
own), in turns: every round runs polydev, then each anchor, and a figure is the median of the
rounds (``--rounds``, default 3, or 1 with --quick), as a shared host's memory bandwidth
moves between minutes:
- polydev t/s / each anchor's t/s for pp512, pp4096 (a 4096-token prompt in batches of 512,
  attention over up to 4096 cells) and tg128 (target 1.0);
- each engine's decode as a share of the host's read bandwidth (bench/bandwidth.py, 2
  threads): the weight bytes a decode step reads times its tg128 t/s (target 0.85);
- polydev's peak RSS against each anchor's (target 1.0), and against the GGUF file plus the
  KV cache (target 1.5);
- polydev's Python time per node of a decode step: the step's time minus the time spent
  inside its kernels, divided by its nodes (target 2 µs);
- polydev's decode (tg128) with half the layers on OpenCL0 (llama.cpp's -ngl counting: the
  output layer is one of them) against all on the CPU backend, both in one process and
  measured in turns (target 0.5); missing, with the reason, where there is no OpenCL device.
``--only TEXT`` keeps the models whose label contains TEXT; ``--cpu-kernels LEVEL`` runs
polydev with the CPU kernels of a lower feature level (``x86-64-v3``: what a processor with
AVX2 alone runs, to compare with llama.cpp built for AVX2, ``bash bench/anchors.sh all avx2``).
The anchors are llama.cpp's own C++ ``llama-bench`` binaries (``--llama-bench [NAME=]PATH``,
repeatable; bench/llama_bench.py runs them: 2 threads, flash attention, ik_llama.cpp with its
run-time repacking). Without one, the anchor is llama-cpp-python (2 threads, the installed
one or the one in ``--llama-cpp DIR``), whose Python loop makes it a weaker anchor. polydev
loads only its CPU backend (POLYDEV_BACKENDS=cpu: no OpenCL driver, which would add about 37
MiB of RSS).
Prints a table, or with --json one JSON object.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

from polydev.numerics import NUMERICS

from bandwidth import measured_in_child  # bench/
from decode_profile import weight_bytes_per_token
from figures import (add_llama_cpp_option, leave_bench_dir, parse_args, print_figures,
                     real_models, run_child)
from llama_bench import LlamaBench

leave_bench_dir()        # bench/gguf.py would stand for the gguf package polydev.models uses

N_PROMPT, N_LONG, N_GEN = 512, 4096, 128
N_CTX = N_LONG + 64
THREADS = 2


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
        for backend in model.evaluator.backends:
            if backend.name == "CPU":
                backend.set_n_threads(THREADS)
        pp, tg = polydev_rates(model, rng, reps)
        model.reset()
        start = time.perf_counter()
        model.evaluator.eval(rng.integers(0, model.hparams.n_vocab, N_LONG))
        pp_long = [N_LONG / (time.perf_counter() - start)]
        overhead = _overhead_per_node(model, rng)
        return {"pp": pp, "pp_long": pp_long, "tg": tg, "rss": _peak_rss(), "start_rss": start_rss,
                "loaded_rss": loaded_rss, "file": os.path.getsize(path),
                "kv": model.kv.nbytes, "weight_bytes": weight_bytes_per_token(model),
                **overhead}


OVERHEAD_ROUNDS = 5


def _overhead_per_node(model, rng) -> dict:
    """A decode step's time outside its kernels, per node: rounds of 20 plain (replayed)
    steps, each followed by 20 steps with every bound kernel call made and timed one by one;
    a round's figure is its plain step's time less its timed kernels' time. The median of
    OVERHEAD_ROUNDS rounds: on a shared machine one round that the OS preempts between two
    kernels would count the whole preemption as Python time."""
    ev = model.evaluator
    steps = 20
    tokens = iter(rng.integers(0, model.hparams.n_vocab, 3 + 2 * steps * OVERHEAD_ROUNDS))
    for _ in range(3):
        ev.eval([next(tokens)])
    spent = [0.0]

    def timed(call):
        def run():
            t0 = time.perf_counter()
            call()
            spent[0] += time.perf_counter() - t0
        return run

    plans = [p for p in ev.sched._step_plans if p]
    originals = [list(p.calls) for p in plans]
    rounds = []
    for _ in range(OVERHEAD_ROUNDS):
        start = time.perf_counter()
        for _ in range(steps):
            ev.eval([next(tokens)])
        plain = (time.perf_counter() - start) / steps
        for plan in plans:
            plan.calls[:] = [timed(c) for c in plan.calls]
            plan.replayed = False
        spent[0] = 0.0
        try:
            for _ in range(steps):
                ev.eval([next(tokens)])
        finally:
            for plan, calls in zip(plans, originals):
                plan.calls[:] = calls
                plan.replayed = True
        rounds.append((plain, spent[0] / steps))
    step, kernels = sorted(rounds, key=lambda r: r[0] - r[1])[len(rounds) // 2]
    return {"step_s": step, "kernel_s": kernels, "nodes": ev.sched._allocated_graph.n_nodes}


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
    llm = llama_cpp.Llama(path, n_ctx=N_CTX, n_batch=512, n_threads=THREADS, verbose=False)
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


def _median(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} t/s (of {len(values)})"


def _anchor_child(anchor: LlamaBench, path: str) -> dict | str:
    """One llama-bench run, in its own child (its peak RSS is then its own), as the engines'
    common record: pp, pp_long and tg as lists of one rate."""
    done = run_child("llama_bench", f"llama_bench_child({anchor.name!r}, {anchor.path!r}, "
                                    f"{path!r}, {THREADS}, {[N_PROMPT, N_LONG]!r}, {N_GEN})")
    if isinstance(done, str):
        return done
    return {"pp": [done[f"pp{N_PROMPT}"]], "pp_long": [done[f"pp{N_LONG}"]],
            "tg": [done["tg"]], "rss": done["rss"]}


def _rounds(path: str, rounds: int, args, anchors: list[LlamaBench]) -> dict[str, dict | str]:
    """Every engine on one model, ``rounds`` times in turns (polydev, then each anchor): a
    shared host's bandwidth moves between minutes, and turns spread that over all engines.
    By engine: its rates of every round and its largest peak RSS, or why it failed."""
    results: dict[str, dict | str] = {}

    def keep(name: str, got: dict | str) -> None:
        """Add a round's rates to ``name``'s; its first failure stands for the engine."""
        kept = results.get(name)
        if kept is None or isinstance(got, str):
            if not isinstance(kept, str):
                results[name] = got
            return
        if isinstance(kept, str):
            return
        for test in ("pp", "pp_long", "tg"):
            kept[test] = kept[test] + got[test]
        kept["rss"] = max(kept["rss"], got["rss"])

    for _ in range(rounds):
        keep("polydev", _child("polydev", path, 1, cpu_kernels=args.cpu_kernels,
                               numerics=args.numerics))
        if anchors:
            for anchor in anchors:
                keep(anchor.name, _anchor_child(anchor, path))
        else:
            keep("llama-cpp-python", _child("llama_cpp", path, 1, args.llama_cpp))
    return results


def _rate_figures(label: str, ours: dict, name: str, theirs: dict | str) -> list[dict]:
    figures = []
    for test, size in (("pp", N_PROMPT), ("pp_long", N_LONG), ("tg", N_GEN)):
        figure = {"name": f"{label}: {test[:2]}{size} polydev / {name}", "unit": "ratio",
                  "target": 1.0, "better": "higher"}
        if isinstance(theirs, str):
            figures.append({**figure, "value": None,
                            "detail": f"polydev {_median(ours[test])}; {name} missing: {theirs}"})
            continue
        ratio = statistics.median(ours[test]) / statistics.median(theirs[test])
        figures.append({**figure, "value": round(ratio, 3),
                        "detail": f"{_median(ours[test])} vs {_median(theirs[test])}"})
    if not isinstance(theirs, str):
        figures.append({"name": f"{label}: polydev peak RSS / {name}'s",
                        "value": round(ours["rss"] / theirs["rss"], 2), "unit": "ratio",
                        "target": 1.0, "better": "lower",
                        "detail": f"{ours['rss'] / 2**20:.0f} MiB vs "
                                  f"{theirs['rss'] / 2**20:.0f} MiB"})
    return figures


def _bandwidth_figures(label: str, results: dict[str, dict | str],
                       bandwidth: float) -> list[dict]:
    """Each engine's decode as a share of the host's read bandwidth: the weight bytes a decode
    step reads (polydev's count of its products' weights, the same file for every engine)
    times its tg t/s."""
    per_token = results["polydev"]["weight_bytes"]
    figures = []
    for name, got in results.items():
        if isinstance(got, str):
            continue
        rate = statistics.median(got["tg"])
        figures.append({"name": f"{label}: {name} tg{N_GEN} read / host read bandwidth",
                        "value": round(per_token * rate / bandwidth, 3), "unit": "ratio",
                        "target": 0.85, "better": "higher",
                        "detail": f"{per_token / 2**20:.0f} MiB/token x {rate:.1f} t/s = "
                                  f"{per_token * rate / 1e9:.1f} GB/s of "
                                  f"{bandwidth / 1e9:.1f} GB/s"})
    return figures


def _memory_figures(label: str, ours: dict) -> list[dict]:
    budget = ours["file"] + ours["kv"]
    above = ours["rss"] - ours["start_rss"]
    outside = ours["step_s"] - ours["kernel_s"]
    return [
        {"name": f"{label}: polydev peak RSS / (file + KV cache)",
         "value": round(ours["rss"] / budget, 2), "unit": "ratio", "target": 1.5,
         "better": "lower",
         "detail": f"{ours['rss'] / 2**20:.0f} MiB vs {budget / 2**20:.0f} MiB (at start "
                   f"{ours['start_rss'] / 2**20:.0f} MiB, after load "
                   f"{ours['loaded_rss'] / 2**20:.0f} MiB)"},
        {"name": f"{label}: polydev peak RSS above the interpreter's own / (file + KV cache)",
         "value": round(above / budget, 2), "unit": "ratio", "target": 1.5, "better": "lower",
         "detail": f"{above / 2**20:.0f} MiB vs {budget / 2**20:.0f} MiB"},
        {"name": f"{label}: Python time per node of a decode step",
         "value": round(outside / ours["nodes"] * 1e6, 2), "unit": "us", "target": 2.0,
         "better": "lower",
         "detail": f"{ours['nodes']} nodes, step {ours['step_s'] * 1e3:.2f} ms, kernels "
                   f"{ours['kernel_s'] * 1e3:.2f} ms (timed one by one, each with its own call "
                   f"from Python, which the replayed step does not make: it can read below 0)"},
    ]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, extra=_options)
    rounds = args.rounds or (1 if args.quick else 3)
    anchors = [LlamaBench.parse(spec) for spec in args.llama_bench or ()]
    figures = []
    models = _models(args.scale, args.only)
    if not models:
        print(f"no model's label contains {args.only!r}", file=sys.stderr)
        return 2
    bandwidth = measured_in_child(THREADS)
    for label, path in models.items():
        results = _rounds(path, rounds, args, anchors)
        ours = results["polydev"]
        if isinstance(ours, str):
            print(f"polydev failed on {label}: {ours}", file=sys.stderr)
            return 1
        for name, theirs in results.items():
            if name != "polydev":
                figures += _rate_figures(label, ours, name, theirs)
        figures += _bandwidth_figures(label, results, bandwidth)
        figures += _memory_figures(label, ours)
        if label not in SCALE_MODELS:         # OpenCL on PoCL: minutes per 1B-class model
            figures.append(_opencl_figure(label, path, rounds))
    engines = (", ".join(f"{a.name} ({a.path})" for a in anchors) if anchors
               else f"llama-cpp-python from {args.llama_cpp}" if args.llama_cpp
               else "llama-cpp-python installed")
    kernels = f"; polydev's {args.cpu_kernels} kernels" if args.cpu_kernels else ""
    kernels += f"; numerics={args.numerics}" if args.numerics else ""
    print_figures("models", f"{THREADS} threads, CPU, {rounds} rounds in turns, medians; "
                            f"against {engines}{kernels}", figures, args.json)
    return 0


def _options(parser) -> None:
    parser.add_argument("--scale", action="store_true",
                        help="also the 1B-class random-weight models (SCALE_MODELS)")
    add_llama_cpp_option(parser)
    parser.add_argument("--llama-bench", metavar="[NAME=]PATH", action="append",
                        help="llama.cpp's C++ llama-bench at PATH as an anchor (repeatable; "
                             "bash bench/anchors.sh builds mainline's and ik_llama.cpp's and "
                             "prints these options); without it, llama-cpp-python")
    parser.add_argument("--rounds", type=int, metavar="N",
                        help="rounds of every engine in turns (default 3; 1 with --quick)")
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
    ratio = statistics.median(opencl["tg"]) / statistics.median(opencl["tg_cpu"])
    return {**figure, "value": round(ratio, 3),
            "detail": f"{_median(opencl['tg'])} (-ngl {opencl['ngl']}: {opencl['ngl'] - 1} of "
                      f"{opencl['n_layer']} layers and the output) vs "
                      f"{_median(opencl['tg_cpu'])}, in turns"}


if __name__ == "__main__":
    sys.exit(main())
