"""OpenAI request bodies read into what the engine needs, with OpenAI's error for a bad one.

Fields are checked by type and range and named in the error (``param``); fields polydev does not
know are ignored, as llama-server and OpenAI-compatible servers do, so clients that send more
than polydev uses keep working. Sampling defaults are llama.cpp's, as llama-server's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from polydev.errors import PolydevError
from polydev.models import SamplingParams

__all__ = ["RequestError", "Generation", "read_completion", "read_chat"]

_MAX_STOPS = 4                  # OpenAI's limit


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
class Generation:
    """One request, read: its prompt (text, or token ids), limits, sampling and streaming."""

    prompt: str | list[int]
    messages: list[dict[str, Any]] | None
    max_tokens: int | None          # None: until the end-of-generation token or the context
    params: SamplingParams
    stops: tuple[str, ...]
    stream: bool
    include_usage: bool


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
    return _generation(body, prompt, None, default_max_tokens=16)   # OpenAI's default


def read_chat(body: Any) -> Generation:
    """``/v1/chat/completions``: ``messages`` with roles and text content."""
    body = _object(body)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list", param="messages")
    read = [_message(m, i) for i, m in enumerate(messages)]
    return _generation(body, "", read, default_max_tokens=None)


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
    return {"role": m["role"], "content": content}


def _generation(body: dict, prompt, messages, default_max_tokens: int | None) -> Generation:
    if _field(body, "n", int, 1) != 1:
        raise RequestError("n must be 1: send several requests, they are batched", param="n")
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
    return Generation(prompt, messages, max_tokens, _sampling(body), tuple(stops),
                      _field(body, "stream", bool, False), include_usage)


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
