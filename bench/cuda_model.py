"""A 1B-class model on a CUDA GPU: polydev against llama.cpp's CUDA backend on the same file.

For random-weight models of TinyLlama's widths (bench/models.py's TINYLLAMA, in Q4_K and Q8_0;
written once with gguf.GGUFWriter into $POLYDEV_CACHE_DIR/bench-models, since a real model file
is too large to carry to a GPU machine), each engine in its own process:
- pp512 and tg128 with every layer on CUDA0 (-ngl all) and with half of them there (-ngl n/2,
  llama.cpp's counting: the output layer is one of them; the rest on the CPU backend);
- the same for llama.cpp, where ``--llama-cpp DIR`` names a llama-cpp-python built with
  ``GGML_CUDA=on`` (bench/gpu.sh llama builds one), and the ratios: targets tg >= 1.0 and
  pp >= 0.8;
- polydev's logits with the layers on CUDA0 against the CPU backend's alone (both with exact
  numerics) over a 64-token prompt and 4 decode steps: the largest difference over the largest
  logit, float32 rounding (target 1e-3).
Both engines use as many CPU threads as the machine has physical cores. Without a CUDA device
it stops at once with one line. Prints a table, or with --json one JSON object.
"""

from __future__ import annotations

import statistics
import sys

from figures import parse_args, print_figures, run_child  # bench/figures.py
from models import (N_GEN, N_PROMPT, TINYLLAMA, RandomTokens, llama_cpp_rates, polydev_rates,
                    scale_model, with_llama_cpp)

MODELS = {f"llama 1B-class {t}": dict(TINYLLAMA, weight_type=t) for t in ("Q4_K", "Q8_0")}
N_CTX = N_PROMPT + N_GEN + 64
N_CHECK, CHECK_STEPS = 64, 4
LOGITS_TARGET = 1e-3
ALL = -1                                     # n_gpu_layers: every layer and the output


# --- what runs in the child processes ------------------------------------------------------------

def _threads() -> int:
    from polydev.probes import physical_cores

    return physical_cores()


def polydev_child(path: str, ngl: int, reps: int) -> dict:
    from polydev.models import load

    rng = RandomTokens(0)
    with load(path, devices=["CUDA0"], n_gpu_layers=ngl, n_ctx=N_CTX, progress=False) as model:
        pp, tg = polydev_rates(model, rng, reps)
        return {"pp": pp, "tg": tg}


def logits_child(path: str, ngl: int) -> dict:
    """The largest difference between the CUDA placement's logits and the CPU backend's alone,
    over the largest CPU logit, at every prompt position and decode step."""
    import numpy as np

    from polydev.models import load

    tokens = RandomTokens(1)
    with (load(path, devices=[], n_ctx=N_CTX, numerics="exact", progress=False) as cpu,
          load(path, devices=["CUDA0"], n_gpu_layers=ngl, n_ctx=N_CTX, numerics="exact",
               progress=False) as gpu):
        prompt = tokens.integers(0, cpu.hparams.n_vocab, N_CHECK)
        want = [cpu.evaluator.eval(prompt, all_logits=True)]
        got = [gpu.evaluator.eval(prompt, all_logits=True)]
        for token in tokens.integers(0, cpu.hparams.n_vocab, CHECK_STEPS):
            want.append(cpu.evaluator.eval([token])[None])
            got.append(gpu.evaluator.eval([token])[None])
    want, got = np.concatenate(want).astype(np.float64), np.concatenate(got)
    scale = float(np.abs(want).max())
    return {"error": float(np.abs(got - want).max()) / scale, "rows": int(want.shape[0]),
            "argmax_same": float((got.argmax(-1) == want.argmax(-1)).mean())}


def llama_cpp_child(path: str, ngl: int, reps: int) -> dict:
    import llama_cpp

    if not llama_cpp.llama_supports_gpu_offload():
        raise SystemExit("this llama-cpp-python was built without a GPU backend")
    rng = RandomTokens(0)
    llm = llama_cpp.Llama(path, n_gpu_layers=ngl, n_ctx=N_CTX, n_batch=512,
                          n_threads=_threads(), verbose=False)
    pp, tg = llama_cpp_rates(llm, rng, reps)
    llm.close()
    return {"pp": pp, "tg": tg}


# --- the parent ----------------------------------------------------------------------------------

def _n_layer(path: str) -> int:
    from polydev.models import GGUFFile

    with GGUFFile(path) as f:
        return int(f.get(f"{f.get('general.architecture')}.block_count"))


def _rate(values: list[float]) -> str:
    return f"{statistics.mean(values):.1f} ± {statistics.pstdev(values):.1f} t/s"


def _speed_figures(label: str, placement: str, ours: dict, theirs: dict | str | None) -> list:
    figures = []
    for test, size, target in (("pp", N_PROMPT, 0.8), ("tg", N_GEN, 1.0)):
        name = f"{label}, {placement}: {test}{size} polydev / llama.cpp CUDA"
        figure = {"name": name, "value": None, "unit": "ratio", "target": target,
                  "better": "higher"}
        if not isinstance(theirs, dict):
            why = theirs or "no --llama-cpp DIR given"
            figures.append({**figure, "detail": f"polydev {_rate(ours[test])}; llama.cpp "
                                                f"missing: {why}"})
            continue
        ratio = statistics.mean(ours[test]) / statistics.mean(theirs[test])
        figures.append({**figure, "value": round(ratio, 3),
                        "detail": f"{_rate(ours[test])} vs {_rate(theirs[test])}"})
    return figures


def _logits_figure(label: str, placement: str, check: dict | str) -> dict:
    figure = {"name": f"{label}, {placement}: logits' largest difference from the CPU backend's "
                      f"/ largest logit", "value": None, "unit": "ratio",
              "target": LOGITS_TARGET, "better": "lower"}
    if isinstance(check, str):
        return {**figure, "detail": f"failed: {check}"}
    return {**figure, "value": float(f"{check['error']:.3g}"),
            "detail": f"{check['rows']} rows ({N_CHECK} prompt positions, {CHECK_STEPS} decode "
                      f"steps), same argmax at {check['argmax_same']:.1%}"}


def _model_figures(label: str, path: str, reps: int, llama_cpp_dir: str | None) -> list:
    n_layer = _n_layer(path)
    llama_env = with_llama_cpp(llama_cpp_dir) if llama_cpp_dir else None
    figures = []
    for placement, ngl in ((f"all {n_layer} layers on CUDA0", ALL),
                           (f"-ngl {(n_layer + 1) // 2} of {n_layer + 1}", (n_layer + 1) // 2)):
        ours = run_child("cuda_model", f"polydev_child({path!r}, {ngl}, {reps})")
        if isinstance(ours, str):
            raise SystemExit(f"polydev failed on {label}, {placement}: {ours}")
        theirs = (run_child("cuda_model", f"llama_cpp_child({path!r}, {ngl}, {reps})", llama_env)
                  if llama_cpp_dir else None)
        figures += _speed_figures(label, placement, ours, theirs)
        figures.append(_logits_figure(label, placement,
                                      run_child("cuda_model", f"logits_child({path!r}, {ngl})")))
    return figures


def _cuda_device():
    import polydev

    gpus = [d for d in polydev.devices() if d.reg is not None and d.reg.name == "CUDA"]
    if gpus:
        return gpus[0]
    reg = polydev.registry().reg_by_name("CUDA")
    why = reg.unavailable_reason if reg is not None else "the CUDA backend is not registered"
    raise SystemExit(f"no CUDA device: {why}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, extra=_options)
    device = _cuda_device()
    reps = 1 if args.quick else 3
    figures = []
    for label, shape in MODELS.items():
        figures += _model_figures(label, scale_model(label, shape), reps, args.llama_cpp)
    engine = f"llama.cpp from {args.llama_cpp}" if args.llama_cpp else "no llama.cpp"
    print_figures("cuda_model", f"{device.description}; {_threads()} CPU threads; {engine}",
                  figures, args.json)
    return 0


def _options(parser) -> None:
    parser.add_argument("--llama-cpp", metavar="DIR",
                        help="measure the llama-cpp-python in DIR (built with GGML_CUDA=on) "
                             "side by side")


if __name__ == "__main__":
    sys.exit(main())
