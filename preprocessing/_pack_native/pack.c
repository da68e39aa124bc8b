/* preprocessing._pack_native: the loops the packers and NVIDIA's shuffle spend their time in.
 *
 * shuffle(state, out): out = 0..n-1, then shuffled exactly as CPython's random.Random.shuffle does a list of n
 *   items (3.8-3.13: for i = n-1 .. 1, j = _randbelow(i + 1), swap), drawing from the Mersenne Twister state
 *   ``state`` (625 uint32: the 624 words and the position of random.Random.getstate()[1]), which it advances.
 *   n < 2**32 (one 32-bit output per draw, as getrandbits(k) for k <= 32). shuffle(state, out, 1): out's own
 *   values shuffled in place (the same swaps: out becomes old_out[perm] for the permutation shuffle(state, perm)
 *   would give).
 * gather_runs(out, addrs, lens, src_itemsize): run i is lens[i] signed integers of src_itemsize bytes at address
 *   addrs[i]; the runs, back to back, into out (signed integers of out's item size), converted. Returns the
 *   index in out of the first value that does not fit out's type (nothing after it is written), or -1.
 *   The caller guarantees every address range is readable (preprocessing/pack_fast.py checks the bounds).
 *
 * gather_runs_bounded(out, addrs, lens, src_itemsize, lo, hi): gather_runs, every value also checked to lie in
 *   lo..hi (within out's type): the index in out of the first value outside, or -1 (the whole output is written).
 * mask_lengths(mask, width, out): mask holds rows of width int8 values; out[r] = the number of 1s that open row r,
 *   each row checked to be those 1s then only 0s. Returns the first row that is not, or -1 (out is complete).
 * prefix_lengths(values, width, out): values holds rows of width signed integers (1, 2, 4 or 8 bytes); out[r] = the
 *   number of non-zero values that open row r, each row checked to be those then only 0s. Returns the first row
 *   that is not, or -1 (out is complete).
 *
 * padded_counts(mask, pos, ids, width, pwidth, seq, pred): padded rows' int8 input_mask (width a row) and int32
 *   masked_lm_positions and masked_lm_ids (pwidth a row): seq[r] (int64) = row r's mask's leading 1s, pred[r] its
 *   non-zero ids, each row checked: its mask 1s then 0s, its positions 0 or below its length and not negative, its
 *   ids not negative. Returns the first row that breaks one (seq/pred written up to it), or -1.
 * position_counts(mask, pos, width, pwidth, seq, pred): padded_counts' lengths and rules without the ids; pred[r]
 *   = row r's leading non-zero positions. Returns (the first row that breaks a rule, or -1; whether every row's
 *   positions up to it are non-zeros then zeros).
 * format_packs(lengths, indices, pack_off): json.dumps of the packs [[[length, index], ...], ...] (pack p: items
 *   pack_off[p] .. pack_off[p+1]-1; int64 arrays), as ASCII bytes: NVIDIA's shard lists.
 * cut_padded(mask, ids, seg, pos, mlm, nsl, out_ids, out_seg, out_pos, out_mlm, seq, pred): padded MLPerf rows
 *   (int8 input_mask / segment_ids / next_sentence_labels, int32 input_ids / masked_lm_positions / masked_lm_ids,
 *   C-contiguous) checked and cut as convert_fixed2variable.py cuts them, in one pass a row: a row's length L is
 *   its mask's leading ones (the rest must be 0), P the count of its nonzero positions; out_ids/out_seg get each
 *   row's first L values (int16/int8), out_pos/out_mlm its first P (int16), back to back; seq/pred (int64) the
 *   lengths. Every value of the row is checked (its padding too): mask 0/1 and a prefix, 1 <= L; ids and mlm ids
 *   0..32767; segment ids and the label 0/1; positions 0..32767 and each nonzero one < L. Returns -1, or the first
 *   row that breaks a rule (the caller's checks say which, in their words; what was written is to be dropped).
 *
 * place_runs(out, dests, addrs, lens, src_itemsize, lo, hi): gather_runs_bounded the other way round: run i (lens[i]
 *   values at addrs[i]) into out from index dests[i], converted, each value checked to lie in lo..hi (within out's
 *   type). The runs come in their sources' order (rows read as stored, one after the other: no cache miss a row
 *   as when they are read in another order); the caller's dests tile out. Returns -1, or 0 when a value is outside
 *   (where: found by gather_runs_bounded, in output order). dests[i] + lens[i] <= len(out) is checked.
 * seg_bounds(out, addrs, lens, src_itemsize): run i (lens[i] signed integers of src_itemsize bytes at addrs[i]) must
 *   be segment ids 0...0 1...1 (either part may be empty); out[i] (int16) = its 0s. Returns the first run that is
 *   not, or -1 (out is complete). What a BERT row's segment ids are: one number a row keeps them.
 * fill_segments(out, bounds, lens): out (int8) = for each row i, bounds[i] 0s then lens[i] - bounds[i] 1s, back to
 *   back (int64 bounds and lens, 0 <= bounds[i] <= lens[i], out exactly their sum: checked). seg_bounds undone.
 *
 * image_callbacks() -> the address of an H5FD_file_image_callbacks_t (HDF5's H5Pset_file_image_callbacks) whose
 *   core-driver buffer is this thread's arena: image_arena(buf) makes the writable buffer buf (kept alive by the
 *   caller) the memory a core-driver file grows in (HDF5 memsets and writes into it, no allocation of its own);
 *   past its size the image moves to malloc'd memory, still the arena's. image_arena(None) frees that and forgets
 *   buf. image_view() -> (address, size, in_buf): the image's memory and the size HDF5 last grew it to (its close
 *   leaves it: the free callback keeps the memory until the next image_arena call).
 *
 * They release the GIL. The Python fallbacks (preprocessing/pyrandom.py, pack_fast.py) give the same results. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The inner loops' functions (HOT) are compiled twice where GCC dispatches at load time (ifunc: x86-64 Linux with
 * glibc; musl has no ifunc): for AVX2 and for the baseline, the AVX2 copy taken on a machine that has it. Integer
 * code only: the same results. Measured on the 2-core VM (AVX-512): the module's place loop built for x86-64-v3,
 * 2.65 GB/s of int32 token ids placed as int16 where its baseline build placed 2.2-2.5; pack-nvidia's CPU on 8
 * parts 0.86x, pack-habana raw's 0.91x (interleaved pairs, medians of 3). */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__) && \
    __GNUC__ >= 7
#define HOT __attribute__((target_clones("avx2", "default")))
#else
#define HOT
#endif

#ifndef BERTPIPE_SOURCES_DIGEST
#define BERTPIPE_SOURCES_DIGEST "unknown"
#endif

/* -- CPython's Mersenne Twister (Modules/_randommodule.c: genrand_uint32) -------------------------------- */
#define MT_N 624
#define MT_M 397

static uint32_t mt_next(uint32_t *mt, uint32_t *pos) {
    static const uint32_t mag01[2] = {0x0u, 0x9908b0dfu};
    uint32_t y;
    if (*pos >= MT_N) {
        int kk;
        for (kk = 0; kk < MT_N - MT_M; kk++) {
            y = (mt[kk] & 0x80000000u) | (mt[kk + 1] & 0x7fffffffu);
            mt[kk] = mt[kk + MT_M] ^ (y >> 1) ^ mag01[y & 0x1u];
        }
        for (; kk < MT_N - 1; kk++) {
            y = (mt[kk] & 0x80000000u) | (mt[kk + 1] & 0x7fffffffu);
            mt[kk] = mt[kk + (MT_M - MT_N)] ^ (y >> 1) ^ mag01[y & 0x1u];
        }
        y = (mt[MT_N - 1] & 0x80000000u) | (mt[0] & 0x7fffffffu);
        mt[MT_N - 1] = mt[MT_M - 1] ^ (y >> 1) ^ mag01[y & 0x1u];
        *pos = 0;
    }
    y = mt[(*pos)++];
    y ^= (y >> 11);
    y ^= (y << 7) & 0x9d2c5680u;
    y ^= (y << 15) & 0xefc60000u;
    y ^= (y >> 18);
    return y;
}


#define SHUFFLE_LOOP(T)                                                                   \
    do {                                                                                  \
        T *x = (T *)outv.buf;                                                             \
        if (!keep) for (uint64_t i = 0; i < n; i++) x[i] = (T)i;                          \
        for (uint64_t i = n > 0 ? n - 1 : 0; i >= 1; i--) {                               \
            uint64_t bound = i + 1;                                                       \
            int k = 64 - __builtin_clzll(bound); /* bound.bit_length(), 2..32 */          \
            uint64_t r;                                                                   \
            do { r = mt_next(mt, &pos) >> (32 - k); } while (r >= bound);                 \
            T tmp = x[i]; x[i] = x[r]; x[r] = tmp;                                        \
        }                                                                                 \
    } while (0)

static PyObject *shuffle(PyObject *self, PyObject *args) {
    PyObject *state_obj, *out_obj;
    int keep = 0; /* 1: shuffle out's values in place instead of 0..n-1 */
    if (!PyArg_ParseTuple(args, "OO|p", &state_obj, &out_obj, &keep)) return NULL;
    Py_buffer sv, outv;
    if (PyObject_GetBuffer(state_obj, &sv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &outv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) {
        PyBuffer_Release(&sv);
        return NULL;
    }
    PyObject *ret = NULL;
    if (sv.len != (MT_N + 1) * 4) {
        PyErr_SetString(PyExc_ValueError, "shuffle: state must be 625 uint32 (624 words and the position)");
        goto done;
    }
    if (outv.itemsize != 4 && outv.itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "shuffle: out must hold 4- or 8-byte integers");
        goto done;
    }
    uint64_t n = (uint64_t)(outv.len / outv.itemsize);
    if (n > ((uint64_t)1 << 32) || (outv.itemsize == 4 && n > ((uint64_t)1 << 31))) {
        PyErr_SetString(PyExc_ValueError, "shuffle: too many items for this kernel");
        goto done;
    }
    uint32_t *mt = (uint32_t *)sv.buf;
    uint32_t pos = mt[MT_N];
    if (pos > MT_N) {
        PyErr_SetString(PyExc_ValueError, "shuffle: position out of range");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    if (outv.itemsize == 4) SHUFFLE_LOOP(int32_t);
    else SHUFFLE_LOOP(int64_t);
    Py_END_ALLOW_THREADS
    mt[MT_N] = pos;
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&sv);
    PyBuffer_Release(&outv);
    return ret;
}

/* -- gathering runs ----------------------------------------------------------------------------------------- */
#define GATHER(S, D, DMIN, DMAX, CHECK)                                                   \
    do {                                                                                  \
        D *o = (D *)outv.buf;                                                             \
        for (Py_ssize_t r = 0; r < nruns && bad < 0; r++) {                               \
            const S *s = (const S *)(uintptr_t)addrs[r];                                  \
            int64_t len = lens[r];                                                        \
            if (CHECK) { /* convert the whole run (vectorized), then look for the culprit if any */ \
                int out_of_range = 0;                                                     \
                D *d = o + at;                                                            \
                for (int64_t i = 0; i < len; i++) {                                       \
                    S v = s[i];                                                           \
                    d[i] = (D)v;                                                          \
                    out_of_range |= (v < (S)(DMIN)) | (v > (S)(DMAX));                    \
                }                                                                         \
                if (out_of_range)                                                         \
                    for (int64_t i = 0; i < len; i++)                                     \
                        if (s[i] < (S)(DMIN) || s[i] > (S)(DMAX)) { bad = at + i; break; } \
            } else if (sizeof(S) == sizeof(D)) {                                          \
                memcpy(o + at, s, (size_t)len * sizeof(D));                               \
            } else {                                                                      \
                for (int64_t i = 0; i < len; i++) o[at + i] = (D)s[i];                    \
            }                                                                             \
            at += len;                                                                    \
        }                                                                                 \
    } while (0)

#define GATHER_TO(S)                                                                               \
    switch (outv.itemsize) {                                                                       \
        case 1: GATHER(S, int8_t, INT8_MIN, INT8_MAX, sizeof(S) > 1); break;                       \
        case 2: GATHER(S, int16_t, INT16_MIN, INT16_MAX, sizeof(S) > 2); break;                    \
        case 4: GATHER(S, int32_t, INT32_MIN, INT32_MAX, sizeof(S) > 4); break;                    \
        default: GATHER(S, int64_t, INT64_MIN, INT64_MAX, 0); break;                               \
    }

HOT static PyObject *gather_runs(PyObject *self, PyObject *args) {
    PyObject *out_obj, *addrs_obj, *lens_obj;
    int src_itemsize;
    if (!PyArg_ParseTuple(args, "OOOi", &out_obj, &addrs_obj, &lens_obj, &src_itemsize)) return NULL;
    Py_buffer outv, av, lv;
    if (PyObject_GetBuffer(out_obj, &outv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(addrs_obj, &av, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&outv);
        return NULL;
    }
    if (PyObject_GetBuffer(lens_obj, &lv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&outv);
        PyBuffer_Release(&av);
        return NULL;
    }
    PyObject *ret = NULL;
    Py_ssize_t nruns = av.len / 8;
    const uint64_t *addrs = (const uint64_t *)av.buf;
    const int64_t *lens = (const int64_t *)lv.buf;
    int64_t total = 0;
    if (lv.len != av.len || av.len % 8) {
        PyErr_SetString(PyExc_ValueError, "gather_runs: addrs and lens must be as many 8-byte integers");
        goto done;
    }
    if (outv.itemsize != 1 && outv.itemsize != 2 && outv.itemsize != 4 && outv.itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "gather_runs: out must hold 1-, 2-, 4- or 8-byte integers");
        goto done;
    }
    if (src_itemsize != 1 && src_itemsize != 2 && src_itemsize != 4 && src_itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "gather_runs: src_itemsize must be 1, 2, 4 or 8");
        goto done;
    }
    for (Py_ssize_t r = 0; r < nruns; r++) {
        if (lens[r] < 0) {
            PyErr_SetString(PyExc_ValueError, "gather_runs: a negative run length");
            goto done;
        }
        total += lens[r];
    }
    if (total * outv.itemsize != outv.len) {
        PyErr_SetString(PyExc_ValueError, "gather_runs: out does not hold exactly the runs' values");
        goto done;
    }
    int64_t at = 0, bad = -1;
    Py_BEGIN_ALLOW_THREADS
    switch (src_itemsize) {
        case 1: GATHER_TO(int8_t); break;
        case 2: GATHER_TO(int16_t); break;
        case 4: GATHER_TO(int32_t); break;
        default: GATHER_TO(int64_t); break;
    }
    Py_END_ALLOW_THREADS
    ret = PyLong_FromLongLong(bad);
done:
    PyBuffer_Release(&outv);
    PyBuffer_Release(&av);
    PyBuffer_Release(&lv);
    return ret;
}

/* -- gathering runs, each value checked against bounds ------------------------------------------------------ */
#define GATHERB(S, D, SMIN, SMAX)                                                         \
    do {                                                                                  \
        D *o = (D *)outv.buf;                                                             \
        int out_of_range = 0;                                                             \
        /* the bounds in the source's type, so the loop compares S with S (vectorized) */ \
        int none = lo > (int64_t)(SMAX) || hi < (int64_t)(SMIN);                          \
        const S slo = none ? (S)0 : (lo < (int64_t)(SMIN) ? (S)(SMIN) : (S)lo);            \
        const S shi = none ? (S)0 : (hi > (int64_t)(SMAX) ? (S)(SMAX) : (S)hi);            \
        for (Py_ssize_t r = 0; r < nruns; r++) {                                          \
            const S *s = (const S *)(uintptr_t)addrs[r];                                  \
            int64_t len = lens[r];                                                        \
            D *d = o + at;                                                                \
            int oor = 0;                                                                  \
            for (int64_t i = 0; i < len; i++) {                                           \
                S v = s[i];                                                               \
                d[i] = (D)v;                                                              \
                oor |= (v < slo) | (v > shi);                                             \
            }                                                                             \
            out_of_range |= oor | (none && len > 0);                                      \
            at += len;                                                                    \
        }                                                                                 \
        if (out_of_range) bad = 0; /* which value: found below, from the sources */       \
    } while (0)

#define GATHERB_TO(S, SMIN, SMAX)                                                         \
    switch (outv.itemsize) {                                                              \
        case 1: GATHERB(S, int8_t, SMIN, SMAX); break;                                    \
        case 2: GATHERB(S, int16_t, SMIN, SMAX); break;                                   \
        case 4: GATHERB(S, int32_t, SMIN, SMAX); break;                                   \
        default: GATHERB(S, int64_t, SMIN, SMAX); break;                                  \
    }

HOT static PyObject *gather_runs_bounded(PyObject *self, PyObject *args) {
    PyObject *out_obj, *addrs_obj, *lens_obj;
    int src_itemsize;
    long long lo_arg, hi_arg;
    if (!PyArg_ParseTuple(args, "OOOiLL", &out_obj, &addrs_obj, &lens_obj, &src_itemsize, &lo_arg, &hi_arg))
        return NULL;
    Py_buffer outv, av, lv;
    if (PyObject_GetBuffer(out_obj, &outv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(addrs_obj, &av, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&outv);
        return NULL;
    }
    if (PyObject_GetBuffer(lens_obj, &lv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&outv);
        PyBuffer_Release(&av);
        return NULL;
    }
    PyObject *ret = NULL;
    Py_ssize_t nruns = av.len / 8;
    const uint64_t *addrs = (const uint64_t *)av.buf;
    const int64_t *lens = (const int64_t *)lv.buf;
    int64_t total = 0, lo = (int64_t)lo_arg, hi = (int64_t)hi_arg;
    if (lv.len != av.len || av.len % 8) {
        PyErr_SetString(PyExc_ValueError, "gather_runs_bounded: addrs and lens must be as many 8-byte integers");
        goto done;
    }
    if ((outv.itemsize != 1 && outv.itemsize != 2 && outv.itemsize != 4 && outv.itemsize != 8) ||
        (src_itemsize != 1 && src_itemsize != 2 && src_itemsize != 4 && src_itemsize != 8)) {
        PyErr_SetString(PyExc_ValueError, "gather_runs_bounded: 1-, 2-, 4- or 8-byte integers only");
        goto done;
    }
    /* the bounds within out's type: a value that fits them is never changed by the conversion */
    int64_t tmin = outv.itemsize == 8 ? INT64_MIN : -((int64_t)1 << (8 * outv.itemsize - 1));
    int64_t tmax = outv.itemsize == 8 ? INT64_MAX : ((int64_t)1 << (8 * outv.itemsize - 1)) - 1;
    if (lo < tmin) lo = tmin;
    if (hi > tmax) hi = tmax;
    for (Py_ssize_t r = 0; r < nruns; r++) {
        if (lens[r] < 0) {
            PyErr_SetString(PyExc_ValueError, "gather_runs_bounded: a negative run length");
            goto done;
        }
        total += lens[r];
    }
    if (total * outv.itemsize != outv.len) {
        PyErr_SetString(PyExc_ValueError, "gather_runs_bounded: out does not hold exactly the runs' values");
        goto done;
    }
    int64_t at = 0, bad = -1;
    Py_BEGIN_ALLOW_THREADS
    switch (src_itemsize) {
        case 1: GATHERB_TO(int8_t, INT8_MIN, INT8_MAX); break;
        case 2: GATHERB_TO(int16_t, INT16_MIN, INT16_MAX); break;
        case 4: GATHERB_TO(int32_t, INT32_MIN, INT32_MAX); break;
        default: GATHERB_TO(int64_t, INT64_MIN, INT64_MAX); break;
    }
    if (bad >= 0) { /* the first source value outside lo..hi, in output order (a wrapped one included) */
        int64_t k = 0;
        bad = -1;
        for (Py_ssize_t r = 0; r < nruns && bad < 0; r++) {
            for (int64_t i = 0; i < lens[r]; i++) {
                int64_t v;
                switch (src_itemsize) {
                    case 1: v = ((const int8_t *)(uintptr_t)addrs[r])[i]; break;
                    case 2: v = ((const int16_t *)(uintptr_t)addrs[r])[i]; break;
                    case 4: v = ((const int32_t *)(uintptr_t)addrs[r])[i]; break;
                    default: v = ((const int64_t *)(uintptr_t)addrs[r])[i]; break;
                }
                if (v < lo || v > hi) { bad = k + i; break; }
            }
            k += lens[r];
        }
    }
    Py_END_ALLOW_THREADS
    ret = PyLong_FromLongLong(bad);
done:
    PyBuffer_Release(&outv);
    PyBuffer_Release(&av);
    PyBuffer_Release(&lv);
    return ret;
}

/* -- padded rows' input_mask: the lengths, checked ----------------------------------------------------------- */
/* A padded row's mask: its leading 1s (eight at a time: a 512-wide row of ~400 ones is ~50 steps, not ~400, then
 * one by one); *rest is non-zero where a value after them is not 0 (the row is not 1s then 0s). */
static inline Py_ssize_t mask_ones(const int8_t *row, Py_ssize_t width, int8_t *rest) {
    Py_ssize_t k = 0;
    for (uint64_t w; k + 8 <= width; k += 8) {
        memcpy(&w, row + k, 8);
        if (w != 0x0101010101010101ULL) break;
    }
    while (k < width && row[k] == 1) k++;
    int8_t r = 0;
    for (Py_ssize_t i = k; i < width; i++) r |= row[i];
    *rest = r;
    return k;
}

HOT static PyObject *mask_lengths(PyObject *self, PyObject *args) {
    PyObject *mask_obj, *out_obj;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "OnO", &mask_obj, &width, &out_obj)) return NULL;
    Py_buffer mv, ov;
    if (PyObject_GetBuffer(mask_obj, &mv, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &ov, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&mv);
        return NULL;
    }
    PyObject *ret = NULL;
    if (width <= 0 || mv.itemsize != 1 || ov.itemsize != 8 || mv.len != (ov.len / 8) * width) {
        PyErr_SetString(PyExc_ValueError, "mask_lengths: mask must hold len(out) rows of width 1-byte integers, out "
                                          "8-byte integers");
        goto done;
    }
    Py_ssize_t rows = ov.len / 8;
    int64_t bad = -1;
    const int8_t *m = (const int8_t *)mv.buf;
    int64_t *out = (int64_t *)ov.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) {
        int8_t rest;
        out[r] = mask_ones(m + r * width, width, &rest);
        if (rest) { bad = r; break; }
    }
    Py_END_ALLOW_THREADS
    ret = PyLong_FromLongLong(bad);
done:
    PyBuffer_Release(&mv);
    PyBuffer_Release(&ov);
    return ret;
}

#define PREFIX_LOOP(T)                                                                    \
    do {                                                                                  \
        const T *v = (const T *)vv.buf;                                                   \
        for (Py_ssize_t r = 0; r < rows; r++) {                                           \
            const T *row = v + r * width;                                                 \
            Py_ssize_t k = 0;                                                             \
            while (k < width && row[k] != 0) k++;                                         \
            out[r] = k;                                                                   \
            T rest = 0;                                                                   \
            for (Py_ssize_t i = k; i < width; i++) rest |= row[i];                        \
            if (rest) { bad = r; break; }                                                 \
        }                                                                                 \
    } while (0)

HOT static PyObject *prefix_lengths(PyObject *self, PyObject *args) {
    PyObject *v_obj, *out_obj;
    Py_ssize_t width;
    if (!PyArg_ParseTuple(args, "OnO", &v_obj, &width, &out_obj)) return NULL;
    Py_buffer vv, ov;
    if (PyObject_GetBuffer(v_obj, &vv, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(out_obj, &ov, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&vv);
        return NULL;
    }
    PyObject *ret = NULL;
    int isz = (int)vv.itemsize;
    if (width <= 0 || ov.itemsize != 8 || (isz != 1 && isz != 2 && isz != 4 && isz != 8) ||
        vv.len != (ov.len / 8) * width * isz) {
        PyErr_SetString(PyExc_ValueError, "prefix_lengths: values must hold len(out) rows of width integers, out "
                                          "8-byte integers");
        goto done;
    }
    Py_ssize_t rows = ov.len / 8;
    int64_t bad = -1;
    int64_t *out = (int64_t *)ov.buf;
    Py_BEGIN_ALLOW_THREADS
    switch (isz) {
        case 1: PREFIX_LOOP(int8_t); break;
        case 2: PREFIX_LOOP(int16_t); break;
        case 4: PREFIX_LOOP(int32_t); break;
        default: PREFIX_LOOP(int64_t); break;
    }
    Py_END_ALLOW_THREADS
    ret = PyLong_FromLongLong(bad);
done:
    PyBuffer_Release(&vv);
    PyBuffer_Release(&ov);
    return ret;
}

/* -- NVIDIA's shard lists: json.dumps of [[[length, index], ...], ...] ------------------------------------ */
static char *put_int(char *p, int64_t v) {
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
    if (v < 0) *p++ = '-';
    do { tmp[n++] = (char)('0' + u % 10); u /= 10; } while (u);
    while (n) *p++ = tmp[--n];
    return p;
}

/* The C-contiguous buffers of objs[0..n-1] into bufs (from index writable on: writable). Returns how many were
 * taken: n, or fewer with the error set (release those). */
static int take_buffers(PyObject *const *objs, Py_buffer *bufs, int n, int writable) {
    for (int i = 0; i < n; i++)
        if (PyObject_GetBuffer(objs[i], &bufs[i], PyBUF_C_CONTIGUOUS | (i >= writable ? PyBUF_WRITABLE : 0)) < 0)
            return i;
    return n;
}

/* padded_counts: what a packer reads of a padded row, its length and its number of predictions, checked, in one
 * pass: mask_lengths' loop, then the row's positions (0, or inside its length) and its ids (>= 0, the non-zero
 * ones counted). */
HOT static PyObject *padded_counts(PyObject *self, PyObject *args) {
    PyObject *mask_obj, *pos_obj, *ids_obj, *seq_obj, *pred_obj;
    Py_ssize_t width, pwidth;
    if (!PyArg_ParseTuple(args, "OOOnnOO", &mask_obj, &pos_obj, &ids_obj, &width, &pwidth, &seq_obj, &pred_obj))
        return NULL;
    Py_buffer bufs[5];
    PyObject *objs[5] = {mask_obj, pos_obj, ids_obj, seq_obj, pred_obj};
    PyObject *ret = NULL;
    int got = take_buffers(objs, bufs, 5, 3);
    if (got < 5) goto done;
    Py_ssize_t rows = bufs[3].len / 8;
    if (width <= 0 || pwidth < 0 || bufs[0].itemsize != 1 || bufs[1].itemsize != 4 || bufs[2].itemsize != 4 ||
        bufs[3].itemsize != 8 || bufs[4].itemsize != 8 || bufs[4].len != bufs[3].len ||
        bufs[0].len != rows * width || bufs[1].len != rows * pwidth * 4 || bufs[2].len != rows * pwidth * 4) {
        PyErr_SetString(PyExc_ValueError, "padded_counts: len(seq) rows of width 1-byte mask values and of pwidth "
                                          "4-byte positions and ids; seq and pred 8-byte integers");
        goto done;
    }
    int64_t bad = -1;
    const int8_t *m = (const int8_t *)bufs[0].buf;
    const int32_t *pos = (const int32_t *)bufs[1].buf, *ids = (const int32_t *)bufs[2].buf;
    int64_t *seq = (int64_t *)bufs[3].buf, *pred = (int64_t *)bufs[4].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) {
        int8_t rest;
        Py_ssize_t k = mask_ones(m + r * width, width, &rest);
        const int32_t *p = pos + r * pwidth, *d = ids + r * pwidth;
        int wrong = rest != 0;
        int64_t n = 0;
        for (Py_ssize_t i = 0; i < pwidth; i++) { /* loops of their own: vectorized */
            wrong |= (p[i] < 0) | ((p[i] != 0) & (p[i] >= k));
            wrong |= d[i] < 0;
            n += d[i] != 0;
        }
        seq[r] = k;
        pred[r] = n;
        if (wrong) { bad = r; break; }
    }
    Py_END_ALLOW_THREADS
    ret = PyLong_FromLongLong(bad);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
    return ret;
}

/* position_counts: padded_counts for pack-nvidia, which takes a row's predictions from its positions: seq[r] the
 * mask's leading 1s, pred[r] the leading non-zero positions; the same rules of the mask and the positions. */
HOT static PyObject *position_counts(PyObject *self, PyObject *args) {
    PyObject *mask_obj, *pos_obj, *seq_obj, *pred_obj;
    Py_ssize_t width, pwidth;
    if (!PyArg_ParseTuple(args, "OOnnOO", &mask_obj, &pos_obj, &width, &pwidth, &seq_obj, &pred_obj)) return NULL;
    Py_buffer bufs[4];
    PyObject *objs[4] = {mask_obj, pos_obj, seq_obj, pred_obj};
    PyObject *ret = NULL;
    int got = take_buffers(objs, bufs, 4, 2);
    if (got < 4) goto done;
    Py_ssize_t rows = bufs[2].len / 8;
    if (width <= 0 || pwidth < 0 || bufs[0].itemsize != 1 || bufs[1].itemsize != 4 || bufs[2].itemsize != 8 ||
        bufs[3].itemsize != 8 || bufs[3].len != bufs[2].len || bufs[0].len != rows * width ||
        bufs[1].len != rows * pwidth * 4) {
        PyErr_SetString(PyExc_ValueError, "position_counts: len(seq) rows of width 1-byte mask values and of pwidth "
                                          "4-byte positions; seq and pred 8-byte integers");
        goto done;
    }
    int64_t bad = -1;
    int prefix = 1;
    const int8_t *m = (const int8_t *)bufs[0].buf;
    const int32_t *pos = (const int32_t *)bufs[1].buf;
    int64_t *seq = (int64_t *)bufs[2].buf, *pred = (int64_t *)bufs[3].buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0; r < rows; r++) {
        int8_t rest;
        Py_ssize_t k = mask_ones(m + r * width, width, &rest);
        const int32_t *p = pos + r * pwidth;
        int wrong = rest != 0;
        for (Py_ssize_t i = 0; i < pwidth; i++) wrong |= (p[i] < 0) | ((p[i] != 0) & (p[i] >= k));
        Py_ssize_t j = 0;
        while (j < pwidth && p[j] != 0) j++;
        seq[r] = k;
        pred[r] = j;
        int32_t after = 0;
        for (Py_ssize_t i = j; i < pwidth; i++) after |= p[i];
        if (after) prefix = 0;
        if (wrong) { bad = r; break; }
    }
    Py_END_ALLOW_THREADS
    ret = Py_BuildValue("Li", (long long)bad, prefix);
done:
    for (int i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
    return ret;
}

static PyObject *format_packs(PyObject *self, PyObject *args) {
    PyObject *len_obj, *idx_obj, *off_obj;
    if (!PyArg_ParseTuple(args, "OOO", &len_obj, &idx_obj, &off_obj)) return NULL;
    Py_buffer lv, iv, ov;
    if (PyObject_GetBuffer(len_obj, &lv, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(idx_obj, &iv, PyBUF_C_CONTIGUOUS) < 0) { PyBuffer_Release(&lv); return NULL; }
    if (PyObject_GetBuffer(off_obj, &ov, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&lv);
        PyBuffer_Release(&iv);
        return NULL;
    }
    PyObject *ret = NULL;
    char *buf = NULL;
    Py_ssize_t items = lv.len / 8, packs = ov.len / 8 - 1;
    const int64_t *lens = (const int64_t *)lv.buf, *idx = (const int64_t *)iv.buf, *off = (const int64_t *)ov.buf;
    if (lv.len % 8 || iv.len != lv.len || ov.len % 8 || packs < 0) {
        PyErr_SetString(PyExc_ValueError, "format_packs: lengths and indices (int64, as many) and pack offsets "
                                          "(int64, packs + 1)");
        goto done;
    }
    for (Py_ssize_t p = 0; p < packs; p++)
        if (off[p] < 0 || off[p] > off[p + 1] || off[p + 1] > items) {
            PyErr_SetString(PyExc_ValueError, "format_packs: pack offsets out of order or range");
            goto done;
        }
    buf = PyMem_Malloc((size_t)items * 48 + (size_t)packs * 4 + 4);
    if (!buf) { PyErr_NoMemory(); goto done; }
    char *w = buf;
    Py_BEGIN_ALLOW_THREADS
    *w++ = '[';
    for (Py_ssize_t p = 0; p < packs; p++) {
        if (p) { *w++ = ','; *w++ = ' '; }
        *w++ = '[';
        for (int64_t i = off[p]; i < off[p + 1]; i++) {
            if (i > off[p]) { *w++ = ','; *w++ = ' '; }
            *w++ = '[';
            w = put_int(w, lens[i]);
            *w++ = ',';
            *w++ = ' ';
            w = put_int(w, idx[i]);
            *w++ = ']';
        }
        *w++ = ']';
    }
    *w++ = ']';
    Py_END_ALLOW_THREADS
    ret = PyBytes_FromStringAndSize(buf, w - buf);
done:
    PyMem_Free(buf);
    PyBuffer_Release(&lv);
    PyBuffer_Release(&iv);
    PyBuffer_Release(&ov);
    return ret;
}

/* -- NVIDIA's cut of padded rows (convert_fixed2variable.py, checked) --------------------------------------- */
HOT static int64_t cut_rows(const int8_t *mask, const int32_t *ids, const int8_t *seg, const int32_t *pos,
                        const int32_t *mlm, const int8_t *nsl, int16_t *o_ids, int8_t *o_seg, int16_t *o_pos,
                        int16_t *o_mlm, int64_t *seq, int64_t *pred, int64_t rows, int64_t w, int64_t pw) {
    int64_t t = 0, q = 0;
    for (int64_t i = 0; i < rows; i++) {
        const int8_t *m = mask + i * w;
        const int32_t *id = ids + i * w, *ps = pos + i * pw, *ml = mlm + i * pw;
        const int8_t *sg = seg + i * w;
        /* each test a loop of its own over one array: the compiler vectorizes them */
        int32_t L = 0;
        int acc = (nsl[i] & ~1) != 0;
        for (int64_t j = 0; j < w; j++) { L += m[j]; acc |= m[j] & ~1; }  /* 0/1 values: L = the ones */
        int bad = acc != 0 || L < 1;
        int32_t head = 0;
        for (int64_t j = 0; j < L; j++) head += m[j];
        bad |= head != L;  /* ... and they come first: the first L values are the L ones */
        for (int64_t j = 0; j < w; j++) bad |= (uint32_t)id[j] > 32767u;
        for (int64_t j = 0; j < w; j++) bad |= (sg[j] & ~1) != 0;
        int64_t P = 0;
        for (int64_t k = 0; k < pw; k++) {
            int32_t p = ps[k];
            bad |= ((uint32_t)p > 32767u) | ((p != 0) & (p >= L)) | ((uint32_t)ml[k] > 32767u);
            P += p != 0;
        }
        if (bad) return i;
        for (int64_t j = 0; j < L; j++) { o_ids[t + j] = (int16_t)id[j]; o_seg[t + j] = sg[j]; }
        for (int64_t k = 0; k < P; k++) { o_pos[q + k] = (int16_t)ps[k]; o_mlm[q + k] = (int16_t)ml[k]; }
        seq[i] = L;
        pred[i] = P;
        t += L;
        q += P;
    }
    return -1;
}

static PyObject *cut_padded(PyObject *self, PyObject *args) {
    PyObject *obj[12];
    if (!PyArg_ParseTuple(args, "OOOOOOOOOOOO", &obj[0], &obj[1], &obj[2], &obj[3], &obj[4], &obj[5], &obj[6],
                          &obj[7], &obj[8], &obj[9], &obj[10], &obj[11]))
        return NULL;
    /* inputs: mask ids seg pos mlm nsl (read-only maps are fine); outputs: ids seg pos mlm seq pred */
    static const int item[12] = {1, 4, 1, 4, 4, 1, 2, 1, 2, 2, 8, 8};
    Py_buffer b[12];
    int got = 0;
    PyObject *ret = NULL;
    for (; got < 12; got++) {
        int flags = PyBUF_C_CONTIGUOUS | (got >= 6 ? PyBUF_WRITABLE : 0);
        if (PyObject_GetBuffer(obj[got], &b[got], flags) < 0) goto done;
        if (b[got].len % item[got]) {
            PyErr_SetString(PyExc_ValueError, "cut_padded: a buffer's size is not a multiple of its item size");
            got++;
            goto done;
        }
    }
    int64_t rows = b[5].len, w = rows ? b[0].len / rows : 0, pw = rows ? b[3].len / 4 / rows : 0;
    if (b[0].len != rows * w || b[1].len != rows * w * 4 || b[2].len != rows * w || b[3].len != rows * pw * 4 ||
        b[4].len != rows * pw * 4 || b[6].len < rows * w * 2 || b[7].len < rows * w || b[8].len < rows * pw * 2 ||
        b[9].len < rows * pw * 2 || b[10].len != rows * 8 || b[11].len != rows * 8) {
        PyErr_SetString(PyExc_ValueError, "cut_padded: the arrays' sizes do not match one chunk of rows");
        goto done;
    }
    int64_t bad;
    Py_BEGIN_ALLOW_THREADS
    bad = cut_rows((const int8_t *)b[0].buf, (const int32_t *)b[1].buf, (const int8_t *)b[2].buf,
                   (const int32_t *)b[3].buf, (const int32_t *)b[4].buf, (const int8_t *)b[5].buf,
                   (int16_t *)b[6].buf, (int8_t *)b[7].buf, (int16_t *)b[8].buf, (int16_t *)b[9].buf,
                   (int64_t *)b[10].buf, (int64_t *)b[11].buf, rows, w, pw);
    Py_END_ALLOW_THREADS
    ret = PyLong_FromLongLong(bad);
done:
    for (int k = 0; k < got; k++) PyBuffer_Release(&b[k]);
    return ret;
}

/* -- placing runs: sources read in order, each run written where it belongs ----------------------------------- */
#define PLACE(S, D)                                                                       \
    do {                                                                                  \
        D *o = (D *)outv.buf;                                                             \
        int none = lo > (int64_t)(S##_MAXV) || hi < (int64_t)(S##_MINV);                  \
        const S slo = none ? (S)0 : (lo < (int64_t)(S##_MINV) ? (S)(S##_MINV) : (S)lo);    \
        const S shi = none ? (S)0 : (hi > (int64_t)(S##_MAXV) ? (S)(S##_MAXV) : (S)hi);    \
        int oor = 0;                                                                      \
        for (Py_ssize_t r = 0; r < nruns; r++) {                                          \
            const S *s = (const S *)(uintptr_t)addrs[r];                                  \
            int64_t len = lens[r];                                                        \
            D *d = o + dests[r];                                                          \
            for (int64_t i = 0; i < len; i++) {                                           \
                S v = s[i];                                                               \
                d[i] = (D)v;                                                              \
                oor |= (v < slo) | (v > shi);                                             \
            }                                                                             \
            oor |= none && len > 0;                                                       \
        }                                                                                 \
        if (oor) bad = 0;                                                                 \
    } while (0)

#define int8_t_MINV INT8_MIN
#define int8_t_MAXV INT8_MAX
#define int16_t_MINV INT16_MIN
#define int16_t_MAXV INT16_MAX
#define int32_t_MINV INT32_MIN
#define int32_t_MAXV INT32_MAX
#define int64_t_MINV INT64_MIN
#define int64_t_MAXV INT64_MAX

#define PLACE_TO(S)                                                                       \
    switch (outv.itemsize) {                                                              \
        case 1: PLACE(S, int8_t); break;                                                  \
        case 2: PLACE(S, int16_t); break;                                                 \
        case 4: PLACE(S, int32_t); break;                                                 \
        default: PLACE(S, int64_t); break;                                                \
    }

HOT static PyObject *place_runs(PyObject *self, PyObject *args) {
    PyObject *out_obj, *dests_obj, *addrs_obj, *lens_obj;
    int src_itemsize;
    long long lo_arg, hi_arg;
    if (!PyArg_ParseTuple(args, "OOOOiLL", &out_obj, &dests_obj, &addrs_obj, &lens_obj, &src_itemsize, &lo_arg,
                          &hi_arg))
        return NULL;
    Py_buffer outv, dv, av, lv;
    if (PyObject_GetBuffer(out_obj, &outv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(dests_obj, &dv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&outv);
        return NULL;
    }
    if (PyObject_GetBuffer(addrs_obj, &av, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&outv);
        PyBuffer_Release(&dv);
        return NULL;
    }
    if (PyObject_GetBuffer(lens_obj, &lv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&outv);
        PyBuffer_Release(&dv);
        PyBuffer_Release(&av);
        return NULL;
    }
    PyObject *ret = NULL;
    Py_ssize_t nruns = av.len / 8;
    const uint64_t *addrs = (const uint64_t *)av.buf;
    const int64_t *lens = (const int64_t *)lv.buf, *dests = (const int64_t *)dv.buf;
    int64_t lo = (int64_t)lo_arg, hi = (int64_t)hi_arg, bad = -1;
    if (lv.len != av.len || dv.len != av.len || av.len % 8) {
        PyErr_SetString(PyExc_ValueError, "place_runs: dests, addrs and lens must be as many 8-byte integers");
        goto done;
    }
    if ((outv.itemsize != 1 && outv.itemsize != 2 && outv.itemsize != 4 && outv.itemsize != 8) ||
        (src_itemsize != 1 && src_itemsize != 2 && src_itemsize != 4 && src_itemsize != 8)) {
        PyErr_SetString(PyExc_ValueError, "place_runs: 1-, 2-, 4- or 8-byte integers only");
        goto done;
    }
    Py_ssize_t n_out = outv.len / outv.itemsize;
    for (Py_ssize_t r = 0; r < nruns; r++)
        if (lens[r] < 0 || dests[r] < 0 || dests[r] + lens[r] > n_out) {
            PyErr_SetString(PyExc_ValueError, "place_runs: a run outside out, or of negative length");
            goto done;
        }
    {
        /* the bounds within out's type: a value that fits them is never changed by the conversion */
        int64_t tmin = outv.itemsize == 8 ? INT64_MIN : -((int64_t)1 << (8 * outv.itemsize - 1));
        int64_t tmax = outv.itemsize == 8 ? INT64_MAX : ((int64_t)1 << (8 * outv.itemsize - 1)) - 1;
        if (lo < tmin) lo = tmin;
        if (hi > tmax) hi = tmax;
    }
    Py_BEGIN_ALLOW_THREADS
    switch (src_itemsize) {
        case 1: PLACE_TO(int8_t); break;
        case 2: PLACE_TO(int16_t); break;
        case 4: PLACE_TO(int32_t); break;
        default: PLACE_TO(int64_t); break;
    }
    Py_END_ALLOW_THREADS
    ret = PyLong_FromLongLong(bad);
done:
    PyBuffer_Release(&outv);
    PyBuffer_Release(&dv);
    PyBuffer_Release(&av);
    PyBuffer_Release(&lv);
    return ret;
}

/* -- segment ids kept as one number a row --------------------------------------------------------------------- */
#define SEG_BOUNDS(S)                                                                     \
    for (Py_ssize_t r = 0; r < nruns && bad < 0; r++) {                                   \
        const S *v = (const S *)(uintptr_t)addrs[r];                                      \
        int64_t len = lens[r], ones = 0;                                                  \
        int wrong = 0;                                                                    \
        /* loops of their own (vectorized): 0s and 1s only, never a 1 before a 0 */      \
        for (int64_t i = 0; i < len; i++) { ones += v[i]; wrong |= (v[i] & ~(S)1) != 0; } \
        for (int64_t i = 0; i + 1 < len; i++) wrong |= v[i] > v[i + 1];                   \
        if (wrong || len - ones > 32767) bad = r;                                         \
        else out[r] = (int16_t)(len - ones);                                              \
    }

HOT static PyObject *seg_bounds(PyObject *self, PyObject *args) {
    PyObject *out_obj, *addrs_obj, *lens_obj;
    int src_itemsize;
    if (!PyArg_ParseTuple(args, "OOOi", &out_obj, &addrs_obj, &lens_obj, &src_itemsize)) return NULL;
    Py_buffer outv, av, lv;
    if (PyObject_GetBuffer(out_obj, &outv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(addrs_obj, &av, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&outv);
        return NULL;
    }
    if (PyObject_GetBuffer(lens_obj, &lv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&outv);
        PyBuffer_Release(&av);
        return NULL;
    }
    PyObject *ret = NULL;
    Py_ssize_t nruns = av.len / 8;
    const uint64_t *addrs = (const uint64_t *)av.buf;
    const int64_t *lens = (const int64_t *)lv.buf;
    int16_t *out = (int16_t *)outv.buf;
    if (lv.len != av.len || av.len % 8 || outv.len != nruns * 2) {
        PyErr_SetString(PyExc_ValueError, "seg_bounds: addrs and lens (8-byte integers) and out (int16) must be as "
                                          "many");
        goto done;
    }
    if (src_itemsize != 1 && src_itemsize != 2 && src_itemsize != 4 && src_itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "seg_bounds: src_itemsize must be 1, 2, 4 or 8");
        goto done;
    }
    for (Py_ssize_t r = 0; r < nruns; r++)
        if (lens[r] < 0) {
            PyErr_SetString(PyExc_ValueError, "seg_bounds: a negative run length");
            goto done;
        }
    int64_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    switch (src_itemsize) {
        case 1: /* BERT's int8 segment ids: the 0s, then the 1s, eight at a time (3x the loops above) */
            for (Py_ssize_t r = 0; r < nruns && bad < 0; r++) {
                const uint8_t *v = (const uint8_t *)(uintptr_t)addrs[r];
                int64_t len = lens[r], i = 0;
                for (uint64_t w; i + 8 <= len; i += 8) {
                    memcpy(&w, v + i, 8);
                    if (w != 0) break;
                }
                while (i < len && v[i] == 0) i++;
                int64_t zeros = i;
                for (uint64_t w; i + 8 <= len; i += 8) {
                    memcpy(&w, v + i, 8);
                    if (w != 0x0101010101010101ULL) break;
                }
                while (i < len && v[i] == 1) i++;
                if (i != len || zeros > 32767) bad = r;
                else out[r] = (int16_t)zeros;
            }
            break;
        case 2: SEG_BOUNDS(int16_t); break;
        case 4: SEG_BOUNDS(int32_t); break;
        default: SEG_BOUNDS(int64_t); break;
    }
    Py_END_ALLOW_THREADS
    ret = PyLong_FromLongLong(bad);
done:
    PyBuffer_Release(&outv);
    PyBuffer_Release(&av);
    PyBuffer_Release(&lv);
    return ret;
}

HOT static PyObject *fill_segments(PyObject *self, PyObject *args) {
    PyObject *out_obj, *b_obj, *lens_obj;
    if (!PyArg_ParseTuple(args, "OOO", &out_obj, &b_obj, &lens_obj)) return NULL;
    Py_buffer outv, bv, lv;
    if (PyObject_GetBuffer(out_obj, &outv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
    if (PyObject_GetBuffer(b_obj, &bv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&outv);
        return NULL;
    }
    if (PyObject_GetBuffer(lens_obj, &lv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&outv);
        PyBuffer_Release(&bv);
        return NULL;
    }
    PyObject *ret = NULL;
    Py_ssize_t rows = lv.len / 8;
    const int64_t *bounds = (const int64_t *)bv.buf, *lens = (const int64_t *)lv.buf;
    int64_t total = 0;
    if (lv.len % 8 || bv.len != lv.len) {
        PyErr_SetString(PyExc_ValueError, "fill_segments: bounds and lens must be as many int64");
        goto done;
    }
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (bounds[r] < 0 || bounds[r] > lens[r]) {
            PyErr_SetString(PyExc_ValueError, "fill_segments: a bound outside 0..its row's length");
            goto done;
        }
        total += lens[r];
    }
    if (total != outv.len) {
        PyErr_SetString(PyExc_ValueError, "fill_segments: out (int8) does not hold exactly the rows' values");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    int8_t *o = (int8_t *)outv.buf;
    for (Py_ssize_t r = 0; r < rows; r++) {
        memset(o, 0, (size_t)bounds[r]);
        memset(o + bounds[r], 1, (size_t)(lens[r] - bounds[r]));
        o += lens[r];
    }
    Py_END_ALLOW_THREADS
    ret = Py_None;
    Py_INCREF(ret);
done:
    PyBuffer_Release(&outv);
    PyBuffer_Release(&bv);
    PyBuffer_Release(&lv);
    return ret;
}

/* -- HDF5 core-driver images in a caller's buffer ----------------------------------------------------------- */
/* HDF5's H5FD_file_image_callbacks_t (H5FDpublic.h, 1.8.9+): the op argument is an enum, herr_t an int. */
typedef struct {
    void *(*image_malloc)(size_t size, int op, void *udata);
    void *(*image_memcpy)(void *dest, const void *src, size_t size, int op, void *udata);
    void *(*image_realloc)(void *ptr, size_t size, int op, void *udata);
    int (*image_free)(void *ptr, int op, void *udata);
    void *(*udata_copy)(void *udata);
    int (*udata_free)(void *udata);
    void *udata;
} image_callbacks_t;

typedef struct {
    unsigned char *buf; /* the caller's buffer (NULL: none) */
    size_t cap;
    unsigned char *heap; /* the image once it outgrew buf */
    size_t size;         /* what HDF5 last grew it to */
} image_arena_t;

static _Thread_local image_arena_t arena;

static void *img_realloc(void *ptr, size_t size, int op, void *udata) {
    (void)op;
    (void)udata;
    image_arena_t *a = &arena;
    if (ptr != NULL && ptr != a->buf && ptr != a->heap) return NULL; /* not this arena's image */
    if (a->heap == NULL && a->buf != NULL && size <= a->cap) {
        a->size = size;
        return a->buf;
    }
    if (a->heap == NULL) {
        unsigned char *h = malloc(size ? size : 1);
        if (!h) return NULL;
        if (ptr != NULL && a->size) memcpy(h, a->buf, a->size < size ? a->size : size);
        a->heap = h;
        a->size = size;
        return h;
    }
    unsigned char *h = realloc(a->heap, size ? size : 1);
    if (!h) return NULL;
    a->heap = h;
    a->size = size;
    return h;
}

static void *img_malloc(size_t size, int op, void *udata) { return img_realloc(NULL, size, op, udata); }

static void *img_memcpy(void *dest, const void *src, size_t size, int op, void *udata) {
    (void)op;
    (void)udata;
    return memcpy(dest, src, size);
}

static int img_free(void *ptr, int op, void *udata) { /* kept: read after the close (image_view) */
    (void)ptr;
    (void)op;
    (void)udata;
    return 0;
}

static const image_callbacks_t image_cbs = {img_malloc, img_memcpy, img_realloc, img_free, NULL, NULL, NULL};

static PyObject *image_callbacks(PyObject *self, PyObject *unused) {
    return PyLong_FromVoidPtr((void *)&image_cbs);
}

static PyObject *image_arena(PyObject *self, PyObject *args) {
    PyObject *obj;
    if (!PyArg_ParseTuple(args, "O", &obj)) return NULL;
    free(arena.heap);
    arena.heap = NULL;
    arena.buf = NULL;
    arena.cap = 0;
    arena.size = 0;
    if (obj != Py_None) {
        Py_buffer v;
        if (PyObject_GetBuffer(obj, &v, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
        arena.buf = (unsigned char *)v.buf; /* the caller keeps obj alive while HDF5 writes into it */
        arena.cap = (size_t)v.len;
        PyBuffer_Release(&v);
    }
    Py_RETURN_NONE;
}

static PyObject *image_view(PyObject *self, PyObject *unused) {
    void *at = arena.heap ? (void *)arena.heap : (void *)arena.buf;
    return Py_BuildValue("(NnO)", PyLong_FromVoidPtr(at), (Py_ssize_t)arena.size,
                         arena.heap ? Py_False : Py_True);
}

static PyMethodDef methods[] = {
    {"shuffle", shuffle, METH_VARARGS,
     "shuffle(state, out[, keep]): out = range(n) (keep: out's values) shuffled as random.Random.shuffle, from MT "
     "state (625 uint32), advanced"},
    {"gather_runs", gather_runs, METH_VARARGS,
     "gather_runs(out, addrs, lens, src_itemsize) -> index of the first value out of out's range, or -1"},
    {"gather_runs_bounded", gather_runs_bounded, METH_VARARGS,
     "gather_runs_bounded(out, addrs, lens, src_itemsize, lo, hi) -> index of the first value outside lo..hi, or -1"},
    {"mask_lengths", mask_lengths, METH_VARARGS,
     "mask_lengths(mask, width, out) -> first row whose mask is not 1s then 0s, or -1; out: each row's 1s"},
    {"prefix_lengths", prefix_lengths, METH_VARARGS,
     "prefix_lengths(values, width, out) -> first row whose values are not non-zeros then zeros, or -1"},
    {"padded_counts", padded_counts, METH_VARARGS,
     "padded_counts(mask, pos, ids, width, pwidth, seq, pred) -> first row breaking the padded rules, or -1"},
    {"position_counts", position_counts, METH_VARARGS,
     "position_counts(mask, pos, width, pwidth, seq, pred) -> (first row breaking the rules or -1, all prefixes)"},
    {"format_packs", format_packs, METH_VARARGS,
     "format_packs(lengths, indices, pack_off) -> json.dumps(packs) as bytes, pack p = [[length, index], ...]"},
    {"cut_padded", cut_padded, METH_VARARGS,
     "cut_padded(mask, ids, seg, pos, mlm, nsl, out_ids, out_seg, out_pos, out_mlm, seq, pred) -> first bad row or -1"},
    {"place_runs", place_runs, METH_VARARGS,
     "place_runs(out, dests, addrs, lens, src_itemsize, lo, hi) -> 0 if a value lies outside lo..hi, else -1"},
    {"seg_bounds", seg_bounds, METH_VARARGS,
     "seg_bounds(out, addrs, lens, src_itemsize) -> first run that is not 0s then 1s, or -1; out: each run's 0s"},
    {"fill_segments", fill_segments, METH_VARARGS,
     "fill_segments(out, bounds, lens): out = each row's bounds[i] 0s then lens[i] - bounds[i] 1s, back to back"},
    {"image_callbacks", image_callbacks, METH_NOARGS,
     "image_callbacks() -> address of HDF5 file-image callbacks whose core-driver buffer is this thread's arena"},
    {"image_arena", image_arena, METH_VARARGS,
     "image_arena(buf): buf (writable, kept alive by the caller) is the arena; None: the arena freed"},
    {"image_view", image_view, METH_NOARGS, "image_view() -> (address, size, in_buf) of the arena's image"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_pack_native", "the packers' inner loops", -1, methods};

PyMODINIT_FUNC PyInit__pack_native(void) {
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    PyModule_AddIntConstant(m, "ABI", 4);
    PyModule_AddStringConstant(m, "SOURCES_DIGEST", BERTPIPE_SOURCES_DIGEST);
    return m;
}
