/* mcuforge_math.h: float (and a little integer) math for generated float kernels.
 *
 * Included by a model's .c only when one of its kernels calls an mfm_ function, so int8
 * models need no libm. Most functions are thin wrappers over C99 <math.h> (the program links
 * -lm); the rest spell out the ONNX semantics that C does not have (round half to even,
 * floored modulo, NaN-propagating max/min, integer powers).
 * codegen_c/mathmirror.py holds a Python mirror of every function here; keep the two in step.
 */
#ifndef MCUFORGE_MATH_H
#define MCUFORGE_MATH_H

#include <math.h>
#include <stdint.h>

static inline float mfm_expf(float x) { return expf(x); }
static inline float mfm_expm1f(float x) { return expm1f(x); }
static inline float mfm_logf(float x) { return logf(x); }
static inline float mfm_log1pf(float x) { return log1pf(x); }
static inline float mfm_sqrtf(float x) { return sqrtf(x); }
static inline float mfm_sinf(float x) { return sinf(x); }
static inline float mfm_cosf(float x) { return cosf(x); }
static inline float mfm_tanhf(float x) { return tanhf(x); }
static inline float mfm_erff(float x) { return erff(x); }
static inline float mfm_powf(float x, float y) { return powf(x, y); }
static inline float mfm_floorf(float x) { return floorf(x); }
static inline float mfm_ceilf(float x) { return ceilf(x); }
static inline float mfm_fabsf(float x) { return fabsf(x); }

/* C fmod: the remainder has the sign of the dividend (ONNX Mod with fmod=1). */
static inline float mfm_fmodf(float a, float b) { return fmodf(a, b); }

/* Floored modulo: the remainder has the sign of the divisor (numpy.mod, ONNX Mod fmod=0). */
static inline float mfm_floor_modf(float a, float b) {
    float r = fmodf(a, b);
    if (r != 0.0f && (r < 0.0f) != (b < 0.0f)) return r + b;
    return r != 0.0f ? r : copysignf(0.0f, b);
}

/* Round half to even (ONNX Round, numpy.round), whatever the FPU's rounding mode. The
 * fraction x - floor(x) is exact in float; |x| >= 2^23 is already an integer. */
static inline float mfm_roundf(float x) {
    float f = floorf(x);
    float d = x - f;
    float r;
    if (d > 0.5f) {
        r = f + 1.0f;
    } else if (d < 0.5f) {
        r = f;
    } else if (d == 0.5f) {
        r = fmodf(f, 2.0f) == 0.0f ? f : f + 1.0f;
    } else {
        return x; /* NaN, +-Inf */
    }
    return copysignf(r, x); /* -0.3 rounds to -0.0 */
}

/* max / min that propagate NaN from either operand (ONNX Max, Min, Clip). */
static inline float mfm_maxf(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float mfm_minf(float a, float b) { return (a < b || a != a) ? a : b; }

/* Floored integer modulo (ONNX Mod, fmod=0: the sign of the divisor), b != 0. */
static inline int32_t mfm_mod_i32(int32_t a, int32_t b) {
    int32_t r = b == -1 ? 0 : a % b; /* INT32_MIN % -1 overflows */
    return (r != 0 && (r < 0) != (b < 0)) ? r + b : r;
}

static inline int64_t mfm_mod_i64(int64_t a, int64_t b) {
    int64_t r = b == -1 ? 0 : a % b;
    return (r != 0 && (r < 0) != (b < 0)) ? r + b : r;
}

/* Integer power by squaring, wrapping modulo 2^64 like the unsigned arithmetic it uses.
 * A negative exponent gives the truncated real result: 1, +-1 for base -1, else 0. */
static inline int64_t mfm_ipow_i64(int64_t base, int64_t e) {
    uint64_t r = 1u, b = (uint64_t)base;
    if (e < 0) {
        if (base == 1) return 1;
        if (base == -1) return (e % 2 == 0) ? 1 : -1;
        return 0;
    }
    while (e > 0) {
        if (e & 1) r *= b;
        b *= b;
        e >>= 1;
    }
    if (r <= (uint64_t)INT64_MAX) return (int64_t)r;
    return (int64_t)(r - (uint64_t)INT64_MAX - 1u) + INT64_MIN; /* modulo 2^64, defined */
}

#endif /* MCUFORGE_MATH_H */
