/* fixlab's compiled CPU loops, built at first use by agents/serving/native.py with gcc -O3 -march=native -fopenmp
   -ffp-contract=off and run on the OpenMP runtime torch has already loaded (one thread pool for both), with as many
   threads as torch uses (`threads`: the process's fair share of the cores, agents/serving/cores.py).

   1. Int8Linear's rounding of its input rows and scaling of its int32 products, one pass each (int8.py).
   2. Decode attention over a KV cache kept in float16 (cpu_attention.py).

   1. is bit-equal to the eager torch ops they replace (test: tests/test_models_int8.py), so answers do not move:
   - the scale is absmax / 127.0f clamped to 1e-12f, as `rows.abs().amax(1) / 127.0` then `.clamp(min=1e-12)`;
     the absmax is taken on the bit patterns with the sign cleared (for floats that are not NaN the order of those
     integers is the order of the magnitudes), an integer max that vectorizes without -ffast-math;
   - x / scale is an IEEE division, rounded half to even by adding and subtracting 1.5 * 2^23 (exact for
     |v| < 2^22; here |v| <= 127.5), as torch.round;
   - the product is scaled as ((float)acc * xs[m]) * ws[n] + bias[n], in that order, with no fused multiply-add
     (-ffp-contract=off), as `.float().mul_(xs).mul_(scale).add_(bias)`.
*/
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDER 12582912.0f /* 1.5 * 2^23 */

static float row_scale(const float *x, int64_t k) {
    const uint32_t *bits = (const uint32_t *)x;
    uint32_t m = 0;
    for (int64_t i = 0; i < k; i++) {
        uint32_t b = bits[i] & 0x7fffffffu;
        m = b > m ? b : m;
    }
    float amax;
    memcpy(&amax, &m, sizeof amax);
    float s = amax / 127.0f;
    return s < 1e-12f ? 1e-12f : s;
}

/* x: rows of k floats, `ldx` apart; q: rows of k int8, contiguous; scales: one per row. */
void fixlab_quantize_rows(const float *x, int64_t rows, int64_t k, int64_t ldx, int8_t *q, float *scales,
                         int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * k >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        int8_t *qr = q + r * k;
        float s = row_scale(xr, k);
        scales[r] = s;
        for (int64_t i = 0; i < k; i++) {
            float v = xr[i] / s; /* one IEEE division, as torch's rows / xs */
            float t = (v + ROUNDER) - ROUNDER;
            qr[i] = (int8_t)(int32_t)t;
        }
    }
}

/* acc: rows x n int32 products, contiguous, overwritten in place by their float32 values. bias may be NULL. */
void fixlab_scale_products(int32_t *acc, int64_t rows, int64_t n, const float *xs, const float *ws,
                           const float *bias, int threads) {
    int64_t total = rows * n;
    /* columns in blocks, so that one row (decode: a few rows of 150k columns) still splits across threads */
    const int64_t block = 4096;
    int64_t blocks_per_row = (n + block - 1) / block;
#pragma omp parallel for schedule(static) num_threads(threads) if (total >= 65536)
    for (int64_t b = 0; b < rows * blocks_per_row; b++) {
        int64_t r = b / blocks_per_row, c0 = (b % blocks_per_row) * block;
        int64_t c1 = c0 + block < n ? c0 + block : n;
        int32_t *ar = acc + r * n;
        float *yr = (float *)ar;
        float s = xs[r];
        if (bias) {
            for (int64_t c = c0; c < c1; c++) {
                float p = (float)ar[c] * s;
                p = p * ws[c];
                yr[c] = p + bias[c];
            }
        } else {
            for (int64_t c = c0; c < c1; c++) {
                float p = (float)ar[c] * s;
                yr[c] = p * ws[c];
            }
        }
    }
}

/* ---- 2. decode attention ------------------------------------------------------------------------------------------

   out[b, q, h, :] = softmax_l(scale * q[b, h, q, :] . k[b, h / G, l, :]) @ v[b, h / G, l, :]
   over the columns l the mask lets query q of row b see (a NULL mask: all of them, or causally with `causal`).
   A column no query of a row may see (left padding, rejected drafts) is never read: each row costs its own length.
   K and V are float16, widened to float32 as they are read; scores, softmax and sums are float32.
   One work item is a row and a K/V head: its G query heads (and Q query positions) share each K/V read. */

typedef _Float16 half;

static inline float exp_neg(float x) {
    /* e^x for x <= 0 (x - max of a softmax), relative error about 2e-7; branch-free, so loops of it vectorize.
       x = n ln2 + r, |r| <= ln2 / 2; e^r by its degree-6 Taylor polynomial; 2^n put into the exponent bits. */
    x = x < -87.0f ? -87.0f : x;
    float n = (x * 1.44269504f + ROUNDER) - ROUNDER;
    float r = x - n * 0.693145752f; /* ln2 in two parts: exact n * hi */
    r = r - n * 1.42860677e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits;
    memcpy(&bits, &p, sizeof bits);
    bits += (int32_t)n << 23;
    memcpy(&p, &bits, sizeof p);
    return p;
}

static inline void widen(const half *s, int64_t d, float *dst) { /* exact: every float16 is a float32 */
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= d; i += 16) _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
#elif defined(__F16C__)
    for (; i + 8 <= d; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
    for (; i < d; i++) dst[i] = (float)s[i];
}

void fixlab_decode_attention(const float *q, int64_t B, int64_t H, int64_t Q, int64_t D,
                             int64_t qsb, int64_t qsh, int64_t qsq,
                             const half *k, const half *v, int64_t KV, int64_t L,
                             int64_t ksb, int64_t ksh, int64_t ksl, int64_t vsb, int64_t vsh, int64_t vsl,
                             const uint8_t *mask, int64_t msb, int64_t msq, int causal, float scale, float *out,
                             int threads) {
    const int64_t G = H / KV, GQ = G * Q;
#pragma omp parallel num_threads(threads)
    {
        float *scores = malloc((size_t)(GQ * L) * sizeof(float));
        float *acc = malloc((size_t)(GQ * D) * sizeof(float));
        float *kv = malloc((size_t)D * sizeof(float));
        uint8_t *seen = malloc((size_t)(Q * L + L));
        float *sum = malloc((size_t)GQ * sizeof(float));
#pragma omp for schedule(dynamic, 1)
        for (int64_t item = 0; item < B * KV; item++) {
            const int64_t b = item / KV, kh = item % KV;
            /* which query sees which column; any[l]: some query does */
            uint8_t *sees = seen, *any = seen + Q * L;
            for (int64_t l = 0; l < L; l++) any[l] = 0;
            for (int64_t qi = 0; qi < Q; qi++)
                for (int64_t l = 0; l < L; l++) {
                    uint8_t s = mask ? mask[b * msb + qi * msq + l] != 0 : (!causal || l <= L - Q + qi);
                    sees[qi * L + l] = s;
                    any[l] |= s;
                }
            const half *kb = k + b * ksb + kh * ksh, *vb = v + b * vsb + kh * vsh;
            for (int64_t l = 0; l < L; l++) {
                if (!any[l]) continue;
                widen(kb + l * ksl, D, kv);
                for (int64_t g = 0; g < G; g++)
                    for (int64_t qi = 0; qi < Q; qi++) {
                        float *srow = scores + (g * Q + qi) * L;
                        if (!sees[qi * L + l]) { srow[l] = -INFINITY; continue; }
                        const float *qv = q + b * qsb + (kh * G + g) * qsh + qi * qsq;
                        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                        for (int64_t d = 0; d < D; d++) dot += qv[d] * kv[d];
                        srow[l] = dot * scale;
                    }
            }
            for (int64_t r = 0; r < GQ; r++) {
                float *srow = scores + r * L;
                const int64_t qi = r % Q;
                float m = -INFINITY;
                for (int64_t l = 0; l < L; l++)
                    if (sees[qi * L + l] && srow[l] > m) m = srow[l];
                float t = 0.0f;
                if (m == -INFINITY) { /* sees nothing: zeros out, not NaN */
                    for (int64_t l = 0; l < L; l++) srow[l] = 0.0f;
                } else {
#pragma omp simd reduction(+ : t)
                    for (int64_t l = 0; l < L; l++) {
                        float e = sees[qi * L + l] ? exp_neg(srow[l] - m) : 0.0f;
                        srow[l] = e;
                        t += e;
                    }
                }
                sum[r] = t;
                for (int64_t d = 0; d < D; d++) acc[r * D + d] = 0.0f;
            }
            for (int64_t l = 0; l < L; l++) {
                if (!any[l]) continue;
                widen(vb + l * vsl, D, kv);
                for (int64_t r = 0; r < GQ; r++) {
                    const float p = scores[r * L + l];
                    float *a = acc + r * D;
#pragma omp simd
                    for (int64_t d = 0; d < D; d++) a[d] += p * kv[d];
                }
            }
            for (int64_t r = 0; r < GQ; r++) {
                const int64_t g = r / Q, qi = r % Q;
                float *o = out + ((b * Q + qi) * H + kh * G + g) * D;
                const float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
                for (int64_t d = 0; d < D; d++) o[d] = acc[r * D + d] * inv;
            }
        }
        free(scores); free(acc); free(kv); free(seen); free(sum);
    }
}
