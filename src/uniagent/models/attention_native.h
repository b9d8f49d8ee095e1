/* fp32 vectors (GCC/Clang vector extensions) shared by the native kernels: 16 lanes for the AVX-512
 * builds of attention_native.c (decode) and attention_prefill.c (prefill), 8 for the AVX2 tiles of
 * attention_native.c and for linear_native.c. Plain C otherwise: every build compiles them. */
#ifndef UA_ATTENTION_NATIVE_H
#define UA_ATTENTION_NATIVE_H
#include <stdint.h>
#include <string.h>

typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));
/* 8 lanes: the AVX2 builds' tiles (attention_native.c) and the weight product (linear_native.c) */
typedef float v8f __attribute__((vector_size(32)));
typedef uint16_t v8h __attribute__((vector_size(16)));
typedef uint32_t v8u __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

#define INLINE static inline __attribute__((always_inline))

/* widenN: N bf16 values (as uint16) to fp32; loadN: N fp32 values; from any alignment. */
#define VECTOR_LOADS(N, VF, VH, VU)                                                                        \
    INLINE VF widen##N(const uint16_t *x) {                                                                 \
        VH h;                                                                                               \
        memcpy(&h, x, sizeof h);                                                                            \
        VU u = __builtin_convertvector(h, VU) << 16;                                                        \
        VF f;                                                                                               \
        memcpy(&f, &u, sizeof f);                                                                           \
        return f;                                                                                           \
    }                                                                                                       \
    INLINE VF load##N(const float *x) {                                                                     \
        VF f;                                                                                               \
        memcpy(&f, x, sizeof f);                                                                            \
        return f;                                                                                           \
    }
VECTOR_LOADS(16, v16f, v16h, v16u)
VECTOR_LOADS(8, v8f, v8h, v8u)

INLINE void store16(float *x, v16f f) { memcpy(x, &f, sizeof f); }

/* the sum of the 8 lanes, in lane order */
INLINE float sum8(v8f v) {
    float s = 0;
    for (int l = 0; l < 8; l++) s += v[l];
    return s;
}

#endif
