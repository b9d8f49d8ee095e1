/* Decode attention's two products over a bf16 key/value cache, read in place (uniagent.models.attention_native).
 *
 * torch has no CPU product of bf16 operands with an fp32 result, so the matmul kernel copies every
 * layer's keys and values to fp32 first: at 8 rows x 4,500 keys that copy moved twice the cache's
 * bytes and the step ran at a third of the memory bandwidth. Here each key or value row is widened to
 * fp32 as it is read and every sum is kept in fp32: SDPA's precision class.
 *
 * q, s, p, out: contiguous fp32. k, v: bf16 as uint16 with element strides per row, head and key
 * (the last dimension contiguous). dim: a multiple of 16, at most 512.
 */
#include <stdint.h>

#define LANES 16
#define BLOCK 256 /* keys a task takes in the scores product: rows x heads alone is too few tasks */

static inline float widen(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x << 16;
    return v.f;
}

/* s[r, h, g, j] = q[r, h, g, :] . k[r, h, j, :] */
void ua_scores(const float *q, const uint16_t *k, float *s, long rows, long heads, long group, long keys,
               long dim, long k_row, long k_head, long k_key, int threads) {
    const long blocks = (keys + BLOCK - 1) / BLOCK;
#pragma omp parallel for collapse(3) schedule(static) num_threads(threads)
    for (long r = 0; r < rows; r++)
        for (long h = 0; h < heads; h++)
            for (long b = 0; b < blocks; b++) {
                const float *qh = q + (r * heads + h) * group * dim;
                float *sh = s + (r * heads + h) * group * keys;
                const uint16_t *kh = k + r * k_row + h * k_head;
                const long end = (b + 1) * BLOCK < keys ? (b + 1) * BLOCK : keys;
                float kf[512];
                for (long j = b * BLOCK; j < end; j++) {
                    const uint16_t *kr = kh + j * k_key;
                    for (long d = 0; d < dim; d++) kf[d] = widen(kr[d]);
                    for (long g = 0; g < group; g++) {
                        const float *qg = qh + g * dim;
                        float acc[LANES] = {0};
                        for (long d = 0; d < dim; d += LANES)
                            for (int l = 0; l < LANES; l++) acc[l] += qg[d + l] * kf[d + l];
                        float sum = 0;
                        for (int l = 0; l < LANES; l++) sum += acc[l];
                        sh[g * keys + j] = sum;
                    }
                }
            }
}

/* out[r, h, g, :] = sum_j p[r, h, g, j] * v[r, h, j, :] */
void ua_weighted(const float *p, const uint16_t *v, float *out, long rows, long heads, long group, long keys,
                 long dim, long v_row, long v_head, long v_key, int threads) {
#pragma omp parallel for collapse(2) schedule(static) num_threads(threads)
    for (long r = 0; r < rows; r++)
        for (long h = 0; h < heads; h++) {
            const float *ph = p + (r * heads + h) * group * keys;
            float *oh = out + (r * heads + h) * group * dim;
            const uint16_t *vh = v + r * v_row + h * v_head;
            float vf[512];
            for (long i = 0; i < group * dim; i++) oh[i] = 0;
            for (long j = 0; j < keys; j++) {
                const uint16_t *vr = vh + j * v_key;
                for (long d = 0; d < dim; d++) vf[d] = widen(vr[d]);
                for (long g = 0; g < group; g++) {
                    const float w = ph[g * keys + j];
                    float *og = oh + g * dim;
                    for (long d = 0; d < dim; d++) og[d] += w * vf[d];
                }
            }
        }
}
