/* fixlab's compiled CPU loops, built at first use by serving/native.py with gcc -O3 -march=native -fopenmp
   -ffp-contract=off and run on the OpenMP runtime torch has already loaded (one thread pool for both), with as many
   threads as torch uses (`threads`: the process's fair share of the cores, serving/cores.py).

   1. Int8Linear's rounding of its input rows and scaling of its int32 products, one pass each (int8.py).
   2. Attention over a KV cache kept in float16, prefill, decode and draft checks alike, each query's sums in an order
      fixed by its row's own tokens (cpu_attention.py).
   3. An int8 matmul over packed weights, exact integer sums (int8.py's fixlab kernel).
   4. A float32 matmul over packed weights whose rows do not depend on the batch (f32.py).
   5. Each row's argmax, as torch.argmax (the engine's greedy choice).
   6. The float work between a decode step's matmuls (RMSNorm's tail, rotary embedding, the MLP's product and its
      rounding), bit-equal to transformers' eager ops (fused.py).
   7. torch's multinomial draw of a seeded CPU generator (sampling.py).
   8. A decode, draft or prefix-hit prefill step's decoder layers in one call, over 1-6 (decoder.py).
   9. A registry pack's Q4_K and Q6_K weights dequantized to float32 as gguf's numpy does (gguf.py's conversion).

   1. is bit-equal to the eager torch ops they replace (test: tests/test_models_int8.py), so answers do not move:
   - the scale is absmax / 127.0f clamped to 1e-12f, as `rows.abs().amax(1) / 127.0` then `.clamp(min=1e-12)`;
     the absmax is taken on the bit patterns with the sign cleared (for floats that are not NaN the order of those
     integers is the order of the magnitudes), an integer max that vectorizes without -ffast-math;
   - x / scale is an IEEE division, rounded half to even by adding and subtracting 1.5 * 2^23 (exact for
     |v| < 2^22; here |v| <= 127.5), as torch.round;
   - the product is scaled as ((float)acc * xs[m]) * ws[n] + bias[n], in that order, with no fused multiply-add
     (-ffp-contract=off), as `.float().mul_(xs).mul_(scale).add_(bias)`.
*/
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h> /* elsewhere (ARM) only the portable loops are built */
#endif
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

/* acc: rows x n int32 products, contiguous, overwritten in place by their float32 values. bias may be NULL.
   `floats`: acc already holds the products as float32 ((float)acc, what oneDNN's int8 matmul gives with unit scales:
   the same IEEE conversion), scaled the same way. */
static void scale_rows(int32_t *acc, int floats, int64_t rows, int64_t n, const float *xs, const float *ws,
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
        if (floats) {
            if (bias) {
                for (int64_t c = c0; c < c1; c++) {
                    float p = yr[c] * s;
                    p = p * ws[c];
                    yr[c] = p + bias[c];
                }
            } else {
                for (int64_t c = c0; c < c1; c++) {
                    float p = yr[c] * s;
                    yr[c] = p * ws[c];
                }
            }
        } else if (bias) {
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

void fixlab_scale_products(int32_t *acc, int64_t rows, int64_t n, const float *xs, const float *ws,
                           const float *bias, int threads) {
    scale_rows(acc, 0, rows, n, xs, ws, bias, threads);
}

void fixlab_scale_floats(float *y, int64_t rows, int64_t n, const float *xs, const float *ws, const float *bias,
                         int threads) {
    scale_rows((int32_t *)y, 1, rows, n, xs, ws, bias, threads);
}

/* ---- 2. attention (decode, draft checks and prefill) --------------------------------------------------------------

   out[b, q, h, :] = softmax_l(scale * q[b, h, q, :] . k[b, h / G, l, :]) @ v[b, h / G, l, :]
   over the columns l the mask lets query q of row b see (a NULL mask: all of them, or causally with `causal`).
   A column no query of a row may see (left padding, rejected drafts) is never read: each row costs its own length.
   K and V are float16, widened to float32 as they are read; scores, softmax and sums are float32.
   One work item is a row and a K/V head: its G query heads (and Q query positions) share each K/V read.
   Where the CPU has AVX-512 (or AVX2 with FMA) the products and sums take the register-blocked paths below (AVX-512:
   2x the portable loops on a 2-core EPYC, benchmarks/attention.py); results agree with exact attention to about 3e-6
   on every path (the test: tests/test_kv_float16.py, every block shape, every build this CPU runs), and every build
   gives the same bits for D a multiple of 16 (canon_dot's sums, fused multiply-adds in token order for the values,
   seen_sum's fixed lanes: tests/test_determinism.py).
   Two layouts keep the CPU and memory busy at once (issue #52; benchmarks/results/attention-20261130T0724*: 1.24x at
   one query a row, 1.29x at 4, 1.53x at 16 on a 2-core Zen 4; held to AVX2 1.11x, 1.13x, 1.27x; the same bits):
   - scores take 16 columns (AVX2: 8) at once, each query row in registers against them, and the last steps of every
     dot's tree run as vertical adds over the 16 (dots16): the same additions, one shuffle where each dot took eight;
   - while an item's values are summed from L2, its thread asks for the next item's K rows (VALUES_DRIVER), so memory
     is not idle in that pass; items go to whichever thread is free, each claiming its next when it starts one. */

typedef _Float16 half;

/* Prefetching. A decode step reads the whole KV cache once (32 rows x 700 tokens: 569 MB over 28 layers), more than
   any cache holds, so each work item's K and V (about 180 KB each) come from memory. With the hardware prefetcher
   alone the kernel read them at 7.4 GB/s on the 2-core Xeon (AMX, 12-14 GB/s streaming); asking for each K row
   PF_ROWS rows ahead, for the item's V rows (into L2) while its scores are computed, and for each V row ahead in the
   values' pass: 12 GB/s, 71 -> 48 ms a step (issue #52). Prefetches change no value. */
#define PF_ROWS 32

static inline void prefetch_row(const half *p, int64_t D, int near) {
    for (int64_t o = 0; o < D * (int64_t)sizeof(half); o += 64) {
        if (near) __builtin_prefetch((const char *)p + o, 0, 3); /* into L1 */
        else __builtin_prefetch((const char *)p + o, 0, 2);      /* into L2 */
    }
}

/* while the scores read K row l: K row l + PF_ROWS, and V row l for the values' pass */
static inline void prefetch_scores(const half *kb, int64_t ksl, const half *vb, int64_t vsl, int64_t l, int64_t Lb,
                                   int64_t D) {
    if (l + PF_ROWS < Lb) prefetch_row(kb + (l + PF_ROWS) * ksl, D, 1);
    prefetch_row(vb + l * vsl, D, 0);
}

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

/* K rows l .. l + n - 1 widened into kbuf (n rows of D floats), with the scores' prefetches: a block of columns the
   vector paths' scores take at once */
static inline void widen_block(const half *kb, int64_t ksl, const half *vb, int64_t vsl, int64_t l, int n, int64_t Lb,
                               int64_t D, float *kbuf) {
    for (int j = 0; j < n; j++) {
        prefetch_scores(kb, ksl, vb, vsl, l + j, Lb, D);
        widen(kb + (l + j) * ksl, D, kbuf + j * D);
    }
}

/* The values' driver of either vector path: the item's rows in blocks of VR, the dimensions in steps of DSTEP, one
   values_block specialisation per (rows, vectors) pair, so that its loops unroll into registers. The values pass reads
   V from L2 (prefetched while the scores read K) and leaves memory idle: it asks for the next item's pkn K rows (pk,
   pksl apart) into L2 meanwhile, one a column, so that the next scores pass finds them there. */
#define VALUES_DRIVER(NAME, DSTEP, NC_OF)                                                                          \
    static void NAME(const float *scores, int64_t L, int64_t Lb, const uint8_t *any, const half *vb, int64_t vsl,  \
                     int64_t GQ, int64_t D, float *acc, const half *pk, int64_t pksl, int64_t pkn) {               \
        int64_t pf = 0;                                                                                            \
        for (int64_t r0 = 0; r0 < GQ; r0 += VR)                                                                    \
            for (int64_t d0 = 0; d0 < D; d0 += DSTEP) {                                                            \
                const int nr = GQ - r0 < VR ? (int)(GQ - r0) : VR, nc = NC_OF(D - d0);                             \
                const float *s = scores + r0 * L;                                                                  \
                float *out = acc + r0 * D;                                                                         \
                switch (nr) {                                                                                      \
                    case 1: VB_NC(1); case 2: VB_NC(2); case 3: VB_NC(3);                                          \
                    case 4: VB_NC(4); case 5: VB_NC(5); default: VB_NC(6);                                         \
                }                                                                                                  \
            }                                                                                                      \
    }

#if defined(__AVX512F__)
/* The AVX-512 path, for D a multiple of 16 up to 256 (Qwen2.5: 64 and 128): the same sums with fused multiply-adds
   and the work laid out for registers. Scores: one K row widened once, then the dot with each of the item's query
   rows (two accumulator chains each). Values: the item's probability rows in blocks of up to 6, each block's running
   sums kept in registers over every column, 64 dimensions (4 vectors) at a time. The same bits as the AVX2 path and
   the portable loops (canon_dot). */
#define VR 6 /* query rows whose sums stay in registers: 6 x 4 vectors + 4 for V, of 32 */
#define VSTEP 16 /* floats a vector */

static inline __attribute__((always_inline)) void values_block(const float *scores, int64_t L, int64_t Lb,
                                                                const uint8_t *any, const half *vb, int64_t vsl,
                                                                int64_t d0, const int nr, const int nc, float *acc,
                                                                int64_t D, const half *pk, int64_t pksl, int64_t pkn,
                                                                int64_t *pf) {
    int64_t next = *pf;
    __m512 a[VR][4];
    for (int r = 0; r < VR; r++)
        for (int c = 0; c < 4; c++) a[r][c] = _mm512_setzero_ps();
    for (int64_t l = 0; l < Lb; l++) {
        if (next < pkn) prefetch_row(pk + next++ * pksl, D, 0);
        if (!any[l]) continue;
        const half *vr = vb + l * vsl + d0;
        if (l + PF_ROWS < Lb) prefetch_row(vr + PF_ROWS * vsl, nc * VSTEP, 1);
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
    *pf = next;
}

/* one specialisation per (rows, vectors) pair, so that the loops above unroll into registers */
#define VB(NR, NC) values_block(s, L, Lb, any, vb, vsl, d0, NR, NC, out, D, pk, pksl, pkn, &pf)
#define VB_NC(NR) switch (nc) { case 1: VB(NR, 1); break; case 2: VB(NR, 2); break; \
                                case 3: VB(NR, 3); break; default: VB(NR, 4); } break
#define NC16(left) ((left) < 64 ? (int)((left) / 16) : 4) /* vectors of 16 in what is left, up to 4 */
VALUES_DRIVER(values_avx512, 64, NC16)
#undef NC16
#undef VB_NC
#undef VB

/* The 16 lanes' sum in the fixed tree every build uses (canon_dot below): lane i + lane i+8, then j + j+4, then
   k + k+2, then the two. Written out, not _mm512_reduce_add_ps, whose tree is the compiler's to choose. */
static inline float tree16(__m512 t) {
    const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(t), _mm512_extractf32x8_ps(t, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    q = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q)));
}

/* One K row's dot with a query row held in registers, up to the tree: canon_dot's two chains of 16 lanes, added. */
static inline __attribute__((always_inline)) __m512 chains16(const __m512 *q, const float *k, const int nc) {
    __m512 s0 = _mm512_mul_ps(q[0], _mm512_loadu_ps(k)), s1 = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int c = 1; c + 1 < nc; c += 2) {
        s1 = _mm512_fmadd_ps(q[c], _mm512_loadu_ps(k + 16 * c), s1);
        s0 = _mm512_fmadd_ps(q[c + 1], _mm512_loadu_ps(k + 16 * (c + 1)), s0);
    }
    if (nc % 2 == 0) s1 = _mm512_fmadd_ps(q[nc - 1], _mm512_loadu_ps(k + 16 * (nc - 1)), s1);
    return _mm512_add_ps(s0, s1);
}

/* 16 K rows' dots with one query row: each key's 16 lanes summed in tree16's tree, but as vertical adds over the
   16 keys at once (the same additions in the same order on the same values, so the same bits): lane i + lane i+8
   for two keys a vector, then i + i+4 for four, then (0 + 2) + (1 + 3) within each group of four. Lane 4c + m of
   the result holds key 4m + c; TREE_ORDER puts the keys back in order. */
static inline __attribute__((always_inline)) __m512 dots16(const __m512 *q, const float *kbuf, int64_t D, const int nc) {
    __m512 h[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        const __m512 a = chains16(q, kbuf + (2 * j) * D, nc), b = chains16(q, kbuf + (2 * j + 1) * D, nc);
        h[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    }
    __m512 f[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        f[j] = _mm512_add_ps(_mm512_shuffle_f32x4(h[2 * j], h[2 * j + 1], 0x88),
                             _mm512_shuffle_f32x4(h[2 * j], h[2 * j + 1], 0xDD));
    const __m512 u0 = _mm512_add_ps(_mm512_shuffle_ps(f[0], f[1], 0x44), _mm512_shuffle_ps(f[0], f[1], 0xEE)),
                 u1 = _mm512_add_ps(_mm512_shuffle_ps(f[2], f[3], 0x44), _mm512_shuffle_ps(f[2], f[3], 0xEE));
    const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(u0, u1, 0x88), _mm512_shuffle_ps(u0, u1, 0xDD));
    const __m512i TREE_ORDER = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
    return _mm512_permutexvar_ps(TREE_ORDER, t);
}

/* Scores of 16 columns that some query sees: the K rows widened once into kbuf, then each query row in registers
   against all 16 (its unseen columns -inf, as the column-at-a-time loop writes them). */
static inline __attribute__((always_inline)) void scores_block16(const float *const *qrows, const uint8_t *sees,
                                                                  int64_t Q, int64_t GQ, const half *kb, int64_t ksl,
                                                                  const half *vb, int64_t vsl, int64_t l, int64_t Lb,
                                                                  int64_t L, int64_t D, float scale, float *kbuf,
                                                                  float *scores, const int nc) {
    widen_block(kb, ksl, vb, vsl, l, 16, Lb, D, kbuf);
    const __m512 sc = _mm512_set1_ps(scale), ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t r = 0; r < GQ; r++) {
        const uint8_t *sr = sees + (r % Q) * L + l;
        __mmask16 seen = 0;
        for (int j = 0; j < 16; j++) seen |= (__mmask16)((sr[j] != 0) << j);
        float *out = scores + r * L + l;
        if (!seen) { _mm512_storeu_ps(out, ninf); continue; }
        __m512 q[16];
#pragma GCC unroll 16
        for (int c = 0; c < nc; c++) q[c] = _mm512_loadu_ps(qrows[r] + 16 * c);
        const __m512 d = _mm512_mul_ps(dots16(q, kbuf, D, nc), sc);
        _mm512_storeu_ps(out, _mm512_mask_blend_ps(seen, ninf, d));
    }
}

static void scores_avx512(const float *const *qrows, const uint8_t *sees, const uint8_t *any, int64_t Q, int64_t GQ,
                          const half *kb, int64_t ksl, const half *vb, int64_t vsl, int64_t Lb, int64_t L, int64_t D,
                          float scale, float *scores) {
    const int64_t nc = D / 16;
    __m512 k[16];
    float kbuf[16 * 128];
    for (int64_t l = 0; l < Lb;) {
        if ((nc == 8 || nc == 4) && l + 16 <= Lb) { /* a block of 16 columns every query may need: in one pass */
            int all = 1;
            for (int j = 0; j < 16; j++) all &= any[l + j];
            if (all) {
                if (nc == 8) scores_block16(qrows, sees, Q, GQ, kb, ksl, vb, vsl, l, Lb, L, D, scale, kbuf, scores, 8);
                else scores_block16(qrows, sees, Q, GQ, kb, ksl, vb, vsl, l, Lb, L, D, scale, kbuf, scores, 4);
                l += 16;
                continue;
            }
        }
        if (!any[l]) { l++; continue; }
        const half *kr = kb + l * ksl;
        prefetch_scores(kb, ksl, vb, vsl, l, Lb, D);
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
            srow[l] = tree16(_mm512_add_ps(s0, s1)) * scale;
        }
        l++;
    }
}
#define FAST_D(D) ((D) % 16 == 0 && (D) <= 256)
#define FAST_SCORES scores_avx512
#define FAST_VALUES values_avx512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* The AVX2 path (AMD Zen 2/3, Intel before Ice Lake), for D a multiple of 16: the same layout with 8-float vectors
   and 16 registers. Values: blocks of up to 6 probability rows x 16 dimensions (12 sums + 2 V vectors + 1 broadcast).
   Scores: one K row widened once into a buffer, its dot with each query row as the AVX-512 path's 16 lanes. */
#define VR 6
#define VSTEP 8

static inline __attribute__((always_inline)) void values_block(const float *scores, int64_t L, int64_t Lb,
                                                                const uint8_t *any, const half *vb, int64_t vsl,
                                                                int64_t d0, const int nr, const int nc, float *acc,
                                                                int64_t D, const half *pk, int64_t pksl, int64_t pkn,
                                                                int64_t *pf) {
    int64_t next = *pf;
    __m256 a[VR][2];
#pragma GCC unroll 6
    for (int r = 0; r < VR; r++)
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++) a[r][c] = _mm256_setzero_ps();
    for (int64_t l = 0; l < Lb; l++) {
        if (next < pkn) prefetch_row(pk + next++ * pksl, D, 0);
        if (!any[l]) continue;
        const half *vr = vb + l * vsl + d0;
        if (l + PF_ROWS < Lb) prefetch_row(vr + PF_ROWS * vsl, nc * VSTEP, 1);
        const __m256 x0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)vr));
        const __m256 x1 = nc > 1 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(vr + 8))) : x0;
#pragma GCC unroll 6
        for (int r = 0; r < VR; r++) {
            if (r < nr) {
                const __m256 p = _mm256_set1_ps(scores[r * L + l]);
                a[r][0] = _mm256_fmadd_ps(p, x0, a[r][0]);
                if (nc > 1) a[r][1] = _mm256_fmadd_ps(p, x1, a[r][1]);
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < VR; r++)
#pragma GCC unroll 2
        for (int c = 0; c < 2; c++)
            if (r < nr && c < nc) _mm256_storeu_ps(acc + r * D + d0 + 8 * c, a[r][c]);
    *pf = next;
}

#define VB(NR, NC) values_block(s, L, Lb, any, vb, vsl, d0, NR, NC, out, D, pk, pksl, pkn, &pf)
#define VB_NC(NR) if (nc == 1) VB(NR, 1); else VB(NR, 2); break
#define NC8(left) ((left) < 16 ? 1 : 2) /* vectors of 8 in what is left, up to 2 */
VALUES_DRIVER(values_avx2, 16, NC8)
#undef NC8
#undef VB_NC
#undef VB

/* One K row's dot with a query row held in registers (nc blocks of 16 floats, each as two halves), up to the tree:
   the AVX-512 path's chains lane for lane (canon_dot), then lane i + lane i+8, the tree's first level. */
static inline __attribute__((always_inline)) __m256 halves8(const __m256 *q, const float *k, const int nc) {
    __m256 s0a = _mm256_mul_ps(q[0], _mm256_loadu_ps(k)), s0b = _mm256_mul_ps(q[1], _mm256_loadu_ps(k + 8)),
           s1a = _mm256_setzero_ps(), s1b = _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int c = 1; c + 1 < nc; c += 2) {
        s1a = _mm256_fmadd_ps(q[2 * c], _mm256_loadu_ps(k + 16 * c), s1a);
        s1b = _mm256_fmadd_ps(q[2 * c + 1], _mm256_loadu_ps(k + 16 * c + 8), s1b);
        s0a = _mm256_fmadd_ps(q[2 * c + 2], _mm256_loadu_ps(k + 16 * c + 16), s0a);
        s0b = _mm256_fmadd_ps(q[2 * c + 3], _mm256_loadu_ps(k + 16 * c + 24), s0b);
    }
    if (nc % 2 == 0) {
        s1a = _mm256_fmadd_ps(q[2 * nc - 2], _mm256_loadu_ps(k + 16 * (nc - 1)), s1a);
        s1b = _mm256_fmadd_ps(q[2 * nc - 1], _mm256_loadu_ps(k + 16 * (nc - 1) + 8), s1b);
    }
    return _mm256_add_ps(_mm256_add_ps(s0a, s1a), _mm256_add_ps(s0b, s1b));
}

/* 8 K rows' dots with one query row, the rest of the tree as vertical adds over the 8 keys (as dots16): lane i + i+4
   for two keys a vector, then (0 + 2) + (1 + 3). Lane 4c + m of the result holds key 2m + c. */
static inline __attribute__((always_inline)) __m256 dots8(const __m256 *q, const float *kbuf, int64_t D, const int nc) {
    __m256 r[4];
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) {
        const __m256 a = halves8(q, kbuf + (2 * j) * D, nc), b = halves8(q, kbuf + (2 * j + 1) * D, nc);
        r[j] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    }
    const __m256 u0 = _mm256_add_ps(_mm256_shuffle_ps(r[0], r[1], 0x44), _mm256_shuffle_ps(r[0], r[1], 0xEE)),
                 u1 = _mm256_add_ps(_mm256_shuffle_ps(r[2], r[3], 0x44), _mm256_shuffle_ps(r[2], r[3], 0xEE));
    const __m256 t = _mm256_add_ps(_mm256_shuffle_ps(u0, u1, 0x88), _mm256_shuffle_ps(u0, u1, 0xDD));
    return _mm256_permutevar8x32_ps(t, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* Scores of 8 columns some query sees, as scores_block16 */
static inline __attribute__((always_inline)) void scores_block8(const float *const *qrows, const uint8_t *sees,
                                                                 int64_t Q, int64_t GQ, const half *kb, int64_t ksl,
                                                                 const half *vb, int64_t vsl, int64_t l, int64_t Lb,
                                                                 int64_t L, int64_t D, float scale, float *kbuf,
                                                                 float *scores, const int nc) {
    widen_block(kb, ksl, vb, vsl, l, 8, Lb, D, kbuf);
    const __m256 sc = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t r = 0; r < GQ; r++) {
        const uint8_t *sr = sees + (r % Q) * L + l;
        int64_t eight;
        memcpy(&eight, sr, 8);
        float *out = scores + r * L + l;
        if (!eight) { _mm256_storeu_ps(out, ninf); continue; }
        const __m256i seen = _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(eight)), _mm256_setzero_si256());
        __m256 q[16];
#pragma GCC unroll 16
        for (int c = 0; c < 2 * nc; c++) q[c] = _mm256_loadu_ps(qrows[r] + 8 * c);
        const __m256 d = _mm256_mul_ps(dots8(q, kbuf, D, nc), sc);
        _mm256_storeu_ps(out, _mm256_blendv_ps(ninf, d, _mm256_castsi256_ps(seen)));
    }
}

static void scores_avx2(const float *const *qrows, const uint8_t *sees, const uint8_t *any, int64_t Q, int64_t GQ,
                        const half *kb, int64_t ksl, const half *vb, int64_t vsl, int64_t Lb, int64_t L, int64_t D,
                        float scale, float *scores) {
    /* the AVX-512 path's sums lane for lane (canon_dot): each 16-float block as two 8-float halves, the same
       chains and the same tree, so both builds give the same bits */
    float k[256];
    float kbuf[8 * 128];
    const int64_t nc = D / 16;
    for (int64_t l = 0; l < Lb; l++) {
        if ((nc == 4 || nc == 8) && l + 8 <= Lb) { /* a block of 8 columns every query may need: in one pass */
            int all = 1;
            for (int j = 0; j < 8; j++) all &= any[l + j];
            if (all) {
                if (nc == 8) scores_block8(qrows, sees, Q, GQ, kb, ksl, vb, vsl, l, Lb, L, D, scale, kbuf, scores, 8);
                else scores_block8(qrows, sees, Q, GQ, kb, ksl, vb, vsl, l, Lb, L, D, scale, kbuf, scores, 4);
                l += 7;
                continue;
            }
        }
        if (!any[l]) continue;
        prefetch_scores(kb, ksl, vb, vsl, l, Lb, D);
        widen(kb + l * ksl, D, k);
        for (int64_t r = 0; r < GQ; r++) {
            float *srow = scores + r * L;
            if (!sees[(r % Q) * L + l]) { srow[l] = -INFINITY; continue; }
            const float *qv = qrows[r];
            __m256 s0a = _mm256_mul_ps(_mm256_loadu_ps(qv), _mm256_loadu_ps(k)),
                   s0b = _mm256_mul_ps(_mm256_loadu_ps(qv + 8), _mm256_loadu_ps(k + 8)),
                   s1a = _mm256_setzero_ps(), s1b = _mm256_setzero_ps();
            for (int64_t c = 1; c + 1 < nc; c += 2) {
                const int64_t d1 = 16 * c, d2 = 16 * (c + 1);
                s1a = _mm256_fmadd_ps(_mm256_loadu_ps(qv + d1), _mm256_loadu_ps(k + d1), s1a);
                s1b = _mm256_fmadd_ps(_mm256_loadu_ps(qv + d1 + 8), _mm256_loadu_ps(k + d1 + 8), s1b);
                s0a = _mm256_fmadd_ps(_mm256_loadu_ps(qv + d2), _mm256_loadu_ps(k + d2), s0a);
                s0b = _mm256_fmadd_ps(_mm256_loadu_ps(qv + d2 + 8), _mm256_loadu_ps(k + d2 + 8), s0b);
            }
            if (nc % 2 == 0) {
                const int64_t d1 = 16 * (nc - 1);
                s1a = _mm256_fmadd_ps(_mm256_loadu_ps(qv + d1), _mm256_loadu_ps(k + d1), s1a);
                s1b = _mm256_fmadd_ps(_mm256_loadu_ps(qv + d1 + 8), _mm256_loadu_ps(k + d1 + 8), s1b);
            }
            const __m256 h = _mm256_add_ps(_mm256_add_ps(s0a, s1a), _mm256_add_ps(s0b, s1b));
            __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
            q = _mm_add_ps(q, _mm_movehl_ps(q, q));
            srow[l] = _mm_cvtss_f32(_mm_add_ss(q, _mm_movehdup_ps(q))) * scale;
        }
    }
}
#define FAST_D(D) ((D) % 16 == 0 && (D) <= 256)
#define FAST_SCORES scores_avx2
#define FAST_VALUES values_avx2
#endif

/* q . k as every build computes it, so that the AVX-512, AVX2 and portable builds give the same bits: D in blocks of
   16 lanes; lane i of chain 0 starts with block 0's product and takes the even blocks, chain 1 the odd ones (and the
   last block when their count is even), one fused multiply-add each; then the two chains add, and the 16 lanes in a
   fixed tree (tree16). D not a multiple of 16: one chain in order. */
static float canon_dot(const float *q, const float *k, int64_t D) {
    if (D % 16) {
        float s = 0.0f;
        for (int64_t d = 0; d < D; d++) s = fmaf(q[d], k[d], s);
        return s;
    }
    const int64_t nc = D / 16;
    float s0[16], s1[16], t[16];
    for (int i = 0; i < 16; i++) { s0[i] = q[i] * k[i]; s1[i] = 0.0f; }
    for (int64_t c = 1; c + 1 < nc; c += 2)
        for (int i = 0; i < 16; i++) {
            s1[i] = fmaf(q[16 * c + i], k[16 * c + i], s1[i]);
            s0[i] = fmaf(q[16 * (c + 1) + i], k[16 * (c + 1) + i], s0[i]);
        }
    if (nc % 2 == 0)
        for (int i = 0; i < 16; i++) s1[i] = fmaf(q[16 * (nc - 1) + i], k[16 * (nc - 1) + i], s1[i]);
    for (int i = 0; i < 16; i++) t[i] = s0[i] + s1[i];
    float h[8], qq[4];
    for (int i = 0; i < 8; i++) h[i] = t[i] + t[i + 8];
    for (int i = 0; i < 4; i++) qq[i] = h[i] + h[i + 4];
    return (qq[0] + qq[2]) + (qq[1] + qq[3]);
}

/* A row's softmax sum over the columns its query sees, in a fixed order: the i-th seen column (= the i-th token of the
   row's sequence) goes to lane i % 16, and the 16 lanes add up in one fixed tree. So the sum, and the answer, depend
   on the row's own tokens only: not on its left padding, rejected drafts' columns, the batch's width, the other query
   positions computed beside it (prefill, drafts, decode), or the build (the lanes are plain floats, the same on every
   instruction set). */
static float seen_sum(const float *e, const uint8_t *sees, int64_t L) {
    float lane[16] = {0};
    int64_t first = 0, last = L - 1, n = 0;
    while (first < L && !sees[first]) first++;
    while (last >= first && !sees[last]) last--;
    for (int64_t l = first; l <= last; l++) n += sees[l];
    if (n == last - first + 1) { /* contiguous (left padding only): the lanes as a vector loop */
        const float *x = e + first;
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            for (int c = 0; c < 16; c++) lane[c] += x[i + c];
        for (int c = 0; i + c < n; c++) lane[c] += x[i + c];
    } else {
        int64_t j = 0;
        for (int64_t l = first; l <= last; l++)
            if (sees[l]) { lane[j & 15] += e[l]; j++; }
    }
    float h[8], q[4];
    for (int c = 0; c < 8; c++) h[c] = lane[c] + lane[c + 8];
    for (int c = 0; c < 4; c++) q[c] = h[c] + h[c + 4];
    return (q[0] + q[2]) + (q[1] + q[3]);
}

/* The largest score a query sees (-inf: none), as `if (sees[l] && s[l] > m) m = s[l]` over l gives it; the vector
   form keeps the running value on ties and NaNs as that loop does (max's second operand), and a maximum is the same
   whatever the order. Unseen columns are never read (a column no query sees was never written). */
static float seen_max(const float *s, const uint8_t *sees, int64_t L) {
    float m = -INFINITY;
    int64_t l = 0;
#if defined(__AVX512BW__) && defined(__AVX512VL__)
    __m512 mv = _mm512_set1_ps(-INFINITY);
    for (; l + 16 <= L; l += 16) {
        const __m128i b = _mm_loadu_si128((const __m128i *)(sees + l));
        mv = _mm512_mask_max_ps(mv, _mm_test_epi8_mask(b, b), _mm512_loadu_ps(s + l), mv);
    }
    float lanes[16];
    _mm512_storeu_ps(lanes, mv);
    for (int i = 0; i < 16; i++)
        if (lanes[i] > m) m = lanes[i];
#elif defined(__AVX2__)
    __m256 mv = _mm256_set1_ps(-INFINITY);
    for (; l + 8 <= L; l += 8) {
        int64_t eight;
        memcpy(&eight, sees + l, 8);
        const __m256i seen = _mm256_cmpgt_epi32(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(eight)), _mm256_setzero_si256());
        mv = _mm256_blendv_ps(mv, _mm256_max_ps(_mm256_loadu_ps(s + l), mv), _mm256_castsi256_ps(seen));
    }
    float lanes[8];
    _mm256_storeu_ps(lanes, mv);
    for (int i = 0; i < 8; i++)
        if (lanes[i] > m) m = lanes[i];
#endif
    for (; l < L; l++)
        if (sees[l] && s[l] > m) m = s[l];
    return m;
}

/* Query positions per work item: a long prefill splits into blocks, so threads share it and the scores buffer stays
   small; every query's numbers are the same whichever block it is in. */
#define QBLOCK 16

void fixlab_decode_attention(const float *q, int64_t B, int64_t H, int64_t Q, int64_t D,
                             int64_t qsb, int64_t qsh, int64_t qsq,
                             const half *k, const half *v, int64_t KV, int64_t L,
                             int64_t ksb, int64_t ksh, int64_t ksl, int64_t vsb, int64_t vsh, int64_t vsl,
                             const uint8_t *mask, int64_t msb, int64_t msq, int causal, float scale,
                             const uint8_t *real, float *out, int threads) {
    const int64_t G = H / KV, QB = Q < QBLOCK ? Q : QBLOCK, nqb = (Q + QB - 1) / QB, GQB = G * QB;
#if defined(FAST_D)
    const int fast = FAST_D(D);
#endif
    int64_t claimed = 0; /* items taken so far, by either thread */
#pragma omp parallel num_threads(threads)
    {
        const float **qrows = malloc((size_t)GQB * sizeof(float *));
        float *scores = malloc((size_t)(GQB * L) * sizeof(float));
        float *acc = malloc((size_t)(GQB * D) * sizeof(float));
        float *kv = malloc((size_t)D * sizeof(float));
        uint8_t *seen = malloc((size_t)(QB * L + L));
        float *sum = malloc((size_t)GQB * sizeof(float));
        /* Items go to whichever thread is free (rows differ in length), each thread taking its next item when it starts
           one, so that the next item's K rows can be fetched while this one's values are summed (memory is idle then) */
        const int64_t items = B * KV * nqb;
        for (int64_t item = __atomic_fetch_add(&claimed, 1, __ATOMIC_RELAXED), next = 0; item < items; item = next) {
            next = __atomic_fetch_add(&claimed, 1, __ATOMIC_RELAXED);
            const int64_t b = item / (KV * nqb), kh = (item / nqb) % KV, q0 = (item % nqb) * QB;
            const int64_t Qall = Q - q0 < QB ? Q - q0 : QB;
            /* which query sees which column; any[l]: some query does. A causal block sees nothing past its last
               query, so the columns after it are never read */
            uint8_t *sees = seen, *any = seen + QB * L;
            const int64_t Lb = mask || !causal ? L : L - Q + q0 + Qall;
            /* real (B x Q flags, or NULL: all): the caller's padding positions (a shorter draft's, a grouped
               prefill's) get zeros and are not computed. Their values are never read (the int8 matmuls skip them too,
               int8.only_rows), and the real queries' numbers do not depend on which others share their block. */
            int64_t qidx[QBLOCK], Qn = 0;
            for (int64_t qi = 0; qi < Qall; qi++) {
                if (!real || real[b * Q + q0 + qi]) qidx[Qn++] = qi;
                else
                    for (int64_t h = 0; h < G; h++) {
                        float *o = out + ((b * Q + q0 + qi) * H + kh * G + h) * D;
                        for (int64_t d = 0; d < D; d++) o[d] = 0.0f;
                    }
            }
            if (Qn == 0) continue;
            const int64_t GQ = G * Qn;
            for (int64_t l = 0; l < Lb; l++) any[l] = 0;
            for (int64_t j = 0; j < Qn; j++)
                for (int64_t l = 0; l < Lb; l++) {
                    const int64_t qi = qidx[j];
                    uint8_t s = mask ? mask[b * msb + (q0 + qi) * msq + l] != 0 : (!causal || l <= L - Q + q0 + qi);
                    sees[j * L + l] = s;
                    any[l] |= s;
                }
            const half *kb = k + b * ksb + kh * ksh, *vb = v + b * vsb + kh * vsh;
            const float *qbase = q + b * qsb + q0 * qsq;
#if defined(FAST_D)
            if (fast) {
                for (int64_t r = 0; r < GQ; r++) qrows[r] = qbase + (kh * G + r / Qn) * qsh + qidx[r % Qn] * qsq;
                FAST_SCORES(qrows, sees, any, Qn, GQ, kb, ksl, vb, vsl, Lb, L, D, scale, scores);
            } else
#endif
            for (int64_t l = 0; l < Lb; l++) {
                if (!any[l]) continue;
                prefetch_scores(kb, ksl, vb, vsl, l, Lb, D);
                widen(kb + l * ksl, D, kv);
                for (int64_t g = 0; g < G; g++)
                    for (int64_t qi = 0; qi < Qn; qi++) {
                        float *srow = scores + (g * Qn + qi) * L;
                        if (!sees[qi * L + l]) { srow[l] = -INFINITY; continue; }
                        const float *qv = qbase + (kh * G + g) * qsh + qidx[qi] * qsq;
                        srow[l] = canon_dot(qv, kv, D) * scale;
                    }
            }
            for (int64_t r = 0; r < GQ; r++) {
                float *srow = scores + r * L;
                const uint8_t *sr = sees + (r % Qn) * L;
                const float m = seen_max(srow, sr, Lb);
                if (m == -INFINITY) { /* sees nothing: zeros out, not NaN */
                    for (int64_t l = 0; l < Lb; l++) srow[l] = 0.0f;
                    sum[r] = 0.0f;
                    continue;
                }
#pragma omp simd
                for (int64_t l = 0; l < Lb; l++) srow[l] = sr[l] ? exp_neg(srow[l] - m) : 0.0f;
                sum[r] = seen_sum(srow, sr, Lb);
            }
#if defined(FAST_D)
            if (fast) { /* writes every sum: nothing to clear */
                const half *pk = NULL;
                int64_t pkn = 0;
                if (next < items) { /* the next item's K rows from its first column its first query sees */
                    const int64_t nb = next / (KV * nqb), nq0 = (next % nqb) * QB;
                    const int64_t nLb = mask || !causal ? L : L - Q + nq0 + (Q - nq0 < QB ? Q - nq0 : QB);
                    int64_t first = 0;
                    if (mask)
                        while (first < nLb && !mask[nb * msb + nq0 * msq + first]) first++;
                    pk = k + nb * ksb + ((next / nqb) % KV) * ksh + first * ksl;
                    pkn = nLb - first;
                }
                FAST_VALUES(scores, L, Lb, any, vb, vsl, GQ, D, acc, pk, ksl, pkn);
            }
            else
#endif
            {
                for (int64_t i = 0; i < GQ * D; i++) acc[i] = 0.0f;
                for (int64_t l = 0; l < Lb; l++) {
                    if (!any[l]) continue;
                    if (l + PF_ROWS < Lb) prefetch_row(vb + (l + PF_ROWS) * vsl, D, 1);
                    widen(vb + l * vsl, D, kv);
                    for (int64_t r = 0; r < GQ; r++) {
                        const float p = scores[r * L + l];
                        float *a = acc + r * D;
                        for (int64_t d = 0; d < D; d++) a[d] = fmaf(p, kv[d], a[d]); /* as the vector paths */
                    }
                }
            }
            for (int64_t r = 0; r < GQ; r++) {
                const int64_t g = r / Qn, qi = qidx[r % Qn];
                float *o = out + ((b * Q + q0 + qi) * H + kh * G + g) * D;
                const float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
                for (int64_t d = 0; d < D; d++) o[d] = acc[r * D + d] * inv;
            }
        }
        free(scores); free(acc); free(kv); free(seen); free(sum); free(qrows);
    }
}

/* ---- 3. int8 matmul over packed weights -------------------------------------------------------------------------

   y[m, n] = ((float)sum_k x[m, k] * w[n, k] * xs[m]) * ws[n] + bias[n], the same values as Int8Linear's
   torch._int_mm path (the integer sums are exact, the scaling is the same IEEE operations in the same order), for
   CPUs where torch._int_mm is slow (on AVX2-only CPUs it is a reference loop: 11-31x slower than float32).
   x and w hold values in [-127, 127] (Int8Linear rounds to that range), so no product or partial sum below can
   saturate or overflow: |sum| <= K * 127 * 255 < 2^31 for K < 66,000.

   Weights are packed once (fixlab_int8_pack) into panels of PANEL output columns; within a panel, for each group of
   KG consecutive k, the PANEL columns' KG values lie side by side: [panel][k / KG][PANEL][KG], K padded with zeros
   to a multiple of 4 and the last panel's missing columns zero. Each instruction set has its own panel:
   - AVX-512 VNNI: vpdpbusd multiplies unsigned by signed bytes, four k at a time into int32 lanes, 64 products an
     instruction. x is offset to unsigned (x + 128) and 128 * (the column's weight sum) taken off at the end: exact.
     A tile is 8 rows x 48 columns: 24 accumulators of the 32 registers.
   - AVX2: no unsigned-by-signed product without 16-bit saturation for our range (vpmaddubsw saturates pairs at 255 *
     127 * 2), so bytes are widened to int16 and vpmaddwd sums pairs of k into int32 (exact); 16 products an
     instruction. A tile is 4 rows x 24 columns: 12 accumulators of the 16 registers.
   - elsewhere (ARM...): the same packing and plain loops the compiler vectorizes.
   The work is split across threads by panels; every tile reads its panel from cache for each block of rows, and
   the first tiles ask for the next panel's weights ahead. */

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define GEMM_ISA "avx512vnni"
#define PANEL 48
#define KG 4
#define MR 8
#define XCOPIES 1
#elif defined(__AVX2__)
#define GEMM_ISA "avx2"
#define PANEL 24
#define KG 4
#define MR 3
#define XCOPIES 2 /* each row of x twice: its values, then their magnitudes */
#else
#define GEMM_ISA "portable"
#define PANEL 16
#define KG 4
#define MR 4
#define XCOPIES 1
#endif

/* Panels a thread takes at a time (fixlab_int8_matmul). Threads take chunks as they free up, not fixed halves: on
   2 cores, a sandbox run or the job's other Python preempting one thread left the other spinning at the barrier
   until it caught up, so every millisecond taken from one core cost the step two (benchmarks/turns.py under a load
   of 2 ms bursts). At least 4 panels where there are enough, so that the next panel's weights, asked for ahead, are
   mostly this thread's; fewer where 4 would leave a thread without its share. */
static inline int64_t chunk_of(int64_t iters, int threads) {
    const int64_t fine = iters / (8 * threads), fair = iters / (2 * threads);
    return fine > 4 ? fine : fair > 4 ? 4 : fair > 1 ? fair : 1;
}
/* row blocks of a panel that share the asking for the next panel's weights (fixlab_int8_matmul) */
#define PF_TILES 4

const char *fixlab_gemm_isa(void) { return GEMM_ISA; }
int64_t fixlab_gemm_panel(void) { return PANEL; }

static inline int64_t pad4(int64_t k) { return (k + 3) / 4 * 4; }

/* Bytes of the packed matrix for N x K weights. */
int64_t fixlab_int8_packed_size(int64_t n, int64_t k) { return (n + PANEL - 1) / PANEL * PANEL * pad4(k); }

/* w: N x K int8, rows contiguous (`ldw` apart). packed: fixlab_int8_packed_size bytes. colsum: N int32 (the weight
   sums the VNNI path takes off; filled on every path). */
void fixlab_int8_pack(const int8_t *w, int64_t n, int64_t k, int64_t ldw, int8_t *packed, int32_t *colsum,
                      int threads) {
    const int64_t kp = pad4(k), panels = (n + PANEL - 1) / PANEL;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < panels; p++) {
        int8_t *dst = packed + p * PANEL * kp;
        for (int64_t g = 0; g < kp / KG; g++)
            for (int64_t c = 0; c < PANEL; c++)
                for (int64_t j = 0; j < KG; j++) {
                    const int64_t col = p * PANEL + c, kk = g * KG + j;
                    dst[(g * PANEL + c) * KG + j] = col < n && kk < k ? w[col * ldw + kk] : 0;
                }
        for (int64_t c = 0; c < PANEL && p * PANEL + c < n; c++) {
            int32_t s = 0;
            for (int64_t kk = 0; kk < k; kk++) s += w[(p * PANEL + c) * ldw + kk];
            colsum[p * PANEL + c] = s;
        }
    }
}

/* One tile's int32 sums as floats: ((float)acc * xs[m]) * ws[n] + bias[n], in that order (as the eager ops). */
static inline void store_tile(const int32_t *acc, int mr, int64_t n0, int64_t n, const float *xs, const float *ws,
                              const float *bias, float *y, int64_t ldy) {
    const int64_t cols = n - n0 < PANEL ? n - n0 : PANEL;
    for (int r = 0; r < mr; r++) {
        const float s = xs[r];
        float *yr = y + r * ldy + n0;
        const int32_t *ar = acc + r * PANEL;
        int64_t c = 0;
#if defined(__AVX512F__)
        for (; c + 16 <= cols; c += 16) {
            __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(ar + c)), _mm512_set1_ps(s));
            p = _mm512_mul_ps(p, _mm512_loadu_ps(ws + n0 + c));
            if (bias) p = _mm512_add_ps(p, _mm512_loadu_ps(bias + n0 + c));
            _mm512_storeu_ps(yr + c, p);
        }
#elif defined(__AVX2__)
        for (; c + 8 <= cols; c += 8) {
            __m256 p = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_loadu_si256((const __m256i *)(ar + c))),
                                     _mm256_set1_ps(s));
            p = _mm256_mul_ps(p, _mm256_loadu_ps(ws + n0 + c));
            if (bias) p = _mm256_add_ps(p, _mm256_loadu_ps(bias + n0 + c));
            _mm256_storeu_ps(yr + c, p);
        }
#endif
        for (; c < cols; c++) {
            float p = (float)ar[c] * s;
            p = p * ws[n0 + c];
            yr[c] = bias ? p + bias[n0 + c] : p;
        }
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* xu: rows of kp bytes (x + 128); wp: one panel. acc: mr x PANEL int32, the exact sums x . w.
   The 24 sums are named variables, not an array: GCC kept an array of them on the stack (spilled every step). */
/* vpdpbusd adds into its destination; through the intrinsic GCC 12 copied every sum out and back each step, so the
   instruction is written with the sum as an in-out operand */
static inline __attribute__((always_inline)) __m512i dpbusd(__m512i acc, __m512i u8, __m512i s8) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u8), "v"(s8));
    return acc;
}
#define Z3(r) __m512i a##r##0 = _mm512_setzero_si512(), a##r##1 = a##r##0, a##r##2 = a##r##0
#define DP(r) if (mr > r) { \
        int32_t four; memcpy(&four, xu + r * kp + 4 * g, 4); const __m512i b = _mm512_set1_epi32(four); \
        a##r##0 = dpbusd(a##r##0, b, w0); a##r##1 = dpbusd(a##r##1, b, w1); a##r##2 = dpbusd(a##r##2, b, w2); }
#define ST(r) if (mr > r) { \
        _mm512_storeu_si512(acc + r * PANEL, _mm512_sub_epi32(a##r##0, o0)); \
        _mm512_storeu_si512(acc + r * PANEL + 16, _mm512_sub_epi32(a##r##1, o1)); \
        _mm512_storeu_si512(acc + r * PANEL + 32, _mm512_sub_epi32(a##r##2, o2)); }
static inline __attribute__((always_inline)) void tile(const uint8_t *xu, int64_t kp, const int mr, const int8_t *wp,
                                                       const int32_t *colsum, int64_t n0, int64_t n, int32_t *acc,
                                                       const char *pf, int64_t pstep) {
    Z3(0); Z3(1); Z3(2); Z3(3); Z3(4); Z3(5); Z3(6); Z3(7);
    for (int64_t g = 0; g < kp / 4; g++) {
        const __m512i w0 = _mm512_loadu_si512(wp + g * 192), w1 = _mm512_loadu_si512(wp + g * 192 + 64),
                      w2 = _mm512_loadu_si512(wp + g * 192 + 128);
        if (pf) for (int64_t o = 0; o < pstep; o += 64) __builtin_prefetch(pf + g * pstep + o, 0, 2);
        DP(0) DP(1) DP(2) DP(3) DP(4) DP(5) DP(6) DP(7)
    }
    int32_t off[PANEL];
    for (int c = 0; c < PANEL; c++) off[c] = n0 + c < n ? colsum[n0 + c] * 128 : 0;
    const __m512i o0 = _mm512_loadu_si512(off), o1 = _mm512_loadu_si512(off + 16), o2 = _mm512_loadu_si512(off + 32);
    ST(0) ST(1) ST(2) ST(3) ST(4) ST(5) ST(6) ST(7)
}
#undef Z3
#undef DP
#undef ST
typedef uint8_t xelem;
static inline xelem to_x(int8_t v) { return (uint8_t)(v + 128); }
#elif defined(__AVX2__)
/* xs8: rows of 2 kp bytes, x then |x|; wp: one panel. vpmaddubsw multiplies unsigned by signed bytes and adds pairs
   into int16, saturating: |x| (unsigned) times w with x's sign (vpsignb) keeps every pair within 2 * 127 * 127 =
   32,258, so nothing saturates; vpmaddwd by ones then adds the pairs into int32. 4 instructions a 32 products (the
   int16 widening this replaced took 4.5). 9 named sums of 16 registers. */
#define Z3(r) __m256i a##r##0 = _mm256_setzero_si256(), a##r##1 = a##r##0, a##r##2 = a##r##0
#define MUL(r, c) _mm256_madd_epi16(_mm256_maddubs_epi16(xa, _mm256_sign_epi8(w##c, xb)), ones)
#define DP(r) if (mr > r) { \
        int32_t four, mag; memcpy(&four, xs8 + r * 2 * kp + 4 * g, 4); memcpy(&mag, xs8 + r * 2 * kp + kp + 4 * g, 4); \
        const __m256i xb = _mm256_set1_epi32(four), xa = _mm256_set1_epi32(mag); \
        a##r##0 = _mm256_add_epi32(a##r##0, MUL(r, 0)); \
        a##r##1 = _mm256_add_epi32(a##r##1, MUL(r, 1)); \
        a##r##2 = _mm256_add_epi32(a##r##2, MUL(r, 2)); }
#define ST(r) if (mr > r) { \
        _mm256_storeu_si256((__m256i *)(acc + r * PANEL), a##r##0); \
        _mm256_storeu_si256((__m256i *)(acc + r * PANEL + 8), a##r##1); \
        _mm256_storeu_si256((__m256i *)(acc + r * PANEL + 16), a##r##2); }
static inline __attribute__((always_inline)) void tile(const int8_t *xs8, int64_t kp, const int mr, const int8_t *wp,
                                                       const int32_t *colsum, int64_t n0, int64_t n, int32_t *acc,
                                                       const char *pf, int64_t pstep) {
    (void)colsum; (void)n0; (void)n;
    const __m256i ones = _mm256_set1_epi16(1);
    Z3(0); Z3(1); Z3(2);
    for (int64_t g = 0; g < kp / 4; g++) {
        const __m256i w0 = _mm256_loadu_si256((const __m256i *)(wp + g * 96)),
                      w1 = _mm256_loadu_si256((const __m256i *)(wp + g * 96 + 32)),
                      w2 = _mm256_loadu_si256((const __m256i *)(wp + g * 96 + 64));
        if (pf) for (int64_t o = 0; o < pstep; o += 64) __builtin_prefetch(pf + g * pstep + o, 0, 2);
        DP(0) DP(1) DP(2)
    }
    ST(0) ST(1) ST(2)
}
#undef Z3
#undef MUL
#undef DP
#undef ST
typedef int8_t xelem;
static inline xelem to_x(int8_t v) { return v; }
static inline xelem to_x2(int8_t v) { return (int8_t)(v < 0 ? -v : v); }
#else
static inline void tile(const int8_t *x, int64_t kp, const int mr, const int8_t *wp, const int32_t *colsum,
                        int64_t n0, int64_t n, int32_t *acc, const char *pf, int64_t pstep) {
    (void)colsum; (void)n0; (void)n; (void)pf; (void)pstep;
    for (int r = 0; r < mr; r++) {
        int32_t s[PANEL] = {0};
        for (int64_t g = 0; g < kp / KG; g++)
            for (int c = 0; c < PANEL; c++)
                for (int j = 0; j < KG; j++) s[c] += (int32_t)x[r * kp + g * KG + j] * wp[(g * PANEL + c) * KG + j];
        for (int c = 0; c < PANEL; c++) acc[r * PANEL + c] = s[c];
    }
}
typedef int8_t xelem;
static inline xelem to_x(int8_t v) { return v; }
#endif

/* x: M x K int8 rows `ldx` apart; packed, colsum: from fixlab_int8_pack; xs: M row scales; ws: N column scales;
   bias: N or NULL; y: M x N float32 rows `ldy` apart. */
void fixlab_int8_matmul(const int8_t *x, int64_t m, int64_t k, int64_t ldx, const int8_t *packed,
                        const int32_t *colsum, int64_t n, const float *xs, const float *ws, const float *bias, float *y,
                        int64_t ldy, int threads) {
    const int64_t kp = pad4(k), panels = (n + PANEL - 1) / PANEL, xrow = XCOPIES * kp;
    xelem *xc = malloc((size_t)(m * xrow) * sizeof(xelem)); /* x in the form the tile multiplies, K padded */
#pragma omp parallel num_threads(threads) if (m * kp >= 65536)
    {
#pragma omp for schedule(static)
        for (int64_t r = 0; r < m; r++) {
            for (int64_t i = 0; i < k; i++) xc[r * xrow + i] = to_x(x[r * ldx + i]);
            for (int64_t i = k; i < kp; i++) xc[r * xrow + i] = to_x(0);
#if XCOPIES > 1
            for (int64_t i = 0; i < k; i++) xc[r * xrow + kp + i] = to_x2(x[r * ldx + i]);
            for (int64_t i = k; i < kp; i++) xc[r * xrow + kp + i] = 0;
#endif
        }
    }
    /* threads split the panels; for many rows and few panels (prefill of a narrow matrix) they split rows too */
    const int64_t row_blocks = (m + MR - 1) / MR;
    const int64_t split = panels >= 4 * threads || row_blocks < 2 ? 1 : (row_blocks < threads ? row_blocks : threads);
    const int64_t chunk = chunk_of(split * panels, threads);
#pragma omp parallel num_threads(threads) if (m * n * k >= 262144)
    {
        int32_t acc[MR * PANEL];
#pragma omp for schedule(dynamic, chunk) collapse(2)
        for (int64_t s = 0; s < split; s++)
            for (int64_t p = 0; p < panels; p++) {
                const int8_t *wp = packed + p * PANEL * kp;
                const int64_t n0 = p * PANEL;
                const int64_t b0 = row_blocks * s / split, b1 = row_blocks * (s + 1) / split;
                /* The next panel's weights are asked for into L2 while this panel's tiles multiply, a share in
                   each of its first PF_TILES row blocks: the hardware prefetcher fetched them only once the first
                   tile read them, so at decode's 16-64 rows the weight stream and the products took turns (2-core
                   Zen 4, interleaved: 0.88x the time at 16 rows, 0.90x at 32, 0.95-0.99x at 64). With one row block
                   (8 rows or fewer) the stream alone bounds it, and asking ahead only competed with it (1.04x). */
                const int64_t pft = b1 - b0 < 2 ? 0 : b1 - b0 < PF_TILES ? b1 - b0 : PF_TILES;
                const int64_t pstep = pft ? PANEL * KG / pft : 0; /* bytes asked for per k-group step */
                for (int64_t rb = b0; rb < b1; rb++) {
                    const int64_t m0 = rb * MR;
                    const int mr = m - m0 < MR ? (int)(m - m0) : MR;
                    const xelem *xr = xc + m0 * xrow;
                    const char *pf = p + 1 < panels && (s * panels + p + 1) % chunk && rb - b0 < pft /* same chunk */
                                         ? (const char *)(wp + PANEL * kp) + (rb - b0) * (PANEL * kp / pft) : NULL;
                    switch (mr) { /* one specialisation per row count, so the tile's loops unroll into registers */
                        case 1: tile(xr, kp, 1, wp, colsum, n0, n, acc, pf, pstep); break;
                        case 2: tile(xr, kp, 2, wp, colsum, n0, n, acc, pf, pstep); break;
                        case 3: tile(xr, kp, 3, wp, colsum, n0, n, acc, pf, pstep); break;
#if MR > 4
                        case 4: tile(xr, kp, 4, wp, colsum, n0, n, acc, pf, pstep); break;
                        case 5: tile(xr, kp, 5, wp, colsum, n0, n, acc, pf, pstep); break;
                        case 6: tile(xr, kp, 6, wp, colsum, n0, n, acc, pf, pstep); break;
                        case 7: tile(xr, kp, 7, wp, colsum, n0, n, acc, pf, pstep); break;
#endif
                        default: tile(xr, kp, MR, wp, colsum, n0, n, acc, pf, pstep);
                    }
                    store_tile(acc, mr, n0, n, xs + m0, ws, bias, y + m0 * ldy, ldy);
                }
            }
    }
    free(xc);
}

/* ---- 4. float32 matmul over packed weights, the same sums at any number of rows ----------------------------------

   y[m, n] = (sum over k in order of x[m, k] * w[n, k], one fused multiply-add a step, from 0) + bias[n].
   Every output is that one chain whatever the number of rows, the row's place in its tile, the tile shapes, the
   threads or the instruction set (fmaf in the portable loops rounds as the vector instruction does), so a row's
   result does not depend on its batch: BLAS libraries block K and choose kernels by the number of rows, so theirs do
   (a logit moved by ~3e-5 between 1 and 2 rows here, enough to flip a greedy tie or a sample).
   Weights are packed once into panels of FPANEL columns: [panel][k][FPANEL], the last panel's missing columns zero. */

#if defined(__AVX512F__)
#define FPANEL 32
#define FMR 12
#elif defined(__AVX2__) && defined(__FMA__)
#define FPANEL 16
#define FMR 6
#else
#define FPANEL 16
#define FMR 4
#endif

int64_t fixlab_f32_packed_size(int64_t n, int64_t k) { return (n + FPANEL - 1) / FPANEL * FPANEL * k; }

void fixlab_f32_pack(const float *w, int64_t n, int64_t k, int64_t ldw, float *packed, int threads) {
    const int64_t panels = (n + FPANEL - 1) / FPANEL;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (int64_t p = 0; p < panels; p++) {
        float *dst = packed + p * FPANEL * k;
        for (int64_t kk = 0; kk < k; kk++)
            for (int64_t c = 0; c < FPANEL; c++) {
                const int64_t col = p * FPANEL + c;
                dst[kk * FPANEL + c] = col < n ? w[col * ldw + kk] : 0.0f;
            }
    }
}

static inline __attribute__((always_inline)) void ftile(const float *x, int64_t ldx, const int mr, const float *wp,
                                                        int64_t k, float *acc) {
#if defined(__AVX512F__)
    __m512 a[FMR][2];
#pragma GCC unroll 12
    for (int r = 0; r < FMR; r++) a[r][0] = a[r][1] = _mm512_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        const __m512 w0 = _mm512_loadu_ps(wp + kk * FPANEL), w1 = _mm512_loadu_ps(wp + kk * FPANEL + 16);
#pragma GCC unroll 12
        for (int r = 0; r < FMR; r++) {
            if (r < mr) {
                const __m512 b = _mm512_set1_ps(x[r * ldx + kk]);
                a[r][0] = _mm512_fmadd_ps(b, w0, a[r][0]);
                a[r][1] = _mm512_fmadd_ps(b, w1, a[r][1]);
            }
        }
    }
#pragma GCC unroll 12
    for (int r = 0; r < FMR; r++)
        if (r < mr) { _mm512_storeu_ps(acc + r * FPANEL, a[r][0]); _mm512_storeu_ps(acc + r * FPANEL + 16, a[r][1]); }
#elif defined(__AVX2__) && defined(__FMA__)
    __m256 a[FMR][2];
#pragma GCC unroll 6
    for (int r = 0; r < FMR; r++) a[r][0] = a[r][1] = _mm256_setzero_ps();
    for (int64_t kk = 0; kk < k; kk++) {
        const __m256 w0 = _mm256_loadu_ps(wp + kk * FPANEL), w1 = _mm256_loadu_ps(wp + kk * FPANEL + 8);
#pragma GCC unroll 6
        for (int r = 0; r < FMR; r++) {
            if (r < mr) {
                const __m256 b = _mm256_set1_ps(x[r * ldx + kk]);
                a[r][0] = _mm256_fmadd_ps(b, w0, a[r][0]);
                a[r][1] = _mm256_fmadd_ps(b, w1, a[r][1]);
            }
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < FMR; r++)
        if (r < mr) { _mm256_storeu_ps(acc + r * FPANEL, a[r][0]); _mm256_storeu_ps(acc + r * FPANEL + 8, a[r][1]); }
#else
    for (int r = 0; r < mr; r++) {
        float s[FPANEL] = {0};
        for (int64_t kk = 0; kk < k; kk++)
            for (int c = 0; c < FPANEL; c++) s[c] = fmaf(x[r * ldx + kk], wp[kk * FPANEL + c], s[c]);
        for (int c = 0; c < FPANEL; c++) acc[r * FPANEL + c] = s[c];
    }
#endif
}

/* x: M x K rows `ldx` apart; packed: from fixlab_f32_pack; bias: N or NULL; y: M x N rows `ldy` apart. */
void fixlab_f32_matmul(const float *x, int64_t m, int64_t k, int64_t ldx, const float *packed, int64_t n,
                       const float *bias, float *y, int64_t ldy, int threads) {
    const int64_t panels = (n + FPANEL - 1) / FPANEL, row_blocks = (m + FMR - 1) / FMR;
    const int64_t split = panels >= 4 * threads || row_blocks < 2 ? 1 : (row_blocks < threads ? row_blocks : threads);
#pragma omp parallel num_threads(threads) if (m * n * k >= 262144)
    {
        float acc[FMR * FPANEL];
#pragma omp for schedule(static) collapse(2)
        for (int64_t s = 0; s < split; s++)
            for (int64_t p = 0; p < panels; p++) {
                const float *wp = packed + p * FPANEL * k;
                const int64_t n0 = p * FPANEL, cols = n - n0 < FPANEL ? n - n0 : FPANEL;
                const int64_t b0 = row_blocks * s / split, b1 = row_blocks * (s + 1) / split;
                for (int64_t rb = b0; rb < b1; rb++) {
                    const int64_t m0 = rb * FMR;
                    const int mr = m - m0 < FMR ? (int)(m - m0) : FMR;
                    const float *xr = x + m0 * ldx;
                    switch (mr) { /* one specialisation per row count, so the tile's loops unroll into registers */
                        case 1: ftile(xr, ldx, 1, wp, k, acc); break;
                        case 2: ftile(xr, ldx, 2, wp, k, acc); break;
                        case 3: ftile(xr, ldx, 3, wp, k, acc); break;
                        case 4: ftile(xr, ldx, 4, wp, k, acc); break;
#if FMR > 4
                        case 5: ftile(xr, ldx, 5, wp, k, acc); break;
#endif
#if FMR > 6
                        case 6: ftile(xr, ldx, 6, wp, k, acc); break;
                        case 7: ftile(xr, ldx, 7, wp, k, acc); break;
                        case 8: ftile(xr, ldx, 8, wp, k, acc); break;
                        case 9: ftile(xr, ldx, 9, wp, k, acc); break;
                        case 10: ftile(xr, ldx, 10, wp, k, acc); break;
                        case 11: ftile(xr, ldx, 11, wp, k, acc); break;
#endif
                        default: ftile(xr, ldx, FMR, wp, k, acc);
                    }
                    for (int r = 0; r < mr; r++) {
                        float *yr = y + (m0 + r) * ldy + n0;
                        const float *ar = acc + r * FPANEL;
                        if (bias)
                            for (int64_t c = 0; c < cols; c++) yr[c] = ar[c] + bias[n0 + c];
                        else
                            for (int64_t c = 0; c < cols; c++) yr[c] = ar[c];
                    }
                }
            }
    }
}

/* ---- 5. greedy choice: each row's argmax ---------------------------------------------------------------------------

   out[r] = the index torch.argmax(x[r]) gives: the first index of the row's largest value, or of its first NaN when
   it has one (NaN counts as the largest). Why: torch's took 3.7 ms for 32 rows of Qwen2.5's 151,936 logits on 2
   cores, 8 ms inside a decode step (issue #52's profile), for 19 MB that stream at about 12 GB/s. Here one pass keeps
   16 running lane maxima (a select the compiler vectorizes, no fast-math) and any NaN, then the row's largest value
   is looked up from the start; +0 and -0 compare equal, so the first of either is taken, as torch's. */
void fixlab_argmax_rows(const float *x, int64_t rows, int64_t n, int64_t ldx, int64_t *out, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows > 1)
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * ldx;
        float lm[16];
        int nan[16];
        for (int j = 0; j < 16; j++) { lm[j] = -INFINITY; nan[j] = 0; }
        int64_t i = 0;
        for (; i + 16 <= n; i += 16)
            for (int j = 0; j < 16; j++) {
                const float v = xr[i + j];
                lm[j] = v > lm[j] ? v : lm[j];
                nan[j] |= v != v;
            }
        float m = -INFINITY;
        int any_nan = 0;
        for (; i < n; i++) { m = xr[i] > m ? xr[i] : m; any_nan |= xr[i] != xr[i]; }
        for (int j = 0; j < 16; j++) { m = lm[j] > m ? lm[j] : m; any_nan |= nan[j]; }
        int64_t at = 0;
        if (any_nan) {
            while (xr[at] == xr[at]) at++;
        } else {
            while (at < n - 1 && xr[at] != m) at++; /* every value is -inf: index 0, as torch */
        }
        out[r] = at;
    }
}

/* ---- 6. a decode step's float work around the matmuls, fused (fused.py) -----------------------------------------

   Each is bit-equal to the transformers eager ops it replaces: the same IEEE operations in the same order on each
   element (-ffp-contract=off: no fused multiply-add), only without a pass over memory, an allocation and a dispatch
   per op (issue #52's profile: 257 multiplies, 172 adds and 57 norms a decode step of the 1.5B pack, 40 ms of a 325 ms
   step outside matmuls and attention). tests/test_fused.py holds them equal to transformers' ops on every build.

   RMSNorm's tail: out = w * (x * (1 / sqrt(var + eps))) per row, from the row's variance as torch computed it
   (x.pow(2).mean(-1): its sum's order is torch's own), as `hidden_states * torch.rsqrt(variance + eps)` then
   `self.weight * hidden_states` (torch's rsqrt is 1 / sqrt, both correctly rounded). */
void fixlab_rms_scale(const float *x, int64_t rows, int64_t n, int64_t ldx, const float *var, float eps,
                      const float *w, float *out, int64_t ldo, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * n >= 65536)
    for (int64_t r = 0; r < rows; r++) {
        const float inv = 1.0f / sqrtf(var[r] + eps);
        const float *xr = x + r * ldx;
        float *o = out + r * ldo;
        for (int64_t i = 0; i < n; i++) o[i] = w[i] * (xr[i] * inv);
    }
}

/* Rotary embedding of one tensor (query or key): x (B, H, L, D) with any strides, cos and sin (B or 1, L, D) with
   rows D apart, `cb` apart per batch row (0: one for every row);
   out (B, L, H, D) contiguous = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[D/2:], x[:D/2]), as
   transformers' apply_rotary_pos_emb: two products, each rounded, then their sum. */
void fixlab_rotary(const float *x, int64_t B, int64_t H, int64_t L, int64_t D, int64_t sb, int64_t sh, int64_t sl,
                   const float *cos_, const float *sin_, int64_t cb, float *out, int threads) {
    const int64_t half_ = D / 2;
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads) if (B * H * L * D >= 65536)
    for (int64_t b = 0; b < B; b++)
        for (int64_t l = 0; l < L; l++) {
            const float *c = cos_ + b * cb + l * D, *s = sin_ + b * cb + l * D;
            for (int64_t h = 0; h < H; h++) {
                const float *xr = x + b * sb + h * sh + l * sl;
                float *o = out + ((b * L + l) * H + h) * D;
                for (int64_t d = 0; d < half_; d++) {
                    const float a = xr[d] * c[d], t = (-xr[d + half_]) * s[d];
                    o[d] = a + t;
                }
                for (int64_t d = half_; d < D; d++) {
                    const float a = xr[d] * c[d], t = xr[d - half_] * s[d];
                    o[d] = a + t;
                }
            }
        }
}

/* The MLP's product, rounded for the down projection: h = a * b (the activated gate times the up projection), then
   Int8Linear's rounding of h's rows (fixlab_quantize_rows' exact steps), without writing h. */
void fixlab_mul_quantize_rows(const float *a, const float *b, int64_t rows, int64_t k, int64_t lda, int64_t ldb,
                              int8_t *q, float *scales, int threads) {
#pragma omp parallel num_threads(threads) if (rows * k >= 65536)
    {
        float *h = malloc((size_t)k * sizeof(float));
#pragma omp for schedule(static)
        for (int64_t r = 0; r < rows; r++) {
            const float *ar = a + r * lda, *br = b + r * ldb;
            for (int64_t i = 0; i < k; i++) h[i] = ar[i] * br[i];
            const float sc = row_scale(h, k);
            scales[r] = sc;
            int8_t *qr = q + r * k;
            for (int64_t i = 0; i < k; i++) {
                float v = h[i] / sc;
                float t = (v + ROUNDER) - ROUNDER;
                qr[i] = (int8_t)(int32_t)t;
            }
        }
        free(h);
    }
}

/* ---- 7. sampling: torch.multinomial(probs, 1, generator) of a CPU generator, the same draw ----------------------

   torch (ATen/core/MT19937RNGEngine.h, DistributionsHelper.h, TransformationHelper.h; Distributions.cpp) draws one
   sample as argmax(p / q) with q = empty_like(p).exponential_(1, generator): for each element in order, two 32-bit
   words of the generator's MT19937 make u = (w1 << 32 | w2) & (2^53 - 1) * 2^-53, and q = (float)(-1.0 * log1p(-u)).
   The state (st: 624 words, then left and next) is the one torch.Generator.manual_seed(seed) makes; the draws are
   checked against torch's at first use (sampling.py), which serves the rows otherwise.

   Why: exponential_ runs one element at a time (2.7 ms for a 151,936-token vocabulary, most of a sampled token's
   cost). Here the words are drawn for every element (the stream must advance as torch's does), but the logarithm and
   the division only where the element can still win: q >= u (log1p(-u) <= -u), so p / q <= p / u, and an element
   whose bound is below the best exact value so far cannot be the argmax. The winner's value is the exact one, the
   ties and NaN order are torch's argmax (the first maximum; a NaN wins, the first NaN). One element at a time, that
   loop still took 0.9-1.5 ms a draw on the 2-core Xeon (AMX), each element's two words, its uniform and its bound
   in turn: a job's sampled rounds draw ~40 tokens a decode step. fixlab_multinomial1 works in blocks (vector passes
   for the words, the uniforms and the bound; benchmarks/sampling.py). */
#define MT_N 624
#define MT_M 397

void fixlab_mt_seed(uint32_t *st, uint64_t seed) {
    st[0] = (uint32_t)(seed & 0xffffffffu);
    for (int j = 1; j < MT_N; j++) st[j] = 1812433253u * (st[j - 1] ^ (st[j - 1] >> 30)) + (uint32_t)j;
    st[MT_N] = 1;     /* left */
    st[MT_N + 1] = 0; /* next */
}

static inline uint32_t mt_twist(uint32_t u, uint32_t v) {
    return (((u & 0x80000000u) | (v & 0x7fffffffu)) >> 1) ^ ((v & 1u) ? 0x9908b0dfu : 0u);
}

static void mt_refill(uint32_t *s) {
    int j = 0;
    for (; j < MT_N - MT_M; j++) s[j] = s[j + MT_M] ^ mt_twist(s[j], s[j + 1]);
    for (; j < MT_N - 1; j++) s[j] = s[j + MT_M - MT_N] ^ mt_twist(s[j], s[j + 1]);
    s[MT_N - 1] = s[MT_M - 1] ^ mt_twist(s[MT_N - 1], s[0]);
}

static inline uint32_t mt_temper(uint32_t y) {
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    return y;
}

static inline uint32_t mt_next(uint32_t *st) {
    if (--st[MT_N] == 0) {
        mt_refill(st);
        st[MT_N] = MT_N;
        st[MT_N + 1] = 0;
    }
    return mt_temper(st[st[MT_N + 1]++]);
}

static inline double mt_uniform53(uint32_t *st) {
    const uint64_t hi = mt_next(st), lo = mt_next(st);
    return (double)(((hi << 32) | lo) & ((UINT64_C(1) << 53) - 1)) * (1.0 / (double)(UINT64_C(1) << 53));
}

static inline float exp_draw(double u) { return (float)(-1.0 * log1p(-u)); }

/* torch's exponential_(1) on n floats (what the first-use check compares) */
void fixlab_exponential(uint32_t *st, float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = exp_draw(mt_uniform53(st));
}

/* One multinomial draw from p (n floats, contiguous): the index, or -1 when p holds an inf, a NaN or a negative
   value, -2 when every p is 0 (torch's two errors, raised before it draws: nothing drawn then).

   In blocks of MN_BLOCK elements: the block's words are drawn and tempered in one pass (mt_words), its uniforms made in
   another, then a vector pass marks the elements that can still win against the best value at the block's start
   (p < best * u * (1 - 2^-19) cannot: p / q <= p / u, and the margin covers q's float rounding and the product's);
   only those get the exact p / q, in order, with torch's argmax rules. The best only grows within a block, so a mark
   made against its start value is a superset of the scalar filter's: the same index comes out. */
#define MN_BLOCK 256

/* The next n tempered words of the stream, as n calls of mt_next would give them (the same state after). */
static void mt_words(uint32_t *st, uint32_t *out, int64_t n) {
    while (n > 0) {
        if (st[MT_N] == 1) { /* mt_next's refill; `left` one higher, as the refilling call has not yet counted */
            mt_refill(st);
            st[MT_N] = MT_N + 1;
            st[MT_N + 1] = 0;
        }
        int64_t c = (int64_t)st[MT_N] - 1;
        if (c > n) c = n;
        const uint32_t *s = st + st[MT_N + 1];
        for (int64_t j = 0; j < c; j++) out[j] = mt_temper(s[j]);
        st[MT_N] -= (uint32_t)c;
        st[MT_N + 1] += (uint32_t)c;
        out += c;
        n -= c;
    }
}

int64_t fixlab_multinomial1(uint32_t *st, const float *p, int64_t n) {
    int bad = 0, any = 0;
    for (int64_t i = 0; i < n; i++) {
        const float x = p[i];
        bad |= !(x >= 0.0f) | (x == INFINITY);
        any |= x > 0.0f;
    }
    if (bad) return -1;
    if (!any) return -2;
    uint32_t w[2 * MN_BLOCK];
    double u[MN_BLOCK];
    unsigned char cand[MN_BLOCK];
    int64_t best = -1;
    float bv = 0.0f;
    int bnan = 0;
    for (int64_t i0 = 0; i0 < n; i0 += MN_BLOCK) {
        const int64_t m = n - i0 < MN_BLOCK ? n - i0 : MN_BLOCK;
        mt_words(st, w, 2 * m);
        if (bnan) continue; /* a NaN already won: the first one stays (the stream still advances) */
        for (int64_t k = 0; k < m; k++) {
            const uint64_t hi = w[2 * k], lo = w[2 * k + 1];
            u[k] = (double)(((hi << 32) | lo) & ((UINT64_C(1) << 53) - 1)) * (1.0 / (double)(UINT64_C(1) << 53));
        }
        const float *pb = p + i0;
        int64_t k = 0;
        if (best < 0) { /* the first element always counts */
            best = i0;
            bv = pb[0] / exp_draw(u[0]);
            bnan = isnan(bv);
            k = 1;
            if (bnan) continue;
        }
        const double lim = (double)bv * (1.0 - 0x1p-19);
        int hits = 0;
        for (int64_t j = k; j < m; j++) {
            const unsigned char c = !((double)pb[j] < lim * u[j]);
            cand[j] = c;
            hits |= c;
        }
        if (!hits) continue;
        for (int64_t j = k; j < m; j++) {
            if (!cand[j]) continue;
            const float v = pb[j] / exp_draw(u[j]);
            if (isnan(v)) { best = i0 + j; bv = v; bnan = 1; break; }
            if (v > bv) { best = i0 + j; bv = v; }
        }
    }
    return best;
}

/* ---- 8. a step's decoder layers in one call (decoder.py) ---------------------------------------------------------

   What packed.py's Python loop does for each layer of a Qwen2 or Llama model, for the real positions of a decode or
   draft step, with the kernels above and no Python, dispatch or allocation between them. Why: at 32 rows that loop
   spent about 30 ms of a 200 ms step between the kernels (benchmarks/decode_profile.py, "rest of the forward"), most
   of it Python and torch's dispatch while the other core waited in OpenMP.

   The two ops that stayed in torch are done here as torch does them, so every value is the same:
   - RMSNorm's variance, x.pow(2).mean(-1): torch's float sum of a contiguous row (ATen/native/cpu/SumKernel.cpp,
     vectorized_inner_sum: `lanes`-wide vector partial sums in 4 interleaved chains, each a cascade of levels, then
     the chains added, then the lanes in order), the squares rounded first, then divided by the width;
   - SiLU, in place on the gate's columns (ATen/native/cpu/Activation.cpp): x / (1 + exp(-x)), the vector exp being
     torch's own Sleef function (`vexp`, taken from libtorch), in the same pieces as torch's loop: at::parallel_for's
     chunks of the flat index, each row's piece in pairs of vectors, and a scalar tail with expf.
   decoder.py checks both against torch at first use, for this torch and this CPU, and keeps the Python loop if either
   differs. */

static int64_t ceil_log2(uint64_t x) { /* c10's utils::CeilLog2 */
    if (x <= 2) return 1;
    return 64 - __builtin_clzll(x - 1);
}

#define SUM_LANES_MAX 16

/* sum of x[0:n] in torch's order, with `lanes`-wide vectors (8: torch's AVX2 kernel, 16: AVX-512) */
static float torch_sum_squares(const float *x, int64_t n, int lanes) {
    const int64_t vec_size = n / lanes, size = vec_size / 4;
    const int64_t level_power = ceil_log2((uint64_t)size) / 4 > 4 ? ceil_log2((uint64_t)size) / 4 : 4;
    const int64_t level_step = (int64_t)1 << level_power, level_mask = level_step - 1;
    float acc[4][4][SUM_LANES_MAX];
    memset(acc, 0, sizeof acc);
    int64_t i = 0;
#define SQ(idx) (x[(idx)] * x[(idx)])
    for (; i + level_step <= size;) {
        for (int64_t j = 0; j < level_step; ++j, ++i)
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < lanes; l++) acc[0][k][l] += SQ((i * 4 + k) * lanes + l);
        for (int j = 1; j < 4; ++j) {
            for (int k = 0; k < 4; k++)
                for (int l = 0; l < lanes; l++) {
                    acc[j][k][l] += acc[j - 1][k][l];
                    acc[j - 1][k][l] = 0.0f;
                }
            if ((i & (level_mask << (j * level_power))) != 0) break;
        }
    }
    for (; i < size; ++i)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < lanes; l++) acc[0][k][l] += SQ((i * 4 + k) * lanes + l);
    for (int j = 1; j < 4; ++j)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < lanes; l++) acc[0][k][l] += acc[j][k][l];
    for (int64_t v = size * 4; v < vec_size; v++) /* vectors after the last group of 4 go to the first chain */
        for (int l = 0; l < lanes; l++) acc[0][0][l] += SQ(v * lanes + l);
    for (int k = 1; k < 4; k++)
        for (int l = 0; l < lanes; l++) acc[0][0][l] += acc[0][k][l];
    float total = 0.0f;
    for (int64_t t = vec_size * lanes; t < n; t++) total += SQ(t);
    for (int l = 0; l < lanes; l++) total += acc[0][0][l];
#undef SQ
    return 0.0f + total; /* CastStoreAccumulate: added to the zeroed output */
}

/* var[r] = x[r].pow(2).mean() for rows r of x (n floats, ldx apart) */
void fixlab_torch_mean_squares(const float *x, int64_t rows, int64_t n, int64_t ldx, float *var, int lanes,
                               int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (rows * n >= 32768)
    for (int64_t r = 0; r < rows; r++) var[r] = torch_sum_squares(x + r * ldx, n, lanes) / (float)n;
}

#if defined(__AVX512F__)
typedef __m512 (*vexp16_t)(__m512);
#endif
#if defined(__AVX2__)
typedef __m256 (*vexp8_t)(__m256);
#endif

/* one row piece of x[0:len] in place, as torch's vectorized_loop: pairs of `lanes` vectors (x / (1 + exp(-x)), the exp
   torch's own), then scalars */
#define SILU_PAIRS(vt, ft, lanes)                                                                                     \
    for (; i + 2 * (lanes) <= len; i += 2 * (lanes)) {                                                                \
        vt a, b;                                                                                                      \
        memcpy(&a, x + i, sizeof a);                                                                                  \
        memcpy(&b, x + i + (lanes), sizeof b);                                                                        \
        const vt ea = ((ft)vexp)(-a), eb = ((ft)vexp)(-b);                                                            \
        a = a / (1.0f + ea);                                                                                          \
        b = b / (1.0f + eb);                                                                                          \
        memcpy(x + i, &a, sizeof a);                                                                                  \
        memcpy(x + i + (lanes), &b, sizeof b);                                                                        \
    }

static void silu_piece(float *x, int64_t len, int lanes, const void *vexp) {
    int64_t i = 0;
#if defined(__AVX512F__)
    if (lanes == 16) SILU_PAIRS(__m512, vexp16_t, 16)
#endif
#if defined(__AVX2__)
    if (lanes == 8) SILU_PAIRS(__m256, vexp8_t, 8)
#endif
    for (; i < len; i++) x[i] = x[i] / (1.0f + expf(-x[i]));
}

/* silu_ of x (rows x n, ldx apart) as torch's silu_ on that view with `threads` threads: at::parallel_for's chunks of
   the flat index (GRAIN_SIZE 32768), each cut at row ends into pieces (TensorIterator's serial_for_each) */
void fixlab_torch_silu(float *x, int64_t rows, int64_t n, int64_t ldx, int lanes, const void *vexp, int threads) {
    const int64_t numel = rows * n, grain = 32768;
    int64_t chunks = 1;
    if (numel > grain && threads > 1) {
        chunks = (numel + grain - 1) / grain;
        if (chunks > threads) chunks = threads;
    }
    const int64_t chunk = (numel + chunks - 1) / chunks;
#pragma omp parallel for schedule(static) num_threads(threads) if (chunks > 1)
    for (int64_t c = 0; c < chunks; c++) {
        const int64_t b = c * chunk, e = b + chunk < numel ? b + chunk : numel;
        for (int64_t f = b; f < e;) {
            const int64_t r = f / n, col = f % n, len = n - col < e - f ? n - col : e - f;
            silu_piece(x + r * ldx + col, len, lanes, vexp);
            f += len;
        }
    }
}

/* One int8 linear's packed weights (fixlab_int8_pack) and scales. */
typedef struct {
    const int8_t *packed;
    const int32_t *colsum;
    const float *ws, *bias; /* bias may be NULL */
    int64_t n;
} fixlab_linear;

/* One decoder layer: its norms, its four int8 matmuls (query, key and value stacked; gate and up stacked), and its KV
   cache buffers at the step's first new column: k[b * ksb + h * ksh + c * ksl + d]. */
typedef struct {
    const float *norm_in, *norm_post;
    float eps_in, eps_post;
    fixlab_linear qkv, o, gate_up, down;
    half *k, *v;
    int64_t ksb, ksh, ksl, vsb, vsh, vsl;
    const half *k0, *v0; /* the cache's first held column, what attention reads (L columns) */
} fixlab_layer;

/* x (n real positions x hid) goes through `nl` layers in place. Positions: idx[i] = b * W + w of rows B and W new
   columns a row (real: B * W flags, or NULL when every position is real); cos, sin: n x D. The attention reads L
   columns from each layer's k0/v0 with mask (msb, msq strides; NULL: all) as native.decode_attention. blk: the rows
   of one of fused.py's MLP blocks. Scratch:
   xn (n x hid), q8 (n x max(hid, inter)), xs (n), qkv (n x qkv.n), qpad (B*W x H*D), att (B*W x H*D), tmp (n x hid),
   gu (n x 2 inter). */
void fixlab_decoder_layers(const fixlab_layer *layers, int64_t nl, float *x, int64_t n, int64_t hid, int64_t H,
                           int64_t KV, int64_t D, int64_t inter, int64_t B, int64_t W, const int64_t *idx,
                           const uint8_t *real, const float *cos_, const float *sin_, int64_t L,
                           const uint8_t *mask, int64_t msb, int64_t msq, int causal, float scale,
                           int sum_lanes, int silu_lanes, const void *vexp, int64_t blk,
                           float *xn, int8_t *q8, float *xs, float *qkv, float *qpad, float *att, float *tmp,
                           float *gu, float *var, int threads) {
    const int64_t HD = H * D, KD = KV * D;
    for (int64_t li = 0; li < nl; li++) {
        const fixlab_layer *ly = layers + li;
        /* input norm, rounding, q k v */
        fixlab_torch_mean_squares(x, n, hid, hid, var, sum_lanes, threads);
        fixlab_rms_scale(x, n, hid, hid, var, ly->eps_in, ly->norm_in, xn, hid, threads);
        fixlab_quantize_rows(xn, n, hid, hid, q8, xs, threads);
        fixlab_int8_matmul(q8, n, hid, hid, ly->qkv.packed, ly->qkv.colsum, ly->qkv.n, xs, ly->qkv.ws, ly->qkv.bias,
                           qkv, ly->qkv.n, threads);
        /* rotary: queries into their padded places' buffer (tmp first: n x H x D), keys into att's rows (n x KV x D) */
        fixlab_rotary(qkv, n, H, 1, D, ly->qkv.n, D, HD, cos_, sin_, D, tmp, threads);
        fixlab_rotary(qkv + HD, n, KV, 1, D, ly->qkv.n, D, KD, cos_, sin_, D, att, threads);
        /* the new columns of the cache: each real position's key and value, zeros at padding positions */
        if (real != NULL)
            for (int64_t b = 0; b < B; b++)
                for (int64_t w = 0; w < W; w++)
                    if (!real[b * W + w])
                        for (int64_t h = 0; h < KV; h++) {
                            memset(ly->k + b * ly->ksb + h * ly->ksh + w * ly->ksl, 0, (size_t)D * sizeof(half));
                            memset(ly->v + b * ly->vsb + h * ly->vsh + w * ly->vsl, 0, (size_t)D * sizeof(half));
                        }
        for (int64_t i = 0; i < n; i++) {
            const int64_t b = idx[i] / W, w = idx[i] % W;
            for (int64_t h = 0; h < KV; h++) {
                half *kd = ly->k + b * ly->ksb + h * ly->ksh + w * ly->ksl;
                half *vd = ly->v + b * ly->vsb + h * ly->vsh + w * ly->vsl;
                const float *ks = att + i * KD + h * D, *vs = qkv + i * ly->qkv.n + HD + KD + h * D;
                for (int64_t d = 0; d < D; d++) {
                    kd[d] = (half)ks[d];
                    vd[d] = (half)vs[d];
                }
            }
            memcpy(qpad + idx[i] * HD, tmp + i * HD, (size_t)HD * sizeof(float));
        }
        fixlab_decode_attention(qpad, B, H, W, D, W * HD, D, HD, ly->k0, ly->v0, KV, L, ly->ksb, ly->ksh, ly->ksl,
                                ly->vsb, ly->vsh, ly->vsl, mask, msb, msq, causal, scale, real, att, threads);
        /* the output projection of the real positions' attention, added to x */
        for (int64_t i = 0; i < n; i++)
            if (idx[i] != i) memcpy(att + i * HD, att + idx[i] * HD, (size_t)HD * sizeof(float));
        fixlab_quantize_rows(att, n, HD, HD, q8, xs, threads);
        fixlab_int8_matmul(q8, n, HD, HD, ly->o.packed, ly->o.colsum, ly->o.n, xs, ly->o.ws, ly->o.bias, tmp, hid,
                           threads);
        for (int64_t t = 0; t < n * hid; t++) x[t] = x[t] + tmp[t];
        /* post-attention norm, the MLP, added to x */
        fixlab_torch_mean_squares(x, n, hid, hid, var, sum_lanes, threads);
        fixlab_rms_scale(x, n, hid, hid, var, ly->eps_post, ly->norm_post, xn, hid, threads);
        fixlab_quantize_rows(xn, n, hid, hid, q8, xs, threads);
        fixlab_int8_matmul(q8, n, hid, hid, ly->gate_up.packed, ly->gate_up.colsum, ly->gate_up.n, xs,
                           ly->gate_up.ws, ly->gate_up.bias, gu, 2 * inter, threads);
        for (int64_t r0 = 0; r0 < n; r0 += blk) /* fused.py's MLP blocks of rows, each its own SiLU call */
            fixlab_torch_silu(gu + r0 * 2 * inter, n - r0 < blk ? n - r0 : blk, inter, 2 * inter, silu_lanes, vexp,
                              threads);
        fixlab_mul_quantize_rows(gu, gu + inter, n, inter, 2 * inter, 2 * inter, q8, xs, threads);
        fixlab_int8_matmul(q8, n, inter, inter, ly->down.packed, ly->down.colsum, ly->down.n, xs, ly->down.ws,
                           ly->down.bias, tmp, hid, threads);
        for (int64_t t = 0; t < n * hid; t++) x[t] = x[t] + tmp[t];
    }
}

/* 9. A registry pack's Q4_K and Q6_K blocks dequantized to float32 (serving/gguf.py's conversion), value for value
   gguf's numpy dequantize (gguf/quants.py): the same float32 products and differences in the same order, no fused
   multiply-add (-ffp-contract=off), float16 widened exactly. One pass with no temporaries where numpy makes several
   arrays the size of the output for each block's scales and nibbles. */
static inline float f16_to_f32(const uint8_t *p) {
    const uint32_t h = (uint32_t)p[0] | (uint32_t)p[1] << 8;
    const uint32_t sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 31) {
        bits = sign | 0x7f800000u | man << 13; /* inf or NaN, its payload kept as numpy keeps it */
    } else if (exp != 0) {
        bits = sign | (exp + 112) << 23 | man << 13;
    } else {
        const float f = (float)man * 0x1p-24f; /* zero or subnormal: exact (man < 2^10) */
        memcpy(&bits, &f, sizeof bits);
        bits |= sign;
    }
    float out;
    memcpy(&out, &bits, sizeof out);
    return out;
}

/* blocks of 144 bytes: d, dmin (float16), 12 bytes of 6-bit scales and mins for 8 groups of 32, 128 bytes of nibbles
   (the 32 bytes of groups 2g and 2g+1 share bytes: low nibble, high nibble) -> 256 floats each. */
void fixlab_dequant_q4_k(const uint8_t *blocks, int64_t n_blocks, float *out, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (n_blocks > 256)
    for (int64_t b = 0; b < n_blocks; b++) {
        const uint8_t *p = blocks + b * 144, *s = p + 4, *qs = p + 16;
        const float d = f16_to_f32(p), dmin = f16_to_f32(p + 2);
        float *y = out + b * 256;
        for (int j = 0; j < 8; j++) {
            const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0f) | ((s[j - 4] >> 2) & 0x30);
            const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 2) & 0x30);
            const float dj = d * (float)sc, mj = dmin * (float)m;
            const uint8_t *q = qs + (j / 2) * 32;
            const int shift = (j % 2) * 4;
            for (int i = 0; i < 32; i++) y[j * 32 + i] = dj * (float)((q[i] >> shift) & 0x0f) - mj;
        }
    }
}

/* blocks of 210 bytes: 128 bytes of low nibbles, 64 of 2-bit highs, 16 int8 scales (one per 16 values), d (float16)
   -> 256 floats each: d * scale times the 6-bit value less 32. */
void fixlab_dequant_q6_k(const uint8_t *blocks, int64_t n_blocks, float *out, int threads) {
#pragma omp parallel for schedule(static) num_threads(threads) if (n_blocks > 256)
    for (int64_t b = 0; b < n_blocks; b++) {
        const uint8_t *ql = blocks + b * 210, *qh = ql + 128;
        const int8_t *sc = (const int8_t *)(ql + 192);
        const float d = f16_to_f32(ql + 208);
        float *y = out + b * 256;
        for (int g = 0; g < 16; g++) {
            const float ds = d * (float)sc[g];
            for (int i = 0; i < 16; i++) {
                const int k = g * 16 + i, h = k / 128, r = k % 128;
                const int lo = (ql[h * 64 + r % 64] >> (4 * (r / 64))) & 0x0f;
                const int hi = (qh[h * 32 + r % 32] >> (2 * (r / 32))) & 0x03;
                y[k] = ds * (float)((lo | hi << 4) - 32);
            }
        }
    }
}
