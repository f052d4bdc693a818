"""OpenAI request bodies read into what the engine needs, with OpenAI's error for a bad one.

Fields are checked by type and range and named in the error (``param``); fields polydev does not
know are ignored, as llama-server and OpenAI-compatible servers do, so clients that send more
than polydev uses keep working. Sampling defaults are llama.cpp's, as llama-server's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from polydev.errors import PolydevError
from polydev.models import SamplingParams
from polydev.models.grammar import Grammar

__all__ = ["RequestError", "Embeddings", "Generation", "Tools", "read_completion", "read_chat",
           "read_embeddings"]

_MAX_STOPS = 4                  # OpenAI's limit
_MAX_N = 16                     # choices of one request
_MAX_TOP_LOGPROBS = 20          # OpenAI's limit for chat
_FUNCTION_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")     # OpenAI's rule


class RequestError(Exception):
    """A request OpenAI would refuse: ``status``, and the body's message, type, param, code."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.code = (message, param, status,
                                                                      type, code)

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


@dataclass(frozen=True)
class Tools:
    """A chat request's functions (OpenAI's ``tools``, each {"type": "function", "function":
    {...}}) and ``choice``: "auto", "required" or the one function's name that must be
    called. ``tool_choice`` "none" is no ``Tools`` at all."""

    functions: tuple[dict[str, Any], ...]
    choice: str
    parallel: bool


@dataclass(frozen=True)
class Generation:
    """One request, read: its prompt (text, or token ids), limits, sampling and streaming;
    ``grammar`` (and ``grammar_param``, the field that gave it) constrains the text,
    ``logprobs`` asks for each token's log-probability and that many alternatives', ``n``
    choices are generated from the one prompt, and ``tools`` may be called (chat)."""

    prompt: str | list[int]
    messages: list[dict[str, Any]] | None
    max_tokens: int | None          # None: until the end-of-generation token or the context
    params: SamplingParams
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool
    grammar: Grammar | None = None
    grammar_param: str | None = None
    logprobs: int | None = None
    n: int = 1
    tools: Tools | None = None


@dataclass(frozen=True)
class Embeddings:
    """An embeddings request: its inputs (texts or token ids), how the vectors are written
    ("float" or "base64") and llama-server's ``embd_normalize``."""

    inputs: tuple[str | list[int], ...]
    encoding_format: str
    normalization: int


def read_embeddings(body: Any, field: str = "input") -> Embeddings:
    """``/v1/embeddings`` (``input``: a text, texts, token ids or lists of them) and
    llama-server's ``/embeddings`` (the same in ``content``)."""
    body = _object(body)
    given = body.get(field)
    if isinstance(given, (str, dict)) or (isinstance(given, list) and given
                                          and all(_is_token(t) for t in given)):
        given = [given]
    if not isinstance(given, list) or not given:
        raise RequestError(f"{field} must be a string, a list of strings, token ids, or a "
                           "list of token id lists", param=field)
    for i, x in enumerate(given):
        if isinstance(x, str) and x:
            continue
        if not (isinstance(x, list) and x and all(_is_token(t) for t in x)):
            raise RequestError(f"{field}[{i}] must be a non-empty string or list of token ids",
                               param=field)
    encoding = _field(body, "encoding_format", str, "float")
    if encoding not in ("float", "base64"):
        raise RequestError(f'encoding_format must be "float" or "base64", got {encoding!r}',
                           param="encoding_format")
    if body.get("dimensions") is not None:
        raise RequestError("dimensions: the vectors have the model's width; shortening them "
                           "is not supported", param="dimensions")
    normalization = _field(body, "embd_normalize", int, 2)
    if normalization < -1:
        raise RequestError("embd_normalize must be -1 (none), 0 (max), 1, 2 (Euclidean) or "
                           f"more, got {normalization}", param="embd_normalize")
    return Embeddings(tuple(given), encoding, normalization)


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def read_completion(body: Any) -> Generation:
    """``/v1/completions``: ``prompt`` is a string or a list of token ids."""
    body = _object(body)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]              # one prompt in a list, as clients often send it
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise RequestError("prompt must be a string or a list of token ids (one prompt per "
                               "request: send several requests, they are batched)",
                               param="prompt")
    elif not isinstance(prompt, str) or not prompt:
        raise RequestError("prompt must be a non-empty string or a list of token ids",
                           param="prompt")
    logprobs = _field(body, "logprobs", int, None)
    if logprobs is not None and not 0 <= logprobs <= _MAX_TOP_LOGPROBS:
        raise RequestError(f"logprobs must be in [0, {_MAX_TOP_LOGPROBS}], got {logprobs}",
                           param="logprobs")
    return _generation(body, prompt, None, default_max_tokens=16,   # OpenAI's default
                       logprobs=logprobs)


def read_chat(body: Any) -> Generation:
    """``/v1/chat/completions``: ``messages`` with roles, text content and tool calls."""
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    read = [_message(m, i) for i, m in enumerate(messages)]
    logprobs = None
    if _field(body, "logprobs", bool, False):
        logprobs = _field(body, "top_logprobs", int, 0)
        if not 0 <= logprobs <= _MAX_TOP_LOGPROBS:
            raise RequestError(f"top_logprobs must be in [0, {_MAX_TOP_LOGPROBS}], got "
                               f"{logprobs}", param="top_logprobs")
    elif body.get("top_logprobs") is not None:
        raise RequestError("top_logprobs needs logprobs: true", param="top_logprobs")
    return _generation(body, "", read, default_max_tokens=None, logprobs=logprobs,
                       tools=_tools(body))


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object")
    return body


def _message(m: Any, i: int) -> dict[str, Any]:
    param = f"messages[{i}]"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise RequestError(f"{param} must be an object with a string role", param=param)
    content = m.get("content")
    if content is None:
        content = ""
    if isinstance(content, list):           # content parts: text only
        texts = []
        for part in content:
            if (not isinstance(part, dict) or part.get("type") != "text"
                    or not isinstance(part.get("text"), str)):
                raise RequestError(f"{param}.content: only text parts are supported",
                                   param=f"{param}.content")
            texts.append(part["text"])
        content = "".join(texts)
    if not isinstance(content, str):
        raise RequestError(f"{param}.content must be a string or a list of text parts",
                           param=f"{param}.content")
    read = {"role": m["role"], "content": content}
    if m.get("tool_calls") is not None:
        read["tool_calls"] = _tool_calls(m["tool_calls"], f"{param}.tool_calls")
    for key in ("tool_call_id", "name", "reasoning_content"):
        if m.get(key) is not None:
            read[key] = _field(m, key, str, None, f"{param}.")
    return read


def _tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    """An assistant message's ``tool_calls`` as chat templates read them: each function's
    ``arguments`` (a JSON string in OpenAI's API) as an object where it parses as one."""
    if not isinstance(calls, list):
        raise RequestError(f"{param} must be a list", param=param)
    out = []
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise RequestError(f"{param}[{i}] must be an object with a function's name",
                               param=f"{param}[{i}]")
        arguments = function.get("arguments") or "{}"
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass                    # rendered as the string it is
        out.append({"id": str(call.get("id") or ""), "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def _tools(body: dict) -> Tools | None:
    """``tools`` and ``tool_choice`` (OpenAI's default choice: "auto" with tools)."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise RequestError("tool_choice needs tools", param="tool_choice")
        return None
    if not isinstance(tools, list):
        raise RequestError("tools must be a list", param="tools")
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (not isinstance(tool, dict) or tool.get("type", "function") != "function"
                or not isinstance(function, dict) or not isinstance(function.get("name"), str)
                or not function["name"]):
            raise RequestError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": "
                               "{\"name\": ...}}", param=f"tools[{i}]")
        if not _FUNCTION_NAME.fullmatch(function["name"]):
            raise RequestError(f"tools[{i}].function.name must be letters, digits, _ or -, at "
                               f"most 64, got {function['name']!r}",
                               param=f"tools[{i}].function.name")
        if not isinstance(function.get("parameters", {}), dict):
            raise RequestError(f"tools[{i}].function.parameters must be a JSON schema object",
                               param=f"tools[{i}].function.parameters")
    # llama-server's default: a forced call is one call unless the client asks for more
    parallel = _field(body, "parallel_tool_calls", bool, False)
    # as OpenAI reads them: no description is an empty one, no parameters an object of none;
    # templates read both without asking whether they are there
    functions = tuple({"type": "function", "function": {
        "description": "", "parameters": {"type": "object", "properties": {}}, **t["function"]}}
        for t in tools)
    names = [t["function"]["name"] for t in functions]
    if len(set(names)) < len(names):
        raise RequestError("tools name a function twice", param="tools")
    if choice is None or choice in ("auto", "required"):
        return Tools(functions, choice or "auto", parallel)
    if choice == "none":
        return None
    named = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(named, str):
        raise RequestError('tool_choice must be "none", "auto", "required" or {"type": '
                           '"function", "function": {"name": ...}}', param="tool_choice")
    if named not in names:
        raise RequestError(f"tool_choice names {named!r}, which is not among the tools "
                           f"({', '.join(names)})", param="tool_choice")
    return Tools(functions, named, parallel)


def _grammar(body: dict) -> tuple[Grammar | None, str | None]:
    """What the text must match, and the field that said so: ``response_format``
    (``json_object``, ``json_schema``), or llama-server's ``json_schema`` or ``grammar``
    (GBNF); one of them at most."""
    given = [name for name in ("response_format", "json_schema", "grammar")
             if body.get(name) is not None]
    if len(given) > 1:
        raise RequestError(f"give one of {' and '.join(given)}", param=given[1])
    if not given:
        return None, None
    name = given[0]
    value = body[name]
    if name == "grammar":
        if not isinstance(value, str):
            raise RequestError("grammar must be a string (GBNF)", param="grammar")
        return (Grammar("gbnf", value) if value.strip() else None), name
    if name == "json_schema":
        if not isinstance(value, (dict, bool)):
            raise RequestError("json_schema must be a JSON schema object", param=name)
        return Grammar.json_schema(value), name
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "text":
        return None, None
    if kind == "json_object":
        schema = value.get("schema")
        return (Grammar.json_object() if schema is None else Grammar.json_schema(schema)), name
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), (dict, bool)):
            raise RequestError("response_format.json_schema must be an object with a schema",
                               param="response_format.json_schema")
        return Grammar.json_schema(spec.get("schema", {})), name
    raise RequestError('response_format.type must be "text", "json_object" or "json_schema"',
                       param="response_format")


def _generation(body: dict, prompt, messages, default_max_tokens: int | None, *,
                logprobs: int | None = None, tools: Tools | None = None) -> Generation:
    n = _field(body, "n", int, 1)
    if not 1 <= n <= _MAX_N:
        raise RequestError(f"n must be in [1, {_MAX_N}], got {n}", param="n")
    max_tokens = _field(body, "max_completion_tokens", int, None)
    if max_tokens is None:
        max_tokens = _field(body, "max_tokens", int, default_max_tokens)
    if max_tokens is not None and max_tokens < 0:
        raise RequestError("max_tokens must be 0 or more", param="max_tokens")
    stops = body.get("stop")
    stops = [] if stops is None else [stops] if isinstance(stops, str) else stops
    if (not isinstance(stops, list) or not all(isinstance(s, str) for s in stops)
            or len(stops) > _MAX_STOPS):
        raise RequestError(f"stop must be a string or a list of at most {_MAX_STOPS} strings",
                           param="stop")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestError("stream_options must be an object", param="stream_options")
    include_usage = _field(options or {}, "include_usage", bool, False, "stream_options.")
    grammar, grammar_param = _grammar(body)
    if grammar is not None and tools is not None and tools.choice != "auto":
        raise RequestError(f"tool_choice {tools.choice!r} forces a call, which {grammar_param} "
                           "would constrain too: give one of them", param=grammar_param)
    if tools is not None and tools.choice != "auto":
        grammar_param = "tool_choice"
    return Generation(prompt, messages, max_tokens, _sampling(body), tuple(stops),
                      _field(body, "stream", bool, False), include_usage, grammar,
                      grammar_param, logprobs, n, tools)


def _sampling(body: dict) -> SamplingParams:
    d = SamplingParams()
    values = dict(
        temperature=_number(body, "temperature", d.temperature, 0.0, 2.0),
        top_p=_number(body, "top_p", d.top_p, 0.0, 1.0),
        min_p=_number(body, "min_p", d.min_p, 0.0, 1.0),
        top_k=_field(body, "top_k", int, d.top_k),
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        repeat_penalty=_number(body, "repeat_penalty", d.repeat_penalty, 0.0, None),
        seed=_field(body, "seed", int, None),
    )
    if values["seed"] is not None and values["seed"] < 0:
        values["seed"] = None           # llama-server's -1 (any negative): a random seed
    if values["repeat_penalty"] <= 0:
        raise RequestError("repeat_penalty must be more than 0", param="repeat_penalty")
    try:
        return SamplingParams(**values)
    except PolydevError as e:
        raise RequestError(str(e)) from None


def _field(body: dict, name: str, kind: type, default, prefix: str = ""):
    value = body.get(name)
    if value is None:
        return default
    # bool is an int in Python, but not in JSON
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RequestError(f"{prefix}{name} must be {_KIND_NAMES[kind]}, got "
                           f"{type(value).__name__} {value!r}", param=prefix + name)
    return value


def _number(body: dict, name: str, default: float, low: float, high: float | None) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{name} must be a number, got {type(value).__name__} {value!r}",
                           param=name)
    if value < low or (high is not None and value > high):
        limits = f"[{low}, {high}]" if high is not None else f"at least {low}"
        raise RequestError(f"{name} must be in {limits}, got {value}", param=name)
    return float(value)


_KIND_NAMES = {int: "an integer", bool: "a boolean", str: "a string"}
