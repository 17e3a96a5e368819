/* Int8Linear's rounding of its input rows and scaling of its int32 products, one pass each (agents/serving/int8.py).

   Built at first use by agents/serving/int8_native.py with gcc -O3 -march=native -fopenmp -ffp-contract=off, and
   linked against the OpenMP runtime torch has already loaded (one thread pool for both).

   Bit-equal to the eager torch ops they replace (test: tests/test_models_int8.py), so answers do not move:
   - the scale is absmax / 127.0f clamped to 1e-12f, as `rows.abs().amax(1) / 127.0` then `.clamp(min=1e-12)`;
     the absmax is taken on the bit patterns with the sign cleared (for floats that are not NaN the order of those
     integers is the order of the magnitudes), an integer max that vectorizes without -ffast-math;
   - x / scale is an IEEE division, rounded half to even by adding and subtracting 1.5 * 2^23 (exact for
     |v| < 2^22; here |v| <= 127.5), as torch.round;
   - the product is scaled as ((float)acc * xs[m]) * ws[n] + bias[n], in that order, with no fused multiply-add
     (-ffp-contract=off), as `.float().mul_(xs).mul_(scale).add_(bias)`.
*/
#include <stdint.h>
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
void fixlab_quantize_rows(const float *x, int64_t rows, int64_t k, int64_t ldx, int8_t *q, float *scales) {
#pragma omp parallel for schedule(static) if (rows * k >= 65536)
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
                           const float *bias) {
    int64_t total = rows * n;
    /* columns in blocks, so that one row (decode: a few rows of 150k columns) still splits across threads */
    const int64_t block = 4096;
    int64_t blocks_per_row = (n + block - 1) / block;
#pragma omp parallel for schedule(static) if (total >= 65536)
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
