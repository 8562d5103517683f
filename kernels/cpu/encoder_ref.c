/* kernels/cpu/encoder_ref.c: scalar references of the encoder's operations (the definition of
 * correct for kernels/cpu/encoder.c; LLMGW_KERNELS=ref runs the encoder on them). dense sums each
 * output as one fused multiply-add chain over the inputs in order, then adds the bias and the
 * residual: the packed SIMD kernels compute exactly this, so the two agree bit for bit. */
#include "kernels/cpu/internal.h"

#include <math.h>
#include <stdlib.h>

void kern__enc_dense_ref(const float *w, const float *bias, int n, int k, const float *x,
                         int n_tok, float *y, bool accumulate, bool gelu)
{
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + (size_t)t * (size_t)k;
        float *yt = y + (size_t)t * (size_t)n;
        for (int j = 0; j < n; j++) {
            const float *wj = w + (size_t)j * (size_t)k;
            float a = 0.0f;
            for (int i = 0; i < k; i++)
                a = fmaf(xt[i], wj[i], a);
            float v = a + bias[j];
            if (accumulate)
                v = v + yt[j];
            yt[j] = v;
        }
        if (gelu)
            kern__enc_gelu_ref(yt, (size_t)n);
    }
}

void kern__enc_layernorm_ref(float *x, const float *w, const float *b, int64_t n, int n_tok,
                             float eps)
{
    for (int t = 0; t < n_tok; t++) {
        float *r = x + (size_t)t * (size_t)n;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < n; i++)
            mean += r[i];
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++)
            var += (r[i] - mean) * (r[i] - mean);
        double inv = 1.0 / sqrt(var / (double)n + eps);
        for (int64_t i = 0; i < n; i++)
            r[i] = (float)((r[i] - mean) * inv * w[i] + b[i]);
    }
}

void kern__enc_gelu_ref(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(0.5 * x[i] * (1.0 + erf(x[i] * 0.70710678118654752)));
}

void kern__enc_attention_ref(const float *qkv, float *out, const int32_t *start, int n_seq,
                             int n_head, int head_dim)
{
    const int H = n_head * head_dim, ld = 3 * H;
    const double scale = 1.0 / sqrt((double)head_dim);
    for (int s = 0; s < n_seq; s++) {
        int s0 = start[s], L = start[s + 1] - start[s];
        double *p = malloc((size_t)(L > 0 ? L : 1) * sizeof *p);
        if (p == NULL)
            abort();
        for (int h = 0; h < n_head; h++)
            for (int i = 0; i < L; i++) {
                const float *q = qkv + (size_t)(s0 + i) * ld + (size_t)h * head_dim;
                double mx = -INFINITY, sum = 0;
                for (int j = 0; j < L; j++) {
                    const float *k = qkv + (size_t)(s0 + j) * ld + H + (size_t)h * head_dim;
                    double d = 0;
                    for (int e = 0; e < head_dim; e++)
                        d += (double)q[e] * k[e];
                    p[j] = d * scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int j = 0; j < L; j++)
                    sum += p[j] = exp(p[j] - mx);
                float *o = out + (size_t)(s0 + i) * H + (size_t)h * head_dim;
                for (int e = 0; e < head_dim; e++) {
                    double acc = 0;
                    for (int j = 0; j < L; j++)
                        acc += p[j] * qkv[(size_t)(s0 + j) * ld + 2 * H + (size_t)h * head_dim + e];
                    o[e] = (float)(acc / sum);
                }
            }
        free(p);
    }
}
