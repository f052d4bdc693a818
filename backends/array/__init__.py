"""Array-API kernels shared by the CPU (numpy) and CUDA (CuPy) backends (DESIGN decision 4)."""

from .env import ArrayEnv
from .kernels import KERNELS, Kernel, find_kernel, kernel_key, supported_op_names

__all__ = ["ArrayEnv", "KERNELS", "Kernel", "find_kernel", "kernel_key", "supported_op_names"]
