/* Helpers of the compiled core of bertpipe's fast create_pretraining_data (preprocessing/mlperf/cpd_fast.py).
 *
 * Byte-identical to the plain implementation (preprocessing/mlperf/create_pretraining_data.py), which is
 * the oracle. What lives here:
 *   - reading: lines split on \n, every \r deleted (TF GFile.readline), Python str.strip() blank test;
 *     pure-ASCII lines are tokenized here with the reference's algorithm (clean, lower, punctuation,
 *     WordPiece); every other line is handed to a Python callback (exact Unicode rules there);
 *   - CPython's MT19937, resumed from random.getstate(), so this code draws exactly the stream that
 *     random.Random(seed) would (random(), getrandbits(k <= 32), _randbelow by rejection);
 *   - instance creation, truncation, masking and both shuffles in the reference's draw order;
 *   - canonical tf.train.Example encoding and TFRecord framing with CRC32C (SSE4.2 when present).
 * No numpy, no TensorFlow: the module is plain C against the CPython API.
 */
#ifndef BERTPIPE_CPD_CORE_H
#define BERTPIPE_CPD_CORE_H
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__linux__)
#include <sys/mman.h>
#endif

/* ------------------------------------------------------------------------------------------ */
/* Growable arrays                                                                             */
typedef struct { int32_t *v; size_t n, cap; } I32Vec;
typedef struct { uint8_t *v; size_t n, cap; } ByteVec;

/* Large pools (the instances' tokens: ~400 MB a part, read back in shuffled order) on transparent huge pages where
 * the kernel offers them: one TLB entry covers 2 MB, not 4 KB, so a random instance costs no page walk, and the
 * pool is faulted in 512 times less often. Only advice: without it (or off Linux) nothing changes but speed. */
static void advise_huge(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    const uintptr_t huge = (uintptr_t)2 << 20;
    uintptr_t lo = ((uintptr_t)p + huge - 1) & ~(huge - 1), hi = ((uintptr_t)p + bytes) & ~(huge - 1);
    if (bytes >= ((size_t)8 << 20) && hi > lo) madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p; (void)bytes;
#endif
}

static int i32_reserve(I32Vec *a, size_t extra) {
    if (a->n + extra <= a->cap) return 0;
    size_t cap = a->cap ? a->cap : 1024;
    while (cap < a->n + extra) cap *= 2;
    int32_t *v = realloc(a->v, cap * sizeof(int32_t));
    if (!v) { PyErr_NoMemory(); return -1; }
    a->v = v; a->cap = cap;
    advise_huge(v, cap * sizeof(int32_t));
    return 0;
}
static int i32_push(I32Vec *a, int32_t x) {
    if (a->n == a->cap && i32_reserve(a, 1) < 0) return -1;
    a->v[a->n++] = x;
    return 0;
}
static int bytes_reserve(ByteVec *a, size_t extra) {
    if (a->n + extra <= a->cap) return 0;
    size_t cap = a->cap ? a->cap : 4096;
    while (cap < a->n + extra) cap *= 2;
    uint8_t *v = realloc(a->v, cap);
    if (!v) { PyErr_NoMemory(); return -1; }
    a->v = v; a->cap = cap;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* Vocab: open-addressing hash of UTF-8 keys -> id (first occurrence wins, ids given by caller) */
typedef struct { uint64_t hash; int64_t off; int32_t len, id; } Slot;
typedef struct { Slot *slots; size_t mask; ByteVec keys; } Vocab;

static uint64_t fnv_step(uint64_t h, const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 1099511628211ULL; }
    return h;
}
#define FNV0 14695981039346656037ULL

/* Id of ("##" if prefix) + p[0:n] whose FNV-1a hash is h, or -1. */
static int vocab_find_h(const Vocab *v, uint64_t h, int prefix, const uint8_t *p, size_t n) {
    size_t len = n + (prefix ? 2 : 0);
    for (size_t i = h & v->mask;; i = (i + 1) & v->mask) {
        const Slot *s = &v->slots[i];
        if (s->id < 0) return -1;
        if (s->hash == h && (size_t)s->len == len) {
            const uint8_t *k = v->keys.v + s->off;
            if (prefix) {
                if (k[0] == '#' && k[1] == '#' && memcmp(k + 2, p, n) == 0) return s->id;
            } else if (memcmp(k, p, n) == 0) {
                return s->id;
            }
        }
    }
}

static int vocab_find(const Vocab *v, int prefix, const uint8_t *p, size_t n) {
    uint64_t h = FNV0;
    if (prefix) h = fnv_step(h, (const uint8_t *)"##", 2);
    return vocab_find_h(v, fnv_step(h, p, n), prefix, p, n);
}

static int vocab_build(Vocab *v, PyObject *words) {
    Py_ssize_t nw = PyList_GET_SIZE(words);
    size_t cap = 1024;
    while (cap < (size_t)nw * 2 + 16) cap *= 2;
    v->slots = malloc(cap * sizeof(Slot));
    if (!v->slots) { PyErr_NoMemory(); return -1; }
    for (size_t i = 0; i < cap; i++) v->slots[i].id = -1;
    v->mask = cap - 1;
    for (Py_ssize_t id = 0; id < nw; id++) {
        Py_ssize_t n;
        const char *s = PyUnicode_AsUTF8AndSize(PyList_GET_ITEM(words, id), &n);
        if (!s) return -1;
        if (vocab_find(v, 0, (const uint8_t *)s, (size_t)n) >= 0) continue;
        uint64_t h = fnv_step(FNV0, (const uint8_t *)s, (size_t)n);
        size_t i = h & v->mask;
        while (v->slots[i].id >= 0) i = (i + 1) & v->mask;
        if (bytes_reserve(&v->keys, (size_t)n) < 0) return -1;
        v->slots[i] = (Slot){h, (int64_t)v->keys.n, (int32_t)n, (int32_t)id};
        memcpy(v->keys.v + v->keys.n, s, (size_t)n);
        v->keys.n += (size_t)n;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */
/* CPython's MT19937 (Modules/_randommodule.c semantics)                                       */
typedef struct { uint32_t mt[624], out[624]; int index; } MT; /* out: tempered mt */

static void mt_temper_all(MT *m, int from) {
    for (int i = from; i < 624; i++) {
        uint32_t y = m->mt[i];
        y ^= (y >> 11);
        y ^= (y << 7) & 0x9d2c5680U;
        y ^= (y << 15) & 0xefc60000U;
        y ^= (y >> 18);
        m->out[i] = y;
    }
}

/* Regenerate the 624 words and temper them all at once (a loop the compiler vectorizes). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default"))) /* 8 words a step where the CPU has AVX2 */
#endif
static void mt_regen(MT *m) {
    uint32_t *restrict mt = m->mt, y;
    int kk;
    /* mag01[y & 1] as a mask: no table lookup, so the loops vectorize */
    for (kk = 0; kk < 624 - 397; kk++) {
        y = (mt[kk] & 0x80000000U) | (mt[kk + 1] & 0x7fffffffU);
        mt[kk] = mt[kk + 397] ^ (y >> 1) ^ (-(y & 1U) & 0x9908b0dfU);
    }
    for (; kk < 623; kk++) {
        y = (mt[kk] & 0x80000000U) | (mt[kk + 1] & 0x7fffffffU);
        mt[kk] = mt[kk + (397 - 624)] ^ (y >> 1) ^ (-(y & 1U) & 0x9908b0dfU);
    }
    y = (mt[623] & 0x80000000U) | (mt[0] & 0x7fffffffU);
    mt[623] = mt[396] ^ (y >> 1) ^ (-(y & 1U) & 0x9908b0dfU);
    mt_temper_all(m, 0);
    m->index = 0;
}

/* genrand_uint32 */
static inline __attribute__((always_inline)) uint32_t mt_next(MT *m) {
    if (__builtin_expect(m->index >= 624, 0)) mt_regen(m);
    return m->out[m->index++];
}
/* random.random(): 53-bit float from two outputs */
static inline double mt_random(MT *m) {
    uint32_t a = mt_next(m) >> 5, b = mt_next(m) >> 6;
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}
/* random._randbelow(n) for 1 <= n < 2**32: k = n.bit_length(); getrandbits(k) until < n */
static inline uint32_t mt_below(MT *m, uint32_t n) {
    int k = 32 - __builtin_clz(n);
    uint32_t r;
    do { r = mt_next(m) >> (32 - k); } while (r >= n);
    return r;
}

/* ------------------------------------------------------------------------------------------ */
/* CRC32C: SSE4.2 instruction when the CPU has it, else a table                                */
static uint32_t crc_table[8][256];
static int crc_hw;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78U : c >> 1;
        crc_table[0][i] = c;
    }
    for (int t = 1; t < 8; t++)
        for (int i = 0; i < 256; i++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xff];
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    crc_hw = __builtin_cpu_supports("sse4.2");
#endif
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) static uint32_t crc_sse42(uint32_t crc, const uint8_t *p, size_t n) {
    uint64_t c = crc;
    while (n >= 8) { uint64_t w; memcpy(&w, p, 8); c = __builtin_ia32_crc32di(c, w); p += 8; n -= 8; }
    uint32_t c32 = (uint32_t)c;
    while (n--) c32 = __builtin_ia32_crc32qi(c32, *p++);
    return c32;
}
#endif

static uint32_t crc_soft(uint32_t c, const uint8_t *p, size_t n) {
    while (n >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4); memcpy(&hi, p + 4, 4);
        lo ^= c;  /* little-endian hosts only; big-endian uses the byte loop below */
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff] ^ crc_table[5][(lo >> 16) & 0xff] ^
            crc_table[4][lo >> 24] ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff] ^
            crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8; n -= 8;
    }
    while (n--) c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return c;
}

static uint32_t masked_crc32c(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFU;
#if defined(__x86_64__)
    if (crc_hw) c = crc_sse42(c, p, n);
    else
#endif
    {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        c = crc_soft(c, p, n);
#else
        while (n--) c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
#endif
    }
    c ^= 0xFFFFFFFFU;
    return ((c >> 15) | (c << 17)) + 0xA282EAD8U;
}


#endif /* BERTPIPE_CPD_CORE_H */
