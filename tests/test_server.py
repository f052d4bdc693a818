"""``polydev serve`` on 127.0.0.1 against the official openai client and plain HTTP: replies
equal what the model generates alone, many clients at once, streams, disconnects, and bad
requests answered with OpenAI's error body while the server keeps serving.

Every server here is started and stopped by the test itself, and every request is bounded in
time (the client's timeout) and count."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

pytest.importorskip("gguf")
pytest.importorskip("starlette")
uvicorn = pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")

from polydev.models import load  # noqa: E402
from polydev.server import ModelWorker, create_app  # noqa: E402
from polydev.tools.cli import main  # noqa: E402

from model_files import write_test_model  # noqa: E402

TIMEOUT = 60            # seconds any one request may take
N_CTX = 256


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    return write_test_model(tmp_path_factory.mktemp("serve") / "m.gguf", n_layer=2,
                            weight_type="F16")


@contextmanager
def live_server(path, *, n_slots=4, api_key=None, max_queued=64, load_model=None,
                wait_ready=True, embeddings=False, slot_save_path=None, drafter=None):
    """A server on a free port of 127.0.0.1, stopped on the way out; with ``wait_ready``, once
    its model has loaded (a request before then is a 503, which only one test wants)."""
    def default_load():
        return load(path, devices=[], n_ctx=N_CTX, progress=False)
    worker = ModelWorker(load_model or default_load, n_slots, max_queued, embeddings=embeddings,
                         drafter=drafter)
    app = create_app(worker, model_name="test-model", api_key=api_key, drain_seconds=10,
                     slot_save_path=slot_save_path)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        assert not wait_ready or worker.wait_ready(TIMEOUT), f"no model: {worker.error}"
        yield f"http://127.0.0.1:{port}", worker
    finally:
        server.should_exit = True
        thread.join(TIMEOUT)
        assert not thread.is_alive(), "the server did not stop"


def client(url, api_key="none"):
    return openai.OpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=TIMEOUT)


def request(url, method, path, body=None, headers=None):
    """(status, headers, parsed JSON or text) of one plain HTTP request."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
    try:
        data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
        conn.request(method, path, data, {"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        raw = r.read().decode()
        kind = r.getheader("content-type", "")
        return r.status, dict(r.getheaders()), json.loads(raw) if "json" in kind else raw
    finally:
        conn.close()


def prompts(n):
    rng = np.random.default_rng(5)
    return [" ".join(f"w{i}" for i in rng.integers(0, 60, rng.integers(2, 12))) for _ in range(n)]


@pytest.fixture(scope="module")
def alone(model_file):
    """What the model generates for a prompt by itself (greedy)."""
    cache = {}
    with load(model_file, devices=[], n_ctx=N_CTX, progress=False) as m:
        def generate(prompt, n, chat=False):
            key = (prompt, n, chat)
            if key not in cache:
                pieces = (m.chat([{"role": "user", "content": prompt}], n, temperature=0) if chat
                          else m.generate(prompt, n, temperature=0, parse_special=True))
                cache[key] = ("".join(pieces), len(m.generated))
            return cache[key]
        for p in prompts(16):
            generate(p, 8)
        for p in prompts(2):
            generate(p, 6, chat=True)
        yield generate


def test_completions_and_chat_streamed_and_not(model_file, alone):
    with live_server(model_file) as (url, _):
        c = client(url)
        p = prompts(1)[0]
        text, n = alone(p, 8)
        r = c.completions.create(model="test-model", prompt=p, max_tokens=8, temperature=0)
        assert r.choices[0].text == text
        assert r.usage.completion_tokens == n and r.usage.prompt_tokens > 0
        assert r.choices[0].finish_reason == ("length" if n == 8 else "stop")

        chunks = list(c.completions.create(model="test-model", prompt=p, max_tokens=8,
                                           temperature=0, stream=True,
                                           stream_options={"include_usage": True}))
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text
        assert chunks[-1].usage.completion_tokens == n and not chunks[-1].choices
        assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] is not None

        q = prompts(2)[1]
        text, n = alone(q, 6, chat=True)
        messages = [{"role": "user", "content": q}]
        r = c.chat.completions.create(model="test-model", messages=messages, max_tokens=6,
                                      temperature=0)
        assert r.choices[0].message.content == text and r.choices[0].message.role == "assistant"
        stream = c.chat.completions.create(model="test-model", messages=messages, max_tokens=6,
                                           temperature=0, stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in stream) == text


def test_sixteen_clients_at_once_get_what_each_gets_alone(model_file, alone):
    """16 concurrent greedy requests over 4 slots (the rest wait): every reply equals the same
    request alone; the metrics count what was generated."""
    with live_server(model_file, n_slots=4) as (url, _):
        c = client(url)

        def ask(p):
            r = c.completions.create(model="test-model", prompt=p, max_tokens=8, temperature=0)
            return r.choices[0].text

        ps = prompts(16)
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            replies = list(pool.map(ask, ps, timeout=TIMEOUT * 2))
        assert replies == [alone(p, 8)[0] for p in ps]
        status, _, text = request(url, "GET", "/metrics")
        assert status == 200
        values = dict(line.split(" ") for line in text.splitlines() if not line.startswith("#"))
        assert int(values["polydev:tokens_predicted_total"]) >= 16
        assert int(values["polydev:requests_processing"]) == 0
        assert float(values["polydev:predicted_tokens_seconds"]) > 0


def test_a_negative_seed_is_a_random_one_and_top_k_zero_is_off(model_file):
    with live_server(model_file) as (url, _):
        c = client(url)
        for body in (dict(seed=-1), dict(top_p=1.0, extra_body={"top_k": 0, "min_p": 0.0}),
                     dict(stop="")):
            r = c.completions.create(model="m", prompt="w1 w2", max_tokens=3, **body)
            assert r.usage.completion_tokens <= 3


def test_models_health_and_slots(model_file):
    with live_server(model_file, n_slots=3) as (url, _):
        assert [m.id for m in client(url).models.list()] == ["test-model"]
        assert request(url, "GET", "/health")[:3:2] == (200, {"status": "ok"})
        status, _, slots = request(url, "GET", "/slots")
        assert status == 200 and [s["id"] for s in slots] == [0, 1, 2]
        assert not any(s["is_processing"] for s in slots)


BAD = [
    (b"{not json", "not valid JSON", None),
    (b'["a list"]', "must be a JSON object", None),
    ({"prompt": "w1", "temperature": "hot"}, "temperature must be a number", "temperature"),
    ({"prompt": "w1", "max_tokens": -1}, "max_tokens must be 0 or more", "max_tokens"),
    ({"prompt": "w1", "max_tokens": 2.5}, "max_tokens must be an integer", "max_tokens"),
    ({"prompt": "w1", "stream": "yes"}, "stream must be a boolean", "stream"),
    ({"prompt": "w1", "stop": [1]}, "stop must be a string or a list", "stop"),
    ({"prompt": "w1", "n": 99}, "n must be in [1, 16]", "n"),
    ({"prompt": ""}, "prompt must be a non-empty string", "prompt"),
    ({"prompt": [1, 99999]}, "outside the vocabulary", "prompt"),
    ({"prompt": " ".join(["w1"] * N_CTX)}, "the context holds", "prompt"),
]


@pytest.mark.parametrize("body, message, param", BAD)
def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(model_file, body, message,
                                                                      param):
    with live_server(model_file) as (url, _):
        status, _, reply = request(url, "POST", "/v1/completions", body)
        assert status == 400, reply
        assert message in reply["error"]["message"]
        assert reply["error"]["type"] == "invalid_request_error"
        assert reply["error"]["param"] == param
        r = client(url).completions.create(model="test-model", prompt="w1", max_tokens=2)
        assert r.usage.completion_tokens <= 2


def test_bad_chat_messages_routes_and_keys(model_file):
    with live_server(model_file, api_key="sesame") as (url, _):
        with pytest.raises(openai.AuthenticationError):
            client(url, "wrong").completions.create(model="m", prompt="w1", max_tokens=1)
        auth = {"Authorization": "Bearer sesame"}
        status, _, reply = request(url, "POST", "/v1/chat/completions",
                                   {"messages": [{"content": "hi"}]}, auth)
        assert status == 400 and reply["error"]["param"] == "messages[0]"
        status, _, reply = request(url, "POST", "/v1/chat/completions", {"messages": []}, auth)
        assert status == 400 and reply["error"]["param"] == "messages"
        status, _, reply = request(url, "GET", "/v1/nothing", None, auth)
        assert status == 404 and "error" in reply
        status, _, reply = request(url, "GET", "/v1/completions", None, auth)
        assert status == 405 and "error" in reply
        assert request(url, "GET", "/health")[0] == 200       # public, as llama-server's
        r = client(url, "sesame").chat.completions.create(
            model="m", messages=[{"role": "user", "content": "w1 w2"}], max_tokens=2)
        assert r.usage.completion_tokens <= 2


def wait_for(condition, what):
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_a_client_that_leaves_mid_stream_frees_its_slot(model_file):
    with live_server(model_file, n_slots=1, max_queued=0) as (url, worker):
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=TIMEOUT)
        body = json.dumps({"prompt": "w1 w2", "max_tokens": 100000, "stream": True,
                           "temperature": 1.0, "min_p": 0.0, "seed": 1})
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.status == 200 and r.readline().startswith(b"data: ")
        busy, _, reply = request(url, "POST", "/v1/completions", {"prompt": "w3"})
        assert busy == 503 and reply["error"]["code"] == "queue_full"
        conn.close()                                   # the client goes away
        wait_for(lambda: worker.engine.processing == 0, "the slot was not freed")
        r = client(url).completions.create(model="test-model", prompt="w3", max_tokens=2)
        assert r.usage.completion_tokens <= 2


def test_health_is_503_while_the_model_loads(model_file):
    loaded = threading.Event()

    def slow_load():
        loaded.wait(TIMEOUT)
        return load(model_file, devices=[], n_ctx=N_CTX, progress=False)

    with live_server(model_file, load_model=slow_load, wait_ready=False) as (url, worker):
        status, headers, reply = request(url, "GET", "/health")
        assert status == 503 and reply["error"]["code"] == "model_loading"
        assert headers.get("retry-after") == "1"
        assert request(url, "POST", "/v1/completions", {"prompt": "w1"})[0] == 503
        loaded.set()
        assert worker.wait_ready(TIMEOUT)
        assert request(url, "GET", "/health")[0] == 200


def test_serve_command_line_mistakes_are_one_line(capsys, tmp_path):
    assert main(["serve", "-m", str(tmp_path / "absent.gguf")]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main(["serve", "-np", "0", "-m", str(tmp_path / "absent.gguf")]) == 1
    assert "-np must be in [1, 64]" in capsys.readouterr().err
    assert main(["serve", "--pooling", "mean", "-m", str(tmp_path / "absent.gguf")]) == 1
    assert "--pooling is for --embeddings" in capsys.readouterr().err
    assert main(["serve", "--spec-type", "draft", "-m", str(tmp_path / "absent.gguf")]) == 1
    assert "needs a draft model: -md FILE" in capsys.readouterr().err
    assert main(["serve", "--spec-type", "ngram", "--draft-max", "0"]) == 1
    assert "draft_max (--draft-max) must be in [1, 64]" in capsys.readouterr().err


def test_ctrl_c_finishes_the_running_stream_then_exits(model_file):
    """polydev serve as a user runs it: SIGINT while a stream runs lets it end with [DONE],
    then the process exits by itself, with the status a shell reports for Ctrl-C."""
    import signal
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code = "import sys; from polydev.tools.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen([sys.executable, "-c", code, "serve", "-m", str(model_file),
                             "--port", str(port), "-c", str(N_CTX), "--device", "none",
                             "--no-progress"], stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def healthy():
            try:
                return request(url, "GET", "/health")[0] == 200
            except OSError:
                return False
        wait_for(healthy, "the server did not come up")
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
        conn.request("POST", "/v1/completions", json.dumps({"prompt": "w1", "max_tokens": 150,
                                                            "stream": True, "min_p": 0.0,
                                                            "seed": 3}),
                     {"Content-Type": "application/json"})
        r = conn.getresponse()
        assert r.readline().startswith(b"data: ")
        proc.send_signal(signal.SIGINT)
        lines = [line for line in r if line.startswith(b"data: ")]
        assert lines[-1].strip() == b"data: [DONE]"
        conn.close()
        assert proc.wait(TIMEOUT) == 130               # the CLI's status for Ctrl-C
        assert "Traceback" not in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
