// Element-wise kernels over strided tensors. Built once per combination of types (-D SRC0_T /
// SRC1_T / DST_T in {f32, f16, i32}); the function is a run-time argument whose codes the host
// defines as -D FN_<NAME>=<code>, so one build serves every function.
// NDRange: (ne0, ne1, ne2 * ne3) of the destination.

#define GELU_COEF_A 0.044715f
#define SQRT_2_OVER_PI 0.79788456080286535588f
#define SQRT_HALF 0.70710678118654752440f

inline float sigmoid_(float x) { return 1.0f / (1.0f + exp(-x)); }
inline float gelu_(float x) {
    return 0.5f * x * (1.0f + tanh(SQRT_2_OVER_PI * x * (1.0f + GELU_COEF_A * x * x)));
}
inline float gelu_erf_(float x) { return 0.5f * x * (1.0f + erf(x * SQRT_HALF)); }
inline float gelu_quick_(float x) { return x / (1.0f + exp(-1.702f * x)); }
inline float silu_(float x) { return x / (1.0f + exp(-x)); }
inline float relu_(float x) { return fmax(x, 0.0f); }

// f(x) for UNARY and the one-source ops (fn: an FN_<NAME> code, given by the host as -D
// options); p0 and p1 are the op's float parameters
inline float unary_fn(float x, int fn, float p0, float p1) {
    switch (fn) {
    case FN_ABS:
        return fabs(x);
    case FN_SGN:
        return x > 0.0f ? 1.0f : (x < 0.0f ? -1.0f : 0.0f);
    case FN_NEG:
        return -x;
    case FN_STEP:
        return x > 0.0f ? 1.0f : 0.0f;
    case FN_TANH:
        return tanh(x);
    case FN_ELU:
        return x > 0.0f ? x : expm1(x);
    case FN_RELU:
        return relu_(x);
    case FN_SIGMOID:
        return sigmoid_(x);
    case FN_GELU:
        return gelu_(x);
    case FN_GELU_QUICK:
        return gelu_quick_(x);
    case FN_GELU_ERF:
        return gelu_erf_(x);
    case FN_SILU:
        return silu_(x);
    case FN_HARDSWISH:
        return x * clamp((x + 3.0f) / 6.0f, 0.0f, 1.0f);
    case FN_HARDSIGMOID:
        return clamp((x + 3.0f) / 6.0f, 0.0f, 1.0f);
    case FN_EXP:
        return exp(x);
    case FN_EXPM1:
        return expm1(x);
    case FN_SOFTPLUS:
        return x > 20.0f ? x : log1p(exp(x));
    case FN_FLOOR:
        return floor(x);
    case FN_CEIL:
        return ceil(x);
    case FN_ROUND:
        return trunc(x + copysign(0.5f, x));
    case FN_TRUNC:
        return trunc(x);
    case FN_SQR:
        return x * x;
    case FN_SQRT:
        return sqrt(x);
    case FN_LOG:
        return log(x);
    case FN_SIN:
        return sin(x);
    case FN_COS:
        return cos(x);
    case FN_SCALE:
        return x * p0 + p1;
    case FN_CLAMP:
        return fmin(fmax(x, p0), p1);
    case FN_LEAKY_RELU:
        return x > 0.0f ? x : x * p0;
    case FN_FILL:
        return p0;
    default:
        return x;
    }
}

kernel void unary(TENSOR(src0), TENSOR(dst), int fn, float p0, float p1) {
    int i0 = get_global_id(0), i1 = get_global_id(1), i23 = get_global_id(2);
    int i2 = i23 % dst_ne2, i3 = i23 / dst_ne2;
    float x = LOAD0(ADDR(src0, i0, i1, i2, i3));
    STORE(ADDR(dst, i0, i1, i2, i3), unary_fn(x, fn, p0, p1));
}

// ADD, SUB, MUL, DIV with src1 repeated over dst (ggml_can_repeat)
inline float binary_fn(float a, float b, int fn) {
    switch (fn) {
    case FN_ADD: return a + b;
    case FN_SUB: return a - b;
    case FN_MUL: return a * b;
    default: return a / b;
    }
}

kernel void binary(TENSOR(src0), TENSOR(src1), TENSOR(dst), int fn) {
    int i0 = get_global_id(0), i1 = get_global_id(1), i23 = get_global_id(2);
    int i2 = i23 % dst_ne2, i3 = i23 / dst_ne2;
    float a = LOAD0(ADDR(src0, i0, i1, i2, i3));
    float b = LOAD1(ADDR(src1, i0 % src1_ne0, i1 % src1_ne1, i2 % src1_ne2, i3 % src1_ne3));
    STORE(ADDR(dst, i0, i1, i2, i3), binary_fn(a, b, fn));
}

// GLU: act(x) * g. The fused form (split == 0) reads x and g from the two halves of src0's
// rows (swapped exchanges them); the split form reads x from src0 and g from src1.
inline float glu_fn(float x, float g, int fn, float alpha, float limit) {
    switch (fn) {
    case FN_REGLU: return relu_(x) * g;
    case FN_GEGLU: return gelu_(x) * g;
    case FN_SWIGLU: return silu_(x) * g;
    case FN_GEGLU_ERF: return gelu_erf_(x) * g;
    case FN_GEGLU_QUICK: return gelu_quick_(x) * g;
    default:     // SWIGLU_OAI
        x = fmin(x, limit);
        return x / (1.0f + exp(-alpha * x)) * (clamp(g, -limit, limit) + 1.0f);
    }
}

kernel void glu(TENSOR(src0), TENSOR(src1), TENSOR(dst), int fn, int split, int swapped,
                float alpha, float limit) {
    int i0 = get_global_id(0), i1 = get_global_id(1), i23 = get_global_id(2);
    int i2 = i23 % dst_ne2, i3 = i23 / dst_ne2;
    float x, g;
    if (split) {
        x = LOAD0(ADDR(src0, i0, i1, i2, i3));
        g = LOAD1(ADDR(src1, i0, i1, i2, i3));
    } else {
        int ix = swapped ? i0 + dst_ne0 : i0, ig = swapped ? i0 : i0 + dst_ne0;
        x = LOAD0(ADDR(src0, ix, i1, i2, i3));
        g = LOAD0(ADDR(src0, ig, i1, i2, i3));
    }
    STORE(ADDR(dst, i0, i1, i2, i3), glu_fn(x, g, fn, alpha, limit));
}

// CPY / DUP / CONT: element n of src (in row-major ggml order) goes to element n of dst; the
// two may differ in shape. NDRange: nelements.
kernel void copy(TENSOR(src0), TENSOR(dst)) {
    long n = get_global_id(0);
    int s0 = n % src0_ne0, s1 = (n / src0_ne0) % src0_ne1;
    int s2 = (n / ((long) src0_ne0 * src0_ne1)) % src0_ne2;
    int s3 = n / ((long) src0_ne0 * src0_ne1 * src0_ne2);
    int d0 = n % dst_ne0, d1 = (n / dst_ne0) % dst_ne1;
    int d2 = (n / ((long) dst_ne0 * dst_ne1)) % dst_ne2;
    int d3 = n / ((long) dst_ne0 * dst_ne1 * dst_ne2);
    STORE(ADDR(dst, d0, d1, d2, d3), LOAD0(ADDR(src0, s0, s1, s2, s3)));
}

// the same copy for 32-bit integers, bit for bit
kernel void copy_i32(TENSOR(src0), TENSOR(dst)) {
    long n = get_global_id(0);
    int s0 = n % src0_ne0, s1 = (n / src0_ne0) % src0_ne1;
    int s2 = (n / ((long) src0_ne0 * src0_ne1)) % src0_ne2;
    int s3 = n / ((long) src0_ne0 * src0_ne1 * src0_ne2);
    int d0 = n % dst_ne0, d1 = (n / dst_ne0) % dst_ne1;
    int d2 = (n / ((long) dst_ne0 * dst_ne1)) % dst_ne2;
    int d3 = n / ((long) dst_ne0 * dst_ne1 * dst_ne2);
    *(global int *) ADDR(dst, d0, d1, d2, d3) = *(const global int *) ADDR(src0, s0, s1, s2, s3);
}

// REPEAT: dst[i] = src0[i mod ne(src0)]
kernel void repeat(TENSOR(src0), TENSOR(dst)) {
    int i0 = get_global_id(0), i1 = get_global_id(1), i23 = get_global_id(2);
    int i2 = i23 % dst_ne2, i3 = i23 / dst_ne2;
    STORE(ADDR(dst, i0, i1, i2, i3), LOAD0(ADDR(src0, i0 % src0_ne0, i1 % src0_ne1,
                                                   i2 % src0_ne2, i3 % src0_ne3)));
}

// CONCAT along dim: indices below src0's extent read src0, the rest src1
kernel void concat(TENSOR(src0), TENSOR(src1), TENSOR(dst), int dim) {
    int i[4] = {get_global_id(0), get_global_id(1), 0, 0};
    int i23 = get_global_id(2);
    i[2] = i23 % dst_ne2;
    i[3] = i23 / dst_ne2;
    int n0[4] = {src0_ne0, src0_ne1, src0_ne2, src0_ne3};
    float v;
    if (i[dim] < n0[dim]) {
        v = LOAD0(ADDR(src0, i[0], i[1], i[2], i[3]));
    } else {
        i[dim] -= n0[dim];
        v = LOAD0(ADDR(src1, i[0], i[1], i[2], i[3]));
        i[dim] += n0[dim];
    }
    STORE(ADDR(dst, i[0], i[1], i[2], i[3]), v);
}

// DIAG_MASK_INF: -inf above the diagonal shifted by n_past
kernel void diag_mask_inf(TENSOR(src0), TENSOR(dst), int n_past) {
    int i0 = get_global_id(0), i1 = get_global_id(1), i23 = get_global_id(2);
    int i2 = i23 % dst_ne2, i3 = i23 / dst_ne2;
    float x = LOAD0(ADDR(src0, i0, i1, i2, i3));
    STORE(ADDR(dst, i0, i1, i2, i3), i0 > n_past + i1 ? -INFINITY : x);
}
