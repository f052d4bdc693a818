// MUL_MAT: dst(i01, i11, i12, i13) = sum_k src0(k, i01, i02, i03) * src1(k, i11, i12, i13),
// src0 broadcast over src1's dims 2 and 3. Quantized src0 rows (QUANT_T) are dequantized
// while they are read; otherwise SRC0_T. Built with -D LS (mat-vec) and -D TS (tiles).

#ifdef QUANT_T
#define A_AT(k, i01, i02, i03) DEQ((const global uchar *) ROW(src0, i01, i02, i03), k)
#else
#define A_AT(k, i01, i02, i03) LOAD0(ADDR(src0, k, i01, i02, i03))
#endif
#define B_AT(k, i11, i12, i13) LOAD1(ADDR(src1, k, i11, i12, i13))

// Decode (a few columns): one work-group per (row of src0, column of src1), NDRange
// (LS, ne01, ne11 * ne12 * ne13); the work-items stride over k and reduce in local memory.
kernel void mul_mat_vec(TENSOR(src0), TENSOR(src1), TENSOR(dst)) {
    local float buf[LS];
    int lid = get_local_id(0), i01 = get_global_id(1), c = get_global_id(2);
    int i11 = c % src1_ne1, i12 = (c / src1_ne1) % src1_ne2, i13 = c / (src1_ne1 * src1_ne2);
    int i02 = i12 / (src1_ne2 / src0_ne2), i03 = i13 / (src1_ne3 / src0_ne3);
    // 32-value chunks: a block format decodes each chunk's scales once
    float s = 0.0f, a[32];
    int K = src0_ne0, chunks = (K + 31) / 32;
    for (int c = lid; c < chunks; c += LS) {
        int n = min(32, K - 32 * c);
#ifdef QUANT_T
        DEQ32((const global uchar *) ROW(src0, i01, i02, i03), c, a);
#else
        for (int j = 0; j < n; j++) a[j] = LOAD0(ADDR(src0, 32 * c + j, i01, i02, i03));
#endif
        for (int j = 0; j < n; j++) s += a[j] * B_AT(32 * c + j, i11, i12, i13);
    }
    buf[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = LS / 2; w > 0; w >>= 1) {
        if (lid < w) buf[lid] += buf[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) *(global float *) ADDR(dst, i01, i11, i12, i13) = buf[0];
}

// Batches: TS x TS output tiles, NDRange (ceil(ne01/TS)*TS, ceil(ne11/TS)*TS, ne12 * ne13),
// with the k loop staged through local memory one TS-wide slice at a time.
kernel void mul_mat_tiled(TENSOR(src0), TENSOR(src1), TENSOR(dst)) {
    local float as[TS][TS + 1];
    local float bs[TS][TS + 1];
    int lx = get_local_id(0), ly = get_local_id(1);
    int r0 = get_group_id(0) * TS, c0 = get_group_id(1) * TS, b = get_global_id(2);
    int i12 = b % src1_ne2, i13 = b / src1_ne2;
    int i02 = i12 / (src1_ne2 / src0_ne2), i03 = i13 / (src1_ne3 / src0_ne3);
    int K = src0_ne0;
    float acc = 0.0f;
    for (int kt = 0; kt < K; kt += TS) {
        int ka = kt + ly, kb = kt + lx;
        as[lx][ly] = (r0 + lx < src0_ne1 && ka < K) ? A_AT(ka, r0 + lx, i02, i03) : 0.0f;
        bs[ly][lx] = (c0 + ly < src1_ne1 && kb < K) ? B_AT(kb, c0 + ly, i12, i13) : 0.0f;
        barrier(CLK_LOCAL_MEM_FENCE);
        for (int k = 0; k < TS; k++) acc += as[lx][k] * bs[ly][k];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (r0 + lx < src0_ne1 && c0 + ly < src1_ne1) {
        *(global float *) ADDR(dst, r0 + lx, c0 + ly, i12, i13) = acc;
    }
}

// MUL_MAT_ID (mixture of experts): dst(i01, slot, t) = as[expert ids(slot, t)] row i01 dotted
// with b(:, slot % ne11, t). NDRange (LS, ne01, n_used * n_tokens); src2 holds the ids. An
// expert id outside src0 gives NaN and sets *bad_index.
kernel void mul_mat_id_vec(TENSOR(src0), TENSOR(src1), TENSOR(src2), TENSOR(dst),
                           global int * bad_index) {
    local float buf[LS];
    int lid = get_local_id(0), i01 = get_global_id(1), c = get_global_id(2);
    int n_used = dst_ne1, slot = c % n_used, t = c / n_used;
    int e = *(const global int *) ADDR(src2, slot, t, 0, 0);
    bool valid = e >= 0 && e < src0_ne2;
    if (!valid && lid == 0) *bad_index = 1;
    float s = 0.0f;
    if (valid) {
        for (int k = lid; k < src0_ne0; k += LS) {
            s += A_AT(k, i01, e, 0) * B_AT(k, slot % src1_ne1, t, 0);
        }
    }
    buf[lid] = s;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int w = LS / 2; w > 0; w >>= 1) {
        if (lid < w) buf[lid] += buf[lid + w];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) *(global float *) ADDR(dst, i01, slot, t, 0) = valid ? buf[0] : NAN;
}

// Decode on a CPU device (PoCL runs a work-group's work-items as loops, so barriers and
// local-memory reductions cost more than they save): each work-item takes one row of src0
// whole, 32 values at a time as float16 vectors, against one f32 column of src1 whose values
// are contiguous. A work-group's work-items run one after another on one core, so its rows
// are read from memory as one sequential stream: four rows interleaved per work-item ran as
// fast in cache but read DRAM at half the speed (a 49152x576 Q8_0 product, 30 MB: 5.0-6.6 ms
// against 2.7-3.5 ms). NDRange (ne01 rounded up to MV_GROUP, ne11 * ne12 * ne13). src0's
// rows hold whole 32-value chunks (every block format; f16/f32 rows of a multiple of 32).

DECODER void chunk32(const global char * row, int c, float16 * lo, float16 * hi) {
#ifdef QUANT_T
    DEQ32V((const global uchar *) row, c, lo, hi);
#else
#if defined(SRC0_IS_F16)                                  // f16 or f32 rows
    *lo = load_f16x16((const global half *) row + 32 * c, 0);
    *hi = load_f16x16((const global half *) row + 32 * c, 1);
#else
    *lo = VLOAD16(float16, 0, (const global float *) row + 32 * c);
    *hi = VLOAD16(float16, 1, (const global float *) row + 32 * c);
#endif
#endif
}

kernel void mul_mat_vec_rows(TENSOR(src0), TENSOR(src1), TENSOR(dst)) {
    int r = get_global_id(0), c = get_global_id(1);
    if (r >= src0_ne1) return;
    int i11 = c % src1_ne1, i12 = (c / src1_ne1) % src1_ne2, i13 = c / (src1_ne1 * src1_ne2);
    int i02 = i12 / (src1_ne2 / src0_ne2), i03 = i13 / (src1_ne3 / src0_ne3);
    const global float * x = (const global float *) ADDR(src1, 0, i11, i12, i13);
    const global char * row = ROW(src0, r, i02, i03);
    float16 acc = 0.0f;
    for (int ch = 0; ch < src0_ne0 / 32; ch++) {
        // fused multiply-adds, as the CPU backend's kernels (PoCL's fma() is a call)
        #pragma OPENCL FP_CONTRACT ON
        float16 x0 = VLOAD16(float16, 0, x + 32 * ch), x1 = VLOAD16(float16, 1, x + 32 * ch);
        float16 lo, hi;
#ifdef VEC_QUANTS       // sum (d q + m) x = d (sum q x) + m (sum x), as ggml's dot products
        float d, m;
        QUANTS32((const global uchar *) row, ch, &lo, &hi, &d, &m);
        float16 t = lo * x0;
        t = t + hi * x1;
        acc = acc + d * t;
#if HAS_MIN              // lane-wise: one horizontal sum per row, not one per chunk
        acc = acc + m * (x0 + x1);
#endif
#else
        chunk32(row, ch, &lo, &hi);
        acc = acc + lo * x0;
        acc = acc + hi * x1;
#endif
    }
    *(global float *) ADDR(dst, r, i11, i12, i13) = sum16(acc);
}
