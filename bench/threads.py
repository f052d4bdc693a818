"""CPU thread scaling: pp512 and tg128 of a 1B-class model at 1, 2, 4, ... threads, polydev
against llama.cpp, each engine and thread count in its own process.

The model is bench/models.py's TinyLlama-wide llama in Q4_K (written once). polydev runs on
its CPU backend alone with ``set_n_threads``; llama.cpp is the llama-cpp-python found on the
path, or in ``--llama-cpp DIR`` (a build for the machine, e.g. the one bench/gpu.sh llama
makes), with n_threads and n_threads_batch alike. Figures: each engine's t/s per thread count,
and polydev / llama.cpp where both ran. The counts go up to the machine's physical cores.
"""

from __future__ import annotations

import statistics
import sys

from figures import add_llama_cpp_option, parse_args, print_figures, run_child  # bench/figures.py
from models import (N_CTX, SCALE_MODELS, RandomTokens, llama_cpp_rates, polydev_rates,
                    scale_model, with_llama_cpp)

MODEL = "llama 1B-class Q4_K"


# --- what runs in the child processes ------------------------------------------------------------

def polydev_child(path: str, threads: int, reps: int) -> dict:
    from polydev.models import load

    with load(path, devices=[], n_ctx=N_CTX, n_batch=512, progress=False) as model:
        for backend in model.evaluator.backends:
            if backend.name == "CPU":
                backend.set_n_threads(threads)
        pp, tg = polydev_rates(model, RandomTokens(0), reps)
        return {"pp": pp, "tg": tg}


def llama_cpp_child(path: str, threads: int, reps: int) -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(path, n_ctx=N_CTX, n_batch=512, n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    pp, tg = llama_cpp_rates(llm, RandomTokens(0), reps)
    llm.close()
    return {"pp": pp, "tg": tg}


# --- the parent ----------------------------------------------------------------------------------

def thread_counts() -> list[int]:
    from polydev.probes import physical_cores

    cores = physical_cores()
    counts = [n for n in (1, 2, 4, 8, 16, 32, 64) if n < cores]
    return counts + [cores]


def _figures(threads: int, ours: dict | str, theirs: dict | str | None) -> list[dict]:
    out = []
    for key, label in (("pp", "pp512"), ("tg", "tg128")):
        rate = statistics.median(ours[key]) if isinstance(ours, dict) else None
        ref = statistics.median(theirs[key]) if isinstance(theirs, dict) else None
        detail = (f"polydev {rate:.1f} t/s" if rate else f"polydev failed: {ours}") + (
            f", llama.cpp {ref:.1f} t/s" if ref else f"; llama.cpp missing: {theirs}")
        out.append({"name": f"{MODEL}, {threads} threads: {label} polydev / llama.cpp",
                    "value": round(rate / ref, 2) if rate and ref else None, "unit": "ratio",
                    "target": 1.0, "better": "higher", "detail": detail})
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, extra=_options)
    reps = 1 if args.quick else 3
    path = scale_model(MODEL, SCALE_MODELS[MODEL])
    env = with_llama_cpp(args.llama_cpp) if args.llama_cpp else None
    figures = []
    for threads in thread_counts():
        ours = run_child("threads", f"polydev_child({path!r}, {threads}, {reps})")
        theirs = (None if args.no_llama_cpp else
                  run_child("threads", f"llama_cpp_child({path!r}, {threads}, {reps})", env))
        figures += _figures(threads, ours, theirs)
        print(figures[-2]["detail"], "|", figures[-1]["detail"], file=sys.stderr)
    print_figures("threads", f"CPU threads {thread_counts()}", figures, args.json)
    return 0


def _options(parser) -> None:
    add_llama_cpp_option(parser)
    parser.add_argument("--no-llama-cpp", action="store_true",
                        help="polydev alone")


if __name__ == "__main__":
    sys.exit(main())
