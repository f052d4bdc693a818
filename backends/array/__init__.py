"""Array-API kernels shared by the CPU (numpy) and CUDA (CuPy) backends (docs/design.md,
decision 4)."""

from .env import ArrayEnv
from .kernels import KERNELS, TABLE

__all__ = ["ArrayEnv", "KERNELS", "TABLE"]
