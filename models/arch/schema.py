"""How an architecture is written down as data (llama.cpp's ``llama-arch.cpp`` tables and the
``create_tensor`` calls of each ``load_arch_tensors``): its hyperparameter keys with their
defaults, and its tensors with name pattern, role, the op that reads each, whether it is
required, and its shape in terms of the hyperparameters.

Shapes and conditions are short expressions over the hyperparameters (``"n_embd, n_ff"``,
``"n_expert > 0"``), evaluated against ``HParams.symbols(il)``; they are this table's own
constants, never text from a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

__all__ = ["REQUIRED", "Key", "TensorSpec", "Architecture", "ExpectedTensor"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The default of a key the file must carry."""


@dataclass(frozen=True)
class Key:
    """One hyperparameter: the GGUF key ``<arch>.<name>`` read into ``HParams.<field>``.

    ``kind`` is "int", "float", "bool" or "int_or_array" (a per-layer array or a scalar);
    ``default`` is REQUIRED or the value llama.cpp uses when the key is absent."""

    name: str
    field: str
    kind: str = "int"
    default: Any = REQUIRED


@dataclass(frozen=True)
class TensorSpec:
    """One tensor of an architecture.

    ``name`` is the GGUF name with ``{il}`` for the layer (``"blk.{il}.attn_q.weight"``);
    ``shape`` its ``ne`` as expressions over the hyperparameters; ``op`` the op that reads it
    (what placement asks a device about); ``role`` what it is, for people. A tensor exists
    where ``when`` holds (all layers when empty); it must be present when ``required``, unless
    the tensor ``unless`` names (its fused alternative, in the same layer) is."""

    name: str
    shape: str
    op: str
    role: str
    required: bool = True
    when: str = ""
    unless: str = ""

    @property
    def per_layer(self) -> bool:
        return "{il}" in self.name

    @property
    def short(self) -> str:
        """The name builders use: ``attn_q`` of ``blk.{il}.attn_q.weight``, ``attn_q.bias``
        of its bias, ``output`` of ``output.weight``."""
        stem = self.name.removeprefix("blk.{il}.")
        return stem.removesuffix(".weight")


@dataclass(frozen=True)
class ExpectedTensor:
    """A ``TensorSpec`` made concrete for one model: its name, layer and shape."""

    spec: TensorSpec
    name: str
    layer: int | None            # None: the input layer; n_layer: the output layer
    shape: tuple[int, ...]
    required: bool
    unless: str = ""             # the concrete name of the fused alternative


@dataclass(frozen=True)
class Architecture:
    """One ``general.architecture``: what llama.cpp reads of it, and which graph builder
    (``models/arch/<module>.py``) runs it.

    ``swa_pattern`` is llama.cpp's default sliding-window pattern n (layer il slides when
    ``il % n < n - 1``), 0 for an architecture without sliding-window layers; ``rope``
    "norm" or "neox" (llama.cpp's ``llama_model_rope_type``); ``requires`` conditions over
    the hyperparameters, each with what a file that breaks it is told."""

    name: str
    module: str
    description: str
    rope: str
    keys: tuple[Key, ...]
    tensors: tuple[TensorSpec, ...]
    swa_pattern: int = 0
    requires: tuple[tuple[str, str], ...] = ()

    def tensor(self, short: str) -> TensorSpec:
        """The spec whose short name is ``short`` (``"attn_q"``, ``"attn_q.bias"``)."""
        for spec in self.tensors:
            if spec.short == short:
                return spec
        raise KeyError(f"{self.name} has no tensor {short!r}")

    def expected(self, hp: Any) -> dict[str, ExpectedTensor]:
        """Every tensor a model with hyperparameters ``hp`` may hold, by GGUF name."""
        out: dict[str, ExpectedTensor] = {}
        for spec in self.tensors:
            layers = range(hp.n_layer) if spec.per_layer else [None]
            for il in layers:
                symbols = hp.symbols(0 if il is None else il)
                if spec.when and not evaluate(spec.when, symbols):
                    continue
                name = spec.name.format(il=il)
                if name in out:          # a per-layer-less name listed in a layer (rope_freqs)
                    continue
                shape = evaluate(f"({spec.shape},)", symbols)
                unless = spec.unless and _unless_name(spec, self, il)
                layer = il if spec.per_layer else _layer_of_global(spec, hp.n_layer)
                out[name] = ExpectedTensor(spec, name, layer, tuple(int(n) for n in shape),
                                           spec.required, unless)
        return out


def _unless_name(spec: TensorSpec, arch: Architecture, il: int | None) -> str:
    return arch.tensor(spec.unless).name.format(il=il)


def _layer_of_global(spec: TensorSpec, n_layer: int) -> int | None:
    """A tensor without a layer: the token embedding is the input layer (read by GET_ROWS on
    the CPU), the RoPE factors sit with layer 0, everything else is the output layer."""
    if spec.op == "GET_ROWS":
        return None
    if spec.op == "ROPE":
        return 0
    return n_layer


def evaluate(expression: str, symbols: Mapping[str, Any]) -> Any:
    """An expression of this table over the hyperparameters (no builtins)."""
    return eval(_compiled(expression), {"__builtins__": {}}, dict(symbols))  # noqa: S307


@lru_cache(maxsize=None)
def _compiled(expression: str):
    return compile(expression, f"<shape {expression}>", "eval")
