"""The HTTP side of ``polydev serve``: OpenAI's routes over a ``ModelWorker`` (Starlette).

Routes: ``/v1/completions`` and ``/v1/chat/completions`` (streamed as server-sent events
ending in ``data: [DONE]`` when asked), ``/v1/models``, ``/health`` (503 while the model
loads), ``/metrics`` (Prometheus) and ``/slots``. Every refusal is OpenAI's error body with a
4xx or 5xx status; a client that goes away cancels its request, which frees its slot at the
next step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from polydev.errors import ContextFullError, PolydevError
from polydev.models.engine import Finished, Piece, QueueFullError
from polydev.models.harmony import ChannelSplitter

from .metrics import prometheus_text
from .requests import Generation, RequestError, read_chat, read_completion
from .worker import ModelWorker

__all__ = ["create_app"]

log = logging.getLogger(__name__)
_RETRY_AFTER = "1"              # seconds a client told 503 should wait
_DISCONNECT_POLL = 0.5          # seconds between checks that a waiting client is still there
_FIELDS = {"content": "content", "reasoning": "reasoning_content"}
_PUBLIC = ("/health", "/v1/models")     # answered without the API key, as llama-server


def create_app(worker: ModelWorker, *, model_name: str, api_key: str | None = None,
               drain_seconds: float = 30.0) -> Starlette:
    """The application; it starts ``worker`` when it starts and stops it (draining) when it
    stops."""
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(app: Starlette):
        worker.start()
        yield
        await run_in_threadpool(worker.stop, drain_seconds)

    def guarded(handler: Callable) -> Callable:
        async def check(request: Request) -> Response:
            if (api_key and request.url.path not in _PUBLIC
                    and request.headers.get("authorization") != f"Bearer {api_key}"):
                return _error(RequestError("Invalid API key", status=401,
                                           type="authentication_error", code="invalid_api_key"))
            try:
                return await handler(request)
            except RequestError as e:
                return _error(e)
        return check

    async def health(request: Request) -> Response:
        _require_ready(worker)
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> Response:
        entry: dict[str, Any] = {"id": model_name, "object": "model", "created": created,
                                 "owned_by": "polydev"}
        if worker.state == "ready":
            hp = worker.model.hparams
            entry["meta"] = {"n_ctx": worker.model.n_ctx, "n_vocab": hp.n_vocab,
                             "n_layer": hp.n_layer, "arch": hp.arch}
        return JSONResponse({"object": "list", "data": [entry]})

    async def metrics(request: Request) -> Response:
        _require_ready(worker)
        return PlainTextResponse(prometheus_text(worker),
                                 media_type="text/plain; version=0.0.4")

    async def slots(request: Request) -> Response:
        _require_ready(worker)
        n_ctx = worker.model.n_ctx
        return JSONResponse([{"id": s.id, "is_processing": s.processing, "n_ctx": n_ctx,
                              "n_cached": s.n_cached, "n_decoded": s.n_decoded}
                             for s in worker.engine.snapshot().slots])

    async def completions(request: Request) -> Response:
        return await _generate(request, worker, read_completion, model_name, chat=False)

    async def chat(request: Request) -> Response:
        return await _generate(request, worker, read_chat, model_name, chat=True)

    async def not_found(request: Request, exc: HTTPException) -> Response:
        return _error(RequestError(f"{request.method} {request.url.path}: {exc.detail}",
                                   status=exc.status_code, code=str(exc.status_code)))

    routes = [Route("/health", guarded(health)), Route("/v1/health", guarded(health)),
              Route("/v1/models", guarded(models)), Route("/metrics", guarded(metrics)),
              Route("/slots", guarded(slots)),
              Route("/v1/completions", guarded(completions), methods=["POST"]),
              Route("/v1/chat/completions", guarded(chat), methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: not_found})


def _require_ready(worker: ModelWorker) -> None:
    if worker.state == "loading":
        raise RequestError("Loading model", status=503, type="unavailable_error",
                           code="model_loading")
    if worker.state == "failed":
        raise RequestError(f"the model failed: {worker.error}", status=500,
                           type="server_error")


def _error(e: RequestError) -> JSONResponse:
    headers = {"Retry-After": _RETRY_AFTER} if e.status == 503 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def _generate(request: Request, worker: ModelWorker, read: Callable[[Any], Generation],
                    model_name: str, chat: bool) -> Response:
    _require_ready(worker)
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}") from None
    gen = read(body)
    model = worker.model
    try:
        ids = await run_in_threadpool(_prompt_ids, model, gen)
        queue: asyncio.Queue = asyncio.Queue()
        handle = worker.submit(ids, asyncio.get_running_loop(), queue,
                               max_tokens=model.n_ctx if gen.max_tokens is None
                               else gen.max_tokens, params=gen.params, stops=gen.stops)
    except QueueFullError as e:
        raise RequestError(f"the server is busy: {e}", status=503, type="unavailable_error",
                           code="queue_full") from None
    except ContextFullError as e:
        raise RequestError(str(e), param="messages" if chat else "prompt",
                           code="context_length_exceeded") from None
    except PolydevError as e:
        raise RequestError(str(e), param="messages" if chat else "prompt") from None
    reply = _Reply(model_name, chat, harmony=chat and model.speaks_harmony)
    if gen.stream:
        return StreamingResponse(_stream(reply, queue, handle, gen.include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await _whole(request, reply, queue, handle)


def _prompt_ids(model, gen: Generation) -> list[int]:
    if gen.messages is not None:
        return model.tokenize(model.chat_prompt(gen.messages), add_special=False,
                              parse_special=True)
    if isinstance(gen.prompt, list):
        return gen.prompt
    return model.tokenize(gen.prompt, add_special=True, parse_special=True)


async def _whole(request: Request, reply: "_Reply", queue: asyncio.Queue,
                 handle) -> Response:
    """Wait for the whole text; a client that leaves meanwhile cancels the request."""
    text = []
    try:
        while True:
            try:
                event = await asyncio.wait_for(queue.get(), _DISCONNECT_POLL)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    handle.cancel()
                    return Response(status_code=499)
                continue
            if isinstance(event, Piece):
                text.append(event.text)
                continue
            if event.reason == "error":
                raise RequestError(f"generation failed: {event.error}", status=500,
                                   type="server_error")
            return JSONResponse(reply.whole("".join(text), event))
    finally:
        handle.cancel()             # a no-op once finished


async def _stream(reply: "_Reply", queue: asyncio.Queue, handle,
                  include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: a chunk per piece, the finish reason, usage if asked, [DONE]. A
    client that disconnects cancels this generator, which cancels the request."""
    try:
        if reply.chat:
            yield _sse(reply.chunk({"role": "assistant", "content": ""}, None))
        while True:
            event = await queue.get()
            if isinstance(event, Piece):
                for delta in reply.deltas(event.text):
                    yield _sse(reply.chunk(delta, None))
                continue
            if event.reason == "error":
                yield _sse(RequestError(f"generation failed: {event.error}", status=500,
                                        type="server_error").body())
            else:
                for delta in reply.deltas(None):
                    yield _sse(reply.chunk(delta, None))
                yield _sse(reply.chunk({} if reply.chat else "", event.reason))
                if include_usage:
                    yield _sse(reply.usage_chunk(event))
            yield "data: [DONE]\n\n"
            return
    finally:
        handle.cancel()


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


class _Reply:
    """The bodies of one reply: whole, or chunk by chunk (same id and time throughout)."""

    def __init__(self, model_name: str, chat: bool, harmony: bool = False) -> None:
        self.model, self.chat, self.created = model_name, chat, int(time.time())
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        # a harmony model's reasoning goes to reasoning_content, as llama-server sends it
        self.splitter = ChannelSplitter() if harmony else None

    def deltas(self, text: str | None) -> list[Any]:
        """The chunk deltas of one piece of text (None: generation ended, flush)."""
        if self.splitter is None:
            return [{"content": text} if self.chat else text] if text else []
        parts = self.splitter.feed(text) if text is not None else self.splitter.finish()
        return [{_FIELDS[kind]: part} for kind, part in parts]

    def chunk(self, delta: Any, finish_reason: str | None) -> dict:
        choice = ({"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
                  if self.chat else
                  {"index": 0, "text": delta, "finish_reason": finish_reason, "logprobs": None})
        return self._envelope("chat.completion.chunk" if self.chat else "text_completion",
                              [choice])

    def usage_chunk(self, end: Finished) -> dict:
        body = self._envelope("chat.completion.chunk" if self.chat else "text_completion", [])
        body["usage"] = _usage(end)
        return body

    def whole(self, text: str, end: Finished) -> dict:
        message = {"role": "assistant", "content": text}
        if self.splitter is not None:
            parts = self.splitter.feed(text) + self.splitter.finish()
            message = {"role": "assistant"} | {
                field: "".join(p for kind, p in parts if _FIELDS[kind] == field)
                for field in ("content", "reasoning_content")}
        choice = ({"index": 0, "message": message,
                   "finish_reason": end.reason, "logprobs": None} if self.chat else
                  {"index": 0, "text": text, "finish_reason": end.reason, "logprobs": None})
        body = self._envelope("chat.completion" if self.chat else "text_completion", [choice])
        body["usage"] = _usage(end)
        return body

    def _envelope(self, kind: str, choices: list) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model,
                "choices": choices}


def _usage(end: Finished) -> dict:
    return {"prompt_tokens": end.prompt_tokens, "completion_tokens": end.completion_tokens,
            "total_tokens": end.prompt_tokens + end.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": end.cached_tokens}}
