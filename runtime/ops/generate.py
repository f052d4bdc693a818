"""Ops that generate values from parameters: arange and sinusoidal timestep embeddings."""

from __future__ import annotations

import math

from ..errors import InvalidArgumentError, TensorTypeError
from ..tensor import Tensor
from ..types import GGMLType
from ._build import _check, _ne, _result
from .catalogue import Op
from .params import ArangeParams, TimestepEmbeddingParams

__all__ = [
    "arange", "timestep_embedding",
]


def arange(ctx, start: float, stop: float, step: float = 1.0) -> Tensor:
    """The F32 values start, start + step, ... below ``stop`` (ceil((stop - start) / step))."""
    _check(stop > start and step > 0, "arange", f"need stop > start and step > 0, got start "
           f"{start}, stop {stop}, step {step}", InvalidArgumentError)
    steps = math.ceil((stop - start) / step)
    return _result(ctx, Op.ARANGE, GGMLType.F32, (steps,), [],
                   ArangeParams(float(start), float(stop), float(step)).pack())


def timestep_embedding(ctx, timesteps: Tensor, dim: int, max_period: int = 10000) -> Tensor:
    """Diffusion models' sinusoidal embedding: row i is [cos(t_i f_j), sin(t_i f_j)] with
    f_j = max_period^(-j / (dim/2)); an odd ``dim`` ends each row with a 0."""
    _check(timesteps.type == GGMLType.F32 and timesteps.ne[1:] == (1, 1, 1), "timestep_embedding",
           f"timesteps {_ne(timesteps)} must be an f32 vector", TensorTypeError)
    _check(dim >= 1 and max_period >= 1, "timestep_embedding",
           f"dim {dim} and max_period {max_period} must be >= 1", InvalidArgumentError)
    return _result(ctx, Op.TIMESTEP_EMBEDDING, GGMLType.F32, (dim, timesteps.ne[0]), [timesteps],
                   TimestepEmbeddingParams(int(dim), int(max_period)).pack())
