// Kernels that read rows of any decodable type T (a ggml block format, F16, BF16 or F32)
// through deq32<T>: the matrix-vector product, its mixture-of-experts form, GET_ROWS, and
// the dequantization that feeds cuBLAS for large batches.

#define MMV_MAX_COLS 8          // columns of src1 one mat-vec launch handles

// A lane's share of row . x for a row of whole chunks: eight lanes to a chunk (4 values each,
// deq4), four chunks a warp step, so that each step of a warp reads a few whole runs of the
// row's bytes and 512 consecutive bytes of x (lanes that each took a chunk of their own read
// 32 scattered places per load). The warp sums the shares.
template <int T>
__device__ __forceinline__ float row_dot_share(const u8 * a_row, const float * x, int K,
                                               int lane) {
    float acc = 0.0f, y[4];
    int q = lane % 8;
    // unrolled so that a warp has eight steps' loads in flight: one step reads 64 to 136
    // bytes of a row, and a 1B-class product's warps with one step each in flight held an
    // eighth of what an H200's memory needs in flight to stream (400 GB/s of its 4 TB/s)
#pragma unroll 8
    for (int c = lane / 8; c < K / 32; c += 4) {
        deq4<T>(a_row, c, q, y);
        const float * xs = x + 32 * c + 4 * q;
        acc += y[0] * xs[0] + y[1] * xs[1] + y[2] * xs[2] + y[3] * xs[3];
    }
    return acc;
}

// dst(i01, col) = row i01 of src0 (K values of type T) . column col of src1 (f32, unit
// stride) for col < n_cols. One warp per row, reducing with shuffles: one column of a row of
// whole chunks through row_dot_share; otherwise lanes stride over the row's 32-value chunks,
// so a block's scales are decoded once for every column. Block (32, rows per block), grid
// ceil(M / rows per block).
template <int T>
__device__ void mul_mat_vec(const char * a, i64 a_nb1, const char * b, i64 b_nb1, char * dst,
                            i64 d_nb1, int K, int M, int n_cols) {
    int row = blockIdx.x * blockDim.y + threadIdx.y, lane = threadIdx.x;
    if (row >= M) return;                  // the whole warp leaves together
    const u8 * a_row = (const u8 *) (a + row * a_nb1);
    if (n_cols == 1 && K % 32 == 0) {
        float s = warp_sum(row_dot_share<T>(a_row, (const float *) b, K, lane));
        if (lane == 0) *(float *) (dst + (i64) row * sizeof(float)) = s;
        return;
    }
    float acc[MMV_MAX_COLS], y[32];
    for (int col = 0; col < MMV_MAX_COLS; col++) acc[col] = 0.0f;
    int chunks = (K + 31) / 32;
    for (int c = lane; c < chunks; c += 32) {
        int n = min(32, K - 32 * c);
        deq32<T>(a_row, c, n, y);
        for (int col = 0; col < MMV_MAX_COLS; col++) {
            if (col >= n_cols) break;
            const float * x = (const float *) (b + col * b_nb1) + 32 * c;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < 32; j++) {
                if (j < n) s += y[j] * x[j];
            }
            acc[col] += s;
        }
    }
    for (int col = 0; col < MMV_MAX_COLS; col++) {
        if (col >= n_cols) break;
        float s = warp_sum(acc[col]);
        if (lane == 0) *(float *) (dst + col * d_nb1 + (i64) row * sizeof(float)) = s;
    }
}

// MUL_MAT_ID for a few tokens: dst(i01, slot, t) = row i01 of expert ids(slot, t) of src0
// dotted with src1(:, slot % src1_ne1, t) (f32, unit stride). Block (32, rows per block),
// grid (ceil(M / rows per block), n_used * n_tokens). An expert id outside src0 gives NaN
// and sets *bad_index (read when the backend synchronizes).
template <int T>
__device__ void mul_mat_id_vec(TENSOR(src0), TENSOR(src1), TENSOR(ids), TENSOR_OUT(dst),
                               int * bad_index) {
    int row = blockIdx.x * blockDim.y + threadIdx.y, lane = threadIdx.x;
    int n_used = dst_ne1, slot = blockIdx.y % n_used, t = blockIdx.y / n_used;
    if (row >= src0_ne1) return;
    int e = *(const int *) ADDR(ids, slot, t, 0, 0);
    float * out = (float *) ADDR(dst, row, slot, t, 0);
    if (e < 0 || e >= src0_ne2) {
        if (lane == 0) {
            *bad_index = 1;
            *out = QNAN;
        }
        return;
    }
    const u8 * a_row = (const u8 *) ROW(src0, row, e, 0);
    const float * x = (const float *) ROW(src1, slot % src1_ne1, t, 0);
    int K = src0_ne0;
    if (K % 32 == 0) {
        float s = warp_sum(row_dot_share<T>(a_row, x, K, lane));
        if (lane == 0) *out = s;
        return;
    }
    float acc = 0.0f, y[32];
    int chunks = (K + 31) / 32;
    for (int c = lane; c < chunks; c += 32) {
        int n = min(32, K - 32 * c);
        deq32<T>(a_row, c, n, y);
#pragma unroll
        for (int j = 0; j < 32; j++) {
            if (j < n) acc += y[j] * x[32 * c + j];
        }
    }
    acc = warp_sum(acc);
    if (lane == 0) *out = acc;
}

// Rows (ne1, ne2, ne3) of src0, K values each, into contiguous f32 (OUT_F16 = 0) or f16:
// one thread per 32-value chunk, grid-stride.
template <int T, bool OUT_F16>
__device__ void dequantize(const char * src, i64 nb1, i64 nb2, i64 nb3, int ne1, int ne2,
                           char * dst, int K, i64 n_chunks) {
    int chunks = (K + 31) / 32;
    float y[32];
    for (i64 g = blockIdx.x * (i64) blockDim.x + threadIdx.x; g < n_chunks;
         g += (i64) gridDim.x * blockDim.x) {
        i64 r = g / chunks;
        int c = g % chunks, n = min(32, K - 32 * c);
        int i1 = r % ne1, i2 = (r / ne1) % ne2, i3 = r / ((i64) ne1 * ne2);
        deq32<T>((const u8 *) (src + i1 * nb1 + i2 * nb2 + i3 * nb3), c, n, y);
        i64 at = r * K + 32 * c;
#pragma unroll
        for (int j = 0; j < 32; j++) {
            if (j >= n) break;
            if (OUT_F16) ((u16 *) dst)[at + j] = f32_to_f16(y[j]);
            else ((float *) dst)[at + j] = y[j];
        }
    }
}

// GET_ROWS into f32: dst(:, i10, i11, i12) = src0(:, rows(i10, i11, i12), i11, i12). Grid
// (ne10, ne11 * ne12), threads over the row's chunks. An index outside src0 gives a row of
// NaN and sets *bad_index.
template <int T>
__device__ void get_rows(TENSOR(src0), TENSOR(src1), TENSOR_OUT(dst), int * bad_index) {
    int i10 = blockIdx.x, i11 = blockIdx.y % src1_ne1, i12 = blockIdx.y / src1_ne1;
    int r = *(const int *) ADDR(src1, i10, i11, i12, 0);
    bool valid = r >= 0 && r < src0_ne1;
    if (!valid && threadIdx.x == 0) *bad_index = 1;
    int K = src0_ne0, chunks = (K + 31) / 32;
    float y[32];
    for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
        int n = min(32, K - 32 * c);
        if (valid) deq32<T>((const u8 *) ROW(src0, r, i11, i12), c, n, y);
#pragma unroll
        for (int j = 0; j < 32; j++) {
            if (j >= n) break;
            *(float *) ADDR(dst, 32 * c + j, i10, i11, i12) = valid ? y[j] : QNAN;
        }
    }
}

#define ROW_KERNELS(name, T)                                                                   \
extern "C" __global__ void mul_mat_vec_##name(const char * a, i64 a_nb1, const char * b,      \
        i64 b_nb1, char * dst, i64 d_nb1, int K, int M, int n_cols) {                         \
    mul_mat_vec<T>(a, a_nb1, b, b_nb1, dst, d_nb1, K, M, n_cols);                             \
}                                                                                              \
extern "C" __global__ void mul_mat_id_vec_##name(TENSOR(src0), TENSOR(src1), TENSOR(ids),     \
        TENSOR_OUT(dst), int * bad_index) {                                                    \
    mul_mat_id_vec<T>(TENSOR_ARGS(src0), TENSOR_ARGS(src1), TENSOR_ARGS(ids), TENSOR_ARGS(dst),  \
                      bad_index);                                                              \
}                                                                                              \
extern "C" __global__ void dequantize_f32_##name(const char * src, i64 nb1, i64 nb2, i64 nb3, \
        int ne1, int ne2, char * dst, int K, i64 n_chunks) {                                   \
    dequantize<T, false>(src, nb1, nb2, nb3, ne1, ne2, dst, K, n_chunks);                     \
}                                                                                              \
extern "C" __global__ void dequantize_f16_##name(const char * src, i64 nb1, i64 nb2, i64 nb3, \
        int ne1, int ne2, char * dst, int K, i64 n_chunks) {                                   \
    dequantize<T, true>(src, nb1, nb2, nb3, ne1, ne2, dst, K, n_chunks);                      \
}                                                                                              \
extern "C" __global__ void get_rows_##name(TENSOR(src0), TENSOR(src1), TENSOR_OUT(dst),       \
        int * bad_index) {                                                                     \
    get_rows<T>(TENSOR_ARGS(src0), TENSOR_ARGS(src1), TENSOR_ARGS(dst), bad_index);           \
}

ROW_KERNELS(f32, T_F32)
ROW_KERNELS(f16, T_F16)
ROW_KERNELS(bf16, T_BF16)
ROW_KERNELS(q4_0, T_Q4_0)
ROW_KERNELS(q4_1, T_Q4_1)
ROW_KERNELS(q5_0, T_Q5_0)
ROW_KERNELS(q5_1, T_Q5_1)
ROW_KERNELS(q8_0, T_Q8_0)
ROW_KERNELS(q4_K, T_Q4_K)
ROW_KERNELS(q5_K, T_Q5_K)
ROW_KERNELS(q6_K, T_Q6_K)
