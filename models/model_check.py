"""A file's tensors checked against its architecture's table before anything uses them, as
llama.cpp's ``create_tensor`` and its final tensor count do: every name known and non-empty,
every required tensor present (a fused ``attn_qkv`` stands in for q/k/v), every shape the one
the hyperparameters give. Each failure is one ``ModelFileError`` naming the tensor and what
was expected; a file that passes cannot fail later for a tensor it lacks."""

from __future__ import annotations

import re

from polydev.errors import ModelFileError

from .arch import Architecture, ExpectedTensor, architecture
from .arch.expressions import names
from .gguf import GGUFFile
from .hparams import HParams

__all__ = ["check_tensors"]

_LAYER = re.compile(r"blk\.(\d+)\.")


def check_tensors(f: GGUFFile, hp: HParams) -> dict[str, ExpectedTensor]:
    """The file's tensors, each with its table entry; a ModelFileError for the first thing
    wrong."""
    spec = architecture(hp.arch)
    expected = spec.expected(hp)
    present: dict[str, ExpectedTensor] = {}
    for name, info in f.tensors.items():
        want = expected.get(name)
        if want is None:
            raise _unknown(f, hp, spec, name)
        if _trimmed(info.ne) != _trimmed(want.shape):
            raise ModelFileError(
                f"{f.path}: tensor {name} has shape {_shape(info.ne)}, expected "
                f"{_shape(want.shape)} ({want.spec.shape}: {_symbols(want, hp)})")
        present[name] = want
    for name, want in expected.items():
        if want.required and name not in present and not (want.unless and want.unless in present):
            alternative = f" (or the fused {want.unless})" if want.unless else ""
            raise ModelFileError(f"{f.path}: required tensor {name}{alternative} is missing "
                                 f"({spec.name}'s {want.spec.role})")
    return present


def _unknown(f: GGUFFile, hp: HParams, spec: Architecture, name: str) -> ModelFileError:
    if not name.strip():
        return ModelFileError(f"{f.path}: a tensor has an empty name")
    m = _LAYER.match(name)
    if m is not None and int(m.group(1)) >= hp.n_layer:
        return ModelFileError(f"{f.path}: tensor {name} names layer {m.group(1)}, but "
                              f"{spec.name}.block_count is {hp.n_layer}")
    return ModelFileError(f"{f.path}: tensor {name!r} is not part of a {spec.name} model with "
                          f"these hyperparameters")


def _trimmed(ne: tuple[int, ...]) -> tuple[int, ...]:
    """ne without trailing 1s: ggml's (64,) and (64, 1) are one shape."""
    ne = tuple(int(n) for n in ne)
    while ne and ne[-1] == 1:
        ne = ne[:-1]
    return ne


def _shape(ne: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(n) for n in ne) + ")"


def _symbols(want: ExpectedTensor, hp: HParams) -> str:
    """The values of the names in the expected shape, for the message."""
    symbols = hp.symbols(0 if want.layer is None or want.layer >= hp.n_layer else want.layer)
    return ", ".join(f"{name} {symbols[name]}" for name in names(want.spec.shape))
