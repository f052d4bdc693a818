"""polydev serve under 1, 4, 8 and 16 concurrent streams, beside llama-cpp-python's server.

For each model (gemma-3-270m, and TinyLlama's widths in Q4_K from bench/models.py's 1B class),
each server runs in its own process on 127.0.0.1, one after the other: polydev serve on the CPU
(-np 16), polydev serve with half the layers on OpenCL0 (-ngl n/2, where an OpenCL device
exists), polydev serve with every layer on CUDA0 (where a GPU exists) and llama-cpp-python's
own server (``python -m llama_cpp.server``, as many threads; it answers one request at a time),
the one a Python user would pick. After a warm-up round, each round sends N streaming
completions of 128 tokens at once (prompts of its own, temperature 0.8, its own seed) and
measures:
- aggregate generation t/s: completion tokens of all N / the round's wall time;
- time to first token, p50 and p95 over the N requests.
Figures: polydev's aggregate t/s at 8 streams / at 1 stream (target 3.0) and / llama-cpp-python
server's at 8 streams (target 2.0). ``--llama-cpp DIR`` runs the llama-cpp-python in DIR (a
native build). Needs the serve extra, and llama-cpp-python[server] for the reference.
"""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial

from polydev.numerics import NUMERICS
from polydev.probes import physical_cores

from figures import (add_llama_cpp_option, leave_bench_dir, parse_args,  # bench/
                     print_figures, real_models)
from models import SCALE_MODELS, scale_model, with_llama_cpp  # bench/

leave_bench_dir()

STREAMS = (1, 4, 8, 16)
N_CTX = 4096
READY_SECONDS = 600         # a 1B-class model on PoCL takes minutes to load
REQUEST_SECONDS = 600
SCALE_MODEL = "llama 1B-class Q4_K"
N_GEN = 128                 # tokens per request, as llama-bench's tg128
THREADS = physical_cores()  # both servers' CPU threads (polydev serve's default)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
    """A server process whose log goes to a temporary file (llama.cpp logs enough to fill a
    pipe, and a server blocked on its stderr never answers)."""
    log = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    proc.log = log
    return proc


def polydev_server(path: str, port: int, extra: list[str]) -> subprocess.Popen:
    code = "import sys; from polydev.tools.cli import main; sys.exit(main(sys.argv[1:]))"
    return start_server([sys.executable, "-c", code, "serve", "-m", path, "--port", str(port),
                         "-np", str(max(STREAMS)), "-c", str(N_CTX), "--no-progress", *extra])


def llama_cpp_server(path: str, port: int, directory: str | None) -> subprocess.Popen:
    return start_server([sys.executable, "-m", "llama_cpp.server", "--model", path, "--host",
                         "127.0.0.1", "--port", str(port), "--n_ctx", str(N_CTX),
                         "--n_threads", str(THREADS), "--n_threads_batch", str(THREADS)],
                        with_llama_cpp(directory) if directory else None)


def wait_ready(proc: subprocess.Popen, port: int) -> str | None:
    """None once the server answers /v1/models, else why it never will."""
    deadline = time.monotonic() + READY_SECONDS
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            proc.log.seek(0)
            return (proc.log.read().strip().splitlines() or ["exited"])[-1]
        try:
            if _get(port, "/v1/models")[0] == 200 and _get(port, "/health")[0] in (200, 404):
                return None
        except OSError:
            pass
        time.sleep(0.2)
    return f"not ready after {READY_SECONDS} s"


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def stream_one(port: int, prompt: str, max_tokens: int, seed: int) -> tuple[float, int]:
    """(seconds to the first token, completion tokens) of one streamed completion."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8,
                       "seed": seed, "stream": True, "stream_options": {"include_usage": True}})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_SECONDS)
    start, first, chunks, usage = time.perf_counter(), None, 0, None
    try:
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        for line in r:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                usage = data["usage"]["completion_tokens"]
            if data.get("choices") and data["choices"][0].get("text"):
                chunks += 1
                if first is None:
                    first = time.perf_counter() - start
    finally:
        conn.close()
    return (first if first is not None else time.perf_counter() - start,
            usage if usage is not None else chunks)


def one_round(port: int, n: int, max_tokens: int, name: str | None = None) -> dict:
    """N streams at once: aggregate t/s and time-to-first-token percentiles. Each round's
    prompts are its own (``name``, by default the stream count, starts them), so no round
    finds another's prompt in a slot's cache."""
    results: list = [None] * n
    name = name or f"Round {n}"

    def client(i: int) -> None:
        try:
            results[i] = stream_one(port, f"{name}, request {i}: tell me a long story about "
                                          f"the number {i * 7 + 3} and a river.", max_tokens, i)
        except Exception as e:             # reported in the figure, not raised in a thread
            results[i] = e
    threads = [threading.Thread(target=client, args=(i,)) for i in range(n)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    failed = [r for r in results if isinstance(r, Exception)]
    if failed:
        raise RuntimeError(f"{len(failed)} of {n} requests failed: {failed[0]}")
    ttft = sorted(r[0] for r in results)
    return {"tps": sum(r[1] for r in results) / wall, "p50": statistics.median(ttft),
            "p95": ttft[min(n - 1, round(0.95 * (n - 1)))]}


def measure(proc: subprocess.Popen, port: int, max_tokens: int) -> dict | str:
    """Every round on one server, after a warm-up request; or why it failed."""
    try:
        why = wait_ready(proc, port)
        if why is not None:
            return why
        one_round(port, 1, 16, name="Warm-up")   # a prompt like the rounds': its graphs built
        return {n: one_round(port, n, max_tokens) for n in STREAMS}
    except Exception as e:
        return str(e)
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        proc.log.close()


def opencl_layers(path: str) -> list[str] | None:
    """-ngl and --device for half the layers on OpenCL0, or None without an OpenCL device."""
    import polydev
    from polydev.models import GGUFFile, HParams

    if not any(d.name == "OpenCL0" for d in polydev.devices()):
        return None
    with GGUFFile(path) as f:
        n_layer = HParams.from_gguf(f).n_layer
    return ["-ngl", str(n_layer // 2 + 1), "--device", "OpenCL0"]


def has_cuda() -> bool:
    import polydev

    return any(d.name == "CUDA0" for d in polydev.devices())


def _models(quick: bool) -> dict[str, str]:
    """The models to serve: gemma-3-270m where its package is installed (a GPU machine may
    lack it), and the 1B-class one unless --quick."""
    from polydev.errors import MissingDependencyError

    models = {}
    try:
        models["gemma-3-270m Q4_K_M"] = real_models()["gemma-3-270m Q4_K_M"]
    except MissingDependencyError as e:
        print(f"gemma-3-270m left out: {e}", file=sys.stderr)
    if not quick:
        models[SCALE_MODEL] = scale_model(SCALE_MODEL, SCALE_MODELS[SCALE_MODEL])
    return models


def _engines(path: str, args) -> dict:
    engines = {}
    numerics = ["--numerics", args.numerics] if args.numerics else []
    if not args.no_cpu:
        engines["polydev CPU"] = partial(polydev_server, path,
                                         extra=["--device", "none", *numerics])
    if not args.no_reference:
        engines["llama-cpp-python server"] = partial(llama_cpp_server, path,
                                                     directory=args.llama_cpp)
    layers = None if args.no_opencl else opencl_layers(path)
    if layers:
        engines["polydev OpenCL0+CPU"] = partial(polydev_server, path, extra=layers + numerics)
    if has_cuda():                       # every layer there (-ngl's default)
        engines["polydev CUDA0"] = partial(polydev_server, path,
                                           extra=["--device", "CUDA0", *numerics])
    return engines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, extra=_options)
    max_tokens = 16 if args.quick else N_GEN
    figures = []
    for label, path in _models(args.quick).items():
        engines = _engines(path, args)
        results = {}
        for engine, start in engines.items():
            port = free_port()
            results[engine] = measure(start(port), port, max_tokens)
            print(f"{label}, {engine}: {_summary(results[engine])}", file=sys.stderr)
        figures += _figures(label, results)
    numerics = f"; numerics={args.numerics}" if args.numerics else ""
    print_figures("serve", f"{THREADS} CPU threads; {max_tokens} tokens per request{numerics}",
                  figures, args.json)
    return 0


def _summary(result: dict | str) -> str:
    if isinstance(result, str):
        return f"failed: {result}"
    return ", ".join(f"{n}: {r['tps']:.1f} t/s (ttft p50 {r['p50'] * 1e3:.0f} ms)"
                     for n, r in result.items())


def _figures(label: str, results: dict) -> list[dict]:
    out = []
    for engine, result in results.items():
        if isinstance(result, str):
            out.append({"name": f"{label}: {engine}", "value": None, "unit": "t/s",
                        "target": None, "better": "higher", "detail": f"failed: {result}"})
            continue
        for n, r in result.items():
            out.append({"name": f"{label}: {engine}, {n} streams, aggregate", "value":
                        round(r["tps"], 1), "unit": "t/s", "target": None, "better": "higher",
                        "detail": f"time to first token p50 {r['p50'] * 1e3:.0f} ms, p95 "
                                  f"{r['p95'] * 1e3:.0f} ms"})
    for engine in ("polydev CPU", "polydev CUDA0"):
        result = results.get(engine)
        if isinstance(result, dict):
            out.append({"name": f"{label}: {engine}, 8 streams / 1 stream", "value":
                        round(result[8]["tps"] / result[1]["tps"], 2), "unit": "ratio",
                        "target": 3.0, "better": "higher"})
    ours, theirs = results.get("polydev CPU"), results.get("llama-cpp-python server")
    if isinstance(ours, dict):
        value = (round(ours[8]["tps"] / theirs[8]["tps"], 2) if isinstance(theirs, dict)
                 else None)
        out.append({"name": f"{label}: polydev CPU / llama-cpp-python server, 8 streams",
                    "value": value, "unit": "ratio", "target": 2.0, "better": "higher",
                    "detail": "" if value is not None else
                    f"reference missing: {theirs or 'left out (--no-reference)'}"})
    return out


def _options(parser) -> None:
    add_llama_cpp_option(parser)
    parser.add_argument("--no-cpu", action="store_true",
                        help="leave out polydev serve on the CPU alone")
    parser.add_argument("--no-reference", action="store_true",
                        help="leave out llama-cpp-python's server (e.g. on a GPU machine "
                             "without it)")
    parser.add_argument("--no-opencl", action="store_true",
                        help="leave out the OpenCL0+CPU server (minutes per 1B-class model "
                             "on PoCL)")
    parser.add_argument("--numerics", choices=NUMERICS,
                        help="polydev serve's numerics (polydev.numerics; default: its default)")


if __name__ == "__main__":
    sys.exit(main())
