"""1B-class models on a CUDA GPU: polydev against llama.cpp's own C++ llama-bench built with its
CUDA backend, on the same files, in turns in one run.

For random-weight models of TinyLlama's widths (bench/models.py's TINYLLAMA: Q4_K, Q4_0 and
Q8_0) and a mixture of experts of the same class (QWEN3_MOE, Q4_K), written once with
tests/model_files.py into $POLYDEV_CACHE_DIR/bench-models (a real model file is too large to
carry to a GPU machine), each engine in its own process, round after round in turns:
- pp512 and tg128 with every layer on CUDA0 (-ngl all), with half of them there (-ngl n/2,
  llama.cpp's counting: the output layer is one of them; the rest on the CPU backend), and
  for the mixture of experts with its experts on the CPU (llama.cpp's --cpu-moe, -ncmoe);
- the same for llama.cpp where ``--llama-bench PATH`` names its llama-bench built with
  ``GGML_CUDA=ON`` (bench/gpu.sh llama builds one), and the ratios: targets tg >= 1.0 and
  pp >= 0.8;
- decode's share of the card's memory bandwidth with every layer on CUDA0: the weight bytes a
  token reads (the experts it uses, not all) times tg over a device-to-device copy's rate
  (read and write counted), the moonshot 0.5;
- polydev's logits with the layers on CUDA0 against the CPU backend's alone (both with exact
  numerics) over a 64-token prompt and 4 decode steps: the largest difference over the largest
  logit, float32 rounding (target 1e-3).
Both engines use as many CPU threads as the machine has physical cores. ``--polydev-env
NAME=VALUE`` runs polydev a second time with that environment (POLYDEV_CUDA_GRAPHS=0: the
step replayed call by call, the figure before CUDA graphs). Without a CUDA device it stops at
once with one line. Prints a table, or with --json one JSON object.
"""

from __future__ import annotations

import os
import statistics
import sys
from dataclasses import dataclass

from figures import parse_args, print_figures, run_child  # bench/figures.py
from llama_bench import LlamaBench
from models import N_GEN, N_PROMPT, QWEN3_MOE, TINYLLAMA, RandomTokens, polydev_rates, scale_model

MODELS = {
    "llama 1B-class Q4_K": dict(TINYLLAMA, weight_type="Q4_K"),
    "llama 1B-class Q4_0": dict(TINYLLAMA, weight_type="Q4_0"),
    "llama 1B-class Q8_0": dict(TINYLLAMA, weight_type="Q8_0"),
    "qwen3moe 1B-class Q4_K": dict(QWEN3_MOE, weight_type="Q4_K"),
}
N_CTX = N_PROMPT + N_GEN + 64
N_CHECK, CHECK_STEPS = 64, 4
LOGITS_TARGET = 1e-3
BANDWIDTH_TARGET = 0.5
ALL = -1                                     # n_gpu_layers: every layer and the output


@dataclass(frozen=True)
class Placement:
    """Where a model's weights go: polydev's load knobs and llama-bench's options alike."""

    name: str
    n_gpu_layers: int                        # ALL, or llama.cpp's count
    cpu_moe: bool = False

    def llama_bench_args(self, n_layer: int) -> tuple[str, ...]:
        ngl = 99 if self.n_gpu_layers == ALL else self.n_gpu_layers
        return ("-ngl", str(ngl)) + (("-ncmoe", str(n_layer)) if self.cpu_moe else ())


def placements(n_layer: int, moe: bool) -> list[Placement]:
    half = (n_layer + 1) // 2
    chosen = [Placement(f"all {n_layer} layers on CUDA0", ALL),
              Placement(f"-ngl {half} of {n_layer + 1}", half)]
    if moe:
        chosen.append(Placement("all layers on CUDA0, experts on the CPU", ALL, cpu_moe=True))
    return chosen


# --- what runs in the child processes ------------------------------------------------------------

def _threads() -> int:
    from polydev.probes import physical_cores

    return physical_cores()


def polydev_child(path: str, ngl: int, cpu_moe: bool, reps: int) -> dict:
    from polydev.models import load

    rng = RandomTokens(0)
    with load(path, devices=["CUDA0"], n_gpu_layers=ngl, cpu_moe=cpu_moe, n_ctx=N_CTX,
              progress=False) as model:
        pp, tg = polydev_rates(model, rng, reps)
        return {"pp": pp, "tg": tg}


def llama_bench_child(path: str, model: str, extra: tuple[str, ...]) -> dict:
    from llama_bench import llama_bench_child as run

    done = run("llama.cpp CUDA", path, model, _threads(), [N_PROMPT], N_GEN, extra)
    return {"pp": [done[f"pp{N_PROMPT}"]], "tg": [done["tg"]]}


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


def copy_bandwidth_child() -> dict:
    """The card's device-to-device copy rate in bytes/s, reads and writes counted (the median
    of 20 copies of 1 GiB)."""
    import cupy

    n = 1 << 30
    src, dst = cupy.ones(n, dtype=cupy.uint8), cupy.empty(n, dtype=cupy.uint8)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(20):
        start.record()
        cupy.copyto(dst, src)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return {"bytes_per_s": 2 * n / statistics.median(times)}


# --- the parent ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ModelFile:
    """A model's file and what the figures need of it."""

    label: str
    path: str
    n_layer: int
    is_moe: bool
    token_bytes: int                         # weight bytes one decoded token reads

    @classmethod
    def read(cls, label: str, path: str) -> "ModelFile":
        from polydev.models import GGUFFile

        with GGUFFile(path) as f:
            arch = f.get("general.architecture")
            n_expert = int(f.get(f"{arch}.expert_count", 0) or 0)
            used = int(f.get(f"{arch}.expert_used_count", 0) or 0)
            token_bytes = 0
            for name, info in f.tensors.items():
                if name == "token_embd.weight" and "output.weight" in f.tensors:
                    continue                  # a token reads one row of it
                share = used / n_expert if n_expert and "_exps" in name else 1.0
                token_bytes += int(info.nbytes * share)
            return cls(label, path, int(f.get(f"{arch}.block_count")), n_expert > 0,
                       token_bytes)


def _rate(values: list[float]) -> str:
    return f"{statistics.mean(values):.1f} ± {statistics.pstdev(values):.1f} t/s"


class Rounds:
    """Each engine's rates over the rounds, or the first reason it failed."""

    def __init__(self) -> None:
        self.results: dict[str, dict | str] = {}

    def keep(self, engine: str, got: dict | str) -> None:
        kept = self.results.get(engine)
        if kept is None or (isinstance(got, str) and not isinstance(kept, str)):
            self.results[engine] = got
        elif isinstance(kept, dict) and isinstance(got, dict):
            for test in ("pp", "tg"):
                kept[test] = kept[test] + got[test]


def _polydev_env(spec: str | None) -> dict[str, str] | None:
    if not spec:
        return None
    name, _, value = spec.partition("=")
    return dict(os.environ, **{name: value})


def _measure(model: ModelFile, placement: Placement, rounds: int, args) -> Rounds:
    """polydev (and polydev under --polydev-env) and llama-bench, ``rounds`` times in turns."""
    measured = Rounds()
    call = (f"polydev_child({model.path!r}, {placement.n_gpu_layers}, {placement.cpu_moe}, 1)")
    for _ in range(rounds):
        measured.keep("polydev", run_child("cuda_model", call))
        if args.polydev_env:
            measured.keep(args.polydev_env,
                          run_child("cuda_model", call, _polydev_env(args.polydev_env)))
        if args.llama_bench:
            extra = placement.llama_bench_args(model.n_layer)
            measured.keep("llama.cpp", run_child(
                "cuda_model", f"llama_bench_child({args.llama_bench!r}, {model.path!r}, "
                              f"{extra!r})"))
    return measured


def _speed_figures(where: str, measured: Rounds) -> list[dict]:
    ours, theirs = measured.results["polydev"], measured.results.get("llama.cpp")
    if isinstance(ours, str):
        return [{"name": f"{where}: polydev", "value": None, "unit": "t/s", "target": None,
                 "better": "higher", "detail": f"failed: {ours}"}]
    figures = []
    for test, size, target in (("pp", N_PROMPT, 0.8), ("tg", N_GEN, 1.0)):
        figure = {"name": f"{where}: {test}{size} polydev / llama.cpp CUDA", "value": None,
                  "unit": "ratio", "target": target, "better": "higher"}
        details = [f"polydev {_rate(ours[test])}"]
        for engine, got in measured.results.items():
            if engine not in ("polydev", "llama.cpp"):
                details.append(f"polydev {engine} " + (_rate(got[test]) if isinstance(got, dict)
                                                       else f"failed: {got}"))
        if isinstance(theirs, dict):
            figure["value"] = round(statistics.mean(ours[test]) / statistics.mean(theirs[test]),
                                    3)
            details.append(f"llama.cpp {_rate(theirs[test])}")
        else:
            details.append(f"llama.cpp missing: {theirs or 'no --llama-bench PATH given'}")
        figures.append({**figure, "detail": "; ".join(details)})
    return figures


def _bandwidth_figure(where: str, model: ModelFile, measured: Rounds, copy: dict | str) -> dict:
    figure = {"name": f"{where}: tg{N_GEN} weight bytes read / copy bandwidth", "value": None,
              "unit": "ratio", "target": BANDWIDTH_TARGET, "better": "higher"}
    ours = measured.results["polydev"]
    if isinstance(copy, str) or isinstance(ours, str):
        return {**figure, "detail": f"failed: {copy if isinstance(copy, str) else ours}"}
    rate = model.token_bytes * statistics.mean(ours["tg"])
    share = rate / copy["bytes_per_s"]
    detail = (f"{model.token_bytes / 2**20:.0f} MiB a token at {rate / 1e9:.0f} GB/s, copies "
              f"{copy['bytes_per_s'] / 1e9:.0f} GB/s")
    theirs = measured.results.get("llama.cpp")
    if isinstance(theirs, dict):
        theirs_share = model.token_bytes * statistics.mean(theirs["tg"]) / copy["bytes_per_s"]
        detail += f"; llama.cpp {theirs_share:.3f}"
    return {**figure, "value": round(share, 3), "detail": detail}


def _logits_figure(where: str, check: dict | str) -> dict:
    figure = {"name": f"{where}: logits' largest difference from the CPU backend's / largest "
                      f"logit", "value": None, "unit": "ratio", "target": LOGITS_TARGET,
              "better": "lower"}
    if isinstance(check, str):
        return {**figure, "detail": f"failed: {check}"}
    return {**figure, "value": float(f"{check['error']:.3g}"),
            "detail": f"{check['rows']} rows ({N_CHECK} prompt positions, {CHECK_STEPS} decode "
                      f"steps), same argmax at {check['argmax_same']:.1%}"}


def _model_figures(model: ModelFile, rounds: int, copy: dict | str, args) -> list[dict]:
    figures = []
    for placement in placements(model.n_layer, model.is_moe):
        where = f"{model.label}, {placement.name}"
        measured = _measure(model, placement, rounds, args)
        figures += _speed_figures(where, measured)
        if placement.n_gpu_layers == ALL and not placement.cpu_moe:
            figures.append(_bandwidth_figure(where, model, measured, copy))
        if args.logits and not placement.cpu_moe:
            figures.append(_logits_figure(where, run_child(
                "cuda_model", f"logits_child({model.path!r}, {placement.n_gpu_layers})")))
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
    if args.llama_bench:
        LlamaBench.parse(args.llama_bench)          # a missing binary stops here, not later
    rounds = args.rounds or (1 if args.quick else 3)
    copy = run_child("cuda_model", "copy_bandwidth_child()")
    figures = []
    for label, shape in MODELS.items():
        if args.only is None or args.only.lower() in label.lower():
            model = ModelFile.read(label, scale_model(label, shape))
            figures += _model_figures(model, rounds, copy, args)
    engine = f"llama-bench {args.llama_bench}" if args.llama_bench else "no llama.cpp"
    print_figures("cuda_model", f"{device.description}; {_threads()} CPU threads; {engine}; "
                                f"{rounds} rounds in turns", figures, args.json)
    return 0


def _options(parser) -> None:
    parser.add_argument("--llama-bench", metavar="PATH",
                        help="llama.cpp's llama-bench built with GGML_CUDA=ON, measured in "
                             "turns with polydev (bench/gpu.sh llama builds one)")
    parser.add_argument("--rounds", type=int, help="rounds in turns (default 3, --quick 1)")
    parser.add_argument("--only", metavar="TEXT", help="only the models whose label holds TEXT")
    parser.add_argument("--polydev-env", metavar="NAME=VALUE",
                        help="also run polydev with this environment variable set")
    parser.add_argument("--no-logits", dest="logits", action="store_false",
                        help="skip the logits check against the CPU backend")


if __name__ == "__main__":
    sys.exit(main())
