// Conversions into and out of ggml's block formats: CPY and SET_ROWS into Q4_0, Q4_1, Q5_0,
// Q5_1 and Q8_0 (ggml's quantize_row_*_ref, operation by operation; built with -D ENCODE),
// and CPY out of any block format common.h decodes. -D QUANT_T names the block type.

inline void put_f16(global uchar * p, float v) { vstore_half_rte(v, 0, (global half *) p); }

inline void quantize_q8_0(const float * x, global uchar * b) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmax(amax, fabs(x[j]));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(b, d);
    for (int j = 0; j < 32; j++) ((global char *) b)[2 + j] = (char) round(x[j] * id);
}

// the value of largest magnitude, the first of equals (ggml keeps its sign)
inline float signed_absmax(const float * x) {
    float amax = 0.0f, m = 0.0f;
    for (int j = 0; j < 32; j++) {
        if (amax < fabs(x[j])) { amax = fabs(x[j]); m = x[j]; }
    }
    return m;
}

inline void quantize_q4_0(const float * x, global uchar * b) {
    float d = signed_absmax(x) / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(b, d);
    for (int j = 0; j < 16; j++) {
        int q0 = min(15, (int) (char) (x[j] * id + 8.5f));
        int q1 = min(15, (int) (char) (x[16 + j] * id + 8.5f));
        b[2 + j] = q0 | (q1 << 4);
    }
}

inline void quantize_q4_1(const float * x, global uchar * b) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) { lo = fmin(lo, x[j]); hi = fmax(hi, x[j]); }
    float d = (hi - lo) / 15.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(b, d);
    put_f16(b + 2, lo);
    for (int j = 0; j < 16; j++) {
        int q0 = min(15, (int) (char) ((x[j] - lo) * id + 0.5f));
        int q1 = min(15, (int) (char) ((x[16 + j] - lo) * id + 0.5f));
        b[4 + j] = q0 | (q1 << 4);
    }
}

inline void put_qh(global uchar * p, uint qh) {
    p[0] = qh & 0xFF; p[1] = (qh >> 8) & 0xFF; p[2] = (qh >> 16) & 0xFF; p[3] = qh >> 24;
}

inline void quantize_q5_0(const float * x, global uchar * b) {
    float d = signed_absmax(x) / -16.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(b, d);
    uint qh = 0;
    for (int j = 0; j < 16; j++) {
        int q0 = min(31, (int) (char) (x[j] * id + 16.5f));
        int q1 = min(31, (int) (char) (x[16 + j] * id + 16.5f));
        b[6 + j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
        qh |= ((uint) (q0 & 0x10) >> 4) << j;
        qh |= ((uint) (q1 & 0x10) >> 4) << (j + 16);
    }
    put_qh(b + 2, qh);
}

inline void quantize_q5_1(const float * x, global uchar * b) {
    float lo = x[0], hi = x[0];
    for (int j = 1; j < 32; j++) { lo = fmin(lo, x[j]); hi = fmax(hi, x[j]); }
    float d = (hi - lo) / 31.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    put_f16(b, d);
    put_f16(b + 2, lo);
    uint qh = 0;
    for (int j = 0; j < 16; j++) {
        int q0 = (int) ((x[j] - lo) * id + 0.5f);
        int q1 = (int) ((x[16 + j] - lo) * id + 0.5f);
        b[8 + j] = (q0 & 0xF) | ((q1 & 0xF) << 4);
        qh |= ((uint) (q0 & 0x10) >> 4) << j;
        qh |= ((uint) (q1 & 0x10) >> 4) << (j + 16);
    }
    put_qh(b + 4, qh);
}

// element n of a tensor in ggml's element order
#define ELEMENT(t, n) ADDR(t, (n) % t##_ne0, ((n) / t##_ne0) % t##_ne1, \
    ((n) / ((long) t##_ne0 * t##_ne1)) % t##_ne2, (n) / ((long) t##_ne0 * t##_ne1 * t##_ne2))

#define QUANTIZE(x, b) CAT(quantize, QUANT_T)(x, b)
#define BLOCK_BYTES_q4_0 18
#define BLOCK_BYTES_q4_1 20
#define BLOCK_BYTES_q5_0 22
#define BLOCK_BYTES_q5_1 24
#define BLOCK_BYTES_q8_0 34
#define BLOCK_BYTES CAT(BLOCK_BYTES, QUANT_T)

#ifdef ENCODE     // the encoders exist for the legacy formats only

// CPY into a contiguous block-format tensor: one work-item per block
kernel void copy_to_blocks(TENSOR(src0), TENSOR(dst)) {
    long blk = get_global_id(0);
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = LOAD0(ELEMENT(src0, blk * 32 + j));
    QUANTIZE(x, (global uchar *) (dst_data + dst_offs) + blk * BLOCK_BYTES);
}

// SET_ROWS into a block-format tensor: one work-item per block of a row
kernel void set_rows_blocks(TENSOR(src0), TENSOR(src1), TENSOR(dst), global int * bad_index) {
    int blk = get_global_id(0), i01 = get_global_id(1), i23 = get_global_id(2);
    int i02 = i23 % src0_ne2, i03 = i23 / src0_ne2;
    long r = *(const global IDX_T *) ADDR(src1, i01, i02 % src1_ne1, i03 % src1_ne2, 0);
    if (r < 0 || r >= dst_ne1) {
        *bad_index = 1;
        return;
    }
    float x[32];
    for (int j = 0; j < 32; j++) x[j] = LOAD0(ADDR(src0, blk * 32 + j, i01, i02, i03));
    QUANTIZE(x, (global uchar *) ROW(dst, r, i02, i03) + blk * BLOCK_BYTES);
}

#endif  // ENCODE

// CPY out of a block format (rows packed): element n of src0 to element n of dst
kernel void copy_from_blocks(TENSOR(src0), TENSOR(dst)) {
    long n = get_global_id(0);
    int i0 = n % src0_ne0, i1 = (n / src0_ne0) % src0_ne1;
    int i2 = (n / ((long) src0_ne0 * src0_ne1)) % src0_ne2;
    int i3 = n / ((long) src0_ne0 * src0_ne1 * src0_ne2);
    STORE(ELEMENT(dst, n), DEQ((const global uchar *) ROW(src0, i1, i2, i3), i0));
}
