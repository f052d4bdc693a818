"""polydev serve under 1, 4, 8 and 16 concurrent streams, against llama.cpp's llama-server.

    bash bench/anchors.sh server          # once: llama-server built for this host
    python bench/serve.py --llama-server $(bash bench/anchors.sh --server) [--rounds 3]

For each model (gemma-3-270m, and TinyLlama's widths in Q4_K from bench/models.py's 1B class),
each server runs in its own process on 127.0.0.1 with the same slots (-np 16), context and
threads, and the engines take turns: every round starts and measures polydev serve on the CPU,
then llama-server (``--llama-server PATH``; without it llama-cpp-python's own server, which
answers one request at a time), then, where they exist, polydev serve with half the layers on
OpenCL0 and with every layer on CUDA0. Figures are medians over ``--rounds``. After a warm-up
request, a round sends N streaming completions of 128 tokens at once (prompts of its own,
temperature 0.8, its own seed) and measures:
- aggregate generation t/s: completion tokens of all N / the round's wall time;
- time to first token, p50 and p99 over the N requests;
- the same at 1 and 8 streams with a JSON schema in ``response_format`` (structured output;
  target: at most 10% slower than the plain streams);
- with ``--llama-server``, speculative decoding on a task that quotes its prompt (a chat
  request to repeat a given text, greedy, 256 tokens, one stream): each engine's t/s with its
  draft-free n-gram speculation (polydev ``--spec-type ngram``, llama-server ``--spec-type
  ngram-simple``) and without, and the speed-up.
Figures: polydev / llama-server aggregate t/s at each stream count (target 1.0; 1.3 at 8
streams), time to first token p50 against llama-server's (target 1.0, lower is better), and
polydev's 8 streams / 1 stream (target 3.0). ``--llama-cpp DIR`` runs the llama-cpp-python in
DIR (a native build) as the fallback reference. Needs the serve extra.
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
from typing import Iterator

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
N_QUOTE = 256               # tokens of the speculative task's reply
# replies that run to max_tokens, as the plain rounds' do: a schema that ended them early would
# make the JSON rounds' aggregate t/s a measure of their lengths
SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 40},
    "story": {"type": "string", "minLength": 4000}},
    "required": ["title", "story"], "additionalProperties": False}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "story", "schema": SCHEMA}}
QUOTED = ("The river ran through the valley for a hundred miles before it reached the sea. "
          "Along its banks stood mills and farms, and in spring the water rose over the "
          "fields. The people of the valley built walls of stone to hold it back, and every "
          "year they mended them after the floods. Children learned to swim in its quiet "
          "bends, and old men fished from the bridges at dawn. ") * 2


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


def llama_server(binary: str, path: str, port: int, extra: list[str]) -> subprocess.Popen:
    """llama.cpp's own C++ server, as polydev serve is set up: the same slots, context and
    threads, continuous batching."""
    return start_server([binary, "-m", path, "--host", "127.0.0.1", "--port", str(port),
                         "-np", str(max(STREAMS)), "-c", str(N_CTX), "-t", str(THREADS),
                         "-tb", str(THREADS), "--cont-batching", "--no-webui", *extra])


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


def sse_events(port: int, path: str, body: str) -> Iterator[dict]:
    """The data of each server-sent event a streamed POST of ``body`` to ``path`` answers
    with, until ``[DONE]``."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=REQUEST_SECONDS)
    try:
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
        for line in r:
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                yield json.loads(line[6:])
    finally:
        conn.close()


def stream_one(port: int, prompt: str, max_tokens: int, seed: int,
               extra: dict | None = None) -> tuple[float, int]:
    """(seconds to the first token, completion tokens) of one streamed completion;
    ``extra``: more body fields (a response format)."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0.8,
                       "seed": seed, "stream": True, "stream_options": {"include_usage": True},
                       **(extra or {})})
    start, first, chunks, usage = time.perf_counter(), None, 0, None
    for data in sse_events(port, "/v1/completions", body):
        if data.get("usage"):
            usage = data["usage"]["completion_tokens"]
        if data.get("choices") and data["choices"][0].get("text"):
            chunks += 1
            if first is None:
                first = time.perf_counter() - start
    return (first if first is not None else time.perf_counter() - start,
            usage if usage is not None else chunks)


def one_round(port: int, n: int, max_tokens: int, name: str | None = None,
              extra: dict | None = None) -> dict:
    """N streams at once: aggregate t/s and time-to-first-token percentiles. Each round's
    prompts are its own (``name``, by default the stream count, starts them), so no round
    finds another's prompt in a slot's cache."""
    results: list = [None] * n
    name = name or f"Round {n}"

    def client(i: int) -> None:
        try:
            results[i] = stream_one(port, f"{name}, request {i}: tell me a long story about "
                                          f"the number {i * 7 + 3} and a river.", max_tokens, i,
                                    extra)
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
            "p99": ttft[min(n - 1, round(0.99 * (n - 1)))]}


def quote_round(port: int, max_tokens: int) -> dict:
    """One greedy chat request that repeats a given text: its generation t/s after the
    first token."""
    body = json.dumps({"messages": [{"role": "user", "content": "Repeat this text exactly, "
                                     f"word for word:\n\n{QUOTED}"}],
                       "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "stream_options": {"include_usage": True}})
    start, first, tokens = time.perf_counter(), None, 0
    for data in sse_events(port, "/v1/chat/completions", body):
        if data.get("usage"):
            tokens = data["usage"]["completion_tokens"]
        elif first is None and data.get("choices") and data["choices"][0]["delta"].get(
                "content"):
            first = time.perf_counter()
    end = time.perf_counter()
    return {"tps": (tokens - 1) / (end - first) if first and tokens > 1 else 0.0,
            "tokens": tokens, "seconds": end - start}


def measure(proc: subprocess.Popen, port: int, max_tokens: int, task: str) -> dict | str:
    """One round of ``task`` on one server, after a warm-up request; or why it failed.
    "streams": every stream count, plain and with a JSON schema; "quote": the speculative
    task."""
    try:
        why = wait_ready(proc, port)
        if why is not None:
            return why
        one_round(port, 1, 16, name="Warm-up")   # a prompt like the rounds': its graphs built
        if task == "quote":
            return quote_round(port, min(max_tokens * 2, N_QUOTE))
        out = {n: one_round(port, n, max_tokens) for n in STREAMS}
        for n in (1, 8):
            out[f"json {n}"] = one_round(port, n, max_tokens, name=f"JSON round {n}",
                                         extra={"response_format": JSON_FORMAT})
        return out
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
    """Each engine's starter and its task."""
    engines = {}
    numerics = ["--numerics", args.numerics] if args.numerics else []
    cpu = ["--device", "none", *numerics]
    if not args.no_cpu:
        engines["polydev CPU"] = (partial(polydev_server, path, extra=cpu), "streams")
    if args.llama_server:
        engines["llama-server"] = (partial(llama_server, args.llama_server, path, extra=[]),
                                   "streams")
        if not args.no_cpu:
            engines["polydev CPU, quote"] = (partial(polydev_server, path, extra=cpu),
                                             "quote")
            engines["polydev CPU ngram, quote"] = (partial(
                polydev_server, path, extra=[*cpu, "--spec-type", "ngram"]), "quote")
        engines["llama-server, quote"] = (partial(llama_server, args.llama_server, path,
                                                  extra=[]), "quote")
        engines["llama-server ngram, quote"] = (partial(
            llama_server, args.llama_server, path, extra=["--spec-type", "ngram-simple"]),
            "quote")
    elif not args.no_reference:
        engines["llama-cpp-python server"] = (partial(llama_cpp_server, path,
                                                      directory=args.llama_cpp), "streams")
    layers = None if args.no_opencl else opencl_layers(path)
    if layers:
        engines["polydev OpenCL0+CPU"] = (partial(polydev_server, path,
                                                  extra=layers + numerics), "streams")
    if has_cuda():                       # every layer there (-ngl's default)
        engines["polydev CUDA0"] = (partial(polydev_server, path,
                                            extra=["--device", "CUDA0", *numerics]), "streams")
    return engines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(__doc__, argv, extra=_options)
    max_tokens = 16 if args.quick else N_GEN
    rounds = 1 if args.quick else args.rounds
    figures = []
    for label, path in _models(args.quick).items():
        engines = _engines(path, args)
        runs: dict[str, list] = {engine: [] for engine in engines}
        for r in range(rounds):                 # in turns: a round of every engine
            for engine, (start, task) in engines.items():
                port = free_port()
                runs[engine].append(measure(start(port), port, max_tokens, task))
                print(f"{label}, round {r + 1}, {engine}: {_summary(runs[engine][-1])}",
                      file=sys.stderr)
        figures += _figures(label, {engine: _median(results)
                                    for engine, results in runs.items()})
    numerics = f"; numerics={args.numerics}" if args.numerics else ""
    print_figures("serve", f"{THREADS} CPU threads; {max_tokens} tokens per request; "
                  f"medians of {rounds} rounds in turns{numerics}", figures, args.json)
    return 0


def _median(results: list) -> dict | str:
    """The rounds' median figure by figure (a failed round: why, when every round failed)."""
    good = [r for r in results if isinstance(r, dict)]
    if not good:
        return results[-1]
    if "tps" in good[0]:
        return {k: statistics.median(r[k] for r in good) for k in good[0]}
    return {n: {k: statistics.median(r[n][k] for r in good) for k in good[0][n]}
            for n in good[0]}


def _summary(result: dict | str) -> str:
    if isinstance(result, str):
        return f"failed: {result}"
    if "tps" in result:
        return f"{result['tps']:.1f} t/s, {result['tokens']} tokens"
    return ", ".join(f"{n}: {r['tps']:.1f} t/s (ttft p50 {r['p50'] * 1e3:.0f} ms)"
                     for n, r in result.items())


def _figures(label: str, results: dict) -> list[dict]:
    out = []
    for engine, result in results.items():
        if isinstance(result, str):
            out.append({"name": f"{label}: {engine}", "value": None, "unit": "t/s",
                        "target": None, "better": "higher", "detail": f"failed: {result}"})
            continue
        if "tps" in result:
            out.append({"name": f"{label}: {engine}, one stream", "value":
                        round(result["tps"], 1), "unit": "t/s", "target": None,
                        "better": "higher", "detail": f"{result['tokens']} tokens"})
            continue
        for n, r in result.items():
            out.append({"name": f"{label}: {engine}, {n} streams, aggregate", "value":
                        round(r["tps"], 1), "unit": "t/s", "target": None, "better": "higher",
                        "detail": f"time to first token p50 {r['p50'] * 1e3:.0f} ms, p99 "
                                  f"{r['p99'] * 1e3:.0f} ms"})
    out += _against_llama_server(label, results)
    for engine in ("polydev CPU", "polydev CUDA0"):
        result = results.get(engine)
        if isinstance(result, dict):
            out.append({"name": f"{label}: {engine}, 8 streams / 1 stream", "value":
                        round(result[8]["tps"] / result[1]["tps"], 2), "unit": "ratio",
                        "target": 3.0, "better": "higher"})
    ours, theirs = results.get("polydev CPU"), results.get("llama-cpp-python server")
    if isinstance(ours, dict) and "llama-server" not in results:     # the fallback reference
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
    parser.add_argument("--llama-server", metavar="PATH",
                        help="llama.cpp's llama-server binary, the reference (bash "
                             "bench/anchors.sh server builds it)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of every engine, in turns (figures are medians; default "
                             "3, 1 with --quick)")


def _against_llama_server(label: str, results: dict) -> list[dict]:
    """polydev / llama-server: aggregate t/s per stream count, first-token p50, structured
    output's cost, and speculation's speed-up."""
    ours, theirs = results.get("polydev CPU"), results.get("llama-server")
    out = []
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for n in STREAMS:
            out.append({"name": f"{label}: polydev / llama-server, {n} streams", "value":
                        round(ours[n]["tps"] / theirs[n]["tps"], 2), "unit": "ratio",
                        "target": 1.3 if n == 8 else 1.0, "better": "higher"})
            out.append({"name": f"{label}: first token p50, polydev / llama-server, {n} "
                                f"streams", "value": round(ours[n]["p50"] / theirs[n]["p50"], 2),
                        "unit": "ratio", "target": 1.0, "better": "lower"})
    for engine, result in (("polydev CPU", ours), ("llama-server", theirs)):
        if isinstance(result, dict):
            for n in (1, 8):
                out.append({"name": f"{label}: {engine}, JSON schema / plain, {n} streams",
                            "value": round(result[f"json {n}"]["tps"] / result[n]["tps"], 2),
                            "unit": "ratio", "target": 0.9 if engine == "polydev CPU" else None,
                            "better": "higher"})
    quotes = {e: results.get(e) for e in ("polydev CPU, quote", "polydev CPU ngram, quote",
                                          "llama-server, quote", "llama-server ngram, quote")}
    if all(isinstance(q, dict) and q["tps"] for q in quotes.values()):
        ours_up = quotes["polydev CPU ngram, quote"]["tps"] / quotes["polydev CPU, quote"]["tps"]
        theirs_up = (quotes["llama-server ngram, quote"]["tps"]
                     / quotes["llama-server, quote"]["tps"])
        out += [{"name": f"{label}: n-gram speculation's speed-up, polydev", "value":
                 round(ours_up, 2), "unit": "ratio", "target": None, "better": "higher"},
                {"name": f"{label}: n-gram speculation's speed-up, llama-server", "value":
                 round(theirs_up, 2), "unit": "ratio", "target": None, "better": "higher"},
                {"name": f"{label}: quoting with n-grams, polydev / llama-server", "value":
                 round(quotes["polydev CPU ngram, quote"]["tps"]
                       / quotes["llama-server ngram, quote"]["tps"], 2), "unit": "ratio",
                 "target": 1.0, "better": "higher"}]
    return out


if __name__ == "__main__":
    sys.exit(main())
