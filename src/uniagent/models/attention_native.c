/* Decode attention's two products over a bf16 key/value cache, read in place (uniagent.models.attention_native).
 *
 * torch has no CPU product of bf16 operands with an fp32 result, so the matmul kernel copies every
 * layer's keys and values to fp32 first: at 8 rows x 4,500 keys that copy moved twice the cache's
 * bytes and the step ran at a third of the memory bandwidth. Here each key or value row is widened to
 * fp32 as it is read and every sum is kept in fp32: SDPA's precision class.
 *
 * With AVX-512 (GCC/Clang vector extensions, 16 fp32 lanes) both products keep their sums in registers:
 * - scores: a tile of G query groups x 16/G keys gives 16 dot products, reduced together by a
 *   transposing tree (30 shuffles, 15 adds) instead of one horizontal sum each (which cost as much as
 *   the products themselves at dim 64);
 * - weighted: a tile of up to 4 groups x 64 dims is summed over every key without touching memory.
 * That took a layer of 8 rows x 4,500 keys from 1.7 + 1.2 ms to 0.41-0.5 + 0.28-0.3 ms (28-34 and
 * 45-49 GB/s of cache read; a plain copy runs at 49). With AVX2 only the same tiles spill their
 * 16-lane registers and ran 2-5x slower than plain loops the compiler vectorises; AVX2 builds have
 * 8-lane tiles of their own instead (their comment says what they gained). Builds with neither keep
 * the plain loops.
 *
 * q, s, p, out: contiguous fp32. k, v: bf16 as uint16 (ua_scores, ua_weighted) or fp32 (the _f32 pair),
 * with element strides per row, head and key (the last dimension contiguous). dim: a multiple of 16, at
 * most 512.
 */
#include <stdint.h>
#include <string.h>

#include "attention_native.h"

#define BLOCK 256 /* keys a task takes in the scores product: rows x heads alone is too few tasks */
#define LANES 16

/* sh[g * keys] = qh[g] . kr for every group g over one fp32 key row, each dot product in LANES partial sums:
 * the plain scores loop the compiler vectorises, for fp32 caches in AVX-512 builds and both cache types
 * (bf16 widened first) in builds without AVX2. The plain weighted sums keep a loop each: a shared row
 * helper ran the bf16 one 1.2x slower on an AVX2 EPYC. */
static inline __attribute__((always_inline)) void score_row(const float *restrict qh, const float *restrict kr,
                                                            float *restrict sh, long group, long keys, long dim) {
    for (long g = 0; g < group; g++) {
        const float *qg = qh + g * dim;
        float acc[LANES] = {0};
        for (long d = 0; d < dim; d += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += qg[d + l] * kr[d + l];
        float sum = 0;
        for (int l = 0; l < LANES; l++) sum += acc[l];
        sh[g * keys] = sum;
    }
}

#if defined(__AVX512F__)

/* 2 shuffles + 1 add: lanes of a and b pairwise summed `w` apart, a's results first. */
#define FOLD(a, b, lo, hi) (__builtin_shuffle((a), (b), (v16i)lo) + __builtin_shuffle((a), (b), (v16i)hi))

/* r[i] = sum of the lanes of a[i], for 16 vectors. */
INLINE v16f reduce16(const v16f a[16]) {
    v16f b[8], c[4], d[2];
    for (int i = 0; i < 8; i++)
        b[i] = FOLD(a[2 * i], a[2 * i + 1], ((v16i){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}),
                    ((v16i){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}));
    for (int i = 0; i < 4; i++)
        c[i] = FOLD(b[2 * i], b[2 * i + 1], ((v16i){0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}),
                    ((v16i){4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}));
    for (int i = 0; i < 2; i++)
        d[i] = FOLD(c[2 * i], c[2 * i + 1], ((v16i){0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29}),
                    ((v16i){2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31}));
    return FOLD(d[0], d[1], ((v16i){0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}),
                ((v16i){1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}));
}

/* One tile of the scores: groups g0..g0+G of one head against keys j..j+16/G (all present). */
INLINE void scores_tile(const float *qh, const uint16_t *kh, float *sh, long g0, long j, long keys, long dim,
                        long k_key, const int G) {
    const int K = 16 / G;
    v16f acc[16] = {0};
    for (long d = 0; d < dim; d += 16) {
        v16f kv[16], qv[16];
        for (int kk = 0; kk < K; kk++) kv[kk] = widen16(kh + (j + kk) * k_key + d);
        for (int g = 0; g < G; g++) qv[g] = load16(qh + (g0 + g) * dim + d);
        for (int g = 0; g < G; g++)
            for (int kk = 0; kk < K; kk++) acc[g * K + kk] += qv[g] * kv[kk];
    }
    v16f r = reduce16(acc);
    for (int g = 0; g < G; g++)
        for (int kk = 0; kk < K; kk++) sh[(g0 + g) * keys + j + kk] = r[g * K + kk];
}

/* One dot product the plain way: the keys left over after the last whole tile. */
static float dot(const float *q, const uint16_t *k, long dim) {
    v16f acc = {0};
    for (long d = 0; d < dim; d += 16) acc += load16(q + d) * widen16(k + d);
    float sum = 0;
    for (int l = 0; l < 16; l++) sum += acc[l];
    return sum;
}

#define TILE_CASE(n) \
    case n: \
        scores_tile(qh, kh, sh, g0, j, keys, dim, k_key, n); \
        break;

/* The scores of one head's groups g0..g0+G (G <= 8) over keys [start, end). */
static void scores_span(const float *qh, const uint16_t *kh, float *sh, long g0, int G, long start, long end,
                        long keys, long dim, long k_key) {
    const long K = 16 / G;
    long j = start;
    for (; j + K <= end; j += K) switch (G) { /* a constant G: the tile's loops unroll into registers */
            TILE_CASE(1) TILE_CASE(2) TILE_CASE(3) TILE_CASE(4) TILE_CASE(5) TILE_CASE(6) TILE_CASE(7) TILE_CASE(8)
        }
    for (; j < end; j++)
        for (long g = g0; g < g0 + G; g++) sh[g * keys + j] = dot(qh + g * dim, kh + j * k_key, dim);
}

/* The scores of one head's groups over keys [start, end). */
static void scores_block(const float *qh, const uint16_t *kh, float *sh, long start, long end, long group, long keys,
                         long dim, long k_key) {
    for (long g0 = 0; g0 < group; g0 += 8)
        scores_span(qh, kh, sh, g0, group - g0 < 8 ? (int)(group - g0) : 8, start, end, keys, dim, k_key);
}

/* One tile of the weighted sum: groups g0..g0+G (G <= 4) x dims d0..d0+16C (C <= 4) over every key. */
INLINE void weighted_tile(const float *ph, const uint16_t *vh, float *oh, long g0, long d0, long keys, long dim,
                          long v_key, const int G, const int C) {
    v16f acc[16] = {0};
    for (long j = 0; j < keys; j++) {
        v16f vv[4];
        for (int c = 0; c < C; c++) vv[c] = widen16(vh + j * v_key + d0 + 16 * c);
        for (int g = 0; g < G; g++) {
            const float w = ph[(g0 + g) * keys + j];
            for (int c = 0; c < C; c++) acc[g * 4 + c] += w * vv[c];
        }
    }
    for (int g = 0; g < G; g++)
        for (int c = 0; c < C; c++) store16(oh + (g0 + g) * dim + d0 + 16 * c, acc[g * 4 + c]);
}

#define WEIGHTED_CASE(n) \
    case n: \
        if (C == 4) \
            weighted_tile(ph, vh, oh, g0, d0, keys, dim, v_key, n, 4); \
        else \
            weighted_tile(ph, vh, oh, g0, d0, keys, dim, v_key, n, 1); \
        break;

/* The weighted sums of one head's groups over dims [start, stop): 4 vectors at a time, then 1. */
static void weighted_dims(const float *ph, const uint16_t *vh, float *oh, long start, long stop, long group,
                          long keys, long dim, long v_key) {
    for (long d0 = start; d0 < stop;) {
        const int C = stop - d0 >= 64 ? 4 : 1;
        for (long g0 = 0; g0 < group; g0 += 4) switch (group - g0 < 4 ? group - g0 : 4) {
                WEIGHTED_CASE(1) WEIGHTED_CASE(2) WEIGHTED_CASE(3) WEIGHTED_CASE(4)
            }
        d0 += 16 * C;
    }
}

#elif defined(__AVX2__)
/* AVX2 without AVX-512: 8-lane tiles sized for its 16 vector registers (the 16-lane ones above spill
 * here). Plain loops held an fp32 cache to 12-14 GB/s of a ~30 GB/s read bandwidth: one horizontal sum
 * per dot product in scores, and a load and store of the running sums per key in the weighted product.
 * - scores: 8 keys x one group in 8 sums, reduced together by a transposing tree (14 shuffles, 7 adds);
 * - weighted: up to 3 groups x 32 dims summed over every key in 12 registers.
 * Both cache types take the same tiles: bf16 rows are widened as they are loaded. On an AVX2 EPYC (2
 * threads), 30 layers' caches of 4 rows x 3 heads x 1,561 keys: scores 10.5-12.4 -> 8.1-8.3 ms and the
 * weighted sum 9.9-11.6 -> 7.9-9.3 ms in fp32; 12.1 -> 8.5-8.8 and 9.0-9.6 -> 6.3-7.2 ms in bf16. */
#define FOLD8(a, b, lo, hi) (__builtin_shuffle((a), (b), (v8i)lo) + __builtin_shuffle((a), (b), (v8i)hi))

/* r[i] = sum of the lanes of a[BITREV[i]]: the callers fill a[] in bit-reversed order (0 4 2 6 1 5 3 7),
 * so lane i of the result is their i-th sum. */
INLINE v8f reduce8(const v8f a[8]) {
    v8f b[4], c[2];
    for (int i = 0; i < 4; i++)
        b[i] = FOLD8(a[2 * i], a[2 * i + 1], ((v8i){0, 1, 2, 3, 8, 9, 10, 11}), ((v8i){4, 5, 6, 7, 12, 13, 14, 15}));
    for (int i = 0; i < 2; i++)
        c[i] = FOLD8(b[2 * i], b[2 * i + 1], ((v8i){0, 1, 8, 9, 4, 5, 12, 13}), ((v8i){2, 3, 10, 11, 6, 7, 14, 15}));
    return FOLD8(c[0], c[1], ((v8i){0, 8, 2, 10, 4, 12, 6, 14}), ((v8i){1, 9, 3, 11, 5, 13, 7, 15}));
}

static const int BITREV8[8] = {0, 4, 2, 6, 1, 5, 3, 7};

#define AVX2_PRODUCTS(SUFFIX, T, LOAD)                                                                             \
    static void scores_block##SUFFIX(const float *qh, const T *kh, float *sh, long start, long end, long group,    \
                                     long keys, long dim, long k_key) {                                            \
        long j = start;                                                                                            \
        for (; j + 8 <= end; j += 8)                                                                               \
            for (long g = 0; g < group; g++) {                                                                     \
                const float *qg = qh + g * dim;                                                                    \
                v8f acc[8] = {0};                                                                                  \
                for (long d = 0; d < dim; d += 8) {                                                                \
                    const v8f qv = load8(qg + d);                                                                  \
                    for (int i = 0; i < 8; i++) acc[i] += qv * LOAD(kh + (j + BITREV8[i]) * k_key + d);           \
                }                                                                                                  \
                const v8f sums = reduce8(acc);                                                                     \
                memcpy(sh + g * keys + j, &sums, sizeof sums);                                                     \
            }                                                                                                      \
        for (; j < end; j++)                                                                                       \
            for (long g = 0; g < group; g++) {                                                                     \
                v8f acc = {0};                                                                                     \
                for (long d = 0; d < dim; d += 8) acc += load8(qh + g * dim + d) * LOAD(kh + j * k_key + d);      \
                sh[g * keys + j] = sum8(acc);                                                                      \
            }                                                                                                      \
    }                                                                                                              \
    INLINE void weighted_tile##SUFFIX(                                                                             \
        const float *ph, const T *vh, float *oh, long g0, long d0, long keys, long dim, long v_key, const int G,    \
        const int C) {                                                                                             \
        v8f acc[12] = {0};                                                                                         \
        for (long j = 0; j < keys; j++) {                                                                          \
            v8f vv[4];                                                                                             \
            for (int c = 0; c < C; c++) vv[c] = LOAD(vh + j * v_key + d0 + 8 * c);                                 \
            for (int g = 0; g < G; g++) {                                                                          \
                const float w = ph[(g0 + g) * keys + j];                                                           \
                for (int c = 0; c < C; c++) acc[g * 4 + c] += w * vv[c];                                           \
            }                                                                                                      \
        }                                                                                                          \
        for (int g = 0; g < G; g++)                                                                                \
            for (int c = 0; c < C; c++) memcpy(oh + (g0 + g) * dim + d0 + 8 * c, &acc[g * 4 + c], sizeof(v8f));  \
    }                                                                                                              \
    static void weighted_dims##SUFFIX(const float *ph, const T *vh, float *oh, long start, long stop, long group,  \
                                      long keys, long dim, long v_key) {                                           \
        for (long d0 = start; d0 < stop;) {                                                                        \
            const int C = stop - d0 >= 32 ? 4 : 1;                                                                 \
            for (long g0 = 0; g0 < group; g0 += 3) {                                                               \
                const int G = group - g0 < 3 ? (int)(group - g0) : 3;                                              \
                if (C == 4 && G == 3)                                                                              \
                    weighted_tile##SUFFIX(ph, vh, oh, g0, d0, keys, dim, v_key, 3, 4);                             \
                else if (C == 4 && G == 2)                                                                         \
                    weighted_tile##SUFFIX(ph, vh, oh, g0, d0, keys, dim, v_key, 2, 4);                             \
                else if (C == 4)                                                                                   \
                    weighted_tile##SUFFIX(ph, vh, oh, g0, d0, keys, dim, v_key, 1, 4);                             \
                else                                                                                               \
                    for (int g = 0; g < G; g++) weighted_tile##SUFFIX(ph, vh, oh, g0 + g, d0, keys, dim, v_key, 1, 1); \
            }                                                                                                      \
            d0 += 8 * C;                                                                                           \
        }                                                                                                          \
    }
AVX2_PRODUCTS(, uint16_t, widen8)
AVX2_PRODUCTS(_f32, float, load8)

#else /* plain loops: widen a row to fp32, then sum over it */

static inline float widen(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)x << 16;
    return v.f;
}

static void scores_block(const float *qh, const uint16_t *kh, float *sh, long start, long end, long group, long keys,
                         long dim, long k_key) {
    float kf[512];
    for (long j = start; j < end; j++) {
        const uint16_t *kr = kh + j * k_key;
        for (long d = 0; d < dim; d++) kf[d] = widen(kr[d]);
        score_row(qh, kf, sh + j, group, keys, dim);
    }
}

static void weighted_dims(const float *ph, const uint16_t *vh, float *oh, long start, long stop, long group,
                          long keys, long dim, long v_key) {
    const long n = stop - start;
    float vf[512];
    for (long g = 0; g < group; g++)
        for (long d = 0; d < n; d++) oh[g * dim + start + d] = 0;
    for (long j = 0; j < keys; j++) {
        const uint16_t *vr = vh + j * v_key + start;
        for (long d = 0; d < n; d++) vf[d] = widen(vr[d]);
        for (long g = 0; g < group; g++) {
            const float w = ph[g * keys + j];
            float *og = oh + g * dim + start;
            for (long d = 0; d < n; d++) og[d] += w * vf[d];
        }
    }
}

#endif

#if !defined(__AVX2__) || defined(__AVX512F__)
/* fp32 caches (AVX-512 and generic builds): nothing to widen, so each key or value row is read where it lies. */
static void scores_block_f32(const float *qh, const float *kh, float *sh, long start, long end, long group,
                             long keys, long dim, long k_key) {
    for (long j = start; j < end; j++) score_row(qh, kh + j * k_key, sh + j, group, keys, dim);
}

static void weighted_dims_f32(const float *ph, const float *vh, float *oh, long start, long stop, long group,
                              long keys, long dim, long v_key) {
    const long n = stop - start;
    for (long g = 0; g < group; g++)
        for (long d = 0; d < n; d++) oh[g * dim + start + d] = 0;
    for (long j = 0; j < keys; j++) {
        const float *vr = vh + j * v_key + start;
        for (long g = 0; g < group; g++) {
            const float w = ph[g * keys + j];
            float *og = oh + g * dim + start;
            for (long d = 0; d < n; d++) og[d] += w * vr[d];
        }
    }
}
#endif

/* The two products' task loops, once per cache element type T (SUFFIX: "" for bf16, _f32 for fp32). */
#define PRODUCTS(SUFFIX, T, SCORES, WEIGHTED) \
    /* s[r, h, g, j] = q[r, h, g, :] . k[r, h, j, :] */ \
    void ua_scores##SUFFIX(const float *q, const T *k, float *s, long rows, long heads, long group, long keys, \
                           long dim, long k_row, long k_head, long k_key, int threads) { \
        const long blocks = (keys + BLOCK - 1) / BLOCK; \
        _Pragma("omp parallel for collapse(3) schedule(static) num_threads(threads)") \
        for (long r = 0; r < rows; r++) \
            for (long h = 0; h < heads; h++) \
                for (long b = 0; b < blocks; b++) { \
                    const long end = (b + 1) * BLOCK < keys ? (b + 1) * BLOCK : keys; \
                    SCORES(q + (r * heads + h) * group * dim, k + r * k_row + h * k_head, \
                           s + (r * heads + h) * group * keys, b * BLOCK, end, group, keys, dim, k_key); \
                } \
    } \
    /* out[r, h, g, :] = sum_j p[r, h, g, j] * v[r, h, j, :]; 64 dims a task (rows x heads can be too few) */ \
    void ua_weighted##SUFFIX(const float *p, const T *v, float *out, long rows, long heads, long group, \
                             long keys, long dim, long v_row, long v_head, long v_key, int threads) { \
        const long chunks = (dim + 63) / 64; \
        _Pragma("omp parallel for collapse(3) schedule(static) num_threads(threads)") \
        for (long r = 0; r < rows; r++) \
            for (long h = 0; h < heads; h++) \
                for (long c = 0; c < chunks; c++) { \
                    const long stop = (c + 1) * 64 < dim ? (c + 1) * 64 : dim; \
                    WEIGHTED(p + (r * heads + h) * group * keys, v + r * v_row + h * v_head, \
                             out + (r * heads + h) * group * dim, c * 64, stop, group, keys, dim, v_key); \
                } \
    }

PRODUCTS(, uint16_t, scores_block, weighted_dims)
PRODUCTS(_f32, float, scores_block_f32, weighted_dims_f32)
