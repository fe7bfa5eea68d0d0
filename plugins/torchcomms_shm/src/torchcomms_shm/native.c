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
    int32_t half;                  /* the half to stage in (set by the caller) */
    int32_t nranks;
    int32_t rank;
    int32_t dtype;
} tc_plan;

#define FOLD(T, U)                                                            \
    do {                                                                      \
        T *out = (T *)p->user;                                                \
        const T *a = (const T *)base;                                         \
        const T *b = (const T *)(base + p->stride);                           \
        for (int64_t i = 0; i < k; i++) out[i] = (T)((U)a[i] + (U)b[i]);      \
        for (int r = 2; r < n; r++) {                                         \
            const T *s = (const T *)(base + r * p->stride);                   \
            for (int64_t i = 0; i < k; i++) out[i] = (T)((U)out[i] + (U)s[i]); \
        }                                                                     \
    } while (0)

#define HAS_NAN(T)                                                            \
    do {                                                                      \
        const T *out = (const T *)p->user;                                    \
        for (int64_t i = 0; i < k; i++)                                       \
            if (out[i] != out[i]) return 0;                                   \
    } while (0)

/* out = s0 + s1 + ... in rank order, from the staged copies of the current half.
 * Returns 0 when a float result is NaN: which NaN (its sign and payload) depends on the
 * order of each addition's operands, which torch's kernels choose, so the caller folds
 * again with them; 1 otherwise. */
int tc_small_fold(tc_plan *p) {
    const char *base = p->slots[p->half];
    const int64_t k = p->count;
    const int n = p->nranks;
    switch (p->dtype) {
    case TC_F32: FOLD(float, float); HAS_NAN(float); break;
    case TC_F64: FOLD(double, double); HAS_NAN(double); break;
    case TC_I32: FOLD(int32_t, uint32_t); break;
    case TC_I64: FOLD(int64_t, uint64_t); break;
    }
    return 1;
}

/* Stage, publish, poll. Returns bit 0 set when every peer published the step and the
 * result is folded into the user's tensor; bit 1 set when a peer sleeps on a step word
 * (the caller wakes it); bit 2 set when every peer published but the fold met a NaN (the
 * caller folds with torch). With neither bit 0 nor bit 2 the caller waits with its own
 * waiter, then folds. */
int tc_small_all_reduce(tc_plan *p) {
    const int n = p->nranks;
    int64_t *w = p->words;
    const int64_t step = p->step;
    int rc = 0;
    memcpy(p->slots[p->half] + p->rank * p->stride, p->user, (size_t)p->nbytes);
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
        if (!behind) return rc | (tc_small_fold(p) ? 1 : 4);
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    }
    return rc;
}
