/* 16-lane fp32 vectors (GCC/Clang vector extensions) shared by the AVX-512 builds of
 * attention_native.c (decode) and attention_prefill.c (prefill). */
#ifndef UA_ATTENTION_NATIVE_H
#define UA_ATTENTION_NATIVE_H
#include <stdint.h>
#include <string.h>

typedef float v16f __attribute__((vector_size(64)));
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
typedef int32_t v16i __attribute__((vector_size(64)));

#define INLINE static inline __attribute__((always_inline))

INLINE v16f widen16(const uint16_t *x) {
    v16h h;
    memcpy(&h, x, sizeof h);
    v16u u = __builtin_convertvector(h, v16u) << 16;
    v16f f;
    memcpy(&f, &u, sizeof f);
    return f;
}

INLINE v16f load16(const float *x) {
    v16f f;
    memcpy(&f, x, sizeof f);
    return f;
}

INLINE void store16(float *x, v16f f) { memcpy(x, &f, sizeof f); }

#endif
