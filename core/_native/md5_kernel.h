/* One MD5 compression kernel over LANES independent streams, included once per (LANES, VECTOR, TARGET, NAME).
 *
 * VECTOR 1: the LANES streams are the lanes of a GCC/Clang vector of uint32 (8 lanes: AVX2, 16: AVX-512);
 * VECTOR 0: plain uint32 arrays, the steps of the LANES streams interleaved (instruction-level parallelism:
 * 2-3 streams on one core run ~1.7-2.2x one stream, whose speed is bound by MD5's dependency chain).
 *
 * NAME(st, p, nblocks): st[4 * MD5_MAX_LANES] holds the A, B, C, D words of each lane (st[w * MD5_MAX_LANES + l]);
 * p[l] points at lane l's next nblocks * 64 bytes. RFC 1321, little-endian words. */

#if VECTOR
typedef uint32_t MD5_CAT(NAME, _v) __attribute__((vector_size(LANES * 4)));
#define V MD5_CAT(NAME, _v)
/* the two interleaves of the transposition below: the low halves of a and b lane by lane, then the high halves
 * (GCC's __builtin_shuffle takes a vector of indices, Clang's __builtin_shufflevector the indices themselves) */
#undef MD5_LO
#undef MD5_HI
#if LANES == 16
#if defined(__clang__)
#define MD5_LO(a, b) __builtin_shufflevector(a, b, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23)
#define MD5_HI(a, b) __builtin_shufflevector(a, b, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31)
#else
static const V MD5_CAT(NAME, _lo) = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
static const V MD5_CAT(NAME, _hi) = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
#endif
#elif LANES == 8
#if defined(__clang__)
#define MD5_LO(a, b) __builtin_shufflevector(a, b, 0, 8, 1, 9, 2, 10, 3, 11)
#define MD5_HI(a, b) __builtin_shufflevector(a, b, 4, 12, 5, 13, 6, 14, 7, 15)
#else
static const V MD5_CAT(NAME, _lo) = {0, 8, 1, 9, 2, 10, 3, 11};
static const V MD5_CAT(NAME, _hi) = {4, 12, 5, 13, 6, 14, 7, 15};
#endif
#else
#error "vector kernels have 8 or 16 lanes"
#endif
#if !defined(__clang__)
#define MD5_LO(a, b) __builtin_shuffle(a, b, MD5_CAT(NAME, _lo))
#define MD5_HI(a, b) __builtin_shuffle(a, b, MD5_CAT(NAME, _hi))
#endif
#else
#define V uint32_t
#endif

TARGET static void NAME(uint32_t *st, const uint8_t *const *p, size_t nblocks) {
#if VECTOR
    V a, b, c, d;
    memcpy(&a, st + 0 * MD5_MAX_LANES, sizeof a);
    memcpy(&b, st + 1 * MD5_MAX_LANES, sizeof b);
    memcpy(&c, st + 2 * MD5_MAX_LANES, sizeof c);
    memcpy(&d, st + 3 * MD5_MAX_LANES, sizeof d);
    for (size_t k = 0; k < nblocks; k++) {
        /* the message words, word g of every lane in m[g]: each lane's block loaded as 16 / LANES vectors, then
         * each LANES x LANES square transposed by log2(LANES) rounds of perfect shuffles (row j with row
         * j + LANES/2, low halves interleaved, then high halves), which the compiler turns into two-source
         * permutes (vpermt2d) rather than one scalar store per word */
        V m[16];
        for (int q = 0; q < 16 / LANES; q++) {
            V r[LANES], o[LANES];
            for (int l = 0; l < LANES; l++) memcpy(&r[l], p[l] + 64 * k + 4 * LANES * q, sizeof(V));
            for (int round = 1; round < LANES; round *= 2) {
                for (int j = 0; j < LANES / 2; j++) {
                    o[2 * j] = MD5_LO(r[j], r[j + LANES / 2]);
                    o[2 * j + 1] = MD5_HI(r[j], r[j + LANES / 2]);
                }
                memcpy(r, o, sizeof r);
            }
            for (int g = 0; g < LANES; g++) m[q * LANES + g] = r[g];
        }
        V aa = a, bb = b, cc = c, dd = d;
#define MD5_STEP(f, i) { V t = a + (f) + MD5_K[i] + m[MD5_G(i)]; a = d; d = c; c = b; \
                         b = b + ((t << MD5_S[i]) | (t >> (32 - MD5_S[i]))); }
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) MD5_STEP(((b & c) | (~b & d)), i)
#pragma GCC unroll 16
        for (int i = 16; i < 32; i++) MD5_STEP(((b & d) | (c & ~d)), i)
#pragma GCC unroll 16
        for (int i = 32; i < 48; i++) MD5_STEP((b ^ c ^ d), i)
#pragma GCC unroll 16
        for (int i = 48; i < 64; i++) MD5_STEP((c ^ (b | ~d)), i)
#undef MD5_STEP
        a += aa; b += bb; c += cc; d += dd;
    }
    memcpy(st + 0 * MD5_MAX_LANES, &a, sizeof a);
    memcpy(st + 1 * MD5_MAX_LANES, &b, sizeof b);
    memcpy(st + 2 * MD5_MAX_LANES, &c, sizeof c);
    memcpy(st + 3 * MD5_MAX_LANES, &d, sizeof d);
#else
    V a[LANES], b[LANES], c[LANES], d[LANES];
    for (int l = 0; l < LANES; l++) {
        a[l] = st[l]; b[l] = st[MD5_MAX_LANES + l]; c[l] = st[2 * MD5_MAX_LANES + l]; d[l] = st[3 * MD5_MAX_LANES + l];
    }
    for (size_t k = 0; k < nblocks; k++) {
        uint32_t m[LANES][16];
        V aa[LANES], bb[LANES], cc[LANES], dd[LANES];
        for (int l = 0; l < LANES; l++) {
            memcpy(m[l], p[l] + 64 * k, 64);
            aa[l] = a[l]; bb[l] = b[l]; cc[l] = c[l]; dd[l] = d[l];
        }
#define MD5_STEP(f, i) for (int l = 0; l < LANES; l++) { V B = b[l], C = c[l], D = d[l]; \
                         V t = a[l] + (f) + MD5_K[i] + m[l][MD5_G(i)]; a[l] = D; d[l] = C; c[l] = B; \
                         b[l] = B + ((t << MD5_S[i]) | (t >> (32 - MD5_S[i]))); }
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) MD5_STEP(((B & C) | (~B & D)), i)
#pragma GCC unroll 16
        for (int i = 16; i < 32; i++) MD5_STEP(((B & D) | (C & ~D)), i)
#pragma GCC unroll 16
        for (int i = 32; i < 48; i++) MD5_STEP((B ^ C ^ D), i)
#pragma GCC unroll 16
        for (int i = 48; i < 64; i++) MD5_STEP((C ^ (B | ~D)), i)
#undef MD5_STEP
        for (int l = 0; l < LANES; l++) { a[l] += aa[l]; b[l] += bb[l]; c[l] += cc[l]; d[l] += dd[l]; }
    }
    for (int l = 0; l < LANES; l++) {
        st[l] = a[l]; st[MD5_MAX_LANES + l] = b[l]; st[2 * MD5_MAX_LANES + l] = c[l]; st[3 * MD5_MAX_LANES + l] = d[l];
    }
#endif
}

#undef V
#undef LANES
#undef VECTOR
#undef TARGET
#undef NAME
