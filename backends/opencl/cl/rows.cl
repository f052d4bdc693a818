// Row-wise kernels: one work-group of LS work-items per row (NDRange (LS, ne1, ne2 * ne3)),
// reducing in local memory. Built with -D LS=<power of two>, SRC0_T / DST_T.

#define ROW_INDICES \
    int lid = get_local_id(0), i1 = get_global_id(1), i23 = get_global_id(2); \
    int i2 = i23 % src0_ne2, i3 = i23 / src0_ne2;

// SUM_ROWS (mean == 0) and MEAN (mean == 1)
kernel void sum_rows(TENSOR(src0), TENSOR(dst), int mean) {
    local float buf[LS];
    ROW_INDICES
    float s = 0.0f;
    for (int i0 = lid; i0 < src0_ne0; i0 += LS) s += LOAD0(ADDR(src0, i0, i1, i2, i3));
    s = group_sum(buf, s);
    if (lid == 0) STORE(ADDR(dst, 0, i1, i2, i3), mean ? s / src0_ne0 : s);
}

// SUM of every element: a single work-group walks the whole tensor
kernel void sum_all(TENSOR(src0), TENSOR(dst)) {
    local float buf[LS];
    int lid = get_local_id(0);
    long n = (long) src0_ne0 * src0_ne1 * src0_ne2 * src0_ne3;
    float s = 0.0f;
    for (long k = lid; k < n; k += LS) {
        int i0 = k % src0_ne0, i1 = (k / src0_ne0) % src0_ne1;
        int i2 = (k / ((long) src0_ne0 * src0_ne1)) % src0_ne2;
        int i3 = k / ((long) src0_ne0 * src0_ne1 * src0_ne2);
        s += LOAD0(ADDR(src0, i0, i1, i2, i3));
    }
    s = group_sum(buf, s);
    if (lid == 0) STORE(ADDR(dst, 0, 0, 0, 0), s);
}

// ARGMAX of each row (the first of equal maxima, as numpy and ggml)
kernel void argmax(TENSOR(src0), TENSOR(dst)) {
    local float vbuf[LS];
    local int ibuf[LS];
    ROW_INDICES
    float best = -INFINITY;
    int at = 0x7fffffff;
    for (int i0 = lid; i0 < src0_ne0; i0 += LS) {
        float v = LOAD0(ADDR(src0, i0, i1, i2, i3));
        if (v > best || (v == best && i0 < at)) { best = v; at = i0; }
    }
    vbuf[lid] = best;
    ibuf[lid] = at;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LS / 2; s > 0; s >>= 1) {
        if (lid < s) {
            float v = vbuf[lid + s];
            int j = ibuf[lid + s];
            if (v > vbuf[lid] || (v == vbuf[lid] && j < ibuf[lid])) { vbuf[lid] = v; ibuf[lid] = j; }
        }
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0) *(global int *) ADDR(dst, i1, i2, i3, 0) = ibuf[0];
}

// NORM (kind 0), RMS_NORM (kind 1) and L2_NORM (kind 2: x / max(|x|, eps))
kernel void norm(TENSOR(src0), TENSOR(dst), float eps, int kind) {
    local float buf[LS];
    ROW_INDICES
    int n = src0_ne0;
    float mean = 0.0f;
    if (kind == 0) {
        float s = 0.0f;
        for (int i0 = lid; i0 < n; i0 += LS) s += LOAD0(ADDR(src0, i0, i1, i2, i3));
        mean = group_sum(buf, s) / n;
    }
    float s2 = 0.0f;
    for (int i0 = lid; i0 < n; i0 += LS) {
        float x = LOAD0(ADDR(src0, i0, i1, i2, i3)) - mean;
        s2 += x * x;
    }
    float sum2 = group_sum(buf, s2);
    float scale = kind == 2 ? 1.0f / fmax(sqrt(sum2), eps) : 1.0f / sqrt(sum2 / n + eps);
    for (int i0 = lid; i0 < n; i0 += LS) {
        STORE(ADDR(dst, i0, i1, i2, i3), (LOAD0(ADDR(src0, i0, i1, i2, i3)) - mean) * scale);
    }
}

// SOFT_MAX(x * scale + slope * mask) with optional sinks. The mask (MASK_T: f32 or f16) is
// read at row i1 and head i2 % mask_ne2, i3 % mask_ne3; the slope is ALiBi's for head i2.
kernel void soft_max(TENSOR(src0), TENSOR(mask), TENSOR(sinks), TENSOR(dst), float scale,
                     float max_bias, float m0, float m1, int n_head_log2, int has_mask,
                     int has_sinks) {
    local float buf[LS];
    ROW_INDICES
    float slope = alibi_slope(i2, max_bias, m0, m1, n_head_log2);
    int n = src0_ne0;
    float mx = -INFINITY;
    for (int i0 = lid; i0 < n; i0 += LS) {
        float w = LOAD0(ADDR(src0, i0, i1, i2, i3)) * scale;
        if (has_mask) w += slope * LOADM(ADDR(mask, i0, i1, i2 % mask_ne2, i3 % mask_ne3));
        mx = fmax(mx, w);
    }
    mx = group_max(buf, mx);
    float sink = has_sinks ? load_f32(ADDR(sinks, i2, 0, 0, 0)) : -INFINITY;
    mx = fmax(mx, sink);
    float s = 0.0f;
    for (int i0 = lid; i0 < n; i0 += LS) {
        float w = LOAD0(ADDR(src0, i0, i1, i2, i3)) * scale;
        if (has_mask) w += slope * LOADM(ADDR(mask, i0, i1, i2 % mask_ne2, i3 % mask_ne3));
        float e = exp(w - mx);
        STORE(ADDR(dst, i0, i1, i2, i3), e);
        s += e;
    }
    s = group_sum(buf, s);
    if (has_sinks) s += exp(sink - mx);
    barrier(CLK_GLOBAL_MEM_FENCE);
    for (int i0 = lid; i0 < n; i0 += LS) {
        global char * p = ADDR(dst, i0, i1, i2, i3);
        STORE(p, load_f32(p) / s);
    }
}

// GET_ROWS: dst(i0, i10, i11, i12) = src0(i0, rows(i10, i11, i12), i11, i12); NDRange
// (ne0, ne10, ne11 * ne12). An index outside src0 gives NaN and sets *bad_index, which the
// backend turns into an error when it synchronizes.
kernel void get_rows(TENSOR(src0), TENSOR(src1), TENSOR(dst), global int * bad_index) {
    int i0 = get_global_id(0), i10 = get_global_id(1), i1112 = get_global_id(2);
    int i11 = i1112 % src1_ne1, i12 = i1112 / src1_ne1;
    int r = *(const global int *) ADDR(src1, i10, i11, i12, 0);
    float v = NAN;
    if (r < 0 || r >= src0_ne1) {
        *bad_index = 1;
    } else {
#ifdef QUANT_T
        v = DEQ((const global uchar *) ROW(src0, r, i11, i12), i0);
#else
        v = LOAD0(ADDR(src0, i0, r, i11, i12));
#endif
    }
    STORE(ADDR(dst, i0, i10, i11, i12), v);
}

kernel void get_rows_i32(TENSOR(src0), TENSOR(src1), TENSOR(dst), global int * bad_index) {
    int i0 = get_global_id(0), i10 = get_global_id(1), i1112 = get_global_id(2);
    int i11 = i1112 % src1_ne1, i12 = i1112 / src1_ne1;
    int r = *(const global int *) ADDR(src1, i10, i11, i12, 0);
    if (r < 0 || r >= src0_ne1) *bad_index = 1;
    int v = (r >= 0 && r < src0_ne1) ? *(const global int *) ADDR(src0, i0, r, i11, i12) : 0;
    *(global int *) ADDR(dst, i0, i10, i11, i12) = v;
}

// SET_ROWS: row i01 of src0 goes to row idx(i01, i02 % ne11, i03 % ne12) of dst; NDRange
// (ne00, ne01, ne02 * ne03). IDX_T is int or long; an index outside dst is skipped (and
// flagged in *bad_index).
kernel void set_rows(TENSOR(src0), TENSOR(src1), TENSOR(dst), global int * bad_index) {
    int i0 = get_global_id(0), i01 = get_global_id(1), i23 = get_global_id(2);
    int i02 = i23 % src0_ne2, i03 = i23 / src0_ne2;
    long r = *(const global IDX_T *) ADDR(src1, i01, i02 % src1_ne1, i03 % src1_ne2, 0);
    if (r < 0 || r >= dst_ne1) {
        *bad_index = 1;
        return;
    }
    STORE(ADDR(dst, i0, r, i02, i03), LOAD0(ADDR(src0, i0, i01, i02, i03)));
}
