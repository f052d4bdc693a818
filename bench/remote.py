"""Remote devices on a Ray cluster of this machine against llama.cpp's RPC, in one run.

The cluster: a head and two worker nodes, node-a and node-b, each its own raylet
(ray.cluster_utils, as Ray's own tests build clusters); a polydev CPU device actor on each
worker (the head gives Ray no CPU, so it holds none). llama.cpp's side: ggml-rpc-server
processes (bash bench/anchors.sh rpc builds them with a llama-bench that has --rpc), each with
as many threads as a polydev device computes with.

- the round trip of a small call to node-a's device, and set and get of 64 MiB through it
  against a local numpy copy;
- MODEL (default: bench/models.py's 1B-class llama in Q4_K; --model PATH) with every layer
  on node-a and node-b, half each (-ts 1,1), pp512 and tg128, against llama-bench --rpc over
  two servers with the same split (-ngl 99 -ts 1/1); and the same on node-a alone (one
  server): what the split costs, split over one node;
- loading MODEL onto the split to the first token's logits: polydev's load and one token,
  against llama-bench -p 1 -n 0 over the two servers, end to end;
- the polydev actors' CPU while the cluster idles with MODEL loaded: % of one core.

Rounds in turns (--rounds), medians. Prints a table, or with --json one JSON object. One
machine cannot show what a pipeline gains, only what the split costs: every node shares the
same cores.
"""

from __future__ import annotations

import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Iterator

import numpy as np

from figures import leave_bench_dir, parse_args, print_figures  # bench/
from llama_bench import LlamaBench
from models import SCALE_MODELS, RandomTokens, polydev_rates, scale_model

leave_bench_dir()

COPY_BYTES = 64 << 20
WORKERS = ("node-a", "node-b")
DEFAULT_MODEL = "llama 1B-class Q4_K"
N_CTX = 1024
IDLE_SECONDS = 10.0


def _best(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


# --- the cluster ------------------------------------------------------------------------------

@contextlib.contextmanager
def cluster() -> Iterator[dict]:
    """A head (no CPU for an actor) and the WORKERS, each its own raylet with one CPU; yields
    {node: its device}."""
    import ray
    from ray.cluster_utils import Cluster

    from polydev.backends import ray as polydev_ray

    one_cpu = dict(num_cpus=1, object_store_memory=256 << 20)
    # the head holds no device (no CPU of Ray's to give an actor): it coordinates
    built = Cluster(initialize_head=True, head_node_args=dict(one_cpu, num_cpus=0,
                                                              include_dashboard=False))
    try:
        for name in WORKERS:
            built.add_node(**one_cpu, node_name=name)
        built.wait_for_nodes()
        ray.init(address=built.address, log_to_driver=False)
        yield {d.node: d for d in polydev_ray.connect(None, devices=["CPU"])}
    finally:
        if ray.is_initialized():
            polydev_ray.disconnect()
            ray.shutdown()
        built.shutdown()


def round_trip(device, repeats: int) -> dict:
    device.memory()
    seconds = _best(device.memory, repeats)
    return {"name": f"round trip of a small call to {device.name} (its memory)",
            "value": round(seconds * 1e3, 3), "unit": "ms", "target": None, "better": "lower"}


def bandwidth(device, repeats: int) -> list[dict]:
    from polydev import Context, GGMLType, alloc_ctx_tensors
    from polydev.buffer import tensor_get, tensor_set

    data = np.random.default_rng(0).integers(0, 255, COPY_BYTES, dtype=np.uint8)
    local = _best(lambda: np.copyto(np.empty_like(data), data), repeats)
    ctx = Context()
    t = ctx.new_tensor(GGMLType.I8, (COPY_BYTES,), "bytes")
    out = np.empty_like(data)
    with alloc_ctx_tensors(ctx, device.buffer_type):
        set_s = _best(lambda: (tensor_set(t, data), device.memory()), repeats)   # it is done
        get_s = _best(lambda: tensor_get(t, out=out), repeats)
        assert np.array_equal(out, data)
    return [{"name": f"{what} of 64 MiB through {device.name}: GiB/s / a local numpy copy's",
             "value": round(local / seconds, 3), "unit": "ratio", "target": None,
             "better": "higher", "detail": f"{COPY_BYTES / seconds / 2**30:.2f} vs "
                                           f"{COPY_BYTES / local / 2**30:.2f} GiB/s"}
            for what, seconds in (("set", set_s), ("get", get_s))]


# --- the two engines' turns -------------------------------------------------------------------

def polydev_turn(path: str, devices: list) -> dict:
    """Load ``path`` with every layer on ``devices`` (an equal share each): seconds to the
    first token's logits, then pp512 and tg128 t/s."""
    from polydev.models import load

    start = time.perf_counter()
    with load(path, devices=[d.name for d in devices], n_gpu_layers=99,
              tensor_split=[1] * len(devices), n_ctx=N_CTX, n_batch=512,
              progress=False) as model:
        model.evaluator.eval([1])
        loaded = time.perf_counter() - start
        pp, tg = polydev_rates(model, RandomTokens(0), 1)
    return {"load": loaded, "pp": pp[0], "tg": tg[0]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def rpc_servers(binary: str, count: int, threads: int) -> Iterator[str]:
    """``count`` ggml-rpc-servers on 127.0.0.1; yields their endpoints for --rpc."""
    ports = [_free_port() for _ in range(count)]
    servers = [subprocess.Popen([binary, "-t", str(threads), "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
               for port in ports]
    try:
        for port in ports:
            deadline = time.monotonic() + 30
            while True:
                with socket.socket() as s:
                    if s.connect_ex(("127.0.0.1", port)) == 0:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"ggml-rpc-server on port {port} did not start")
                time.sleep(0.05)
        yield ",".join(f"127.0.0.1:{port}" for port in ports)
    finally:
        for server in servers:
            server.terminate()
        for server in servers:
            server.wait(10)


def llama_turn(bin_dir: str, path: str, count: int, threads: int) -> dict:
    """llama-bench over ``count`` RPC servers, every layer on them in equal shares: pp512 and
    tg128 t/s, and the seconds of a run to its first token (-p 1 -n 0, end to end)."""
    bench = LlamaBench("llama.cpp RPC", os.path.join(bin_dir, "llama-bench"))
    server = os.path.join(bin_dir, "ggml-rpc-server")
    out: dict = {}
    with rpc_servers(server, count, threads) as endpoints:
        extra = ("--rpc", endpoints, "-ngl", "99", "-ts", "/".join(["1"] * count))
        start = time.perf_counter()
        _run(bench.command(path, threads, [1], 0, extra))
        out["load"] = time.perf_counter() - start
    with rpc_servers(server, count, threads) as endpoints:
        extra = ("--rpc", endpoints, "-ngl", "99", "-ts", "/".join(["1"] * count))
        for test in _run(bench.command(path, threads, [512], 128, extra)):
            out["tg" if test["n_gen"] else "pp"] = test["avg_ts"]
    return out


def _run(command: list[str]) -> list[dict]:
    import json

    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{os.path.basename(command[0])} exited with {done.returncode}: "
                           f"{tail}")
    return json.loads(done.stdout)


# --- idle --------------------------------------------------------------------------------------

def _cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _polydev_actors() -> list[int]:
    """The processes of polydev's actors on this machine (Ray titles them by class)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().split(b"\0")[0]
        except OSError:
            continue
        if title.startswith((b"ray::DeviceActor", b"ray::HeartbeatCollector")):
            pids.append(int(entry))
    return pids


def idle_cpu(path: str, devices: list, seconds: float) -> dict:
    """Every polydev actor's CPU (the device actors and the heartbeat's collector), % of one
    core summed, while MODEL sits loaded on ``devices``."""
    from polydev.models import load

    with load(path, devices=[d.name for d in devices], n_gpu_layers=99,
              tensor_split=[1] * len(devices), n_ctx=N_CTX, progress=False) as model:
        model.evaluator.eval([1])
        time.sleep(1.0)
        pids = _polydev_actors()
        before = {pid: _cpu_seconds(pid) for pid in pids}
        time.sleep(seconds)
        used = sum(_cpu_seconds(pid) - start for pid, start in before.items())
    return {"name": f"polydev's {len(pids)} actors' CPU while the cluster idles with the model "
                    f"loaded", "value": round(100 * used / seconds, 2), "unit": "% of a core",
            "target": 2.0, "better": "lower",
            "detail": f"over {seconds:g} s: every device actor and the heartbeat's "
                      f"collector"}


# --- the figures -------------------------------------------------------------------------------

def _med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def model_figures(label: str, ours: dict[str, list], theirs: dict[str, list] | None) -> list:
    figures = []
    split, one = ours["split"], ours["one"]
    for key, what in (("tg", "tg128"), ("pp", "pp512")):
        if theirs is not None:
            mine, rpc = _med(split, key), _med(theirs["split"], key)
            figures.append({"name": f"{label}: {what} over node-a and node-b, polydev / "
                                    f"llama.cpp RPC", "value": round(mine / rpc, 3),
                            "unit": "ratio", "target": 1.0, "better": "higher",
                            "detail": f"{mine:.1f} vs {rpc:.1f} t/s"})
        ratio = _med(split, key) / _med(one, key)
        detail = f"{_med(split, key):.1f} vs {_med(one, key):.1f} t/s"
        if theirs is not None:
            split_rpc, one_rpc = _med(theirs["split"], key), _med(theirs["one"], key)
            detail += (f"; llama.cpp RPC {split_rpc / one_rpc:.3f} ({split_rpc:.1f} vs "
                       f"{one_rpc:.1f})")
        figures.append({"name": f"{label}: {what} split over two nodes / on node-a alone",
                        "value": round(ratio, 3), "unit": "ratio",
                        "target": 0.9 if key == "tg" else None, "better": "higher",
                        "detail": detail})
    if theirs is not None:
        mine, rpc = _med(split, "load"), _med(theirs["split"], "load")
        figures.append({"name": f"{label}: loading onto the split to the first token, "
                                f"llama.cpp RPC s / polydev s", "value": round(rpc / mine, 3),
                        "unit": "ratio", "target": 1.0, "better": "higher",
                        "detail": f"{mine:.2f} vs {rpc:.2f} s"})
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, extra=_options)
    try:
        import ray  # noqa: F401
    except ImportError:
        print("bench/remote.py needs the ray extra: pip install -e '.[ray]'", file=sys.stderr)
        return 1
    from polydev.probes import physical_cores

    rounds = args.rounds or (1 if args.quick else 3)
    path = args.model or scale_model(DEFAULT_MODEL, SCALE_MODELS[DEFAULT_MODEL])
    label = os.path.basename(path) if args.model else DEFAULT_MODEL
    rpc = args.rpc
    if rpc and not os.path.isfile(os.path.join(rpc, "ggml-rpc-server")):
        rpc = None
    if rpc is None:
        print("no llama.cpp RPC (bash bench/anchors.sh rpc, then --rpc $(bash "
              "bench/anchors.sh --rpc)): polydev's figures alone", file=sys.stderr)
    threads = physical_cores()
    ours: dict[str, list] = {"split": [], "one": []}
    theirs: dict[str, list] | None = {"split": [], "one": []} if rpc else None
    with cluster() as devices:
        a = devices["node-a"]
        figures = [round_trip(a, 50 if args.quick else 500)]
        figures += bandwidth(a, 2 if args.quick else 5)
        for _ in range(rounds):
            for kind, used in (("split", [a, devices["node-b"]]), ("one", [a])):
                ours[kind].append(polydev_turn(path, used))
                if theirs is not None:
                    theirs[kind].append(llama_turn(rpc, path, len(used), threads))
        figures += model_figures(label, ours, theirs)
        figures.append(idle_cpu(path, [a, devices["node-b"]],
                                3.0 if args.quick else IDLE_SECONDS))
    print_figures("remote", f"Ray cluster of this machine (a head, node-a, node-b), {threads} "
                            f"threads a device, {rounds} rounds in turns, medians; against "
                            f"{'llama.cpp RPC in ' + rpc if rpc else 'nothing'}", figures,
                  args.json)
    return 0


def _options(parser) -> None:
    parser.add_argument("--model", metavar="PATH",
                        help=f"a GGUF model (default: bench/models.py's {DEFAULT_MODEL})")
    parser.add_argument("--rpc", metavar="DIR",
                        help="the folder of llama.cpp's ggml-rpc-server and llama-bench built "
                             "with -DGGML_RPC=ON (bash bench/anchors.sh --rpc prints it)")
    parser.add_argument("--rounds", type=int, metavar="N",
                        help="rounds of each engine in turns (default 3; 1 with --quick)")


if __name__ == "__main__":
    sys.exit(main())
