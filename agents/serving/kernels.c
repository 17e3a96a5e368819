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
   One work item is a row and a K/V head: its G query heads (and Q query positions) share each K/V read.
   Where the CPU has AVX-512 the products and sums take the register-blocked path below (2x the portable loops on a
   2-core EPYC: benchmarks/attention.py); results agree with exact attention to about 3e-6 either way (the test:
   tests/test_kv_float16.py, every block shape). */

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

#if defined(__AVX512F__)
/* The AVX-512 path, for D a multiple of 16 up to 256 (Qwen2.5: 64 and 128): the same sums with fused multiply-adds
   and the work laid out for registers. Scores: one K row widened once, then the dot with each of the item's query
   rows (two accumulator chains each). Values: the item's probability rows in blocks of up to 6, each block's running
   sums kept in registers over every column, 64 dimensions (4 vectors) at a time. Rounding differs from the portable
   loops below in the last bits only (fused multiply-adds, another summation order). */
#define VR 6 /* query rows whose sums stay in registers: 6 x 4 vectors + 4 for V, of 32 */

static inline __attribute__((always_inline)) void values_block(const float *scores, int64_t L, const uint8_t *any,
                                                                const half *vb, int64_t vsl, int64_t d0, const int nr,
                                                                const int nc, float *acc, int64_t D) {
    __m512 a[VR][4];
    for (int r = 0; r < VR; r++)
        for (int c = 0; c < 4; c++) a[r][c] = _mm512_setzero_ps();
    for (int64_t l = 0; l < L; l++) {
        if (!any[l]) continue;
        const half *vr = vb + l * vsl + d0;
        __m512 x[4];
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++)
            if (c < nc) x[c] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(vr + 16 * c)));
#pragma GCC unroll 6
        for (int r = 0; r < VR; r++) {
            if (r >= nr) break;
            const __m512 p = _mm512_set1_ps(scores[r * L + l]);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++)
                if (c < nc) a[r][c] = _mm512_fmadd_ps(p, x[c], a[r][c]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int c = 0; c < nc; c++) _mm512_storeu_ps(acc + r * D + d0 + 16 * c, a[r][c]);
}

/* one specialisation per (rows, vectors) pair, so that the loops above unroll into registers */
#define VB(NR, NC) values_block(s, L, any, vb, vsl, d0, NR, NC, out, D)
#define VB_NC(NR) switch (nc) { case 1: VB(NR, 1); break; case 2: VB(NR, 2); break; \
                                case 3: VB(NR, 3); break; default: VB(NR, 4); } break

static void values_avx512(const float *scores, int64_t L, const uint8_t *any, const half *vb, int64_t vsl,
                          int64_t GQ, int64_t D, float *acc) {
    for (int64_t r0 = 0; r0 < GQ; r0 += VR)
        for (int64_t d0 = 0; d0 < D; d0 += 64) {
            const int nr = GQ - r0 < VR ? (int)(GQ - r0) : VR, nc = D - d0 < 64 ? (int)((D - d0) / 16) : 4;
            const float *s = scores + r0 * L;
            float *out = acc + r0 * D;
            switch (nr) {
                case 1: VB_NC(1); case 2: VB_NC(2); case 3: VB_NC(3);
                case 4: VB_NC(4); case 5: VB_NC(5); default: VB_NC(6);
            }
        }
}
#undef VB_NC
#undef VB

static void scores_avx512(const float *const *qrows, const uint8_t *sees, const uint8_t *any, int64_t Q, int64_t GQ,
                          const half *kb, int64_t ksl, int64_t L, int64_t D, float scale, float *scores) {
    const int64_t nc = D / 16;
    __m512 k[16];
    for (int64_t l = 0; l < L; l++) {
        if (!any[l]) continue;
        const half *kr = kb + l * ksl;
        for (int64_t c = 0; c < nc; c++) k[c] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(kr + 16 * c)));
        for (int64_t r = 0; r < GQ; r++) {
            float *srow = scores + r * L;
            if (!sees[(r % Q) * L + l]) { srow[l] = -INFINITY; continue; }
            const float *qv = qrows[r];
            __m512 s0 = _mm512_mul_ps(_mm512_loadu_ps(qv), k[0]), s1 = _mm512_setzero_ps();
            for (int64_t c = 1; c + 1 < nc; c += 2) {
                s1 = _mm512_fmadd_ps(_mm512_loadu_ps(qv + 16 * c), k[c], s1);
                s0 = _mm512_fmadd_ps(_mm512_loadu_ps(qv + 16 * (c + 1)), k[c + 1], s0);
            }
            if (nc % 2 == 0) s1 = _mm512_fmadd_ps(_mm512_loadu_ps(qv + 16 * (nc - 1)), k[nc - 1], s1);
            srow[l] = _mm512_reduce_add_ps(_mm512_add_ps(s0, s1)) * scale;
        }
    }
}
#endif

void fixlab_decode_attention(const float *q, int64_t B, int64_t H, int64_t Q, int64_t D,
                             int64_t qsb, int64_t qsh, int64_t qsq,
                             const half *k, const half *v, int64_t KV, int64_t L,
                             int64_t ksb, int64_t ksh, int64_t ksl, int64_t vsb, int64_t vsh, int64_t vsl,
                             const uint8_t *mask, int64_t msb, int64_t msq, int causal, float scale, float *out,
                             int threads) {
    const int64_t G = H / KV, GQ = G * Q;
#if defined(__AVX512F__)
    const int fast = D % 16 == 0 && D <= 256;
#endif
#pragma omp parallel num_threads(threads)
    {
        const float **qrows = malloc((size_t)GQ * sizeof(float *));
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
#if defined(__AVX512F__)
            if (fast) {
                for (int64_t r = 0; r < GQ; r++) qrows[r] = q + b * qsb + (kh * G + r / Q) * qsh + (r % Q) * qsq;
                scores_avx512(qrows, sees, any, Q, GQ, kb, ksl, L, D, scale, scores);
            } else
#endif
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
            }
#if defined(__AVX512F__)
            if (fast) values_avx512(scores, L, any, vb, vsl, GQ, D, acc); /* writes every sum: nothing to clear */
            else
#endif
            {
                for (int64_t i = 0; i < GQ * D; i++) acc[i] = 0.0f;
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
            }
            for (int64_t r = 0; r < GQ; r++) {
                const int64_t g = r / Q, qi = r % Q;
                float *o = out + ((b * Q + qi) * H + kh * G + g) * D;
                const float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
                for (int64_t d = 0; d < D; d++) o[d] = acc[r * D + d] * inv;
            }
        }
        free(scores); free(acc); free(kv); free(seen); free(sum); free(qrows);
    }
}
