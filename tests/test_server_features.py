"""What programs use of an OpenAI-compatible server, through the official openai client:
structured output (``response_format``, llama-server's ``json_schema`` and ``grammar``),
log-probabilities, ``n`` choices, and tool calls forced by ``tool_choice`` and sent back."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

pytest.importorskip("llguidance")
jsonschema = pytest.importorskip("jsonschema")

from polydev.models import load  # noqa: E402

from test_server import N_CTX, client, live_server, request  # noqa: E402

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "maximum": 9},
    "units": {"enum": ["C", "F"]}}, "required": ["city", "days", "units"],
    "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": SCHEMA}},
         {"type": "function", "function": {"name": "noop", "description": "Nothing"}}]
MESSAGES = [{"role": "user", "content": "w1 w2 w3"}]


@pytest.fixture(scope="module")
def server(model_file):
    with live_server(model_file) as (url, worker):
        yield url, worker


@pytest.fixture(scope="module")
def long_server(model_file):
    """A context for the functions' description (a token per character in this vocabulary)."""
    def load_long():
        return load(model_file, devices=[], n_ctx=2048, progress=False)
    with live_server(model_file, load_model=load_long) as (url, worker):
        yield url, worker


@pytest.fixture(scope="module")
def model_file(tmp_path_factory):
    from model_files import write_test_model
    return write_test_model(tmp_path_factory.mktemp("features") / "m.gguf", n_layer=2,
                            weight_type="F16")


def test_structured_output_validates_whole_streamed_and_in_every_choice(server):
    url, _ = server
    c = client(url)
    formats = [{"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA,
                                                       "strict": True}},
               {"type": "json_object", "schema": SCHEMA}]     # llama-server's form
    for response_format in formats:
        r = c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=150, n=3,
                                      temperature=1.0, seed=4, response_format=response_format,
                                      extra_body={"min_p": 0.0})
        assert [ch.index for ch in r.choices] == [0, 1, 2]
        for choice in r.choices:
            jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    r = c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=40, seed=1,
                                  response_format={"type": "json_object"})
    text = r.choices[0].message.content             # random weights: keys that never end
    assert text.startswith("{") and (r.choices[0].finish_reason == "length"
                                     or isinstance(json.loads(text), dict))
    stream = c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=150,
                                       stream=True, response_format=formats[0])
    jsonschema.validate(json.loads("".join(ch.choices[0].delta.content or ""
                                           for ch in stream if ch.choices)), SCHEMA)
    r = c.completions.create(model="m", prompt="w5", max_tokens=20,
                             extra_body={"grammar": 'root ::= "id-" [0-9]{3}'})
    assert re.fullmatch(r"id-[0-9]{3}", r.choices[0].text)
    r = c.completions.create(model="m", prompt="w5", max_tokens=150,
                             extra_body={"json_schema": SCHEMA})
    jsonschema.validate(json.loads(r.choices[0].text), SCHEMA)


@pytest.mark.parametrize("body, param, fault", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "object", "properties": {"a": {"type": "wrong"}}}}}},
     "response_format", "wrong"),
    ({"response_format": {"type": "yaml"}}, "response_format", "response_format.type"),
    ({"grammar": 'root ::= missing'}, "grammar", "missing"),
    ({"grammar": "x", "json_schema": {}}, "grammar", "give one of"),
    ({"tools": [{"type": "function"}]}, "tools[0]", "tools[0]"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice", "nope"),
    ({"logprobs": True, "top_logprobs": 50}, "top_logprobs", "top_logprobs"),
    ({"tools": [{"type": "function", "function": {"name": "has space"}}]},
     "tools[0].function.name", "letters, digits"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools", "twice"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format", "give one of them"),
    ({"n": 0}, "n", "n must be"),
])
def test_bad_constraints_are_400s_naming_the_fault(server, body, param, fault):
    url, _ = server
    status, _, reply = request(url, "POST", "/v1/chat/completions",
                               {"messages": MESSAGES, "max_tokens": 4, **body})
    assert status == 400, reply
    assert reply["error"]["param"] == param and fault in reply["error"]["message"]


def test_logprobs_follow_the_models_distribution(server, model_file):
    url, _ = server
    c = client(url)
    r = c.completions.create(model="m", prompt="w7 w8", max_tokens=5, temperature=0,
                             logprobs=3)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text and len(lp.tokens) == 5
    assert lp.text_offset == list(np.cumsum([0] + [len(t) for t in lp.tokens[:-1]]))
    with load(model_file, devices=[], n_ctx=N_CTX, progress=False) as m:
        m.eval(m.tokenize("w7 w8", parse_special=True))
        x = m.logits().astype(np.float64)
    want = x - (x.max() + np.log(np.exp(x - x.max()).sum()))
    assert lp.token_logprobs[0] == pytest.approx(want.max(), abs=2e-4)
    assert sorted(lp.top_logprobs[0].values(), reverse=True) == pytest.approx(
        sorted(want)[::-1][:3], abs=2e-4)

    r = c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=6, temperature=0,
                                  logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert "".join(e.token for e in content) == r.choices[0].message.content
    for entry in content:
        assert entry.logprob <= 0 and entry.top_logprobs[0].logprob == entry.logprob
        assert sum(np.exp(t.logprob) for t in entry.top_logprobs) <= 1 + 1e-6
    stream = c.chat.completions.create(model="m", messages=MESSAGES, max_tokens=6,
                                       temperature=0, logprobs=True, top_logprobs=2,
                                       stream=True)
    streamed = [e for ch in stream if ch.choices and ch.choices[0].logprobs
                for e in ch.choices[0].logprobs.content]
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content],
                                                          abs=1e-4)   # cells reused


def test_n_choices_are_the_seeds_one_after_another(server):
    url, _ = server
    c = client(url)
    body = dict(model="m", prompt="w9 w10 w11", max_tokens=6, temperature=1.0,
                extra_body={"min_p": 0.0})
    together = c.completions.create(n=3, seed=10, **body)
    alone = [c.completions.create(seed=10 + i, **body).choices[0].text for i in range(3)]
    assert [ch.text for ch in together.choices] == alone
    assert together.usage.completion_tokens == sum(
        c.completions.create(seed=10 + i, **body).usage.completion_tokens for i in range(3))
    streamed = ["", "", ""]
    for chunk in c.completions.create(n=3, seed=10, stream=True, **body):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == alone


def streamed_calls(chunks) -> list[tuple[str, str]]:
    """The calls of a streamed reply as a client joins them: an index's first entry has its
    id, type and name, and every entry a piece of its arguments, which come in pieces."""
    calls: list[list[str]] = []
    entries = [d for ch in chunks for d in ch.choices[0].delta.tool_calls or []]
    for d in entries:
        if d.index == len(calls):
            assert d.id and d.type == "function" and d.function.name
            calls.append([d.function.name, d.function.arguments])
        else:
            assert d.id is None and d.function.name is None
            calls[d.index][1] += d.function.arguments
    assert len(entries) > len(calls)
    return [tuple(c) for c in calls]


@pytest.mark.parametrize("choice", ["required", "get_weather"])
def test_a_forced_tool_call_comes_back_as_tool_calls_and_goes_back_in(long_server, choice):
    url, _ = long_server
    c = client(url)
    tool_choice = (choice if choice == "required"
                   else {"type": "function", "function": {"name": choice}})
    r = c.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=150,
                                  tool_choice=tool_choice, temperature=0)
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.content is None
    [call] = message.tool_calls
    assert call.type == "function" and call.id
    if choice == "get_weather" or call.function.name == "get_weather":
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    else:
        assert call.function.name == "noop"

    stream = c.chat.completions.create(model="m", messages=MESSAGES, tools=TOOLS,
                                       max_tokens=150, tool_choice=tool_choice, temperature=0,
                                       stream=True)
    chunks = [ch for ch in stream if ch.choices]
    assert streamed_calls(chunks) == [(call.function.name, call.function.arguments)]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    back = MESSAGES + [{"role": "assistant", "content": None,
                        "tool_calls": [call.model_dump()]},
                       {"role": "tool", "tool_call_id": call.id, "content": "12 C"}]
    r = c.chat.completions.create(model="m", messages=back, tools=TOOLS, max_tokens=4)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")


def test_tool_choice_auto_leaves_prose_free_and_holds_a_call_to_the_grammar(long_server,
                                                                           monkeypatch):
    """"auto": a reply that opens no call is the model's own text (greedy: equal to the reply
    without tools' grammar); one that opens a call (here the trigger is moved to just after
    the reply's first token, which no random-weight model writes otherwise) continues as a
    call of an offered function with arguments in its schema, whole and streamed."""
    import polydev.server.app as app
    url, _ = long_server
    c = client(url)
    body = dict(model="m", messages=MESSAGES, tools=TOOLS, max_tokens=40, temperature=0)
    free = c.chat.completions.create(**body, tool_choice="auto")
    monkeypatch.setattr(app, "call_trigger", lambda template: None)
    unconstrained = c.chat.completions.create(**body, tool_choice="auto")
    assert free.choices[0].message == unconstrained.choices[0].message
    after_first = re.compile(rb"\A(?s:.+)(?P<call>)")
    monkeypatch.setattr(app, "call_trigger", lambda template: after_first)
    r = c.chat.completions.create(**{**body, "max_tokens": 150}, tool_choice="auto")
    message = r.choices[0].message
    assert r.choices[0].finish_reason == "tool_calls" and message.content
    [call] = message.tool_calls
    if call.function.name == "get_weather":
        jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    else:
        assert call.function.name == "noop"
    stream = c.chat.completions.create(**{**body, "max_tokens": 150}, tool_choice="auto",
                                       stream=True)
    chunks = [ch for ch in stream if ch.choices]
    assert streamed_calls(chunks) == [(call.function.name, call.function.arguments)]
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == message.content
    unknown = [{"type": "function", "function": {"name": "f", "parameters": {   # llguidance
        "type": "object", "properties": {"a": {"not": {"type": "string"}}}}}}]  # lacks "not"
    r = c.chat.completions.create(**{**body, "tools": unknown, "max_tokens": 4})
    assert r.choices[0].finish_reason in ("stop", "length")       # free, as before: no 400


@pytest.fixture(scope="module")
def embedding_server(model_file):
    with live_server(model_file, embeddings=True) as served:
        yield served


def test_embeddings_equal_the_models_and_come_batched(embedding_server, model_file):
    url, worker = embedding_server
    c = client(url)
    texts = ["w1 w2 w3", "w40", "w7 w7 w7 w7 w7"]
    r = c.embeddings.create(model="m", input=texts)
    with load(model_file, devices=[], n_ctx=N_CTX, progress=False) as m:
        want = m.embed(texts, pooling="mean")
        ids = m.tokenize(texts[0])
    assert [d.index for d in r.data] == [0, 1, 2]
    for d, w in zip(r.data, want):
        assert np.allclose(d.embedding, w, atol=1e-5)
    assert r.usage.prompt_tokens == r.usage.total_tokens > 3
    one = c.embeddings.create(model="m", input=ids)              # token ids
    assert np.allclose(one.data[0].embedding, want[0], atol=1e-5)
    status, _, raw = request(url, "POST", "/v1/embeddings",
                             {"input": texts[1], "encoding_format": "base64"})
    import base64
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert status == 200 and np.allclose(decoded, want[1], atol=1e-5)
    status, _, raw = request(url, "POST", "/embeddings", {"content": texts[0],
                                                          "embd_normalize": -1})
    assert status == 200 and len(raw) == 1 and len(raw[0]["embedding"]) == 1
    assert np.linalg.norm(raw[0]["embedding"][0]) != pytest.approx(1.0, abs=1e-3)
    status, _, text = request(url, "GET", "/metrics")
    values = dict(line.split(" ") for line in text.splitlines() if not line.startswith("#"))
    assert status == 200 and int(values["polydev:prompt_tokens_total"]) >= r.usage.prompt_tokens


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/embeddings", {"input": []}, 400, "input"),
    ("/v1/embeddings", {"input": ["ok", 5]}, 400, "input"),
    ("/v1/embeddings", {"input": "x", "dimensions": 8}, 400, "dimensions"),
    ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ("/v1/embeddings", {"input": [[1, 99999]]}, 400, "input"),
    ("/v1/completions", {"prompt": "w1"}, 501, None),
    ("/v1/chat/completions", {"messages": MESSAGES}, 501, None),
])
def test_embedding_server_refusals(embedding_server, path, body, status, param):
    url, _ = embedding_server
    got, _, reply = request(url, "POST", path, body)
    assert got == status and reply["error"]["param"] == param, reply
    assert client(url).embeddings.create(model="m", input="w1").data


def test_a_generating_server_refuses_embeddings(server):
    url, _ = server
    status, _, reply = request(url, "POST", "/v1/embeddings", {"input": "w1"})
    assert status == 501 and "--embeddings" in reply["error"]["message"]


def test_a_slot_saved_erased_and_restored_serves_its_prefix_again(model_file, tmp_path):
    with live_server(model_file, n_slots=2, slot_save_path=str(tmp_path)) as (url, _):
        c = client(url)
        prompt = " ".join(f"w{i % 50}" for i in range(25))
        first = c.completions.create(model="m", prompt=prompt, max_tokens=4, temperature=0)
        [slot] = [s for s in request(url, "GET", "/slots")[2] if s["n_cached"]]
        status, _, saved = request(url, "POST", f"/slots/{slot['id']}?action=save",
                                   {"filename": "chat.bin"})
        assert status == 200 and saved["n_saved"] == slot["n_cached"]
        assert saved["n_written"] == (tmp_path / "chat.bin").stat().st_size
        status, _, erased = request(url, "POST", f"/slots/{slot['id']}?action=erase")
        assert status == 200 and erased["n_erased"] == slot["n_cached"]
        assert not any(s["n_cached"] for s in request(url, "GET", "/slots")[2])
        status, _, restored = request(url, "POST", f"/slots/{slot['id']}?action=restore",
                                      {"filename": "chat.bin"})
        assert status == 200 and restored["n_restored"] == slot["n_cached"]
        again = c.completions.create(model="m", prompt=prompt, max_tokens=4, temperature=0)
        assert again.choices[0].text == first.choices[0].text
        assert again.usage.prompt_tokens_details.cached_tokens == first.usage.prompt_tokens - 1

        for action, body, status, param in [
                ("save", {"filename": "../up.bin"}, 400, "filename"),
                ("save", {"filename": ".hidden"}, 400, "filename"),
                ("restore", {"filename": "absent.bin"}, 400, None),
                ("rename", {"filename": "x"}, 400, "action")]:
            got, _, reply = request(url, "POST", f"/slots/0?action={action}", body)
            assert (got, reply["error"]["param"]) == (status, param), reply
        got, _, reply = request(url, "POST", "/slots/7?action=erase")
        assert got == 400 and "no slot 7" in reply["error"]["message"]
        (tmp_path / "short.bin").write_bytes((tmp_path / "chat.bin").read_bytes()[:-10])
        got, _, reply = request(url, "POST", "/slots/0?action=restore",
                                {"filename": "short.bin"})
        assert got == 400 and "damaged" in reply["error"]["message"]
    with live_server(model_file) as (url, _):
        assert request(url, "POST", "/slots/0?action=erase")[0] == 501


def test_speculative_serving_gives_the_same_text_and_counts_its_drafts(model_file, server):
    from polydev.models.speculative import ModelDrafter, SpeculativeSettings

    def same_model_drafts(model):
        draft = load(model_file, devices=[], n_ctx=N_CTX, progress=False)
        return ModelDrafter(draft, model.hparams.n_vocab, SpeculativeSettings(draft_max=4,
                                                                              p_min=0.0))
    prompts = ["w1 w2 w3 w1 w2 w3 w1", "w5 w9", "w30 w31 w32"]
    plain_url, _ = server
    want = [client(plain_url).completions.create(model="m", prompt=p, max_tokens=12,
                                                 temperature=0).choices[0].text
            for p in prompts]
    with live_server(model_file, drafter=same_model_drafts) as (url, worker):
        c = client(url)
        got = [c.completions.create(model="m", prompt=p, max_tokens=12,
                                    temperature=0).choices[0].text for p in prompts]
        _, _, text = request(url, "GET", "/metrics")
    assert got == want
    values = dict(line.split(" ") for line in text.splitlines() if not line.startswith("#"))
    assert int(values["polydev:draft_tokens_total"]) > 0
    assert float(values["polydev:draft_acceptance_ratio"]) > 0.9
