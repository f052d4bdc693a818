"""How exactly a backend computes: the names a user picks between (``numerics=``).

- ``"exact"``: every product in float32 from the weights' decoded values, as a float64
  evaluation of the same weights gives them up to float32 rounding (polydev's path until the
  integer products).
- ``"fast"``: a backend may quantize the activations of a quantized weight's product to
  integers where its kernels multiply those faster. The CPU backend quantizes them to int16
  per 32 values (``backends/cpu/native/int_dot.c``): a relative error of at most 1.5e-5 of a
  group's largest value, against 4e-3 for llama.cpp's 8-bit activations.
- ``"int8"``: llama.cpp's arithmetic: the CPU backend quantizes activations to int8 per 32
  values (``backends/cpu/native/interleaved_int8.c``, AVX-512 VNNI), which multiplies prompts
  and batches of sequences up to 1.6x faster than int16 (compute-bound); a single row reads
  its weights at the speed of memory either way. Where the build has no such kernels it
  computes as "fast".

The CUDA backend's "fast" multiplies batches of more than one column in half precision on the
tensor cores (ggml-cuda's cuBLAS path) and its "exact" in float32 ("int8" is its "fast"). On a
1B-class random-weight model (H100, 64 prompt positions and 4 decode steps) the logits' largest
difference from the CPU backend's exact ones was 0.00092 of the largest logit under "exact",
the same argmax at every row, and 0.023 under "fast", the same argmax at 98.5% of rows.
A backend without such kernels computes ``"fast"`` exactly. The default is ``"fast"``: it gives
up nothing a user can see, where "int8" gives up as much as llama.cpp does. ``python
bench/accuracy.py``, 256 tokens of the GPL-3 text one at a time, mean KL divergence from a
float64 evaluation of the same weights (top token differing from float64's; 2026-11-26):

    model                  exact          fast (default)   int8             llama.cpp
    SmolLM2-135M Q4_1      1.1e-6 (0%)    2.0e-6 (0%)      4.1e-3 (5.1%)    4.7e-3 (3.5%)
    gemma-3-270m Q4_K_M    7.4e-7 (0%)    1.5e-6 (0%)      4.5e-3 (3.5%)    6.6e-3 (3.1%)

(int8's figures move between runs as any change upstream moves its roundings: 4.8e-3 and
3.4e-3 before the decode attention went blocked.)

"int8" buys the speed of prompts and batches (1B-class models on 2 Zen 4 cores, ``bench/models.py
--scale --numerics int8``: pp512 1.2-1.5x "fast"'s; ``bench/serve.py``: 8 streams of the
1B-class llama 3.5x one stream against 2.9x) for the accuracy llama.cpp has; the default keeps
polydev's logits those of float64.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import InvalidArgumentError

if TYPE_CHECKING:
    from .device import Backend

__all__ = ["DEFAULT_NUMERICS", "NUMERICS", "check_numerics", "set_backend_numerics"]

NUMERICS = ("exact", "fast", "int8")
DEFAULT_NUMERICS = "fast"


def check_numerics(numerics: str) -> str:
    """``numerics`` when it names a mode, else InvalidArgumentError saying which do."""
    if numerics not in NUMERICS:
        raise InvalidArgumentError(f"numerics must be one of {', '.join(NUMERICS)}; got "
                                   f"{numerics!r}")
    return numerics


def set_backend_numerics(backend: "Backend", numerics: str) -> None:
    """Tell ``backend`` how to compute, where its reg has a "set_numerics" proc (the CPU's,
    CUDA's, a remote device's); a backend without one has one way only."""
    check_numerics(numerics)
    reg = backend.device.reg
    proc = reg.get_proc_address("set_numerics") if reg is not None else None
    if proc is not None:
        proc(backend, numerics)
