"""The thread that owns the model: it loads it, then runs the batching engine's steps, while the
server's event loop submits requests and awaits their events.

Loading happens in this thread so that the server answers (``/health``: 503) from its first
moment. Events cross to the event loop with ``call_soon_threadsafe``; a stop drains the
running requests first. A device of the model found lost after a step (a remote device whose
node is gone: the step that met it failed its requests) ends the running and waiting
requests with ``RemoteDeviceError``; the thread then loads the model again, placed over the
devices that remain, and serves on (``/health``: 503 while it loads, then the devices
lost). While a device is lost, the thread asks every two seconds whether it is back (the
reg's "reconnect_lost" proc: a remote device whose node returned under its name), and once
one is and no request runs or waits, it places the model over the devices it was given again.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from typing import Any, Callable, Sequence

from polydev.device import lost_text
from polydev.errors import MissingDependencyError, PolydevError, RemoteDeviceError
from polydev.models import Model
from polydev.models.embedding_engine import EmbeddingEngine
from polydev.models.engine import BatchEngine, Event, Handle
from polydev.models.speculative import Drafter
from polydev.registry import registry

__all__ = ["ModelWorker"]

log = logging.getLogger(__name__)
_IDLE_WAIT = 0.05           # seconds a worker with nothing to do waits for a request
_RETURN_CHECK_S = 2.0       # how often a worker serving without a lost device asks for it


def _settle(future: asyncio.Future, result: Any, error: BaseException | None) -> None:
    """Give ``future`` its result or error (on its loop; a cancelled one stays so)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _prepare_grammars(model: Model) -> None:
    """Build the model's grammar vocabulary (about a second for 262k tokens) before the
    first constrained request needs it; a request meanwhile waits for it."""
    try:
        model.grammar_vocabulary
    except MissingDependencyError:
        log.info("constrained output is off: llguidance is not installed")
    except Exception:
        log.exception("the grammar vocabulary failed")


class ModelWorker:
    """Loads a model with ``load`` and serves ``n_slots`` sequences of it; with
    ``embeddings``, embedding requests only (``EmbeddingEngine``), pooled by ``pooling``
    (default: the file's, else "mean")."""

    def __init__(self, load: Callable[[], Model], n_slots: int, max_queued: int, *,
                 embeddings: bool = False, pooling: str | None = None,
                 drafter: Callable[[Model], Drafter] | None = None) -> None:
        """``drafter``: makes the speculative drafter for the loaded model (a draft model is
        loaded then, on the model's thread)."""
        self._load, self.n_slots, self.max_queued = load, n_slots, max_queued
        self.embeddings, self._pooling = embeddings, pooling
        self._make_drafter, self.drafter = drafter, None
        self.model: Model | None = None
        self.engine: BatchEngine | EmbeddingEngine | None = None
        self.error: BaseException | None = None
        self.lost: dict[str, str] = {}      # the devices found lost: name -> why
        self.busy_seconds = 0.0             # time spent in steps that did work
        # (run, refuse) pairs: run on the model's thread, or refused once it has stopped
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        self._calls_lock = threading.Lock()
        self._calls_closed = False
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._placing_again = threading.Event()
        self._placing_why = ""
        self._placing_code = "device_lost"
        self._next_return_check = 0.0
        self._swap = threading.Lock()       # submit never meets a model being replaced
        self._thread = threading.Thread(target=self._main, name="polydev-model", daemon=True)

    @property
    def state(self) -> str:
        """"loading", "ready", "failed", or "placing" (loading again over the devices that
        remain after one was lost, or with one that returned)."""
        if self.error is not None:
            return "failed"
        if self._placing_again.is_set():
            return "placing"
        return "ready" if self._ready.is_set() else "loading"

    def start(self) -> None:
        self._thread.start()

    def wait_ready(self, timeout: float | None = None) -> bool:
        """True once the model is loaded (False on a timeout or a failed load)."""
        self._ready.wait(timeout)
        return self.state == "ready"

    def submit(self, prompt: Sequence[int], loop: asyncio.AbstractEventLoop,
               queue: asyncio.Queue, *, index: int = 0, **settings: Any) -> Handle:
        """Queue a request (``settings``: ``BatchEngine.submit``'s; ``max_tokens=None``: up
        to the context); its events are put on ``queue`` in ``loop`` as (``index``,
        event)."""
        def on_event(event: Event) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, (index, event))
        with self._swap:
            self._check_serving()
            if settings.get("max_tokens", 0) is None:       # up to the context
                settings["max_tokens"] = self.model.n_ctx
            return self.engine.submit(prompt, on_event, **settings)

    @property
    def pooling(self) -> str:
        """How embeddings are pooled: ``--pooling``, else the model file's, else "mean"
        (resolved when the model loads)."""
        return self._pooling

    def embed(self, inputs: Sequence[Sequence[int]], loop: asyncio.AbstractEventLoop,
              normalization: int, pooling: str | None = None) -> asyncio.Future:
        """Queue the embedding of ``inputs``; the future gets the vectors (or the error)."""
        future = loop.create_future()

        def on_done(result) -> None:
            error = result if isinstance(result, Exception) else None
            loop.call_soon_threadsafe(_settle, future, result, error)
        with self._swap:
            self._check_serving()
            job = self.engine.submit(inputs, on_done, pooling=pooling or self.pooling,
                                     normalization=normalization)
        future.add_done_callback(lambda f: job.cancel() if f.cancelled() else None)
        return future

    def call(self, function: Callable[[], Any], loop: asyncio.AbstractEventLoop
             ) -> asyncio.Future:
        """Run ``function`` on the model's thread between two steps (what must not race the
        engine: a slot's cache saved or restored); the future gets its result or error."""
        future = loop.create_future()

        def run() -> None:
            try:
                result, error = function(), None
            except Exception as e:          # the caller's to answer
                result, error = None, e
            loop.call_soon_threadsafe(_settle, future, result, error)

        def refuse(error: Exception) -> None:
            loop.call_soon_threadsafe(_settle, future, None, error)
        with self._calls_lock:
            try:
                self._check_serving()
                stopped = self._calls_closed or self._stopping.is_set()
                if stopped or not self._thread.is_alive():
                    raise RuntimeError("the model's thread is not running")
            except Exception as e:
                future.set_exception(e)
                return future
            self._calls.put((run, refuse))
        engine = self.engine
        if engine is not None:
            engine.wake()
        return future

    def stop(self, drain_seconds: float = 30.0) -> None:
        """Let running and waiting requests finish (up to ``drain_seconds``), then stop the
        thread and close the model."""
        deadline = time.monotonic() + drain_seconds
        engine = self.engine
        while (engine is not None and (engine.processing or engine.queued)
               and time.monotonic() < deadline and self._thread.is_alive()):
            time.sleep(0.05)
        self._stopping.set()
        if engine is not None:
            engine.wake()
        if self._thread.is_alive():
            self._thread.join()

    def placing_message(self) -> str:
        """What a request meets while the model is placed again: why."""
        return self._placing_why

    @property
    def placing_code(self) -> str:
        """The error code of a request refused while the model is placed again:
        "device_lost", or "model_loading" where a device returned."""
        return self._placing_code

    def _check_serving(self) -> None:
        state = self.state
        if state == "placing":
            raise RemoteDeviceError(self.placing_message())
        if state != "ready":
            raise RuntimeError(f"the model is {state}")

    def _main(self) -> None:
        if not self._start_models():
            self._refuse_calls()
            return
        try:
            while not self._stopping.is_set():
                while not self._calls.empty():
                    run, _ = self._calls.get()
                    run()
                start = time.perf_counter()
                if self.engine.step():
                    self.busy_seconds += time.perf_counter() - start
                else:
                    self.engine.wait_for_work(_IDLE_WAIT)
                lost = _lost_devices(self.model)
                if lost and not self._place_again(lost):
                    return
                if self.lost and not self._place_with_returned():
                    return
        except BaseException as e:
            log.exception("the model's thread stopped")
            self.error = e
            self.engine.abort(e if isinstance(e, Exception) else RuntimeError(repr(e)))
        finally:
            self._close_models()
            self._refuse_calls()

    def _refuse_calls(self) -> None:
        """Settle the calls still queued with an error, and take no more."""
        with self._calls_lock:
            self._calls_closed = True
        while not self._calls.empty():
            _, refuse = self._calls.get()
            refuse(RuntimeError("the model's thread stopped"))

    def _start_models(self) -> bool:
        """Load the model (its drafter, its engine); False, with ``error`` set, on a
        failure."""
        try:
            self.model = self._load()
            if self.embeddings:
                self._pooling = self._pooling or self.model.pooling
            if self._make_drafter is not None:
                self.drafter = self._make_drafter(self.model)
            self.engine = (EmbeddingEngine(self.model, self.max_queued) if self.embeddings
                           else BatchEngine(self.model, self.n_slots, self.max_queued,
                                            self.drafter))
        except BaseException as e:          # reported by /health and the log, not raised here
            log.error("the model failed to load: %s", e)
            self.error = e
            self._close_models()
            self._ready.set()
            return False
        self._ready.set()
        log.info("model loaded: %r, %s", self.model, f"embeddings ({self.pooling} pooling)"
                 if self.embeddings else f"{self.n_slots} slots")
        if not self.embeddings:
            threading.Thread(target=_prepare_grammars, args=(self.model,), daemon=True,
                             name="polydev-grammar-vocabulary").start()
        return True

    def _place_again(self, lost: dict[str, str]) -> bool:
        """End every request with the devices' loss, then load the model again over the
        devices that remain (the placement leaves lost devices out); False if that fails."""
        self.lost.update(lost)
        error = RemoteDeviceError(f"{_lost_text(lost)}; the request could not finish")
        log.error("%s: placing the model again over the devices that remain",
                  _lost_text(lost))
        with self._swap:
            self._placing_why = (f"{_lost_text(self.lost)}; the model is being placed over "
                                 f"the devices that remain")
            self._placing_code = "device_lost"
            self._placing_again.set()
            self.engine.abort(error)
        return self._load_again()

    def _place_with_returned(self) -> bool:
        """Every ``_RETURN_CHECK_S`` while no request runs or waits: where a lost device is
        back, load the model again with it; where that fails, serve on without it. False if
        the model cannot be loaded at all."""
        now = time.monotonic()
        if now < self._next_return_check or self.engine.processing or self.engine.queued:
            return True
        self._next_return_check = now + _RETURN_CHECK_S
        returned = _returned(self.lost)
        if not returned:
            return True
        with self._swap:
            if self.engine.processing or self.engine.queued:
                return True                   # once they have ended
            self._placing_why = (f"{', '.join(returned)} returned; the model is being placed "
                                 f"again with it")
            self._placing_code = "model_loading"
            self._placing_again.set()
        lost = {name: self.lost.pop(name) for name in returned}
        log.info("%s returned: placing the model again with it", ", ".join(returned))
        if self._load_again():
            return True
        log.error("placing the model with %s failed (%s): placing it without",
                  ", ".join(returned), self.error)
        self.error = None
        self.lost.update(lost)
        self._placing_again.set()
        return self._load_again()

    def _load_again(self) -> bool:
        """Close the model and load it again (placed over the devices in service)."""
        try:
            self._close_models()
        except PolydevError as e:             # what a lost device held is gone with it
            log.warning("closing the model: %s", e)
        self.model = self.engine = self.drafter = None
        try:
            return self._start_models()
        finally:
            self._placing_again.clear()

    def _close_models(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
        if self.model is not None:
            self.model.close()


def _lost_devices(model: Model) -> dict[str, str]:
    """The model's devices that are lost (a remote device whose node is gone), with why."""
    return {b.device.name: b.device.lost for b in model.evaluator.backends
            if b.device.lost is not None}


def _returned(lost: dict[str, str]) -> list[str]:
    """The devices of ``lost`` that are back in service, after asking every backend library
    that can bring lost devices back (its "reconnect_lost" proc) to."""
    for reg in registry().regs:
        reconnect = reg.get_proc_address("reconnect_lost")
        if reconnect is not None:
            try:
                reconnect()
            except Exception as e:            # asked again at the next check
                log.warning("%s: bringing lost devices back failed: %s", reg.name, e)
    serving = {d.name for d in registry().devices if d.lost is None}
    return [name for name in lost if name in serving]


def _lost_text(lost: dict[str, str]) -> str:
    return "; ".join(lost_text(name, why) for name, why in lost.items())
