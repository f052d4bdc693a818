// ROPE in the normal and NeoX modes, with YaRN and optional frequency factors; f32 or f16
// (is_f16) rows, the result of the source's type. Grid (ne1, ne2, ne3), threads over the
// row's pairs and then over the channels past n_dims, which are copied unchanged.
//
// The angle of pair k is p * theta_scale^k as a running product in float32, the order ggml's
// CPU code (and polydev's reference) uses, which a closed-form powf would not reproduce; each
// thread recomputes the product up to its own pair (at most n_dims / 2 multiplications).

__device__ __forceinline__ float load_x(const char * p, int is_f16) {
    return is_f16 ? f16_at((const u8 *) p) : *(const float *) p;
}

__device__ __forceinline__ void store_x(char * p, float v, int is_f16) {
    if (is_f16) *(u16 *) p = f32_to_f16(v);
    else *(float *) p = v;
}

extern "C" __global__ void rope(TENSOR(src0), TENSOR(pos), TENSOR(ff), TENSOR_OUT(dst),
                                int n_dims, int neox, int is_f16, float theta_scale,
                                float freq_scale, float ext_factor, float mscale,
                                float corr_low, float corr_span, int has_ff) {
    int i1 = blockIdx.x, i2 = blockIdx.y, i3 = blockIdx.z;
    int n_pairs = n_dims / 2;
    float p = (float) *(const int *) ADDR(pos, i2, 0, 0, 0);
    for (int k = threadIdx.x; k < n_pairs; k += blockDim.x) {
        float theta_extrap = p;
        for (int j = 0; j < k; j++) theta_extrap *= theta_scale;
        if (has_ff) theta_extrap /= *(const float *) ADDR(ff, k, 0, 0, 0);
        float theta = theta_extrap * freq_scale;
        if (ext_factor != 0.0f) {
            float y = ((float) k - corr_low) / corr_span;     // span: max(0.001, high - low)
            float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * ext_factor;
            theta = theta * (1.0f - mix) + theta_extrap * mix;
        }
        float c = cosf(theta) * mscale, s = sinf(theta) * mscale;
        int a = neox ? k : 2 * k, b = neox ? k + n_pairs : 2 * k + 1;
        float x0 = load_x(ADDR(src0, a, i1, i2, i3), is_f16);
        float x1 = load_x(ADDR(src0, b, i1, i2, i3), is_f16);
        store_x(ADDR(dst, a, i1, i2, i3), x0 * c - x1 * s, is_f16);
        store_x(ADDR(dst, b, i1, i2, i3), x0 * s + x1 * c, is_f16);
    }
    for (int i0 = 2 * n_pairs + threadIdx.x; i0 < src0_ne0; i0 += blockDim.x) {
        store_x(ADDR(dst, i0, i1, i2, i3), load_x(ADDR(src0, i0, i1, i2, i3), is_f16), is_f16);
    }
}
