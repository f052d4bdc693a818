// Shared by every polydev OpenCL program: tensor arguments, F16 through vload_half /
// vstore_half (PoCL has no cl_khr_fp16; on CPU devices, loads convert by integer arithmetic)
// and the dequantizers of ggml's block formats.

// numpy rounds a * b + c twice; so must we (no silent fused multiply-adds)
#pragma OPENCL FP_CONTRACT OFF

// A tensor argument: its cl_mem, byte offset, ne[4] and nb[4] (ggml's layout).
#define TENSOR(t) global char * t##_data, ulong t##_offs, \
    int t##_ne0, int t##_ne1, int t##_ne2, int t##_ne3, \
    ulong t##_nb0, ulong t##_nb1, ulong t##_nb2, ulong t##_nb3

// The address of element (i0, i1, i2, i3) of a tensor of a plain type.
#define ADDR(t, i0, i1, i2, i3) (t##_data + t##_offs + (ulong)(i0) * t##_nb0 + \
    (ulong)(i1) * t##_nb1 + (ulong)(i2) * t##_nb2 + (ulong)(i3) * t##_nb3)

// The start of row (i1, i2, i3): block formats are addressed by rows.
#define ROW(t, i1, i2, i3) (t##_data + t##_offs + (ulong)(i1) * t##_nb1 + \
    (ulong)(i2) * t##_nb2 + (ulong)(i3) * t##_nb3)

// VLOAD16(T, i, p): vload16(i, p) into a T (a 16-lane vector of p's element type). PoCL's
// vload16 is an out-of-line call into its kernel library, several times the cost of the load
// in a mat-vec's inner loop; -D VLOAD_BY_CAST (given on CPU devices, where clang compiles the
// kernels) reads through a vector type aligned to its element, one unaligned vector load.
#ifdef VLOAD_BY_CAST
typedef ushort16 ushort16_unaligned __attribute__((aligned(2)));
typedef uchar16 uchar16_unaligned __attribute__((aligned(1)));
typedef char16 char16_unaligned __attribute__((aligned(1)));
typedef float16 float16_unaligned __attribute__((aligned(4)));
#define VLOAD16(T, i, p) (((const global T##_unaligned *) (p))[i])
#else
#define VLOAD16(T, i, p) vload16(i, p)
#endif

#ifdef HALF_BY_BITS
// A CPU driver (PoCL) converts each half in software, call by call; the same conversion as
// integer arithmetic is exact (subnormals, infinities and NaN payloads included), inlines
// and vectorises. -D HALF_BY_BITS is given on CPU devices; GPUs convert in hardware.
inline float half_bits(uint h) {
    uint em = h & 0x7FFF, sign = (h & 0x8000) << 16;
    float f = em < 0x0400 ? (float) em * 0x1p-24f                      // zero, subnormal
            : em >= 0x7C00 ? as_float(((em & 0x3FF) << 13) | 0x7F800000) // inf, NaN
            : as_float((em << 13) + 0x38000000);                        // rebias 15 -> 127
    return as_float(as_uint(f) | sign);
}

inline float16 half16_bits(ushort16 h16) {
    uint16 h = convert_uint16(h16), em = h & 0x7FFF, sign = (h & 0x8000) << 16;
    uint16 sub = as_uint16(convert_float16(em) * 0x1p-24f);
    uint16 special = ((em & 0x3FF) << 13) | 0x7F800000;
    uint16 normal = (em << 13) + 0x38000000;
    // vector ?: becomes blends; PoCL compiled select() on float16 as an out-of-line call
    uint16 bits = em >= (uint16) 0x7C00 ? special : normal;
    bits = em < (uint16) 0x0400 ? sub : bits;
    return as_float16(bits | sign);
}

inline float load_f16(const global char * p) { return half_bits(*(const global ushort *) p); }
inline float16 load_f16x16(const global half * p, int i) {
    return half16_bits(VLOAD16(ushort16, i, (const global ushort *) p));
}
#else
inline float load_f16(const global char * p) { return vload_half(0, (const global half *) p); }
inline float16 load_f16x16(const global half * p, int i) { return vload_half16(i, p); }
#endif
inline float load_f32(const global char * p) { return *(const global float *) p; }
inline float load_i32(const global char * p) { return (float) *(const global int *) p; }
inline void store_f32(global char * p, float v) { *(global float *) p = v; }
inline void store_f16(global char * p, float v) { vstore_half_rte(v, 0, (global half *) p); }
inline void store_i32(global char * p, float v) { *(global int *) p = (int) v; }

// Type-generic loads and stores, chosen per program with -D SRC0_T=f32 (etc.); a program
// that does not name a type gets f32 (its kernels that would use it are not called).
#define CAT_(a, b) a##_##b
#define CAT(a, b) CAT_(a, b)
#ifndef SRC0_T
#define SRC0_T f32
#endif
#ifndef SRC1_T
#define SRC1_T f32
#endif
#ifndef DST_T
#define DST_T f32
#endif
#ifndef MASK_T
#define MASK_T f32
#endif
#ifndef IDX_T
#define IDX_T int
#endif
#define LOAD0(p) CAT(load, SRC0_T)(p)
#define LOAD1(p) CAT(load, SRC1_T)(p)
#define LOADM(p) CAT(load, MASK_T)(p)
#define STORE(p, v) CAT(store, DST_T)(p, v)

// The 32-value decoders sit in mat-vec inner loops; LLVM declines to inline the larger ones
// (the K-quants), and a call returns its vectors through memory
#define DECODER inline __attribute__((always_inline))

// --- block formats: element i of a row (ggml's dequantize_row_* element by element) --------

inline float sum16(float16 v) {
    float8 a = v.lo + v.hi;
    float4 b = a.lo + a.hi;
    float2 c = b.lo + b.hi;
    return c.x + c.y;
}

inline float f16_at(const global uchar * p) { return load_f16((const global char *) p); }

inline float deq_q4_0(const global uchar * row, int i) {
    const global uchar * b = row + (i / 32) * 18;
    int j = i % 32;
    int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
    return (q - 8) * f16_at(b);
}

inline float deq_q4_1(const global uchar * row, int i) {
    const global uchar * b = row + (i / 32) * 20;
    int j = i % 32;
    int q = j < 16 ? (b[4 + j] & 0xF) : (b[4 + j - 16] >> 4);
    return q * f16_at(b) + f16_at(b + 2);
}

inline int q5_high_bit(const global uchar * qh, int j) {
    uint h = qh[0] | (qh[1] << 8) | (qh[2] << 16) | ((uint) qh[3] << 24);
    return j < 16 ? ((h >> j) << 4) & 0x10 : (h >> (j - 16 + 12)) & 0x10;
}

inline float deq_q5_0(const global uchar * row, int i) {
    const global uchar * b = row + (i / 32) * 22;
    int j = i % 32;
    int q = (j < 16 ? (b[6 + j] & 0xF) : (b[6 + j - 16] >> 4)) | q5_high_bit(b + 2, j);
    return (q - 16) * f16_at(b);
}

inline float deq_q5_1(const global uchar * row, int i) {
    const global uchar * b = row + (i / 32) * 24;
    int j = i % 32;
    int q = (j < 16 ? (b[8 + j] & 0xF) : (b[8 + j - 16] >> 4)) | q5_high_bit(b + 4, j);
    return q * f16_at(b) + f16_at(b + 2);
}

inline float deq_q8_0(const global uchar * row, int i) {
    const global uchar * b = row + (i / 32) * 34;
    return ((const global char *) b)[2 + i % 32] * f16_at(b);
}

// the 6-bit scale and min of sub-block j of a Q4_K/Q5_K super-block (get_scale_min_k4)
inline void scale_min_k4(int j, const global uchar * q, float * sc, float * m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

inline float deq_q4_K(const global uchar * row, int i) {
    const global uchar * b = row + (i / 256) * 144;
    int e = i % 256, g = e / 64, hi = (e % 64) / 32, l = e % 32;
    float sc, m;
    scale_min_k4(2 * g + hi, b + 4, &sc, &m);
    uchar byte = b[16 + 32 * g + l];
    int q = hi ? byte >> 4 : byte & 0xF;
    return f16_at(b) * sc * q - f16_at(b + 2) * m;
}

inline float deq_q5_K(const global uchar * row, int i) {
    const global uchar * b = row + (i / 256) * 176;
    int e = i % 256, g = e / 64, hi = (e % 64) / 32, l = e % 32;
    float sc, m;
    scale_min_k4(2 * g + hi, b + 4, &sc, &m);
    uchar byte = b[48 + 32 * g + l];
    int q = (hi ? byte >> 4 : byte & 0xF) + ((b[16 + l] >> (2 * g + hi)) & 1) * 16;
    return f16_at(b) * sc * q - f16_at(b + 2) * m;
}

inline float deq_q6_K(const global uchar * row, int i) {
    const global uchar * b = row + (i / 256) * 210;
    int e = i % 256, h = e / 128, w = e % 128, quarter = w / 32, l = w % 32;
    const global uchar * ql = b + 64 * h;
    const global uchar * qh = b + 128 + 32 * h;
    const global char * sc = (const global char *) (b + 192 + 8 * h);
    int low = (quarter & 1) ? ql[l + 32] : ql[l];
    low = (quarter & 2) ? low >> 4 : low & 0xF;
    int q = (low | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
    return f16_at(b + 208) * sc[l / 16 + 2 * quarter] * q;
}

inline float deq_f32(const global uchar * row, int i) { return ((const global float *) row)[i]; }
inline float deq_f16(const global uchar * row, int i) {
    return load_f16((const global char *) row + 2 * i);
}

// --- 32 values at once: chunk c of a row (a legacy block, or a K-quant sub-block, whose
// scales are decoded once) --------------------------------------------------------------

DECODER void deq32_q4_0(const global uchar * row, int c, float * y) {
    const global uchar * b = row + c * 18;
    float d = f16_at(b);
    for (int j = 0; j < 16; j++) {
        y[j] = ((b[2 + j] & 0xF) - 8) * d;
        y[j + 16] = ((b[2 + j] >> 4) - 8) * d;
    }
}

DECODER void deq32_q4_1(const global uchar * row, int c, float * y) {
    const global uchar * b = row + c * 20;
    float d = f16_at(b), m = f16_at(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = (b[4 + j] & 0xF) * d + m;
        y[j + 16] = (b[4 + j] >> 4) * d + m;
    }
}

DECODER void deq32_q5_0(const global uchar * row, int c, float * y) {
    const global uchar * b = row + c * 22;
    float d = f16_at(b);
    for (int j = 0; j < 16; j++) {
        y[j] = (((b[6 + j] & 0xF) | q5_high_bit(b + 2, j)) - 16) * d;
        y[j + 16] = (((b[6 + j] >> 4) | q5_high_bit(b + 2, j + 16)) - 16) * d;
    }
}

DECODER void deq32_q5_1(const global uchar * row, int c, float * y) {
    const global uchar * b = row + c * 24;
    float d = f16_at(b), m = f16_at(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = ((b[8 + j] & 0xF) | q5_high_bit(b + 4, j)) * d + m;
        y[j + 16] = ((b[8 + j] >> 4) | q5_high_bit(b + 4, j + 16)) * d + m;
    }
}

DECODER void deq32_q8_0(const global uchar * row, int c, float * y) {
    const global uchar * b = row + c * 34;
    float d = f16_at(b);
    for (int j = 0; j < 32; j++) y[j] = ((const global char *) b)[2 + j] * d;
}

DECODER void deq32_q4_K(const global uchar * row, int c, float * y) {
    const global uchar * b = row + (c / 8) * 144;
    int sub = c % 8, g = sub / 2, hi = sub % 2;
    float sc, m;
    scale_min_k4(sub, b + 4, &sc, &m);
    float d1 = f16_at(b) * sc, m1 = f16_at(b + 2) * m;
    const global uchar * q = b + 16 + 32 * g;
    for (int l = 0; l < 32; l++) y[l] = d1 * (hi ? q[l] >> 4 : q[l] & 0xF) - m1;
}

DECODER void deq32_q5_K(const global uchar * row, int c, float * y) {
    const global uchar * b = row + (c / 8) * 176;
    int sub = c % 8, g = sub / 2, hi = sub % 2;
    float sc, m;
    scale_min_k4(sub, b + 4, &sc, &m);
    float d1 = f16_at(b) * sc, m1 = f16_at(b + 2) * m;
    const global uchar * q = b + 48 + 32 * g;
    for (int l = 0; l < 32; l++) {
        int v = (hi ? q[l] >> 4 : q[l] & 0xF) + ((b[16 + l] >> sub) & 1) * 16;
        y[l] = d1 * v - m1;
    }
}

DECODER void deq32_q6_K(const global uchar * row, int c, float * y) {
    const global uchar * b = row + (c / 8) * 210;
    int sub = c % 8, h = sub / 4, quarter = sub % 4;
    const global uchar * ql = b + 64 * h + (quarter & 1) * 32;
    const global uchar * qh = b + 128 + 32 * h;
    const global char * sc = (const global char *) (b + 192 + 8 * h);
    float d = f16_at(b + 208);
    for (int l = 0; l < 32; l++) {
        int low = (quarter & 2) ? ql[l] >> 4 : ql[l] & 0xF;
        int q = (low | (((qh[l] >> (2 * quarter)) & 3) << 4)) - 32;
        y[l] = d * sc[l / 16 + 2 * quarter] * q;
    }
}

// --- 32 values as two float16 vectors (values 0-15 and 16-31), for the barrier-free
// kernels of CPU devices, lane-wise. Only where PoCL ran them faster than deq32_* (Q5_K was
// not). quants32v_*: the quantized values q and the map the decoding applies, w = d * q + m
// (the decode product factors d and m out of its sums, which PoCL ran no slower than
// decoding first; HAS_MIN_*: m is not always 0) ----------------------------------------------

#define QUANTS32V(NAME) DECODER void NAME(const global uchar * row, int c, \
    float16 * lo, float16 * hi, float * d, float * m)

#define HAS_MIN_q4_0 0
QUANTS32V(quants32v_q4_0) {
    const global uchar * b = row + c * 18;
    uchar16 qs = VLOAD16(uchar16, 0, b + 2);
    *lo = convert_float16(convert_int16(qs & (uchar16) (15)) - 8);
    *hi = convert_float16(convert_int16(qs >> (uchar16) (4)) - 8);
    *d = f16_at(b), *m = 0.0f;
}

#define HAS_MIN_q4_1 1
QUANTS32V(quants32v_q4_1) {
    const global uchar * b = row + c * 20;
    uchar16 qs = VLOAD16(uchar16, 0, b + 4);
    *lo = convert_float16(qs & (uchar16) (15));
    *hi = convert_float16(qs >> (uchar16) (4));
    *d = f16_at(b), *m = f16_at(b + 2);
}

#define HAS_MIN_q8_0 0
QUANTS32V(quants32v_q8_0) {
    const global uchar * b = row + c * 34;
    *lo = convert_float16(VLOAD16(char16, 0, (const global char *) (b + 2)));
    *hi = convert_float16(VLOAD16(char16, 1, (const global char *) (b + 2)));
    *d = f16_at(b), *m = 0.0f;
}

#define HAS_MIN_q4_K 1
QUANTS32V(quants32v_q4_K) {
    const global uchar * b = row + (c / 8) * 144;
    int sub = c % 8, g = sub / 2;
    float sc, mn;
    scale_min_k4(sub, b + 4, &sc, &mn);
    const global uchar * q = b + 16 + 32 * g;
    uchar shift = (sub % 2) ? 4 : 0;
    *lo = convert_float16((VLOAD16(uchar16, 0, q) >> shift) & (uchar16) (15));
    *hi = convert_float16((VLOAD16(uchar16, 1, q) >> shift) & (uchar16) (15));
    *d = f16_at(b) * sc, *m = -(f16_at(b + 2) * mn);
}

// bit j of the 32 high bits at p, as 16 (ggml's qh, little-endian, unaligned)
inline int16 q5_high_bits(const global uchar * p, int first) {
    uint qh = p[0] | (p[1] << 8) | (p[2] << 16) | ((uint) p[3] << 24);
    const uint16 bit = (uint16) (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return convert_int16(((uint16) (qh) >> (bit + (uint) first)) & (uint16) (1)) << 4;
}

#define HAS_MIN_q5_0 0
QUANTS32V(quants32v_q5_0) {
    const global uchar * b = row + c * 22;
    uchar16 qs = VLOAD16(uchar16, 0, b + 6);
    *lo = convert_float16((convert_int16(qs & (uchar16) (15)) | q5_high_bits(b + 2, 0)) - 16);
    *hi = convert_float16((convert_int16(qs >> (uchar16) (4)) | q5_high_bits(b + 2, 16)) - 16);
    *d = f16_at(b), *m = 0.0f;
}

#define HAS_MIN_q5_1 1
QUANTS32V(quants32v_q5_1) {
    const global uchar * b = row + c * 24;
    uchar16 qs = VLOAD16(uchar16, 0, b + 8);
    *lo = convert_float16(convert_int16(qs & (uchar16) (15)) | q5_high_bits(b + 4, 0));
    *hi = convert_float16(convert_int16(qs >> (uchar16) (4)) | q5_high_bits(b + 4, 16));
    *d = f16_at(b), *m = f16_at(b + 2);
}

// Q6_K has a scale per 16 values: decoded lane-wise, not factored
DECODER void deq32v_q6_K(const global uchar * row, int c, float16 * lo, float16 * hi) {
    const global uchar * b = row + (c / 8) * 210;
    int sub = c % 8, h = sub / 4, quarter = sub % 4;
    const global uchar * ql = b + 64 * h + (quarter & 1) * 32;
    const global uchar * qh = b + 128 + 32 * h;
    const global char * sc = (const global char *) (b + 192 + 8 * h);
    float d = f16_at(b + 208);
    uchar lshift = (quarter & 2) ? 4 : 0, hshift = 2 * quarter;
    int16 q0 = convert_int16(((VLOAD16(uchar16, 0, ql) >> lshift) & (uchar16) (15))
                             | (((VLOAD16(uchar16, 0, qh) >> hshift) & (uchar16) (3)) << (uchar16) (4))) - 32;
    int16 q1 = convert_int16(((VLOAD16(uchar16, 1, ql) >> lshift) & (uchar16) (15))
                             | (((VLOAD16(uchar16, 1, qh) >> hshift) & (uchar16) (3)) << (uchar16) (4))) - 32;
    *lo = (d * sc[2 * quarter]) * convert_float16(q0);
    *hi = (d * sc[1 + 2 * quarter]) * convert_float16(q1);
}

#ifdef QUANT_T
#define DEQ(row, i) CAT(deq, QUANT_T)(row, i)
#define DEQ32(row, c, y) CAT(deq32, QUANT_T)(row, c, y)
#ifdef VEC_QUANTS
#define QUANTS32(row, c, lo, hi, d, m) CAT(quants32v, QUANT_T)(row, c, lo, hi, d, m)
#define HAS_MIN CAT(HAS_MIN, QUANT_T)
#endif
#ifdef VEC_DEQ
#define DEQ32V(row, c, lo, hi) CAT(deq32v, QUANT_T)(row, c, lo, hi)
#else   // a block format without a lane-wise decoder: its scalar one, then loaded as vectors
#define DEQ32V(row, c, lo, hi) do { float16 y_[2]; DEQ32(row, c, (float *) y_); \
    *(lo) = y_[0]; *(hi) = y_[1]; } while (0)
#endif
#endif

// ALiBi's slope of head h (1 without ALiBi), as ggml computes it (SOFT_MAX, attention).
inline float alibi_slope(int h, float max_bias, float m0, float m1, int n_head_log2) {
    if (max_bias <= 0.0f) return 1.0f;
    return h < n_head_log2 ? pow(m0, (float) (h + 1))
                           : pow(m1, (float) (2 * (h - n_head_log2) + 1));
}

// --- work-group reductions (LS work-items, a power of two) --------------------------------

#ifndef LS
#define LS 64
#endif

// tree sum of the work-group's partial values; every work-item gets the total
inline float group_sum(local float * buf, float v) {
    int lid = get_local_id(0);
    buf[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LS / 2; s > 0; s >>= 1) {
        if (lid < s) buf[lid] += buf[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float total = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return total;
}

inline float group_max(local float * buf, float v) {
    int lid = get_local_id(0);
    buf[lid] = v;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int s = LS / 2; s > 0; s >>= 1) {
        if (lid < s) buf[lid] = fmax(buf[lid], buf[lid + s]);
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    float m = buf[0];
    barrier(CLK_LOCAL_MEM_FENCE);
    return m;
}

