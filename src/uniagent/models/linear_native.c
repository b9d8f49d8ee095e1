/* A decode step's weight products in fp32: out = x w^T (+ bias) for a few rows (uniagent.models.linear).
 *
 * At a decode step's 1-8 rows every weight is read once from memory for a few multiply-adds, so the
 * product is as fast as the weights stream in. On an AVX2-only AMD EPYC (2 threads, a plain read at
 * 29-31 GB/s) oneDNN's laid-out product streamed SmolLM2's weights at 11-19 GB/s. Here each task takes
 * 2 weight rows against 4 input rows at a time (8 sums in registers, 8 lanes each) and asks for the
 * weight 8 KB ahead of the sums: the model's 211 products ran 1.41-1.45x faster than oneDNN's at 4
 * rows, 1.29-1.36x at 8 and 1.1x at 1. The sums are fp32 in another order than MKL's or oneDNN's
 * (float noise: the linear probe measures it and refuses past its tolerance).
 *
 * x: [rows, k] contiguous; w: [n, k] contiguous (the dense weight as torch keeps it); bias: [n] or NULL;
 * out: [rows, n] contiguous. k: a multiple of 8.
 */
#include <string.h>

#include "attention_native.h"

#define ROWS 4   /* input rows a tile takes */
#define OUTS 2   /* weight rows a tile takes */
#define AHEAD 2048 /* floats between the weight a tile reads and the weight it asks the memory for */

/* out[m, j] for rows m0.. (mr of them) and weight rows n0.. (nr of them): whole tiles run the unrolled
 * loop, the edges a general one. */
INLINE void tile(const float *x, const float *w, const float *bias, float *out, long m0, int mr, long n0, int nr,
                 long n, long k) {
    v8f acc[ROWS][OUTS];
    memset(acc, 0, sizeof acc);
    const float *wb = w + n0 * k;
    if (mr == ROWS && nr == OUTS) {
        for (long d = 0; d < k; d += 8) {
            v8f wv[OUTS];
            for (int j = 0; j < OUTS; j++) wv[j] = load8(wb + j * k + d);
            if ((d & 15) == 0)
                for (int j = 0; j < OUTS; j++) __builtin_prefetch(wb + j * k + d + AHEAD, 0, 0);
            for (int m = 0; m < ROWS; m++) {
                const v8f xv = load8(x + (m0 + m) * k + d);
                for (int j = 0; j < OUTS; j++) acc[m][j] += xv * wv[j];
            }
        }
    } else {
        for (long d = 0; d < k; d += 8) {
            if ((d & 15) == 0)
                for (int j = 0; j < nr; j++) __builtin_prefetch(wb + j * k + d + AHEAD, 0, 0);
            for (int j = 0; j < nr; j++) {
                const v8f wv = load8(wb + j * k + d);
                for (int m = 0; m < mr; m++) acc[m][j] += load8(x + (m0 + m) * k + d) * wv;
            }
        }
    }
    for (int m = 0; m < mr; m++)
        for (int j = 0; j < nr; j++) out[(m0 + m) * n + n0 + j] = sum8(acc[m][j]) + (bias ? bias[n0 + j] : 0.0f);
}

void ua_linear_f32(const float *x, const float *w, const float *bias, float *out, long rows, long n, long k,
                   int threads) {
    const long tasks = (n + OUTS - 1) / OUTS;
#pragma omp parallel for schedule(static) num_threads(threads)
    for (long t = 0; t < tasks; t++) {
        const long n0 = t * OUTS;
        const int nr = n - n0 < OUTS ? (int)(n - n0) : OUTS;
        for (long m0 = 0; m0 < rows; m0 += ROWS) tile(x, w, bias, out, m0, rows - m0 < ROWS ? (int)(rows - m0) : ROWS, n0, nr, n, k);
    }
}
