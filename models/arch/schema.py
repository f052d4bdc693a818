"""How an architecture is written down as data (llama.cpp's ``llama-arch.cpp`` tables and the
``create_tensor`` calls of each ``load_arch_tensors``): its hyperparameter keys with their
defaults, and its tensors with name pattern, role, the op that reads each, whether it is
required, and its shape in terms of the hyperparameters.

Shapes and conditions are short expressions over the hyperparameters (``"n_embd, n_ff"``,
``"n_expert > 0"``, ``expressions.py``), and keys name the ``HParams`` field they are read
into; an ``Architecture`` checks all of them as it is made, so a mistake in a table raises
when the table is imported.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from polydev.errors import InvalidArgumentError

from .expressions import HPARAM_FIELDS, check, evaluate, evaluate_shape

__all__ = ["REQUIRED", "KEY_KINDS", "Key", "TensorSpec", "Architecture", "ExpectedTensor",
           "Hyperparameters"]


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()
"""The default of a key the file must carry."""

KEY_KINDS = ("int", "float", "bool", "int_or_array")


class Hyperparameters(Protocol):
    """What a table entry reads of a model's hyperparameters (``HParams``)."""

    n_layer: int

    def symbols(self, il: int) -> Mapping[str, Any]:
        """The values of the expressions' names in layer ``il``."""


@dataclass(frozen=True)
class Key:
    """One hyperparameter: the GGUF key ``<arch>.<name>`` read into ``HParams.<field>``.

    ``kind`` is one of ``KEY_KINDS`` ("int_or_array": a per-layer array or a scalar);
    ``default`` is REQUIRED, the value llama.cpp uses when the key is absent, or
    ``"=<field>"``: the value of another field, read before this one."""

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
    """One ``general.architecture``: what llama.cpp reads of it (its graph builder is
    ``models/graphs``' entry of the same name).

    ``swa_pattern`` is llama.cpp's default sliding-window pattern n (layer il slides when
    ``il % n < n - 1``), 0 for an architecture without sliding-window layers; ``rope``
    "norm" or "neox" (llama.cpp's ``llama_model_rope_type``); ``requires`` conditions over
    the hyperparameters, each with what a file that breaks it is told.

    Made with a key that names no ``HParams`` field, an expression that does not check, or
    an ``unless`` that names no tensor of the entry, it raises an InvalidArgumentError
    naming the architecture and the mistake."""

    name: str
    description: str
    rope: str
    keys: tuple[Key, ...]
    tensors: tuple[TensorSpec, ...]
    swa_pattern: int = 0
    requires: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        read: set[str] = set()             # the fields of the keys read before each one
        for key in self.keys:
            self._check_key(key, read)
            read.add(key.field)
        for spec in self.tensors:
            self._check_tensor(spec)
        for condition, _ in self.requires:
            check(condition, f"{self.name}: the requirement")

    def tensor(self, short: str) -> TensorSpec:
        """The spec whose short name is ``short`` (``"attn_q"``, ``"attn_q.bias"``)."""
        for spec in self.tensors:
            if spec.short == short:
                return spec
        raise KeyError(f"{self.name} has no tensor {short!r}")

    def _check_key(self, key: Key, read: set[str]) -> None:
        where = f"{self.name}: key {key.name!r}"
        if key.field not in HPARAM_FIELDS:
            raise InvalidArgumentError(f"{where} is read into {key.field!r}, which is no field "
                                       "of HParams")
        if key.kind not in KEY_KINDS:
            raise InvalidArgumentError(f"{where} has kind {key.kind!r}; the kinds are "
                                       f"{', '.join(KEY_KINDS)}")
        if isinstance(key.default, str) and key.default.startswith("=") and (
                key.default[1:] not in read):
            raise InvalidArgumentError(f"{where} defaults to {key.default[1:]!r}, which no key "
                                       "read before it fills")

    def _check_tensor(self, spec: TensorSpec) -> None:
        where = f"{self.name}: tensor {spec.name}'s"
        check(spec.shape, f"{where} shape", shape=True)
        if spec.when:
            check(spec.when, f"{where} condition")
        if spec.unless and not any(other.short == spec.unless for other in self.tensors):
            raise InvalidArgumentError(f"{where} alternative {spec.unless!r} is no tensor of "
                                       f"{self.name}")

    def expected(self, hp: Hyperparameters) -> dict[str, ExpectedTensor]:
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
                shape = evaluate_shape(spec.shape, symbols)
                unless = spec.unless and _unless_name(spec, self, il)
                layer = il if spec.per_layer else _layer_of_global(spec, hp.n_layer)
                out[name] = ExpectedTensor(spec, name, layer, shape, spec.required, unless)
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
