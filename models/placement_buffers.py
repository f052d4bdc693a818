"""Which buffer type holds a weight, as llama.cpp's ``select_weight_buft``: the first in its
layer's list (the layer's device's own, then the CPU's) whose device can run the op the
weight is used in (MUL_MAT, GET_ROWS, MUL_MAT_ID, ...: the op its architecture's table names,
``polydev.models.arch``). So a device that lacks an op never gets its weights, whatever policy
chose the layer's device.
"""

from __future__ import annotations

from polydev import Context, GGMLType, ops
from polydev.buffer import BufferType
from polydev.device import Device
from polydev.errors import PolydevError, UnsupportedError

from .gguf import GGUFTensorInfo
from .hparams import HParams

__all__ = ["WeightBufferChooser"]

_PROBE_TOKENS = 512               # the batch size llama.cpp probes ops with


class WeightBufferChooser:
    """Picks a weight's device and buffer type; answers are cached per (device, buffer type,
    op, type, ne), since every layer asks the same questions."""

    def __init__(self, hp: HParams, cpu: Device) -> None:
        self.hp = hp
        self.cpu = cpu
        self._answers: dict[tuple, bool] = {}

    def choose(self, name: str, info: GGUFTensorInfo, layer: int | None, op: str,
               device: Device) -> tuple[Device, BufferType, str]:
        """(device, buffer type, why) for the weight ``name`` of ``layer`` (None: the input
        layer), whose layer went to ``device``."""
        where = "input layer" if layer is None else (
            "output layer" if layer == self.hp.n_layer else f"layer {layer}")
        candidates = [device] if device is self.cpu else [device, self.cpu]
        for dev in candidates:
            buft = dev.buffer_type
            if self.supported(dev, buft, info, op):
                cause = where if dev is device else (
                    f"{where}: {device.name} cannot run {op} on {info.type}")
                return dev, buft, cause
        raise UnsupportedError(f"no device can hold {name} ({info.type}, used in {op}): "
                               f"{', '.join(d.name for d in candidates)} cannot run it")

    def supported(self, dev: Device, buft: BufferType, info: GGUFTensorInfo, op: str) -> bool:
        """Whether ``dev`` runs ``op`` on the weight ``info`` held in ``buft``."""
        key = (id(dev), id(buft), op, info.type, info.ne)
        if key not in self._answers:
            self._answers[key] = dev.supports_buft(buft) and self._runs(dev, buft, info, op)
        return self._answers[key]

    def _runs(self, dev: Device, buft: BufferType, info: GGUFTensorInfo, op: str) -> bool:
        ctx = Context("probe")
        w = ctx.new_tensor(info.type, info.ne or (1,), name=info.name)
        dummy = buft.alloc_buffer(0)        # lets supports_op see where the weight lives
        w.buffer = dummy
        try:
            node = _probe_op(ctx, w, op, self.hp)
        except PolydevError:
            return dev is self.cpu           # an op the weight cannot feed: CPU holds it
        try:
            return dev.supports_op(node)
        finally:
            dummy.close()


def _probe_op(ctx: Context, w, op: str, hp: HParams):
    """The op llama.cpp builds to ask a device about a weight (weight_buft_supported)."""
    n = _PROBE_TOKENS
    f32, i32 = GGMLType.F32, GGMLType.I32
    if op == "GET_ROWS":
        return ops.get_rows(ctx, w, ctx.new_tensor(i32, [n]))
    if op == "MUL_MAT":
        return ops.mul_mat(ctx, w, ctx.new_tensor(f32, [w.ne[0], n, w.ne[2], w.ne[3]]))
    if op == "MUL_MAT_ID":
        used = max(hp.n_expert_used, 1)
        return ops.mul_mat_id(ctx, w, ctx.new_tensor(f32, [w.ne[0], used, n]),
                              ctx.new_tensor(i32, [used, n]))
    if op in ("ADD", "MUL"):
        a = ctx.new_tensor(f32, list(w.ne))
        return ops.add(ctx, a, w) if op == "ADD" else ops.mul(ctx, a, w)
    if op == "FLASH_ATTN_EXT":                       # attention sinks, one per head
        head, f16 = hp.n_embd_head_k, GGMLType.F16
        out = ops.flash_attn_ext(ctx, ctx.new_tensor(f32, [head, n, hp.n_head]),
                                 ctx.new_tensor(f16, [head, 256, hp.n_head_kv[0]]),
                                 ctx.new_tensor(f16, [hp.n_embd_head_v, 256, hp.n_head_kv[0]]),
                                 None, 1.0)
        ops.flash_attn_ext_add_sinks(out, w)
        return out
    if op == "ROPE":
        a = ctx.new_tensor(f32, [hp.n_embd_head_v, hp.n_head, n])
        return ops.rope_ext(ctx, a, ctx.new_tensor(i32, [n]), w, hp.n_embd_head_v)
    raise AssertionError(op)
