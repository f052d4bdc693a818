"""The HTTP side of ``polydev serve``: OpenAI's routes over a ``ModelWorker`` (Starlette).

Routes: ``/v1/completions`` and ``/v1/chat/completions`` (streamed as server-sent events
ending in ``data: [DONE]`` when asked), or, with ``--embeddings``, ``/v1/embeddings`` and
llama-server's ``/embeddings``; ``/v1/models``, ``/health`` (503 while the model loads),
``/metrics`` (Prometheus) and ``/slots``. Every refusal is OpenAI's error body with a
4xx or 5xx status; a client that goes away cancels its request, which frees its slot at the
next step.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any, AsyncIterator, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from polydev.errors import (ContextFullError, InvalidArgumentError, MissingDependencyError,
                            PolydevError, RemoteDeviceError)
from polydev.models import SamplingParams
from polydev.models.engine import Finished, Piece, QueueFullError, SlotBusyError
from polydev.models.kv_state import checked_name
from polydev.models.reasoning import opens_thinking, thinks
from polydev.models.grammar import CONTROL_TYPES, Grammar, GrammarError
from polydev.models.lazy_grammar import LazyGrammar
from polydev.models.tool_calls import call_grammar, call_trigger

from .metrics import prometheus_text
from .replies import ChoiceText, Reply, finish_reason, merge_logprobs, usage
from .requests import Generation, RequestError, read_chat, read_completion, read_embeddings
from .worker import ModelWorker

__all__ = ["create_app"]

log = logging.getLogger(__name__)
_RETRY_AFTER = "1"              # seconds a client told 503 should wait
_DISCONNECT_POLL = 0.5          # seconds between checks that a waiting client is still there
_PUBLIC = ("/health", "/v1/models")     # answered without the API key, as llama-server


def create_app(worker: ModelWorker, *, model_name: str, api_key: str | None = None,
               drain_seconds: float = 30.0, slot_save_path: str | None = None) -> Starlette:
    """The application; it starts ``worker`` when it starts and stops it (draining) when it
    stops. ``slot_save_path``: the folder where ``/slots/{id}?action=save`` writes a slot's
    cache and ``restore`` reads it (None: those actions are refused, as llama-server's)."""
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
        body: dict[str, Any] = {"status": "ok"}
        if worker.lost:                     # served again without them
            body["lost_devices"] = dict(worker.lost)
        return JSONResponse(body)

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

    async def slot_action(request: Request) -> Response:
        _require_ready(worker)
        _require_mode(worker, embeddings=False)
        return await _slot_action(request, worker, slot_save_path)

    async def completions(request: Request) -> Response:
        _require_mode(worker, embeddings=False)
        return await _generate(request, worker, read_completion, model_name, chat=False)

    async def chat(request: Request) -> Response:
        _require_mode(worker, embeddings=False)
        return await _generate(request, worker, read_chat, model_name, chat=True)

    async def embeddings(request: Request) -> Response:
        return await _embed(request, worker, model_name, openai=True)

    async def embeddings_llama(request: Request) -> Response:
        return await _embed(request, worker, model_name, openai=False)

    async def not_found(request: Request, exc: HTTPException) -> Response:
        return _error(RequestError(f"{request.method} {request.url.path}: {exc.detail}",
                                   status=exc.status_code, code=str(exc.status_code)))

    routes = [Route("/health", guarded(health)), Route("/v1/health", guarded(health)),
              Route("/v1/models", guarded(models)), Route("/metrics", guarded(metrics)),
              Route("/slots", guarded(slots)),
              Route("/slots/{id_slot}", guarded(slot_action), methods=["POST"]),
              Route("/v1/completions", guarded(completions), methods=["POST"]),
              Route("/v1/chat/completions", guarded(chat), methods=["POST"]),
              Route("/v1/embeddings", guarded(embeddings), methods=["POST"]),
              Route("/embeddings", guarded(embeddings_llama), methods=["POST"])]
    return Starlette(routes=routes, lifespan=lifespan,
                     exception_handlers={404: not_found, 405: not_found})


def _require_ready(worker: ModelWorker) -> None:
    if worker.state == "loading":
        raise RequestError("Loading model", status=503, type="unavailable_error",
                           code="model_loading")
    if worker.state == "placing":
        raise RequestError(worker.placing_message(), status=503, type="unavailable_error",
                           code=worker.placing_code)
    if worker.state == "failed":
        raise RequestError(f"the model failed: {worker.error}", status=500,
                           type="server_error")


def _failed(error: BaseException | None) -> RequestError:
    """A request the engine ended with ``error``: 503 where a device was lost (the server
    serves again once the model is placed over the devices that remain), else 500."""
    if isinstance(error, RemoteDeviceError):
        return _device_lost(error)
    return RequestError(f"generation failed: {error}", status=500, type="server_error")


def _device_lost(error: RemoteDeviceError) -> RequestError:
    return RequestError(str(error), status=503, type="unavailable_error", code="device_lost")


async def _slot_action(request: Request, worker: ModelWorker, folder: str | None) -> Response:
    """llama-server's ``POST /slots/{id}?action=save|restore|erase`` (``{"filename": ...}``
    for save and restore, in ``--slot-save-path``)."""
    if folder is None:
        raise RequestError("slot actions need polydev serve --slot-save-path DIR", status=501,
                           type="not_supported_error")
    try:
        slot = int(request.path_params["id_slot"])
    except ValueError:
        raise RequestError(f"no slot {request.path_params['id_slot']!r}: slots are numbered",
                           param="id_slot") from None
    action = request.query_params.get("action")
    if action == "erase":     # the engine of the moment the call runs (a lost device replaces it)
        erased = await _on_model_thread(worker, lambda: worker.engine.erase_slot(slot))
        return JSONResponse({"id_slot": slot, "n_erased": erased})
    if action not in ("save", "restore"):
        raise RequestError('action must be "save", "restore" or "erase"', param="action")
    body = await _json_body(request)
    name = body.get("filename") if isinstance(body, dict) else None
    try:
        path = Path(folder) / checked_name(name)
    except InvalidArgumentError as e:
        raise RequestError(str(e), param="filename") from None
    start = time.perf_counter()
    if action == "save":
        n, size = await _on_model_thread(worker, lambda: worker.engine.save_slot(slot, path))
        return JSONResponse({"id_slot": slot, "filename": name, "n_saved": n,
                             "n_written": size, "timings": {"save_ms": _ms_since(start)}})
    n, size = await _on_model_thread(worker, lambda: worker.engine.restore_slot(slot, path))
    return JSONResponse({"id_slot": slot, "filename": name, "n_restored": n, "n_read": size,
                         "timings": {"restore_ms": _ms_since(start)}})


async def _on_model_thread(worker: ModelWorker, function: Callable[[], Any]) -> Any:
    try:
        return await worker.call(function, asyncio.get_running_loop())
    except SlotBusyError as e:
        raise RequestError(str(e), status=503, type="unavailable_error",
                           code="slot_busy") from None
    except PolydevError as e:
        raise RequestError(str(e)) from None
    except OSError as e:                # the server's folder: full, gone, not writable
        raise RequestError(f"the slot file could not be written: {e.strerror or e}",
                           status=500, type="server_error") from None
    except RuntimeError as e:
        raise RequestError(str(e), status=503, type="unavailable_error") from None


def _ms_since(start: float) -> float:
    return round((time.perf_counter() - start) * 1e3, 3)


def _require_mode(worker: ModelWorker, embeddings: bool) -> None:
    """Refuse what the server's mode does not serve, as llama-server does (501)."""
    if worker.embeddings and not embeddings:
        raise RequestError("this server computes embeddings only (polydev serve "
                           "--embeddings): start it without --embeddings to generate",
                           status=501, type="not_supported_error")
    if embeddings and not worker.embeddings:
        raise RequestError("this server generates text: start polydev serve with "
                           "--embeddings for embeddings", status=501,
                           type="not_supported_error")


async def _embed(request: Request, worker: ModelWorker, model_name: str,
                 openai: bool) -> Response:
    """``/v1/embeddings`` (OpenAI's body) or ``/embeddings`` (llama-server's: every
    token's vector with pooling "none")."""
    _require_ready(worker)
    _require_mode(worker, embeddings=True)
    field = "input" if openai else "content"
    body = await _json_body(request)
    if not openai and isinstance(body, dict) and "content" not in body:
        field = "input"
    read = read_embeddings(body, field)
    if openai and worker.pooling == "none":
        raise RequestError("pooling none gives a vector per token, which OpenAI's API cannot "
                           "carry: use /embeddings, or --pooling mean, cls or last",
                           param=field)
    model = worker.model

    def tokenized() -> list[list[int]]:
        return [model.tokenize(x, add_special=True, parse_special=True) if isinstance(x, str)
                else x for x in read.inputs]
    ids = await run_in_threadpool(tokenized)
    try:
        vectors = await worker.embed(ids, asyncio.get_running_loop(), read.normalization)
    except QueueFullError as e:
        raise RequestError(f"the server is busy: {e}", status=503, type="unavailable_error",
                           code="queue_full") from None
    except ContextFullError as e:
        raise RequestError(str(e), param=field, code="context_length_exceeded") from None
    except RemoteDeviceError as e:
        raise _device_lost(e) from None
    except PolydevError as e:
        raise RequestError(str(e), param=field) from None
    n_tokens = sum(map(len, ids))
    if not openai:
        return JSONResponse([{"index": i, "embedding": (v if v.ndim == 2 else v[None]).tolist()}
                             for i, v in enumerate(vectors)])
    data = [{"object": "embedding", "index": i,
             "embedding": _encoded(v, read.encoding_format)} for i, v in enumerate(vectors)]
    return JSONResponse({"object": "list", "data": data, "model": model_name,
                         "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}})


def _encoded(vector, encoding_format: str) -> list[float] | str:
    """A vector as OpenAI writes it: a list of floats, or base64 of its float32 bytes."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


async def _json_body(request: Request) -> Any:
    try:
        return await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"the request body is not valid JSON: {e}") from None


def _error(e: RequestError) -> JSONResponse:
    headers = {"Retry-After": _RETRY_AFTER} if e.status == 503 else None
    return JSONResponse(e.body(), status_code=e.status, headers=headers)


async def _generate(request: Request, worker: ModelWorker, read: Callable[[Any], Generation],
                    model_name: str, chat: bool) -> Response:
    _require_ready(worker)
    gen = read(await _json_body(request))
    model = worker.model
    param = "messages" if chat else "prompt"
    queue: asyncio.Queue = asyncio.Queue()
    try:
        ids, constraints, thinking = await run_in_threadpool(_prepare, model, gen)
        handles = _submit_choices(worker, gen, ids, constraints, queue)
    except QueueFullError as e:
        raise RequestError(f"the server is busy: {e}", status=503, type="unavailable_error",
                           code="queue_full") from None
    except MissingDependencyError as e:
        raise RequestError(str(e), status=501, type="server_error") from None
    except GrammarError as e:
        raise RequestError(str(e), param=gen.grammar_param) from None
    except ContextFullError as e:
        raise RequestError(str(e), param=param, code="context_length_exceeded") from None
    except RemoteDeviceError as e:
        raise _device_lost(e) from None
    except PolydevError as e:
        raise RequestError(str(e), param=param) from None
    reply = Reply(model_name, chat)
    functions = gen.tools.functions if gen.tools is not None else None
    texts = [ChoiceText(i, chat, chat and model.speaks_harmony, functions,
                        lambda t: model.tokenizer.token_to_piece(t, special=True), thinking,
                        gen.stream) for i in range(gen.n)]
    if gen.stream:
        return StreamingResponse(_stream(reply, texts, queue, handles, gen.include_usage),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await _whole(request, reply, texts, queue, handles)


def _submit_choices(worker: ModelWorker, gen: Generation, ids: list[int], constraints: list,
                    queue: asyncio.Queue) -> list:
    """A handle per choice; a choice refused (a full queue) cancels those queued before it."""
    handles: list = []
    try:
        for i in range(gen.n):
            handles.append(worker.submit(
                ids, asyncio.get_running_loop(), queue, index=i, max_tokens=gen.max_tokens,
                params=_choice_params(gen, i), stops=gen.stops, constraint=constraints[i],
                logprobs=gen.logprobs, show_special=gen.tools is not None))
    except BaseException:
        for handle in handles:
            handle.cancel()
        raise
    return handles


def _prepare(model, gen: Generation) -> tuple[list[int], list, str | None]:
    """The prompt's token ids, a grammar matcher per choice (None: unconstrained), and how
    the reply's ``<think>`` reasoning begins ("open", "closed"; None: the model has none)."""
    tools, thinking = gen.tools, None
    if gen.messages is not None:
        text = model.chat_prompt(gen.messages, tools.functions if tools else None)
        ids = model.tokenize(text, add_special=False, parse_special=True)
        if thinks(model.chat_template):
            thinking = "open" if opens_thinking(text) else "closed"
    elif isinstance(gen.prompt, list):
        ids = gen.prompt
    else:
        ids = model.tokenize(gen.prompt, add_special=True, parse_special=True)
    grammar = gen.grammar
    if tools is not None and tools.choice != "auto":     # requests.py refused both at once
        grammar = _tools_grammar(model, tools, tools.choice)
    elif tools is not None and grammar is None:
        return ids, _lazy_call_grammars(model, tools, gen.n, thinking), thinking
    if grammar is None:
        return ids, [None] * gen.n, thinking
    vocabulary = model.grammar_vocabulary
    compiled = vocabulary.compile(grammar)
    return ids, [vocabulary.matcher(compiled) for _ in range(gen.n)], thinking


def _tools_grammar(model, tools, choice: str) -> Grammar:
    """The grammar of a reply that is only calls (of the function ``choice`` names, or of
    any, "required"), in the syntax of the model's template."""
    vocab = model.tokenizer.vocab
    return Grammar("lark", call_grammar(tools.functions, choice, tools.parallel,
                                        model.chat_template,
                                        lambda text: _control_id(vocab, text)))


def _lazy_call_grammars(model, tools, n: int, thinking: str | None) -> list:
    """For ``tool_choice`` "auto", a grammar per choice that applies from the marker that
    opens a call on (``LazyGrammar``); unconstrained choices where the template's calls have
    no marker or llguidance is not installed (the reply is then only parsed)."""
    trigger = call_trigger(model.chat_template)
    if trigger is None:
        return [None] * n
    try:
        vocabulary = model.grammar_vocabulary
        compiled = vocabulary.compile(_tools_grammar(model, tools, "required"))
    except (MissingDependencyError, GrammarError) as e:    # e.g. a schema llguidance lacks
        log.debug("tool calls go unconstrained: %s", e)
        return [None] * n
    return [LazyGrammar(vocabulary, compiled, trigger, thinking) for _ in range(n)]


def _control_id(vocab, text: str) -> int | None:
    token = vocab.tokens.id_of(text)
    return token if token is not None and vocab.types[token] in CONTROL_TYPES else None


def _choice_params(gen: Generation, index: int) -> SamplingParams:
    """Choice ``index``'s sampling: a request's seed gives each choice its own."""
    if index == 0 or gen.params.seed is None:
        return gen.params
    return replace(gen.params, seed=gen.params.seed + index)


async def _whole(request: Request, reply: Reply, texts: list[ChoiceText],
                 queue: asyncio.Queue, handles: list) -> Response:
    """Wait for every choice's whole text; a client that leaves meanwhile cancels the
    request."""
    parts: list[list[dict]] = [[] for _ in texts]
    logprobs: list[list[dict]] = [[] for _ in texts]
    ends: dict[int, Finished] = {}
    checked = time.monotonic()
    try:
        while len(ends) < len(texts):
            try:
                index, event = await asyncio.wait_for(queue.get(), _DISCONNECT_POLL)
            except asyncio.TimeoutError:
                index, event = None, None
            if time.monotonic() - checked >= _DISCONNECT_POLL:    # n choices never pause
                checked = time.monotonic()
                if await request.is_disconnected():
                    return Response(status_code=499)
            if event is None:
                continue
            text = texts[index]
            if isinstance(event, Piece):
                parts[index] += text.feed(event.text)
                found = text.logprobs(event, event.text)
                if found is not None:
                    logprobs[index].append(found)
                continue
            if event.reason == "error":
                raise _failed(event.error)
            parts[index] += text.feed(None)
            ends[index] = event
        choices = [_whole_choice(reply.chat, t, parts[t.index], logprobs[t.index],
                                 ends[t.index]) for t in texts]
        body = reply.whole(choices)
        body["usage"] = usage([ends[i] for i in range(len(texts))])
        return JSONResponse(body)
    finally:
        for handle in handles:
            handle.cancel()             # a no-op once finished


def _whole_choice(chat: bool, text: ChoiceText, parts: list, logprobs: list[dict],
                  end: Finished) -> dict:
    merged = merge_logprobs(chat, logprobs)
    if not chat:
        return {"index": text.index, "text": "".join(parts), "finish_reason": end.reason,
                "logprobs": merged}
    message: dict[str, Any] = {"role": "assistant", "content": "".join(
        p.get("content", "") for p in parts)}
    reasoning = "".join(p.get("reasoning_content", "") for p in parts)
    if reasoning:
        message["reasoning_content"] = reasoning
    if text.calls:
        message["tool_calls"] = [call.openai() for call in text.calls]
        message["content"] = message["content"] or None
    return {"index": text.index, "message": message, "finish_reason": finish_reason(end, text),
            "logprobs": merged}


async def _stream(reply: Reply, texts: list[ChoiceText], queue: asyncio.Queue, handles: list,
                  include_usage: bool) -> AsyncIterator[str]:
    """Server-sent events: a chunk per piece of each choice, its finish reason, usage if
    asked, [DONE]; a failure ends the stream with an error event instead (no [DONE], as
    OpenAI's API). A client that disconnects cancels this generator, which cancels the
    request."""
    ends: dict[int, Finished] = {}
    try:
        if reply.chat:
            for text in texts:
                yield _sse(reply.chunk(text.index, {"role": "assistant", "content": ""}, None))
        while len(ends) < len(texts):
            index, event = await queue.get()
            text = texts[index]
            if isinstance(event, Piece):
                deltas = text.feed(event.text)
                logprobs = text.logprobs(event, event.text)
                if logprobs is not None and not deltas:
                    deltas = [{} if reply.chat else ""]
                for i, delta in enumerate(deltas):
                    yield _sse(reply.chunk(index, delta, None, logprobs if i == 0 else None))
                continue
            if event.reason == "error":
                yield _sse(_failed(event.error).body())
                break
            for delta in text.feed(None):
                yield _sse(reply.chunk(index, delta, None))
            ends[index] = event
            yield _sse(reply.chunk(index, {} if reply.chat else "", finish_reason(event, text)))
        if len(ends) < len(texts):          # an error event ended it: no [DONE], as OpenAI
            return
        if include_usage:
            yield _sse(reply.usage_chunk([ends[i] for i in range(len(texts))]))
        yield "data: [DONE]\n\n"
    finally:
        for handle in handles:
            handle.cancel()


def _sse(data: dict) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"
