// Element-wise kernels of float32 rows for a decode step, where CuPy's array kernels cost a
// launch each of several passes (a GLU was six: a copy, exp, add, divide, multiply, copy):
// binary arithmetic with ggml's repeat of the second operand, and the gated linear units.
// One block per row (ne1, ne2, ne3), threads over its values.

enum { BIN_ADD = 0, BIN_SUB = 1, BIN_MUL = 2, BIN_DIV = 3 };

// dst = a op b, b repeated over a's shape (each b_ne divides a's: ggml's can_repeat)
extern "C" __global__ void binary_f32(TENSOR(a), TENSOR(b), TENSOR_OUT(dst), int op) {
    int i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z;
    const char * a_row = ROW(a, i1, i2, i3);
    const char * b_row = ROW(b, i1 % b_ne1, i2 % b_ne2, i3 % b_ne3);
    char * d_row = ROW(dst, i1, i2, i3);
    for (int i = threadIdx.x; i < dst_ne0; i += blockDim.x) {
        float x = *(const float *) (a_row + i * a_nb0);
        float y = *(const float *) (b_row + (i % b_ne0) * b_nb0);
        float r = op == BIN_ADD ? x + y : op == BIN_SUB ? x - y : op == BIN_MUL ? x * y : x / y;
        *(float *) (d_row + i * dst_nb0) = r;
    }
}

// GluOp's order (runtime/ops/catalogue.py)
enum { GLU_REGLU = 0, GLU_GEGLU = 1, GLU_SWIGLU = 2, GLU_SWIGLU_OAI = 3, GLU_GEGLU_ERF = 4,
       GLU_GEGLU_QUICK = 5 };

#define GELU_COEF_A 0.044715f
#define GELU_QUICK_COEF -1.702f
#define SQRT_2_OVER_PI 0.79788456080286535588f
#define SQRT_HALF 0.70710678118654752440f

// the activation of x gated by g, in the array kernels' order of operations
__device__ __forceinline__ float glu(int fn, float x, float g, float alpha, float limit) {
    switch (fn) {
    case GLU_REGLU:
        return fmaxf(x, 0.0f) * g;
    case GLU_GEGLU: {
        float inner = tanhf((x * x * GELU_COEF_A + 1.0f) * x * SQRT_2_OVER_PI);
        return x * ((inner + 1.0f) * 0.5f) * g;
    }
    case GLU_SWIGLU:
        return x / (expf(-x) + 1.0f) * g;
    case GLU_SWIGLU_OAI: {
        x = fminf(x, limit);
        return x / (expf(x * -alpha) + 1.0f) * (fminf(fmaxf(g, -limit), limit) + 1.0f);
    }
    case GLU_GEGLU_ERF:
        return x * ((erff(x * SQRT_HALF) + 1.0f) * 0.5f) * g;
    default:                               // GLU_GEGLU_QUICK
        return x / (expf(x * GELU_QUICK_COEF) + 1.0f) * g;
    }
}

// dst = act(x) * g: x and g are a's halves (the first is x unless swapped), or a and b
extern "C" __global__ void glu_f32(TENSOR(a), TENSOR(b), TENSOR_OUT(dst), int fn, int has_b,
                                   int swapped, float alpha, float limit) {
    int i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z, n = dst_ne0;
    const char * x_row = ROW(a, i1, i2, i3), * g_row;
    i64 g_nb0 = a_nb0;
    if (has_b) {
        g_row = ROW(b, i1, i2, i3);
        g_nb0 = b_nb0;
    } else {
        g_row = x_row + (swapped ? 0 : n * a_nb0);
        x_row += swapped ? n * a_nb0 : 0;
    }
    char * d_row = ROW(dst, i1, i2, i3);
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        float x = *(const float *) (x_row + i * a_nb0), g = *(const float *) (g_row + i * g_nb0);
        *(float *) (d_row + i * dst_nb0) = glu(fn, x, g, alpha, limit);
    }
}
