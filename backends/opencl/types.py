"""What the OpenCL kernels call each ggml type, and the function codes of elementwise.cl."""

from __future__ import annotations

from polydev.ops import GluOp, Op, UnaryOp
from polydev.types import GGMLType

F32, F16, I32, I64 = GGMLType.F32, GGMLType.F16, GGMLType.I32, GGMLType.I64
FLOATS = (F32, F16)
# the plain types of common.h's load_* / store_* (selected with -D SRC0_T=f32 ...)
PLAIN_NAMES = {F32: "f32", F16: "f16", I32: "i32"}
# the block formats common.h decodes (deq_* / deq32_*, selected with -D QUANT_T=q4_K ...)
QUANT_NAMES = {GGMLType.Q4_0: "q4_0", GGMLType.Q4_1: "q4_1", GGMLType.Q5_0: "q5_0",
               GGMLType.Q5_1: "q5_1", GGMLType.Q8_0: "q8_0", GGMLType.Q4_K: "q4_K",
               GGMLType.Q5_K: "q5_K", GGMLType.Q6_K: "q6_K"}
MATMUL_WEIGHTS = FLOATS + tuple(QUANT_NAMES)
# the block formats the CPU-device decode product reads lane-wise (PoCL ran these faster than
# their scalar decoders, deq32_*): their quantized values and scale (common.h's quants32v_*,
# -D VEC_QUANTS), or for Q6_K, a scale per 16 values, the decoded values (deq32v_*, -D VEC_DEQ)
VEC_QUANTS = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0,
              GGMLType.Q4_K)
VEC_DECODED = (GGMLType.Q6_K,)
# the block formats quantize.cl can write (ggml's reference quantizers)
ENCODABLE = (GGMLType.Q4_0, GGMLType.Q4_1, GGMLType.Q5_0, GGMLType.Q5_1, GGMLType.Q8_0)

# run-time function codes of elementwise.cl (given to the compiler as -D FN_<NAME>=<code>)
ONE_SOURCE_OPS = (Op.SQR, Op.SQRT, Op.LOG, Op.SIN, Op.COS, Op.SCALE, Op.CLAMP, Op.LEAKY_RELU,
                  Op.FILL)
UNARY_FUNCTIONS = tuple(fn for fn in UnaryOp if fn != UnaryOp.XIELU)
_FN_NAMES = ([fn.name for fn in UNARY_FUNCTIONS] + [op.name for op in ONE_SOURCE_OPS]
    + ["ADD", "SUB", "MUL", "DIV"] + [fn.name for fn in GluOp])
FN_CODES = {name: code for code, name in enumerate(_FN_NAMES)}
FN_DEFINES = {f"FN_{name}": code for name, code in FN_CODES.items()}

MAT_VEC_MAX_COLUMNS = 4     # up to this many src1 columns, the decode kernel beats tiles
FLASH_ATTN_MAX_DV = 1024    # attention.cl's DV_MAX: the value rows it accumulates
FLASH_ATTN_ROWS_MAX_DV = 512   # its DV_ROWS_MAX: the same for flash_attn_rows (CPU devices)
MV_GROUP = 8                # mul_mat_vec_rows's work-group: 8 rows (PoCL's own pick was slower)
