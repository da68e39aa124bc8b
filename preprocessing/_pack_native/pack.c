/* preprocessing._pack_native: the loops the packers and NVIDIA's shuffle spend their time in.
 *
 * shuffle(state, out): out = 0..n-1, then shuffled exactly as CPython's random.Random.shuffle does a list of n
 *   items (3.8-3.13: for i = n-1 .. 1, j = _randbelow(i + 1), swap), drawing from the Mersenne Twister state
 *   ``state`` (625 uint32: the 624 words and the position of random.Random.getstate()[1]), which it advances.
 *   n < 2**32 (one 32-bit output per draw, as getrandbits(k) for k <= 32).
 * gather_runs(out, addrs, lens, src_itemsize): run i is lens[i] signed integers of src_itemsize bytes at address
 *   addrs[i]; the runs, back to back, into out (signed integers of out's item size), converted. Returns the
 *   index in out of the first value that does not fit out's type (nothing after it is written), or -1.
 *   The caller guarantees every address range is readable (preprocessing/pack_fast.py checks the bounds).
 *
 * format_packs(lengths, indices, pack_off): json.dumps of the packs [[[length, index], ...], ...] (pack p: items
 *   pack_off[p] .. pack_off[p+1]-1; int64 arrays), as ASCII bytes: NVIDIA's shard lists.
 *
 * They release the GIL. The Python fallbacks (preprocessing/pyrandom.py, pack_fast.py) give the same results. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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
        for (uint64_t i = 0; i < n; i++) x[i] = (T)i;                                     \
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
    if (!PyArg_ParseTuple(args, "OO", &state_obj, &out_obj)) return NULL;
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

static PyObject *gather_runs(PyObject *self, PyObject *args) {
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

static PyMethodDef methods[] = {
    {"shuffle", shuffle, METH_VARARGS,
     "shuffle(state, out): out = range(n) shuffled as random.Random.shuffle, from MT state (625 uint32), advanced"},
    {"gather_runs", gather_runs, METH_VARARGS,
     "gather_runs(out, addrs, lens, src_itemsize) -> index of the first value out of out's range, or -1"},
    {"format_packs", format_packs, METH_VARARGS,
     "format_packs(lengths, indices, pack_off) -> json.dumps(packs) as bytes, pack p = [[length, index], ...]"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_pack_native", "the packers' inner loops", -1, methods};

PyMODINIT_FUNC PyInit__pack_native(void) {
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    PyModule_AddIntConstant(m, "ABI", 1);
    PyModule_AddStringConstant(m, "SOURCES_DIGEST", BERTPIPE_SOURCES_DIGEST);
    return m;
}
