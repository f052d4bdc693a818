"""A GGUF file's weights in device buffers, where a ``Placement`` says they go.

Weights whose buffer type is the CPU's are the file mapping itself: one read-only
``buffer_from_host_ptr`` buffer over the whole ``mmap`` holds every one of them at its file
offset, so loading onto the CPU copies nothing (llama.cpp's mmap buffers). Every other buffer
type gets one context, ``alloc_ctx_tensors`` and an upload from the mapping, asynchronous on
devices that have async copies, with a progress bar on stderr; a device on another host
that has the same file reads its share there instead (``Buffer.set_from_file``). A tied
output matrix placed away from the token embedding gets its own copy there. Every buffer is
marked WEIGHTS, which is what the scheduler places ops by.

``close()`` (or ``with``) releases the buffers, then the file. A load that fails part-way
closes what it made before the error propagates.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from polydev import BufferUsage, Context, Tensor, alloc_ctx_tensors, tensor_alloc, tensor_set
from polydev.buffer import Buffer, BufferType
from polydev.lifetime import Resource

from .gguf import GGUFFile
from .placement import Placement, TensorPlacement, plan_placement

__all__ = ["ModelWeights", "load_weights"]

log = logging.getLogger(__name__)


class ModelWeights(Resource):
    """The weights of one model on their devices: ``weights["blk.0.attn_q.weight"]`` is a
    polydev ``Tensor`` in a WEIGHTS buffer."""

    def __init__(self, file: GGUFFile, placement: Placement, owns_file: bool) -> None:
        self.file = file
        self.placement = placement
        self.tensors: dict[str, Tensor] = {}
        self.buffers: list[Buffer] = []
        self.uploaded_bytes = 0          # what the load copied (the CPU's share is mapped)
        self.upload_seconds = 0.0
        self._owns_file = owns_file

    def __getitem__(self, name: str) -> Tensor:
        self._check_open()
        try:
            return self.tensors[name]
        except KeyError:
            raise KeyError(f"the model has no weight named {name!r}") from None

    def get(self, name: str) -> Tensor | None:
        """The weight named ``name``, or None (optional tensors)."""
        self._check_open()
        return self.tensors.get(name)

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    @property
    def nbytes(self) -> int:
        """Bytes of device memory the weights hold (the CPU mapping counts as the file)."""
        return sum(b.size for b in self.buffers)

    def _describe(self) -> str:
        return f"the weights of {self.file.path}"

    def _free(self) -> None:
        for buf in self.buffers:
            buf.close()
        self.buffers.clear()
        for t in self.tensors.values():
            t.buffer = None
        if self._owns_file:
            self.file.close()


def load_weights(model: GGUFFile | str | os.PathLike, placement: Placement | None = None, *,
                 progress: bool = True, **knobs: Any) -> ModelWeights:
    """Load the weights of ``model`` (a path or an open ``GGUFFile``) as ``placement`` says,
    or as ``plan_placement(file, **knobs)`` says when none is given."""
    owns_file = not isinstance(model, GGUFFile)
    file = GGUFFile(model) if owns_file else model
    weights = None
    try:
        placement = placement or plan_placement(file, **knobs)
        weights = ModelWeights(file, placement, owns_file)
        _create_tensors(weights)
        _upload(weights, progress)
        return weights
    except BaseException:
        if weights is not None:
            weights.close()
        elif owns_file:
            file.close()
        raise


def _create_tensors(weights: ModelWeights) -> None:
    """One context per buffer type; the CPU's tensors sit in the mapping at their offsets."""
    cpu = weights.placement.cpu
    contexts: dict[int, tuple[BufferType, Context]] = {}
    mapped: Buffer | None = None
    for tp in weights.placement.tensors.values():
        t = _new_tensor(tp)
        weights.tensors[tp.name] = t
        if tp.buffer_type is cpu.buffer_type:
            if mapped is None:
                mapped = cpu.buffer_from_host_ptr(weights.file.mapping)
                mapped.usage = BufferUsage.WEIGHTS
                weights.buffers.append(mapped)
            tensor_alloc(mapped, t, weights.file.tensors[tp.source].offset)
        else:
            buft = tp.buffer_type
            _, ctx = contexts.setdefault(id(buft), (buft, Context(f"weights {buft.name}")))
            ctx.tensors.append(t)
    for buft, ctx in contexts.values():
        buf = alloc_ctx_tensors(ctx, buft)
        if buf is not None:
            buf.usage = BufferUsage.WEIGHTS
            weights.buffers.append(buf)


def _new_tensor(tp: TensorPlacement) -> Tensor:
    ctx = Context()
    return ctx.new_tensor(tp.type, tp.ne or (1,), name=tp.name)


def _upload(weights: ModelWeights, progress: bool) -> None:
    """Copy the non-mapped weights from the file, one backend stream per device."""
    todo = [(tp, weights.tensors[tp.name]) for tp in weights.placement.tensors.values()
            if tp.buffer_type is not weights.placement.cpu.buffer_type]
    if not todo:
        return
    from tqdm import tqdm

    total = sum(tp.nbytes for tp, _ in todo)
    start = time.perf_counter()
    backends: dict[str, Any] = {}
    bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, leave=False,
               desc=f"loading {os.path.basename(weights.file.path)}",
               disable=None if progress else True)
    try:
        for tp, t in todo:
            info = weights.file.tensor(tp.source)
            data = weights.file.tensor_data(info)
            if t.buffer.set_from_file(t, data, os.path.abspath(weights.file.path), info.offset):
                pass                 # read where it runs (a remote node's copy of the file)
            elif tp.device.caps.async_:
                backend = backends.get(tp.device.name)
                if backend is None:
                    backend = backends[tp.device.name] = tp.device.init_backend()
                backend.set_tensor_async(t, data)
            else:
                tensor_set(t, data)
            bar.update(tp.nbytes)
        for backend in backends.values():
            backend.synchronize()
        weights.uploaded_bytes = total
        weights.upload_seconds = time.perf_counter() - start
    finally:
        bar.close()
        for backend in backends.values():
            backend.close()
    log.info("uploaded %.1f MiB of weights to %s", total / 2**20,
             ", ".join(sorted({tp.device.name for tp, _ in todo})))

