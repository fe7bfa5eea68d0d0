/* The small all-reduce of torchcomms-shm in C: one copy into this rank's slot, the step
 * published, a bounded poll of the peers' steps, and the fold in rank order.
 *
 * Built at run time by torchcomms_shm.native (the system's C compiler) and called through
 * ctypes with the GIL held (the polls are bounded). The fold is the one of the Python and
 * torch paths, bit for bit: float and double sums are single IEEE additions in rank order
 * (compiled without contraction or fast-math), integer sums wrap as torch's do.
 */
#include <stdint.h>
#include <string.h>

#define TC_MAX_RANKS 64

enum { TC_F32 = 0, TC_F64 = 1, TC_I32 = 2, TC_I64 = 3 };

typedef struct {
    char *user;                    /* the caller's tensor (contiguous) */
    char *slots[2];                /* rank 0's slot in each half */
    int64_t stride;                /* bytes from one rank's slot to the next */
    int64_t *words;                /* the segment's control words */
    int64_t my_step;               /* index of this rank's step word */
    int64_t peer_steps[TC_MAX_RANKS];
    int64_t sleep_words[TC_MAX_RANKS];
    int64_t nbytes;
    int64_t count;
    int64_t polls;                 /* peer polls before giving up to the caller's waiter */
    int64_t step;                  /* the step to publish (set by the caller) */
    int64_t total;                 /* the whole call's bytes, announced and compared */
    int64_t my_size[2];            /* per half: this rank's word announcing them */
    int64_t peer_sizes[2][TC_MAX_RANKS];
    int32_t half;                  /* the half to stage in (set by the caller) */
    int32_t nranks;
    int32_t rank;
    int32_t dtype;
} tc_plan;

/* One fold per type, cloned for the vector units the machine may have (the loader picks
 * the clone at load time), over restrict pointers so the compiler vectorises it. Each
 * element is still the same IEEE additions in rank order (no contraction, no reassociation
 * across ranks), so the bits match torch's kernels. A NaN is noted, not returned early. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TC_CLONES
#endif

#define DEFINE_FOLD(NAME, T, U, NAN_CHECK)                                          \
    TC_CLONES static int NAME(T *restrict out, const char *base, int64_t stride, int n, \
                              int64_t k) {                                          \
        const T *restrict a = (const T *)base;                                      \
        const T *restrict b = (const T *)(base + stride);                           \
        int nan = 0;                                                                \
        if (n == 2) { /* one pass: the sum and the NaN check together */            \
            for (int64_t i = 0; i < k; i++) {                                       \
                T v = (T)((U)a[i] + (U)b[i]);                                       \
                out[i] = v;                                                         \
                if (NAN_CHECK) nan |= v != v;                                       \
            }                                                                       \
            return !nan;                                                            \
        }                                                                           \
        for (int64_t i = 0; i < k; i++) out[i] = (T)((U)a[i] + (U)b[i]);            \
        for (int r = 2; r < n - 1; r++) {                                           \
            const T *restrict s = (const T *)(base + r * stride);                   \
            for (int64_t i = 0; i < k; i++) out[i] = (T)((U)out[i] + (U)s[i]);      \
        }                                                                           \
        const T *restrict last = (const T *)(base + (n - 1) * stride);              \
        for (int64_t i = 0; i < k; i++) {                                           \
            T v = (T)((U)out[i] + (U)last[i]);                                      \
            out[i] = v;                                                             \
            if (NAN_CHECK) nan |= v != v;                                           \
        }                                                                           \
        return !nan;                                                                \
    }

DEFINE_FOLD(fold_f32, float, float, 1)
DEFINE_FOLD(fold_f64, double, double, 1)
DEFINE_FOLD(fold_i32, int32_t, uint32_t, 0)
DEFINE_FOLD(fold_i64, int64_t, uint64_t, 0)

/* out = s0 + s1 + ... in rank order, from the staged copies of the current half.
 * Returns 0 when a float result is NaN: which NaN (its sign and payload) depends on the
 * order of each addition's operands, which torch's kernels choose, so the caller folds
 * again with them; 1 otherwise. */
/* Whether every peer announced this call's size in this half (read once they published
 * the step). */
static int sizes_match(const tc_plan *p) {
    for (int r = 0; r < p->nranks - 1; r++)
        if (__atomic_load_n(&p->words[p->peer_sizes[p->half][r]], __ATOMIC_ACQUIRE) != p->total)
            return 0;
    return 1;
}

/* The fold, once every peer published the step: 2 without folding if a peer announced
 * another size (the caller raises), else as below. */
int tc_small_fold(tc_plan *p) {
    if (!sizes_match(p)) return 2;
    const char *base = p->slots[p->half];
    const int64_t k = p->count;
    const int n = p->nranks;
    switch (p->dtype) {
    case TC_F32: return fold_f32((float *)p->user, base, p->stride, n, k);
    case TC_F64: return fold_f64((double *)p->user, base, p->stride, n, k);
    case TC_I32: return fold_i32((int32_t *)p->user, base, p->stride, n, k);
    case TC_I64: return fold_i64((int64_t *)p->user, base, p->stride, n, k);
    }
    return 1;
}

/* Stage, publish, poll. Returns bit 0 set when every peer published the step and the
 * result is folded into the user's tensor; bit 1 set when a peer sleeps on a step word
 * (the caller wakes it); bit 2 set when every peer published but the fold met a NaN (the
 * caller folds with torch); bit 3 set when a peer announced another size (nothing folded;
 * the caller raises). With none of bits 0, 2 and 3 the caller waits with its own waiter,
 * then folds. */
int tc_small_all_reduce(tc_plan *p) {
    const int n = p->nranks;
    int64_t *w = p->words;
    const int64_t step = p->step;
    int rc = 0;
    memcpy(p->slots[p->half] + p->rank * p->stride, p->user, (size_t)p->nbytes);
    w[p->my_size[p->half]] = p->total;  /* published by the step's release store */
    __atomic_store_n(&w[p->my_step], step, __ATOMIC_RELEASE);
    for (int r = 0; r < n - 1; r++) {
        if (__atomic_load_n(&w[p->sleep_words[r]], __ATOMIC_ACQUIRE)) {
            rc |= 2;
            break;
        }
    }
    for (int64_t poll = 0; poll < p->polls; poll++) {
        int behind = 0;
        for (int r = 0; r < n - 1; r++) {
            if (__atomic_load_n(&w[p->peer_steps[r]], __ATOMIC_ACQUIRE) < step) {
                behind = 1;
                break;
            }
        }
        if (!behind) {
            int folded = tc_small_fold(p);
            return rc | (folded == 2 ? 8 : folded ? 1 : 4);
        }
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    return rc;
}
