/* Prefill attention over a bf16 cache: many queries per row (uniagent.models.attention_native).
 *
 * torch's CPU flash attention runs bf16 through fp32 GEMMs and computes every key block an explicit
 * mask hides; at 8 rows x 600 new tokens over 4,700 keys it ran at 114 GFLOP/s on a CPU whose fp32
 * peak is 178, and prefill attention was most of an agent turn's time to first token. Here a task is
 * one row, one kv head and up to 16 queries: their query rows (queries x grouped heads) share every
 * key and value read. Keys come in blocks of 64, widened to fp32 and transposed so each score is a
 * plain multiply-add with no horizontal sum; a block the mask hides from every query of the task is
 * skipped (the causal corner, left padding, gaps between prefixes); the softmax is the online one
 * (a running max and sum per query row). Scores, softmax and sums are fp32, as in SDPA's kernel, and
 * the output is rounded to bf16 once. With AVX512-BF16 the scores take the keys as bf16 pairs
 * (vdpbf16ps: exact products, fp32 sums, twice the multiply-adds an instruction): at 8 rows x 600 new
 * tokens over 4,700 keys 191 GFLOP/s against SDPA's 124 on the same CPU (161 without it).
 *
 * q [rows, heads, queries, dim], k/v [rows, kv_heads, keys, dim]: bf16 as uint16, element strides
 * per row, head and position, last dimension contiguous. mask: bytes (0 hides), [r * m_row + i *
 * m_pos + j], or NULL: then `causal` < 0 shows every key, else query i sees keys j <= i + causal.
 * out: [rows, queries, heads, dim] bf16, contiguous. dim: 64, 128, 192 or 256; heads / kv_heads <= 16.
 * Returns 0, or -1 where this build has no prefill kernel (not AVX-512), the shape is not taken or a
 * thread's scratch (~270 KB, on the heap: OpenMP threads' stacks may be small) could not be allocated.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define PREFILL_ARGS                                                                                            \
    const uint16_t *q, const uint16_t *k, const uint16_t *v, const uint8_t *mask, uint16_t *out, long rows,       \
        long heads, long kv_heads, long queries, long keys, long dim, long q_row, long q_head, long q_pos,        \
        long k_row, long k_head, long k_key, long v_row, long v_head, long v_key, long m_row, long m_pos,         \
        long causal, float scale, int threads

#if defined(__AVX512F__)
#include "attention_native.h"
#if defined(__AVX512BF16__)
#include <immintrin.h>
#endif

#define MAXM 64  /* query rows a task holds */
#define MAXD 256 /* head dim */
#define KB 64    /* keys a block: four vectors of lanes */

/* e^x for x <= 0 (Cephes' expf: a degree-6 polynomial after range reduction; ~2 ulp). */
INLINE v16f vexp(v16f x) {
    const v16i low = x < -87.0f;
    x = (v16f)(((v16i)x & ~low) | ((v16i)((v16f){0} - 87.0f) & low));
    const v16i n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, v16i); /* round, x <= 0 */
    const v16f nf = __builtin_convertvector(n, v16f);
    const v16f r = x - nf * 0.693359375f + nf * 2.12194440e-4f;
    v16f p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    const v16f y = p * r * r + r + 1.0f;
    return y * (v16f)((n + 127) << 23);
}

INLINE v16f vmax(v16f a, v16f b) {
    const v16i gt = a > b;
    return (v16f)(((v16i)a & gt) | ((v16i)b & ~gt));
}

INLINE float hmax(v16f x) {
    x = vmax(x, __builtin_shuffle(x, (v16i){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7}));
    x = vmax(x, __builtin_shuffle(x, (v16i){4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3}));
    x = vmax(x, __builtin_shuffle(x, (v16i){2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1}));
    x = vmax(x, __builtin_shuffle(x, (v16i){1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0}));
    return x[0];
}
INLINE float hsum(v16f x) {
    x += __builtin_shuffle(x, (v16i){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    x += __builtin_shuffle(x, (v16i){4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3});
    x += __builtin_shuffle(x, (v16i){2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1});
    x += __builtin_shuffle(x, (v16i){1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0});
    return x[0];
}

INLINE uint16_t to_bf16(float f) { /* round to nearest even */
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return (uint16_t)((u + 0x7FFF + ((u >> 16) & 1)) >> 16);
}

/* The keys query i sees in j0..j0+KB (bit l: key j0 + l), of `nk` present. */
static uint64_t visible(const uint8_t *mrow, long i, long j0, long nk, long causal) {
    uint64_t bits = 0;
    for (long l = 0; l < nk; l++) {
        const long j = j0 + l;
        const int see = mrow ? mrow[j] != 0 : (causal < 0 || j <= i + causal);
        bits |= (uint64_t)see << l;
    }
    return bits;
}

/* One thread's working set for a task (64-byte aligned members: every size is a multiple of 64). */
struct scratch {
    float qf[MAXM][MAXD];
    float o[MAXM][MAXD];
#if defined(__AVX512BF16__)
    uint32_t kp[MAXD / 2][KB]; /* keys as bf16 pairs */
    uint32_t qp[MAXM][MAXD / 2];
#else
    float kt[MAXD][KB];
#endif
    float vf[KB][MAXD];
    float p[MAXM][KB];
    float mx[MAXM], sum[MAXM], corr[MAXM];
    uint64_t vis[MAXM];
} __attribute__((aligned(64)));

static const v16i LANE_BIT = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768};

int ua_prefill(PREFILL_ARGS) {
    const long G = heads / kv_heads;
    if (G * kv_heads != heads || G > 16 || dim % 64 || dim > MAXD) return -1;
    const long QB = MAXM / G < 16 ? MAXM / G : 16; /* queries a task: up to 64 query rows */
    const long blocks = (queries + QB - 1) / QB;
    int failed = 0;
#pragma omp parallel num_threads(threads)
    {
        struct scratch *const s = aligned_alloc(64, sizeof(struct scratch));
        if (!s) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for collapse(3) schedule(dynamic)
    for (long r = 0; r < rows; r++)
        for (long h = 0; h < kv_heads; h++)
            for (long b = 0; b < blocks; b++) {
                if (!s) continue; /* the call returns -1: SDPA runs instead */
                const long i0 = b * QB, nq = queries - i0 < QB ? queries - i0 : QB, M = nq * G;
                const long M4 = (M + 3) & ~3L;
                float(*const qf)[MAXD] = s->qf, (*const o)[MAXD] = s->o, (*const vf)[MAXD] = s->vf;
                float(*const p)[KB] = s->p, *const mx = s->mx, *const sum = s->sum, *const corr = s->corr;
                uint64_t *const vis = s->vis;
#if defined(__AVX512BF16__)
                uint32_t(*const kp)[KB] = s->kp, (*const qp)[MAXD / 2] = s->qp;
#else
                float(*const kt)[KB] = s->kt;
#endif
                for (long m = 0; m < M4; m++) { /* row m: query i0 + m / G, head h * G + m % G */
                    mx[m] = -INFINITY, sum[m] = 0, corr[m] = 1;
                    for (long d = 0; d < dim; d++) qf[m][d] = o[m][d] = 0;
#if defined(__AVX512BF16__)
                    memset(qp[m], 0, sizeof qp[m]);
#endif
                    if (m >= M) continue;
                    const uint16_t *qr = q + r * q_row + (h * G + m % G) * q_head + (i0 + m / G) * q_pos;
                    for (long d = 0; d < dim; d += 16) store16(&qf[m][d], widen16(qr + d) * scale);
#if defined(__AVX512BF16__)
                    memcpy(qp[m], qr, dim * sizeof(uint16_t));
#endif
                }
                const uint8_t *mr = mask ? mask + r * m_row : 0;
                const uint16_t *kh = k + r * k_row + h * k_head, *vh = v + r * v_row + h * v_head;
                for (long j0 = 0; j0 < keys; j0 += KB) {
                    const long nk = keys - j0 < KB ? keys - j0 : KB;
                    uint64_t any = 0;
                    for (long qi = 0; qi < nq; qi++) {
                        const uint64_t bits = visible(mr ? mr + (i0 + qi) * m_pos : 0, i0 + qi, j0, nk, causal);
                        for (long g = 0; g < G; g++) vis[qi * G + g] = bits;
                        any |= bits;
                    }
                    if (!any) continue; /* hidden from every query here */
                    for (long m = M; m < M4; m++) vis[m] = 0;
                    for (long l = 0; l < KB; l++) {
                        if (l >= nk) {
                            for (long d = 0; d < dim; d++) {
                                vf[l][d] = 0;
#if defined(__AVX512BF16__)
                                kp[d / 2][l] = 0;
#else
                                kt[d][l] = 0;
#endif
                            }
                            continue;
                        }
                        for (long d = 0; d < dim; d += 16) {
#if defined(__AVX512BF16__)
                            if (d % 32 == 0) {
                                uint32_t pairs[16];
                                memcpy(pairs, kh + (j0 + l) * k_key + d, sizeof pairs);
                                for (int x = 0; x < 16; x++) kp[d / 2 + x][l] = pairs[x];
                            }
#else
                            const v16f kv = widen16(kh + (j0 + l) * k_key + d);
                            for (int x = 0; x < 16; x++) kt[d + x][l] = kv[x];
#endif
                            store16(&vf[l][d], widen16(vh + (j0 + l) * v_key + d));
                        }
                    }
                    for (long m = 0; m < M4; m += 4) { /* scores and the online softmax, 4 rows at a time */
                        v16f s[4][4] = {0};
#if defined(__AVX512BF16__) /* bf16 pairs: exact products, fp32 sums, twice the multiply-adds a cycle */
                        for (long d2 = 0; d2 < dim / 2; d2++) {
                            __m512bh kv[4];
                            for (int c = 0; c < 4; c++) kv[c] = (__m512bh)_mm512_load_si512(&kp[d2][16 * c]);
                            for (int x = 0; x < 4; x++) {
                                const __m512bh qv = (__m512bh)_mm512_set1_epi32((int)qp[m + x][d2]);
                                for (int c = 0; c < 4; c++) s[x][c] = (v16f)_mm512_dpbf16_ps((__m512)s[x][c], qv, kv[c]);
                            }
                        }
                        for (int x = 0; x < 4; x++)
                            for (int c = 0; c < 4; c++) s[x][c] *= scale;
#else
                        for (long d = 0; d < dim; d++) {
                            v16f kv[4];
                            for (int c = 0; c < 4; c++) kv[c] = load16(&kt[d][16 * c]);
                            for (int x = 0; x < 4; x++)
                                for (int c = 0; c < 4; c++) s[x][c] += qf[m + x][d] * kv[c];
                        }
#endif
                        for (int x = 0; x < 4; x++) {
                            const uint64_t bits = vis[m + x];
                            if (!bits) {
                                corr[m + x] = 1;
                                for (int c = 0; c < 4; c++) store16(&p[m + x][16 * c], (v16f){0});
                                continue;
                            }
                            v16i hide[4];
                            v16f top = (v16f){0} - INFINITY;
                            for (int c = 0; c < 4; c++) {
                                hide[c] = (LANE_BIT & (int)((bits >> (16 * c)) & 0xFFFF)) == 0;
                                s[x][c] = (v16f)(((v16i)s[x][c] & ~hide[c]) | ((v16i)top & hide[c]));
                            }
                            for (int c = 0; c < 4; c++) top = vmax(top, s[x][c]);
                            const float best = hmax(top), next = best > mx[m + x] ? best : mx[m + x];
                            corr[m + x] = expf(mx[m + x] - next);
                            mx[m + x] = next;
                            v16f total = {0};
                            for (int c = 0; c < 4; c++) {
                                const v16f e = (v16f)((v16i)vexp(s[x][c] - next) & ~hide[c]);
                                total += e;
                                store16(&p[m + x][16 * c], e);
                            }
                            sum[m + x] = sum[m + x] * corr[m + x] + hsum(total);
                        }
                    }
                    for (long m = 0; m < M4; m += 4) /* o = o * corr + p @ v, a 4 x 64 tile in registers */
                        for (long d = 0; d < dim; d += 64) {
                            v16f acc[4][4];
                            for (int x = 0; x < 4; x++)
                                for (int c = 0; c < 4; c++) acc[x][c] = load16(&o[m + x][d + 16 * c]) * corr[m + x];
                            for (long l = 0; l < nk; l++) {
                                v16f vv[4];
                                for (int c = 0; c < 4; c++) vv[c] = load16(&vf[l][d + 16 * c]);
                                for (int x = 0; x < 4; x++)
                                    for (int c = 0; c < 4; c++) acc[x][c] += p[m + x][l] * vv[c];
                            }
                            for (int x = 0; x < 4; x++)
                                for (int c = 0; c < 4; c++) store16(&o[m + x][d + 16 * c], acc[x][c]);
                        }
                }
                for (long m = 0; m < M; m++) { /* a row that saw nothing gives zeros, never NaN */
                    const float inv = sum[m] > 0 ? 1.0f / sum[m] : 0.0f;
                    uint16_t *orow = out + ((r * queries + i0 + m / G) * heads + h * G + m % G) * dim;
                    for (long d = 0; d < dim; d++) orow[d] = to_bf16(o[m][d] * inv);
                }
            }
        free(s);
    }
    return failed ? -1 : 0;
}

#else

int ua_prefill(PREFILL_ARGS) { return -1; } /* no prefill kernel without AVX-512: SDPA runs */

#endif
