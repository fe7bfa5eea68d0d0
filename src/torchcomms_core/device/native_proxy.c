/* The device window's proxy in C, for windows whose every peer is mapped into this process
 * (shared memory: the shm backend's windows, gloo's on one host). See native_proxy.py.
 *
 * A thread of its own, outside the Python interpreter lock, drains the command ring by the
 * protocol of ring.py and layout.py (their numbers are repeated below and compared at load
 * time): a put is one memcpy into the peer's mapped window, a signal one store of this
 * rank's running total into the peer's signal word, a barrier one store of the round into
 * every rank's word. Each command is checked as the Python proxy checks it; the first that
 * fails is recorded in the state block's ERR_* words and stops the thread with ABORT set.
 */
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* layout.py, word for word */
enum {
    W_RANK = 1, W_NRANKS = 2, W_SIGNAL_COUNT = 3, W_COUNTER_COUNT = 4, W_BARRIER_COUNT = 5,
    W_RING = 6, W_CAPACITY = 7, W_HEAD = 8, W_TAIL = 9, W_DONE = 10, W_COUNTERS = 13,
    W_BUFFERS = 17, W_PEER_BYTES = 18, W_ELEMENT = 20, W_ABORT = 23, W_ERR_CODE = 24,
    W_ERR_OP = 25, W_ERR_PEER = 26, W_ERR_ID = 27, W_ERR_EXPECTED = 28, W_ERR_SEEN = 29,
    DESC_WORDS = 8, OPCODE_MASK = 0xFF, PHASE_SHIFT = 8, MAX_BUFFERS = 64, BUFFER_WORDS = 2,
    B_GENERATION = 0, B_BYTES = 1, HANDLE_SHIFT = 16,
    OP_PUT = 1, OP_SIGNAL = 2, OP_BARRIER = 3, ABORTED = 1, PROXY_FAILED = 2,
    E_HANDLE = -1, E_RANK = -2, E_SIGNAL_ID = -3, E_COUNTER_ID = -4, E_BARRIER_ID = -5,
    E_BUFFER = -6, E_RANGE = -7, E_ALIGN = -8,
};

static const int64_t LAYOUT[] = {
    W_RANK, W_NRANKS, W_SIGNAL_COUNT, W_COUNTER_COUNT, W_BARRIER_COUNT, W_RING, W_CAPACITY,
    W_HEAD, W_TAIL, W_DONE, W_COUNTERS, W_BUFFERS, W_PEER_BYTES, W_ELEMENT, W_ABORT,
    W_ERR_CODE, W_ERR_OP, W_ERR_PEER, W_ERR_ID, W_ERR_EXPECTED, W_ERR_SEEN, DESC_WORDS,
    OPCODE_MASK, PHASE_SHIFT, MAX_BUFFERS, BUFFER_WORDS, B_GENERATION, B_BYTES, HANDLE_SHIFT,
    OP_PUT, OP_SIGNAL, OP_BARRIER, ABORTED, PROXY_FAILED, E_HANDLE, E_RANK, E_SIGNAL_ID,
    E_COUNTER_ID, E_BARRIER_ID, E_BUFFER, E_RANGE, E_ALIGN,
};

/* The numbers above, for native_proxy.py to compare with layout.py. */
int64_t tc_proxy_layout(int64_t *out, int64_t room) {
    int64_t n = (int64_t)(sizeof(LAYOUT) / sizeof(LAYOUT[0]));
    for (int64_t i = 0; i < n && i < room; i++) out[i] = LAYOUT[i];
    return n;
}

/* Filled by native_proxy.py; every pointer is an array it keeps alive. */
typedef struct {
    int64_t *state;        /* the state block */
    int64_t *data_bases;   /* [nranks]: every rank's window buffer, mapped here */
    int64_t *signal_bases; /* [nranks]: every rank's signal words, mapped here */
    int64_t *sources;      /* [MAX_BUFFERS]: the address of each registered source */
    int64_t *sent;         /* [nranks][signal_count]: what this rank signalled in total */
    int64_t barrier_at;    /* the first barrier word in the signal words */
    int64_t busy_ns;       /* after a command, keep polling this long before napping */
    int64_t nap_ns;        /* then sleep this long between polls */
    int64_t stop;          /* set by tc_proxy_stop */
    int64_t running;       /* 1 while the thread runs */
    pthread_t thread;
} tc_proxy;

typedef struct {
    int64_t op, peer, dst, src, src_offset, bytes, id, value;
} command;

static int64_t load(const int64_t *w) { return __atomic_load_n(w, __ATOMIC_ACQUIRE); }
static void store(int64_t *w, int64_t v) { __atomic_store_n(w, v, __ATOMIC_RELEASE); }

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* The first failure only, as proxy.record_failure keeps it (ERR_CODE written last). */
static void record(int64_t *s, int64_t code, const command *c, int64_t id, int64_t expected,
                   int64_t seen) {
    if (load(&s[W_ERR_CODE])) return;
    s[W_ERR_OP] = c->op;
    s[W_ERR_PEER] = c->peer;
    s[W_ERR_ID] = id;
    s[W_ERR_EXPECTED] = expected;
    s[W_ERR_SEEN] = seen;
    store(&s[W_ERR_CODE], code);
}

static int signal_peer(tc_proxy *p, const command *c, int64_t id, int64_t value) {
    int64_t *s = p->state;
    if (id < 0 || id >= s[W_SIGNAL_COUNT]) {
        record(s, E_SIGNAL_ID, c, id, 0, 0);
        return 1;
    }
    int64_t *total = &p->sent[c->peer * s[W_SIGNAL_COUNT] + id];
    *total += value;
    int64_t *words = (int64_t *)(intptr_t)p->signal_bases[c->peer];
    /* Everything stored before (a put's data) is visible before this word changes. */
    store(&words[id * s[W_NRANKS] + s[W_RANK]], *total);
    return 0;
}

static int put(tc_proxy *p, const command *c) {
    int64_t *s = p->state;
    int64_t slot = c->src & ((1 << HANDLE_SHIFT) - 1), generation = c->src >> HANDLE_SHIFT;
    int64_t *buffers = (int64_t *)(intptr_t)s[W_BUFFERS];
    if (c->src <= 0 || slot >= MAX_BUFFERS ||
        load(&buffers[slot * BUFFER_WORDS + B_GENERATION]) != generation) {
        record(s, E_BUFFER, c, c->src, 0, 0);
        return 1;
    }
    int64_t element = s[W_ELEMENT];
    if ((c->dst | c->src_offset | c->bytes) % element) {
        record(s, E_ALIGN, c, -1, 0, 0);
        return 1;
    }
    int64_t peer_bytes = ((int64_t *)(intptr_t)s[W_PEER_BYTES])[c->peer];
    int64_t source_bytes = buffers[slot * BUFFER_WORDS + B_BYTES];
    if (c->dst < 0 || c->src_offset < 0 || c->bytes < 0 || c->dst + c->bytes > peer_bytes) {
        record(s, E_RANGE, c, -1, c->dst + c->bytes, peer_bytes);
        return 1;
    }
    if (c->src_offset + c->bytes > source_bytes) {
        record(s, E_RANGE, c, -1, c->src_offset + c->bytes, source_bytes);
        return 1;
    }
    memcpy((char *)(intptr_t)p->data_bases[c->peer] + c->dst,
           (const char *)(intptr_t)p->sources[slot] + c->src_offset, (size_t)c->bytes);
    /* memcpy may use weakly ordered (non-temporal) stores for large copies: order them
     * before the signal that announces the data. */
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    return 0;
}

/* One command, as DeviceWindow._perform carries it out; nonzero once it failed. */
static int perform(tc_proxy *p, const command *c) {
    int64_t *s = p->state;
    int64_t nranks = s[W_NRANKS];
    if (c->peer < 0 || c->peer >= nranks) {
        record(s, E_RANK, c, c->id, 0, 0);
        return 1;
    }
    if (c->op == OP_PUT) {
        /* Every id is checked before anything is written. */
        if (c->id >= s[W_SIGNAL_COUNT]) {
            record(s, E_SIGNAL_ID, c, c->id, 0, 0);
            return 1;
        }
        if (c->value >= s[W_COUNTER_COUNT]) {
            record(s, E_COUNTER_ID, c, c->value, 0, 0);
            return 1;
        }
        if (c->bytes && put(p, c)) return 1;
        if (c->id >= 0 && signal_peer(p, c, c->id, 1)) return 1;
        if (c->value >= 0) { /* the source may be reused: the copy above has returned */
            int64_t *counters = (int64_t *)(intptr_t)s[W_COUNTERS];
            store(&counters[c->value], counters[c->value] + 1);
        }
        return 0;
    }
    if (c->op == OP_SIGNAL) return signal_peer(p, c, c->id, c->value);
    if (c->op == OP_BARRIER) {
        if (c->id < 0 || c->id >= s[W_BARRIER_COUNT]) {
            record(s, E_BARRIER_ID, c, c->id, 0, 0);
            return 1;
        }
        int64_t at = p->barrier_at + c->id * nranks + s[W_RANK];
        for (int64_t peer = 0; peer < nranks; peer++)
            store(&((int64_t *)(intptr_t)p->signal_bases[peer])[at], c->value);
        return 0;
    }
    record(s, E_HANDLE, c, c->op, 0, 0);
    return 1;
}

static void pause_briefly(int64_t idle_ns, const tc_proxy *p) {
    if (idle_ns < p->busy_ns) {
        sched_yield();
    } else {
        struct timespec t = {0, (long)p->nap_ns};
        nanosleep(&t, NULL);
    }
}

static void *run(void *arg) {
    tc_proxy *p = (tc_proxy *)arg;
    int64_t *s = p->state;
    int64_t *ring = (int64_t *)(intptr_t)s[W_RING];
    int64_t cap = s[W_CAPACITY];
    int64_t idle_since = now_ns();
    int failed = 0;
    unsigned spins = 0;
    while (!load(&p->stop)) {
        int64_t tail = s[W_TAIL];
        int64_t *slot = ring + (tail % cap) * DESC_WORDS;
        int64_t header = load(slot);
        if (((header >> PHASE_SHIFT) & 1) != (((tail / cap) + 1) & 1) ||
            !(header & OPCODE_MASK)) {
            if (++spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
                __builtin_ia32_pause();
#endif
                continue;
            }
            spins = 0;
            pause_briefly(now_ns() - idle_since, p);
            continue;
        }
        command c = {header & OPCODE_MASK, slot[1], slot[2], slot[3],
                     slot[4],              slot[5], slot[6], slot[7]};
        store(&s[W_TAIL], tail + 1); /* the slot may be written again by the next lap */
        if (perform(p, &c)) {
            failed = 1;
            break;
        }
        store(&s[W_DONE], s[W_DONE] + 1);
        spins = 0;
        idle_since = now_ns();
    }
    if (!load(&s[W_ABORT])) store(&s[W_ABORT], failed ? PROXY_FAILED : ABORTED);
    store(&p->running, 0);
    return NULL;
}

/* Start the thread; 0 on success, else the error number of pthread_create. */
int tc_proxy_start(tc_proxy *p) {
    p->stop = 0;
    store(&p->running, 1);
    int rc = pthread_create(&p->thread, NULL, run, p);
    if (rc) store(&p->running, 0);
    return rc;
}

/* Ask the thread to stop after the command it is carrying out (returns at once). */
void tc_proxy_stop(tc_proxy *p) { store(&p->stop, 1); }

/* Wait up to timeout_ns for the thread to end; 0 once it has (and is joined), 1 if not. */
int tc_proxy_join(tc_proxy *p, int64_t timeout_ns) {
    int64_t deadline = now_ns() + timeout_ns;
    while (load(&p->running)) {
        if (now_ns() > deadline) return 1;
        struct timespec t = {0, 100000};
        nanosleep(&t, NULL);
    }
    pthread_join(p->thread, NULL);
    return 0;
}
