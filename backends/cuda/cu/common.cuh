// Shared by every polydev CUDA kernel: plain C types (NVRTC has no <stdint.h>), F16 through
// PTX conversions (no <cuda_fp16.h> include path needed), tensor arguments, warp and block
// reductions, and the decoders of ggml's block formats.
//
// The tests compile these sources for the CPU against a small emulation of the CUDA
// execution model (POLYDEV_CUDA_EMU), so the kernels use only what it provides:
// threadIdx/blockIdx/blockDim/gridDim, __syncthreads, __shfl_xor_sync and static __shared__
// arrays.

typedef unsigned char u8;
typedef signed char i8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef long long i64;

#ifndef POLYDEV_CUDA_EMU
__device__ __forceinline__ float f16_to_f32(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f32_to_f16(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

#define NEG_INF __int_as_float(0xff800000)
#define QNAN __int_as_float(0x7fc00000)

// A tensor argument: the address of its first byte, ne[4] and nb[4] (ggml's layout).
#define TENSOR(t) const char * t##_data, int t##_ne0, int t##_ne1, int t##_ne2, int t##_ne3, \
    i64 t##_nb0, i64 t##_nb1, i64 t##_nb2, i64 t##_nb3
#define TENSOR_OUT(t) char * t##_data, int t##_ne0, int t##_ne1, int t##_ne2, int t##_ne3, \
    i64 t##_nb0, i64 t##_nb1, i64 t##_nb2, i64 t##_nb3

// The address of element (i0, i1, i2, i3), and of the start of row (i1, i2, i3).
#define ADDR(t, i0, i1, i2, i3) (t##_data + (i64) (i0) * t##_nb0 + (i64) (i1) * t##_nb1 + \
    (i64) (i2) * t##_nb2 + (i64) (i3) * t##_nb3)
#define ROW(t, i1, i2, i3) ADDR(t, 0, i1, i2, i3)
// a TENSOR parameter passed on to a device function
#define TENSOR_ARGS(t) t##_data, t##_ne0, t##_ne1, t##_ne2, t##_ne3, t##_nb0, t##_nb1, t##_nb2, \
    t##_nb3

// --- reductions -------------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
    for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int m = 16; m > 0; m >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, m));
    return v;
}

// Sum over a one-dimensional block of whole warps (at most 1024 threads); every thread gets
// the total. `scratch` is a __shared__ float[32] of the caller.
__device__ __forceinline__ float block_sum(float v, float * scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();                       // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float * scratch) {
    int lane = threadIdx.x % 32, warp = threadIdx.x / 32, n_warps = blockDim.x / 32;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < n_warps ? scratch[lane] : NEG_INF;
    return warp_max(v);
}

// --- loads ---------------------------------------------------------------------------------

__device__ __forceinline__ float f16_at(const u8 * p) { return f16_to_f32(*(const u16 *) p); }

// four bytes of a block whose layout guarantees only 2-byte alignment
__device__ __forceinline__ u32 u32_a2(const u8 * p) {
    return (u32) ((const u16 *) p)[0] | ((u32) ((const u16 *) p)[1] << 16);
}

__device__ __forceinline__ u32 u32_a4(const u8 * p) { return *(const u32 *) p; }

__device__ __forceinline__ float bf16_to_f32(u16 h) { return __int_as_float((u32) h << 16); }

// --- block formats: 32 values at once ----------------------------------------------------------
// Chunk c of a row is a legacy block, or sub-block c % 8 of a K-quant super-block (whose
// scales are then decoded once per 32 values). Plain types decode n <= 32 values and zeros
// after them. Every index into y is a constant after unrolling, so y lives in registers.

enum { T_F32 = 0, T_F16 = 1, T_Q4_0 = 2, T_Q4_1 = 3, T_Q5_0 = 6, T_Q5_1 = 7, T_Q8_0 = 8,
       T_Q4_K = 12, T_Q5_K = 13, T_Q6_K = 14, T_BF16 = 30 };

template <int T> __device__ void deq32(const u8 * row, int c, int n, float * y);

template <> __device__ __forceinline__ void deq32<T_F32>(const u8 * row, int c, int n, float * y) {
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = j < n ? ((const float *) row)[32 * c + j] : 0.0f;
}

template <> __device__ __forceinline__ void deq32<T_F16>(const u8 * row, int c, int n, float * y) {
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = j < n ? f16_to_f32(((const u16 *) row)[32 * c + j]) : 0.0f;
}

template <> __device__ __forceinline__ void deq32<T_BF16>(const u8 * row, int c, int n, float * y) {
#pragma unroll
    for (int j = 0; j < 32; j++) y[j] = j < n ? bf16_to_f32(((const u16 *) row)[32 * c + j]) : 0.0f;
}

// 16 bytes of packed nibbles plus, for Q5, their fifth bits: the low nibbles are values
// 0..15, the high ones 16..31; value q decodes as (q + off) * d + m (ggml's order of rounding)
// (A4: the block layout keeps qs 4-byte aligned)
template <bool A4>
__device__ __forceinline__ void nibbles(const u8 * qs, u32 qh, int off, float d, float m,
                                        float * y) {
#pragma unroll
    for (int j = 0; j < 16; j += 4) {
        u32 w = A4 ? u32_a4(qs + j) : u32_a2(qs + j);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int byte = (w >> (8 * k)) & 0xFF;
            int lo = (byte & 0xF) | (((qh >> (j + k)) & 1) << 4);
            int hi = (byte >> 4) | (((qh >> (j + k + 16)) & 1) << 4);
            y[j + k] = (lo + off) * d + m;
            y[j + k + 16] = (hi + off) * d + m;
        }
    }
}

template <> __device__ __forceinline__ void deq32<T_Q4_0>(const u8 * row, int c, int, float * y) {
    const u8 * b = row + c * 18;                    // d: f16, qs[16]
    nibbles<false>(b + 2, 0, -8, f16_at(b), 0.0f, y);
}

template <> __device__ __forceinline__ void deq32<T_Q4_1>(const u8 * row, int c, int, float * y) {
    const u8 * b = row + c * 20;                    // d, m: f16, qs[16]
    nibbles<true>(b + 4, 0, 0, f16_at(b), f16_at(b + 2), y);
}

template <> __device__ __forceinline__ void deq32<T_Q5_0>(const u8 * row, int c, int, float * y) {
    const u8 * b = row + c * 22;                    // d: f16, qh[4], qs[16]
    nibbles<false>(b + 6, u32_a2(b + 2), -16, f16_at(b), 0.0f, y);
}

template <> __device__ __forceinline__ void deq32<T_Q5_1>(const u8 * row, int c, int, float * y) {
    const u8 * b = row + c * 24;                    // d, m: f16, qh[4], qs[16]
    nibbles<true>(b + 8, u32_a4(b + 4), 0, f16_at(b), f16_at(b + 2), y);
}

template <> __device__ __forceinline__ void deq32<T_Q8_0>(const u8 * row, int c, int, float * y) {
    const u8 * b = row + c * 34;                    // d: f16, qs[32] (int8)
    float d = f16_at(b);
#pragma unroll
    for (int j = 0; j < 32; j += 4) {
        u32 w = u32_a2(b + 2 + j);
#pragma unroll
        for (int k = 0; k < 4; k++) y[j + k] = (float) (i8) ((w >> (8 * k)) & 0xFF) * d;
    }
}

// the 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (ggml's get_scale_min_k4)
__device__ __forceinline__ void scale_min_k4(int j, const u8 * q, float * sc, float * m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// 32 values of a Q4_K/Q5_K sub-block: the low or high nibbles of 32 bytes, plus the fifth
// bit `bit` of qh for Q5_K; value q decodes as d1 * q - m1 (ggml's order of rounding)
__device__ __forceinline__ void k_nibbles(const u8 * q, int hi, const u8 * qh, int bit,
                                          float d1, float m1, float * y) {
#pragma unroll
    for (int j = 0; j < 32; j += 4) {
        u32 w = u32_a4(q + j), h = qh ? u32_a4(qh + j) : 0;
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int byte = (w >> (8 * k)) & 0xFF;
            int v = (hi ? byte >> 4 : byte & 0xF) + (((h >> (8 * k + bit)) & 1) << 4);
            y[j + k] = d1 * v - m1;
        }
    }
}

template <> __device__ __forceinline__ void deq32<T_Q4_K>(const u8 * row, int c, int, float * y) {
    const u8 * b = row + (c / 8) * 144;             // d, dmin: f16, scales[12], qs[128]
    int sub = c % 8;
    float sc, m;
    scale_min_k4(sub, b + 4, &sc, &m);
    k_nibbles(b + 16 + 32 * (sub / 2), sub % 2, 0, 0, f16_at(b) * sc, f16_at(b + 2) * m, y);
}

template <> __device__ __forceinline__ void deq32<T_Q5_K>(const u8 * row, int c, int, float * y) {
    const u8 * b = row + (c / 8) * 176;             // d, dmin: f16, scales[12], qh[32], qs[128]
    int sub = c % 8;
    float sc, m;
    scale_min_k4(sub, b + 4, &sc, &m);
    k_nibbles(b + 48 + 32 * (sub / 2), sub % 2, b + 16, sub, f16_at(b) * sc, f16_at(b + 2) * m,
              y);
}

template <> __device__ __forceinline__ void deq32<T_Q6_K>(const u8 * row, int c, int, float * y) {
    const u8 * b = row + (c / 8) * 210;             // ql[128], qh[64], scales[16] (int8), d: f16
    int sub = c % 8, h = sub / 4, quarter = sub % 4;
    const u8 * ql = b + 64 * h + (quarter & 1) * 32;
    const u8 * qh = b + 128 + 32 * h;
    const i8 * sc = (const i8 *) (b + 192 + 8 * h + 2 * quarter);
    float d = f16_at(b + 208);
#pragma unroll
    for (int j = 0; j < 32; j += 4) {
        u32 lw = u32_a2(ql + j), hw = u32_a2(qh + j);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            int low = (lw >> (8 * k)) & 0xFF;
            low = (quarter & 2) ? low >> 4 : low & 0xF;
            int q = (low | (((hw >> (8 * k + 2 * quarter)) & 3) << 4)) - 32;
            y[j + k] = d * sc[(j + k) / 16] * q;
        }
    }
}

// --- block formats: 4 values at once ------------------------------------------------------------
// Values 4q..4q+3 (q < 8) of chunk c, for kernels whose lanes share a chunk eight to a chunk
// (mat-vec): neighbouring lanes then read neighbouring bytes of the row, and of the
// activations. The same arithmetic as deq32, value for value. Whole chunks only.

template <int T> __device__ void deq4(const u8 * row, int c, int q, float * y);

template <> __device__ __forceinline__ void deq4<T_F32>(const u8 * row, int c, int q, float * y) {
#pragma unroll
    for (int k = 0; k < 4; k++) y[k] = ((const float *) row)[32 * c + 4 * q + k];
}

template <> __device__ __forceinline__ void deq4<T_F16>(const u8 * row, int c, int q, float * y) {
#pragma unroll
    for (int k = 0; k < 4; k++) y[k] = f16_to_f32(((const u16 *) row)[32 * c + 4 * q + k]);
}

template <> __device__ __forceinline__ void deq4<T_BF16>(const u8 * row, int c, int q, float * y) {
#pragma unroll
    for (int k = 0; k < 4; k++) y[k] = bf16_to_f32(((const u16 *) row)[32 * c + 4 * q + k]);
}

// values 4q..4q+3 of 16 bytes of packed nibbles (the low nibbles are values 0..15), with the
// fifth bits of qh for Q5; value v decodes as (v + off) * d + m
template <bool A4>
__device__ __forceinline__ void nibbles4(const u8 * qs, u32 qh, int off, float d, float m, int q,
                                         float * y) {
    int j = 4 * (q % 4);
    u32 w = A4 ? u32_a4(qs + j) : u32_a2(qs + j);
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int byte = (w >> (8 * k)) & 0xFF;
        int v = (q >= 4 ? byte >> 4 : byte & 0xF) | (((qh >> (4 * q + k)) & 1) << 4);
        y[k] = (v + off) * d + m;
    }
}

template <> __device__ __forceinline__ void deq4<T_Q4_0>(const u8 * row, int c, int q, float * y) {
    const u8 * b = row + c * 18;
    nibbles4<false>(b + 2, 0, -8, f16_at(b), 0.0f, q, y);
}

template <> __device__ __forceinline__ void deq4<T_Q4_1>(const u8 * row, int c, int q, float * y) {
    const u8 * b = row + c * 20;
    nibbles4<true>(b + 4, 0, 0, f16_at(b), f16_at(b + 2), q, y);
}

template <> __device__ __forceinline__ void deq4<T_Q5_0>(const u8 * row, int c, int q, float * y) {
    const u8 * b = row + c * 22;
    nibbles4<false>(b + 6, u32_a2(b + 2), -16, f16_at(b), 0.0f, q, y);
}

template <> __device__ __forceinline__ void deq4<T_Q5_1>(const u8 * row, int c, int q, float * y) {
    const u8 * b = row + c * 24;
    nibbles4<true>(b + 8, u32_a4(b + 4), 0, f16_at(b), f16_at(b + 2), q, y);
}

template <> __device__ __forceinline__ void deq4<T_Q8_0>(const u8 * row, int c, int q, float * y) {
    const u8 * b = row + c * 34;
    float d = f16_at(b);
    u32 w = u32_a2(b + 2 + 4 * q);
#pragma unroll
    for (int k = 0; k < 4; k++) y[k] = (float) (i8) ((w >> (8 * k)) & 0xFF) * d;
}

// values 4q..4q+3 of a Q4_K/Q5_K sub-block (k_nibbles' arithmetic)
__device__ __forceinline__ void k_nibbles4(const u8 * qs, int hi, const u8 * qh, int bit,
                                           float d1, float m1, float * y) {
    u32 w = u32_a4(qs), h = qh ? u32_a4(qh) : 0;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int byte = (w >> (8 * k)) & 0xFF;
        int v = (hi ? byte >> 4 : byte & 0xF) + (((h >> (8 * k + bit)) & 1) << 4);
        y[k] = d1 * v - m1;
    }
}

template <> __device__ __forceinline__ void deq4<T_Q4_K>(const u8 * row, int c, int q, float * y) {
    const u8 * b = row + (c / 8) * 144;
    int sub = c % 8;
    float sc, m;
    scale_min_k4(sub, b + 4, &sc, &m);
    k_nibbles4(b + 16 + 32 * (sub / 2) + 4 * q, sub % 2, 0, 0, f16_at(b) * sc,
               f16_at(b + 2) * m, y);
}

template <> __device__ __forceinline__ void deq4<T_Q5_K>(const u8 * row, int c, int q, float * y) {
    const u8 * b = row + (c / 8) * 176;
    int sub = c % 8;
    float sc, m;
    scale_min_k4(sub, b + 4, &sc, &m);
    k_nibbles4(b + 48 + 32 * (sub / 2) + 4 * q, sub % 2, b + 16 + 4 * q, sub, f16_at(b) * sc,
               f16_at(b + 2) * m, y);
}

template <> __device__ __forceinline__ void deq4<T_Q6_K>(const u8 * row, int c, int q, float * y) {
    const u8 * b = row + (c / 8) * 210;
    int sub = c % 8, h = sub / 4, quarter = sub % 4, j = 4 * q;
    u32 lw = u32_a2(b + 64 * h + (quarter & 1) * 32 + j), hw = u32_a2(b + 128 + 32 * h + j);
    float d = f16_at(b + 208), sc = ((const i8 *) (b + 192 + 8 * h + 2 * quarter))[j / 16];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        int low = (lw >> (8 * k)) & 0xFF;
        low = (quarter & 2) ? low >> 4 : low & 0xF;
        int v = (low | (((hw >> (8 * k + 2 * quarter)) & 3) << 4)) - 32;
        y[k] = d * sc * v;
    }
}
