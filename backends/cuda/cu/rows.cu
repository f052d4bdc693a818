// Row kernels: one block of whole warps per row (grid (ne1, ne2, ne3)), reducing through
// warp shuffles and a 32-float __shared__ scratch. Sources and results are f32 and may be
// strided (ADDR).

// NORM (kind 0), RMS_NORM (kind 1) and L2_NORM (kind 2: x / max(|x|, eps)), ggml's formulas;
// with `has_mul`, also prod = dst * w, w repeated over dst's shape (the MUL that follows a
// norm in every transformer layer, fused as ggml-cuda fuses it: the norm's row is still in
// registers, and a launch is saved).
__device__ __forceinline__ void norm_row(TENSOR(src0), TENSOR_OUT(dst), float eps, int kind,
                                         TENSOR(w), TENSOR_OUT(prod), int has_mul) {
    __shared__ float scratch[32];
    int i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z, n = src0_ne0;
    float mean = 0.0f;
    if (kind == 0) {
        float s = 0.0f;
        for (int i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
            s += *(const float *) ADDR(src0, i0, i1, i2, i3);
        }
        mean = block_sum(s, scratch) / n;
    }
    float s2 = 0.0f;
    for (int i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        float x = *(const float *) ADDR(src0, i0, i1, i2, i3) - mean;
        s2 += x * x;
    }
    float sum2 = block_sum(s2, scratch);
    float scale = kind == 2 ? 1.0f / fmaxf(sqrtf(sum2), eps) : 1.0f / sqrtf(sum2 / n + eps);
    const char * w_row = has_mul ? ROW(w, i1 % w_ne1, i2 % w_ne2, i3 % w_ne3) : 0;
    for (int i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        float x = *(const float *) ADDR(src0, i0, i1, i2, i3);
        float y = (x - mean) * scale;
        *(float *) ADDR(dst, i0, i1, i2, i3) = y;
        if (has_mul) {
            *(float *) ADDR(prod, i0, i1, i2, i3) =
                y * *(const float *) (w_row + (i0 % w_ne0) * w_nb0);
        }
    }
}

extern "C" __global__ void norm_f32(TENSOR(src0), TENSOR_OUT(dst), float eps, int kind) {
    norm_row(TENSOR_ARGS(src0), TENSOR_ARGS(dst), eps, kind, 0, 1, 1, 1, 1, 0, 0, 0, 0,
             0, 1, 1, 1, 1, 0, 0, 0, 0, 0);
}

extern "C" __global__ void norm_mul_f32(TENSOR(src0), TENSOR_OUT(dst), float eps, int kind,
                                        TENSOR(w), TENSOR_OUT(prod)) {
    norm_row(TENSOR_ARGS(src0), TENSOR_ARGS(dst), eps, kind, TENSOR_ARGS(w), TENSOR_ARGS(prod),
             1);
}

__device__ __forceinline__ float mask_at(const char * p, int mask_type) {
    return mask_type == 2 ? f16_at((const u8 *) p) : *(const float *) p;
}

// SOFT_MAX(x * scale + slope * mask) with optional sinks. The mask (mask_type 0: none, 1: f32,
// 2: f16) is read at row i1 and head i2 % mask_ne2, i3 % mask_ne3; the slope is ALiBi's for
// head i2 (1 when max_bias is 0). The row's exponentials are staged in dst.
extern "C" __global__ void soft_max_f32(TENSOR(src0), TENSOR(mask), TENSOR(sinks),
                                        TENSOR_OUT(dst), float scale, float max_bias, float m0,
                                        float m1, int n_head_log2, int mask_type,
                                        int has_sinks) {
    __shared__ float scratch[32];
    int i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z, n = src0_ne0;
    float slope = 1.0f;
    if (max_bias > 0.0f) {
        slope = i2 < n_head_log2 ? powf(m0, (float) (i2 + 1))
                                 : powf(m1, (float) (2 * (i2 - n_head_log2) + 1));
    }
    int mi2 = mask_type ? i2 % mask_ne2 : 0, mi3 = mask_type ? i3 % mask_ne3 : 0;
    float mx = NEG_INF;
    for (int i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        float w = *(const float *) ADDR(src0, i0, i1, i2, i3) * scale;
        if (mask_type) w += slope * mask_at(ADDR(mask, i0, i1, mi2, mi3), mask_type);
        *(float *) ADDR(dst, i0, i1, i2, i3) = w;
        mx = fmaxf(mx, w);
    }
    mx = block_max(mx, scratch);
    float sink = has_sinks ? *(const float *) ADDR(sinks, i2, 0, 0, 0) : NEG_INF;
    mx = fmaxf(mx, sink);
    float s = 0.0f;
    for (int i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        float * p = (float *) ADDR(dst, i0, i1, i2, i3);
        float e = expf(*p - mx);
        *p = e;
        s += e;
    }
    s = block_sum(s, scratch);
    if (has_sinks) s += expf(sink - mx);
    float inv = 1.0f / s;
    for (int i0 = threadIdx.x; i0 < n; i0 += blockDim.x) {
        *(float *) ADDR(dst, i0, i1, i2, i3) *= inv;
    }
}

// ggml's float to bf16: round to nearest even, NaN kept quiet
__device__ __forceinline__ u16 f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u16) ((u >> 16) | 64);
    return (u16) ((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

// SET_ROWS: dst(:, idx(i1, i2 % idx_ne1, i3 % idx_ne2), i2, i3) = src(:, i1, i2, i3), the
// source f32 or f16 (src_f16), written as f32 (dst_kind 0), f16 (1) or bf16 (2). Indices are
// i32 or i64 (idx_64). Grid (src_ne1, src_ne2, src_ne3), threads over the row. An index
// outside dst writes nothing and sets *bad_index (ggml asserts).
extern "C" __global__ void set_rows(TENSOR(src), TENSOR(idx), TENSOR_OUT(dst), int src_f16,
                                    int dst_kind, int idx_64, int * bad_index) {
    int i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z;
    const char * at = ADDR(idx, i1, i2 % idx_ne1, i3 % idx_ne2, 0);
    i64 r = idx_64 ? *(const i64 *) at : (i64) *(const int *) at;
    if (r < 0 || r >= dst_ne1) {
        if (threadIdx.x == 0) *bad_index = 1;
        return;
    }
    for (int i0 = threadIdx.x; i0 < src_ne0; i0 += blockDim.x) {
        const char * s = ADDR(src, i0, i1, i2, i3);
        float x = src_f16 ? f16_at((const u8 *) s) : *(const float *) s;
        char * d = ADDR(dst, i0, r, i2, i3);
        if (dst_kind == 0) *(float *) d = x;
        else if (dst_kind == 1) *(u16 *) d = f32_to_f16(x);
        else *(u16 *) d = f32_to_bf16(x);
    }
}
