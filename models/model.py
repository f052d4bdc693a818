"""The public model: ``polydev.models.load(path)`` and ``Model``.

``Model`` ties a GGUF file's weights (placed over devices), its tokenizer, a KV cache and the
step evaluator together: ``tokenize``/``detokenize``, ``eval`` and ``logits``, ``generate``
(an iterator of text pieces), ``chat`` (the file's own chat template), ``reset`` and ``close``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Iterator, Sequence

import numpy as np

from polydev.errors import InvalidArgumentError
from polydev.lifetime import Resource
from polydev.numerics import DEFAULT_NUMERICS, check_numerics

from .chat_fallback import fallback_format
from .chat_template import render_chat
from .batch import Batch
from .default_model import default_model_path
from .embeddings import embed, file_pooling
from .engine import BatchEngine, Piece
from .evaluator import Evaluator, Timings
from .gguf import GGUFFile
from .grammar import Grammar, GrammarVocabulary
from .kv_cache import KVCache
from .kv_cells import MAX_SEQUENCES
from .loader import ModelWeights, load_weights
from .placement import Placement, plan_placement
from .placement_settings import PlacementSettings, settings_from
from .harmony import is_harmony
from .sampling import SamplingParams
from .tokenizer import Tokenizer
from .tool_calls import template_writes_tools, without_tool_roles

__all__ = ["Model", "load"]


def load(path: str | os.PathLike | None = None, *, settings: PlacementSettings | None = None,
         progress: bool = True, numerics: str = DEFAULT_NUMERICS, **knobs: Any) -> "Model":
    """Load a GGUF model (default: the embedded gemma-3-270m) with its layers placed as
    llama.cpp's knobs (or accelerate's ``device_map``/``max_memory``) say: a
    ``PlacementSettings`` record, or its knobs as keywords (``n_gpu_layers=10, n_ctx=2048``;
    with both, the keywords change the record's). ``numerics``: "fast" (the default), "int8"
    or "exact", how the CPU computes (see ``polydev.numerics``)."""
    settings = settings_from(settings, knobs)       # a mistaken knob fails before the file opens
    check_numerics(numerics)
    path = default_model_path() if path is None else path
    file = GGUFFile(path)
    try:
        placement = plan_placement(file, settings)
        return Model(file, placement, progress=progress, numerics=numerics)
    except BaseException:
        file.close()
        raise


class Model(Resource):
    """A loaded model; a context manager (``close()`` frees every buffer and the file)."""

    def __init__(self, file: GGUFFile, placement: Placement, *, progress: bool = True,
                 numerics: str = DEFAULT_NUMERICS) -> None:
        start = time.perf_counter()
        self.file, self.placement, self.hparams = file, placement, placement.hparams
        self.weights: ModelWeights | None = None
        self.kv: KVCache | None = None
        self.evaluator: Evaluator | None = None
        try:
            self.tokenizer = Tokenizer.from_gguf(file)
            self.weights = load_weights(file, placement, progress=progress)
            self.kv = KVCache(self.hparams, placement)
            self.evaluator = Evaluator(self.weights, self.kv, placement.settings.n_batch,
                                       numerics)
        except BaseException:
            self._free()
            raise
        self.load_seconds = time.perf_counter() - start
        self._logits: np.ndarray | None = None
        self.tokens: list[int] = []          # the context: every token evaluated, in order
        self._edits = 0                      # memory edits that ``tokens`` has seen
        self.generated: list[int] = []       # the tokens the last generate produced
        self._engine = BatchEngine(self, n_slots=1, max_queued=0)   # generate's, on sequence 0
        self._grammar_vocabulary: GrammarVocabulary | None = None
        self._grammar_lock = threading.Lock()

    # --- text ------------------------------------------------------------------------------

    def tokenize(self, text: str, add_special: bool = True,
                 parse_special: bool = False) -> list[int]:
        """llama.cpp's tokenize."""
        return self.tokenizer.encode(text, add_special, parse_special)

    def detokenize(self, tokens: Sequence[int], remove_special: bool = False,
                   unparse_special: bool = False) -> str:
        """llama.cpp's detokenize."""
        return self.tokenizer.decode(tokens, remove_special, unparse_special)

    # --- evaluation ------------------------------------------------------------------------

    def eval(self, tokens: Sequence[int], all_logits: bool = False) -> None:
        """Evaluate ``tokens`` after those already in the context; ``logits()`` then holds the
        last token's logits (every token's with ``all_logits``)."""
        self._check_open()
        self._logits = self.evaluator.eval(tokens, all_logits)
        self.tokens += [int(t) for t in tokens]

    def decode(self, batch: Batch) -> np.ndarray:
        """Evaluate a ``Batch`` of tokens of one or many sequences (llama.cpp's
        ``llama_decode``); the logits of the tokens it asks for, [n_asked, n_vocab], in its
        order. Sequence 0 is the one ``eval`` and ``generate`` continue; ``memory`` holds every
        sequence's cells (``seq_rm``, ``seq_cp``, ``seq_keep``, ``seq_add``,
        ``seq_pos_max``)."""
        self._check_open()
        logits = self.evaluator.decode(batch)
        self.tokens += [t for t, seq in zip(batch.tokens, batch.seq_ids) if seq == 0]
        return logits

    @property
    def memory(self) -> KVCache:
        """The KV cache and its sequences (llama.cpp's ``llama_get_memory``)."""
        return self.kv

    def logits(self) -> np.ndarray:
        """The logits of the last ``eval``: [n_vocab], or [n_tokens, n_vocab] (a copy)."""
        if self._logits is None:
            raise InvalidArgumentError("no logits yet: call eval first")
        return self._logits.copy()

    def reset(self) -> None:
        """Forget the context (the KV cache and the tokens in it)."""
        self._check_open()
        self.evaluator.reset()
        self.tokens, self._logits, self._edits = [], None, self.kv.edits

    @property
    def n_ctx(self) -> int:
        return self.kv.size

    @property
    def timings(self) -> Timings:
        return self.evaluator.timings

    # --- generation ------------------------------------------------------------------------

    def generate(self, prompt: str | Sequence[int], max_tokens: int = 128, *,
                 temperature: float = 0.8, top_k: int = 40, top_p: float = 0.95,
                 min_p: float = 0.05, repeat_penalty: float = 1.0, repeat_last_n: int = 64,
                 seed: int | None = None, stop: str | Sequence[str] = (),
                 add_special: bool = True, parse_special: bool = False,
                 keep_context: bool = False, grammar: Grammar | None = None) -> Iterator[str]:
        """Text pieces of the continuation of ``prompt`` (text, or token ids), streamed as they
        are generated; stops at an end-of-generation token, at a ``stop`` string (not
        shown) or after ``max_tokens``. ``temperature=0`` is greedy. The context starts over
        from the prompt (reusing the cached tokens it begins with), or continues after them
        with ``keep_context``. ``grammar``: what the text must match (a JSON schema, GBNF,
        Lark or a regular expression: ``polydev.models.grammar``). This is the batching
        engine (``polydev.models.engine``) with one sequence, sequence 0 of the cache."""
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                                repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n,
                                seed=seed)
        ids = self._prompt_ids(prompt, add_special, parse_special)
        if not ids:
            raise InvalidArgumentError("the prompt has no tokens")
        if max_tokens < 0:
            raise InvalidArgumentError(f"max_tokens must be >= 0, got {max_tokens}")
        constraint = None if grammar is None else self.grammar_vocabulary.matcher(grammar)
        return self._generate(ids, max_tokens, params, stop, keep_context, constraint)

    def _generate(self, ids: list[int], max_tokens: int, params: SamplingParams,
                  stops: str | Sequence[str], keep_context: bool,
                  constraint=None) -> Iterator[str]:
        self._check_open()
        if self._engine.release(0):         # a generation left open ends here, where it was
            self.tokens, self._edits = self._engine.cached(0), self.kv.edits
        elif self.kv.edits != self._edits:  # memory.seq_* changed sequence 0 behind our back
            self.tokens = []
        prompt = self.tokens + ids if keep_context else ids
        self._engine.adopt(0, self.tokens)
        self.generated, self._logits = [], None
        events = self._engine.stream(prompt, max_tokens=max_tokens, params=params, stops=stops,
                                     constraint=constraint)
        try:
            for event in events:
                if isinstance(event, Piece):
                    self.generated += event.tokens
                    if event.text:
                        yield event.text
                elif event.error is not None:
                    raise event.error
        finally:
            events.close()
            self.tokens, self._edits = self._engine.cached(0), self.kv.edits

    def _prompt_ids(self, prompt: str | Sequence[int], add_special: bool,
                    parse_special: bool) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenize(prompt, add_special, parse_special)
        return [int(t) for t in prompt]

    def generate_batch(self, prompts: Sequence[str | Sequence[int]], max_tokens: int = 128, *,
                       n_parallel: int | None = None, stop: str | Sequence[str] = (),
                       add_special: bool = True, parse_special: bool = False,
                       **sampling: Any) -> list[str]:
        """The continuations of several prompts, generated together by continuous batching
        over ``n_parallel`` sequences (default: one per prompt, at most 64); each prompt gets
        its own sampler with the same settings (``temperature``, ``seed``, ... as
        ``generate``). The cache is shared: the prompts and their continuations must fit
        ``n_ctx`` together, or the longest ones end early. Starts the context over."""
        ids = [self._prompt_ids(p, add_special, parse_special) for p in prompts]
        params = SamplingParams(**sampling)
        engine = BatchEngine(self, n_parallel or max(1, min(len(ids), MAX_SEQUENCES)),
                             max_queued=len(ids))
        self.tokens, self._logits = [], None
        texts = [""] * len(ids)
        failures: list[Exception] = []

        def collect(i: int):
            def on_event(event) -> None:
                if isinstance(event, Piece):
                    texts[i] += event.text
                elif event.error is not None:
                    failures.append(event.error)
            return on_event

        for i, prompt in enumerate(ids):
            engine.submit(prompt, collect(i), max_tokens=max_tokens, params=params, stops=stop)
        engine.run_until_done()
        self.reset()                # the sequences are the engine's; the context starts over
        if failures:
            raise failures[0]
        return texts

    def chat(self, messages: Sequence[dict[str, Any]], max_tokens: int = 256,
             **sampling: Any) -> Iterator[str]:
        """The assistant's reply to ``messages``, through the model's own chat template
        (``stop`` and the sampling settings as ``generate``)."""
        prompt = self.chat_prompt(messages)
        return self.generate(prompt, max_tokens, add_special=False, parse_special=True,
                             **sampling)

    def embed(self, inputs: str | Sequence[str] | Sequence[Sequence[int]], *,
              pooling: str | None = None, normalization: int = 2) -> list[np.ndarray]:
        """The embedding of each input (a text, or token ids; one text alone is a list of
        one): its final hidden state pooled over its tokens (``pooling``: "mean", "cls",
        "last", "none"; default the file's ``pooling_type``, else "mean") and normalized as
        llama-server's ``embd_normalize`` (2: Euclidean). The inputs are evaluated together,
        a sequence each; starts the context over (``polydev.models.embeddings``)."""
        self._check_open()
        if isinstance(inputs, str):
            inputs = [inputs]
        ids = [self.tokenize(x, add_special=True, parse_special=True) if isinstance(x, str)
               else [int(t) for t in x] for x in inputs]
        self._engine.release(0)
        self.reset()                    # every cell is the embeddings' to use
        try:
            return embed(self, ids, pooling or self.pooling, normalization)
        finally:
            self.reset()

    @property
    def pooling(self) -> str:
        """How ``embed`` pools by default: the file's ``pooling_type``, else "mean"."""
        return file_pooling(self.file, self.hparams.arch) or "mean"

    @property
    def grammar_vocabulary(self) -> GrammarVocabulary:
        """The model's tokens as constrained sampling needs them (``polydev.models.grammar``;
        built at the first use, 0.1-0.6 s, then kept; any thread)."""
        with self._grammar_lock:
            if self._grammar_vocabulary is None:
                self._grammar_vocabulary = GrammarVocabulary(self.tokenizer)
            return self._grammar_vocabulary

    @property
    def speaks_harmony(self) -> bool:
        """Whether replies come in gpt-oss's harmony channels (``polydev.models.harmony``:
        reasoning and answer apart)."""
        return is_harmony(self.chat_template, self.tokenizer.vocab.tokens)

    @property
    def chat_template(self) -> str:
        """The file's ``tokenizer.chat_template``; a file without one gets its family's turn
        format (``polydev.models.chat_fallback``, logged once)."""
        template = self.file.get("tokenizer.chat_template")
        if template is None:
            vocab = self.tokenizer.vocab
            template = fallback_format(self.hparams.arch, vocab.tokens, vocab.model,
                                       str(self.file.path)).template
        return template

    def chat_prompt(self, messages: Sequence[dict[str, Any]],
                    tools: Sequence[dict[str, Any]] | None = None) -> str:
        """``messages`` rendered by the model's chat template (``chat_template``), ready for
        the assistant; ``tools``: the functions it may call (OpenAI's ``tools``), rendered by
        the template, or described in the system message where the template has no place
        for them (``polydev.models.tool_calls``)."""
        tok = self.tokenizer
        bos = tok.vocab.tokens[tok.bos_id] if tok.bos_id is not None else ""
        eos = tok.vocab.tokens[tok.eos_id] if tok.eos_id is not None else ""
        template = self.chat_template
        if tools and not template_writes_tools(template):
            messages, tools = without_tool_roles(messages, tools), None
        text = render_chat(template, messages, bos_token=bos, eos_token=eos, tools=tools)
        if tok.vocab.add_bos and bos and not text.startswith(bos):
            text = bos + text                  # llama.cpp adds BOS when the template does not
        return text

    # --- lifetime ---------------------------------------------------------------------------

    def __repr__(self) -> str:
        return (f"Model({os.path.basename(self.file.path)!r}, {self.hparams.arch}, "
                f"{self.hparams.n_layer} layers, n_ctx={self.n_ctx if self.kv else '?'})")

    def _describe(self) -> str:
        return f"the model {self.file.path}"

    def _free(self) -> None:
        for part in (self.evaluator, self.kv, self.weights):
            if part is not None:
                part.close()
        self.file.close()
