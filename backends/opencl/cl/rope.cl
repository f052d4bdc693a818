// ROPE, normal and NeoX modes, with YaRN and optional frequency factors. One work-item per
// row (NDRange (ne1, ne2, ne3)): theta is the running product p * theta_scale^i in ggml's
// float32 order, which a closed-form pow() would not reproduce.

inline float yarn_ramp(float low, float high, int i0) {
    float y = (i0 / 2 - low) / fmax(0.001f, high - low);
    return 1.0f - fmin(1.0f, fmax(0.0f, y));
}

kernel void rope(TENSOR(src0), TENSOR(pos), TENSOR(ff), TENSOR(dst), int n_dims, int neox,
                 float freq_scale, float ext_factor, float attn_factor, float corr_low,
                 float corr_high, float theta_scale, int has_ff) {
    int i1 = get_global_id(0), i2 = get_global_id(1), i3 = get_global_id(2);
    float theta_base = (float) *(const global int *) ADDR(pos, i2, 0, 0, 0);
    int half_dims = n_dims / 2;
    for (int i0 = 0; i0 < n_dims; i0 += 2) {
        float f = has_ff ? load_f32(ADDR(ff, i0 / 2, 0, 0, 0)) : 1.0f;
        float theta_extrap = theta_base / f;
        float theta = freq_scale * theta_extrap;
        float mscale = attn_factor;
        if (ext_factor != 0.0f) {
            float mix = yarn_ramp(corr_low, corr_high, i0) * ext_factor;
            theta = theta * (1.0f - mix) + theta_extrap * mix;
            mscale *= 1.0f + 0.1f * log(1.0f / freq_scale);
        }
        float c = cos(theta) * mscale, s = sin(theta) * mscale;
        theta_base *= theta_scale;
        int a = neox ? i0 / 2 : i0, b = neox ? i0 / 2 + half_dims : i0 + 1;
        float x0 = LOAD0(ADDR(src0, a, i1, i2, i3)), x1 = LOAD0(ADDR(src0, b, i1, i2, i3));
        STORE(ADDR(dst, a, i1, i2, i3), x0 * c - x1 * s);
        STORE(ADDR(dst, b, i1, i2, i3), x0 * s + x1 * c);
    }
    for (int i0 = n_dims; i0 < src0_ne0; i0++) {      // the channels rope leaves alone
        STORE(ADDR(dst, i0, i1, i2, i3), LOAD0(ADDR(src0, i0, i1, i2, i3)));
    }
}
