"""The CUDA backend's kernels (cu/*.cu) compiled by NVRTC with the options a GPU machine uses
(programs.py), without a GPU: the emulation (test_cuda_kernels_emu.py) compiles them with a
C++ compiler, which accepts code NVRTC may not, and a module that fails to build there takes
the whole CUDA backend with it. NVRTC comes with the dev extra (nvidia-cuda-nvrtc-cu12)."""

from __future__ import annotations

import ctypes
import importlib.util
from pathlib import Path

import pytest

from polydev.backends.cuda.binders import ROW_TYPE_NAMES
from polydev.backends.cuda.programs import kernel_source, nvrtc_options

# every kernel the binders and the cuBLAS path launch, by name
KERNELS = ["norm_f32", "norm_mul_f32", "soft_max_f32", "set_rows", "rope", "flash_attn_ext_vec",
           "flash_attn_ext_combine", "binary_f32", "glu_f32"] + [
    f"{kind}_{name}" for name in ROW_TYPE_NAMES.values()
    for kind in ("mul_mat_vec", "mul_mat_id_vec", "get_rows", "dequantize_f32",
                 "dequantize_f16")]


def _nvrtc() -> ctypes.CDLL:
    spec = importlib.util.find_spec("nvidia.cuda_nvrtc")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("NVRTC is not installed (pip install nvidia-cuda-nvrtc-cu12)")
    libs = sorted(Path(spec.submodule_search_locations[0], "lib").glob("libnvrtc.so*"))
    if not libs:
        pytest.skip("the nvidia-cuda-nvrtc package has no libnvrtc.so")
    return ctypes.CDLL(str(libs[0]))


def _compile(nvrtc: ctypes.CDLL, architecture: str) -> bytes:
    """The cubin of the module, or a failure with NVRTC's log."""
    program = ctypes.c_void_p()
    assert nvrtc.nvrtcCreateProgram(ctypes.byref(program), kernel_source().encode(),
                                    b"polydev.cu", 0, None, None) == 0
    try:
        options = [o.encode() for o in nvrtc_options(architecture)]
        status = nvrtc.nvrtcCompileProgram(program, len(options),
                                           (ctypes.c_char_p * len(options))(*options))
        size = ctypes.c_size_t()
        nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        nvrtc.nvrtcGetProgramLog(program, log)
        assert status == 0, log.value.decode(errors="replace")[:4000]
        assert nvrtc.nvrtcGetCUBINSize(program, ctypes.byref(size)) == 0
        cubin = ctypes.create_string_buffer(size.value)
        assert nvrtc.nvrtcGetCUBIN(program, cubin) == 0
        return cubin.raw
    finally:
        nvrtc.nvrtcDestroyProgram(ctypes.byref(program))


@pytest.mark.parametrize("architecture", ["sm_80", "sm_90"])
def test_the_kernels_build_with_nvrtc_and_hold_every_kernel_launched(architecture):
    cubin = _compile(_nvrtc(), architecture)
    missing = [name for name in KERNELS if name.encode() + b"\0" not in cubin]
    assert not missing, f"kernels the binders launch but the module lacks: {missing}"
