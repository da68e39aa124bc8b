/* Canonical tf.train.Example encoding and TFRecord framing for cpd.c (spec §8.4; the Python
 * equivalent is preprocessing.mlperf.tfrecord.encode_mlperf_example + frame). */
#ifndef BERTPIPE_CPD_WRITE_H
#define BERTPIPE_CPD_WRITE_H

static size_t vlen(uint64_t v) { size_t n = 1; while (v >= 0x80) { v >>= 7; n++; } return n; }
static uint8_t *put_varint(uint8_t *p, uint64_t v) {
    while (v >= 0x80) { *p++ = (uint8_t)(v | 0x80); v >>= 7; }
    *p++ = (uint8_t)v;
    return p;
}

static const char *const FEATURE_NAMES[7] = {"input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                                             "masked_lm_ids", "masked_lm_weights", "next_sentence_labels"};

/* Sizes of the nested messages of one feature map entry whose packed values take `packed` bytes. */
typedef struct { size_t packed, list, feature, entry; } FeatSize;
static FeatSize feat_size(size_t name_len, size_t packed) {
    FeatSize f;
    f.packed = packed;
    f.list = packed ? 1 + vlen(packed) + packed : 0;             /* Int64List/FloatList.value, packed */
    f.feature = 1 + vlen(f.list) + f.list;                       /* Feature.int64_list / float_list */
    f.entry = 1 + vlen(name_len) + name_len + 1 + vlen(f.feature) + f.feature; /* map entry key, value */
    return f;
}

/* Varint bytes of every value < n packed as b0 | b1 << 8 | b2 << 16 | length << 24 (values < 2**21). */
static uint32_t *varint_table(size_t n) {
    uint32_t *t = malloc(n * sizeof(uint32_t));
    if (!t) return NULL;
    for (size_t v = 0; v < n; v++) {
        uint8_t b[10];
        size_t len = (size_t)(put_varint(b, v) - b);
        t[v] = (uint32_t)b[0] | (len > 1 ? (uint32_t)b[1] << 8 : 0) | (len > 2 ? (uint32_t)b[2] << 16 : 0) |
               (uint32_t)len << 24;
    }
    return t;
}
static inline size_t tvlen(const uint32_t *t, int32_t v) { return t[v] >> 24; }
static inline uint8_t *tput(uint8_t *p, const uint32_t *t, int32_t v) {
    uint32_t x = t[v];
    p[0] = (uint8_t)x; p[1] = (uint8_t)(x >> 8); p[2] = (uint8_t)(x >> 16); /* the caller leaves slack */
    return p + (x >> 24);
}

/* Encode the payload of one instance (its tokens tok, its masks mk) into out (reserved by the caller, with 4 bytes
 * of slack).
 * vt: varint_table of every value that can occur (ids and positions). Returns the length. */
static size_t encode_instance(const Engine *e, const Inst *in, const uint32_t *vt, uint8_t *out, const int32_t *tok,
                              const int32_t *mk) {
    const int L = e->L, P = e->P, n = in->ntok, nm = in->nmask;
    size_t packed[7];
    size_t s = (size_t)(L - n);
    for (int i = 0; i < n; i++) s += tvlen(vt, tok[i]);
    packed[0] = s;
    packed[1] = packed[2] = (size_t)L;
    s = (size_t)(P - nm);
    size_t s2 = s;
    for (int i = 0; i < nm; i++) { s += tvlen(vt, mk[2 * i]); s2 += tvlen(vt, mk[2 * i + 1]); }
    packed[3] = s; packed[4] = s2;
    packed[5] = 4 * (size_t)P;
    packed[6] = 1;
    FeatSize fs[7];
    size_t feats = 0;
    for (int f = 0; f < 7; f++) {
        fs[f] = feat_size(strlen(FEATURE_NAMES[f]), packed[f]);
        feats += 1 + vlen(fs[f].entry) + fs[f].entry;
    }
    uint8_t *p = out;
    *p++ = 0x0A; p = put_varint(p, feats); /* Example.features */
    for (int f = 0; f < 7; f++) {
        size_t nl = strlen(FEATURE_NAMES[f]);
        *p++ = 0x0A; p = put_varint(p, fs[f].entry);            /* Features.feature (map entry) */
        *p++ = 0x0A; p = put_varint(p, nl); memcpy(p, FEATURE_NAMES[f], nl); p += nl;
        *p++ = 0x12; p = put_varint(p, fs[f].feature);
        *p++ = f == 5 ? 0x12 : 0x1A; p = put_varint(p, fs[f].list);
        *p++ = 0x0A; p = put_varint(p, fs[f].packed);
        switch (f) {
        case 0:
            for (int i = 0; i < n; i++) p = tput(p, vt, tok[i]);
            memset(p, 0, (size_t)(L - n)); p += L - n;
            break;
        case 1:
            memset(p, 1, (size_t)n); memset(p + n, 0, (size_t)(L - n)); p += L;
            break;
        case 2:
            memset(p, 0, (size_t)in->lena + 2); memset(p + in->lena + 2, 1, (size_t)(n - in->lena - 2));
            memset(p + n, 0, (size_t)(L - n)); p += L;
            break;
        case 3: case 4:
            for (int i = 0; i < nm; i++) p = tput(p, vt, mk[2 * i + (f == 4)]);
            memset(p, 0, (size_t)(P - nm)); p += P - nm;
            break;
        case 5:
            for (int i = 0; i < P; i++) {
                static const uint8_t one[4] = {0x00, 0x00, 0x80, 0x3F};
                if (i < nm) memcpy(p, one, 4); else memset(p, 0, 4);
                p += 4;
            }
            break;
        default:
            *p++ = in->is_random ? 1 : 0;
        }
    }
    return (size_t)(p - out);
}

static void put_u32le(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static int flush_to(PyObject *file, ByteVec *b) {
    if (!b->n) return 0;
    /* a view of the buffer, not a copy of it as bytes; released after the call (io's contract: a writer reads
     * the buffer only during write(), and one that kept the view would get an error, not changed bytes) */
    PyObject *view = PyMemoryView_FromMemory((char *)b->v, (Py_ssize_t)b->n, PyBUF_READ);
    if (!view) return -1;
    PyObject *r = PyObject_CallMethod(file, "write", "O", view);
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* write()'s error, if any, outlives the release */
    PyObject *rel = PyObject_CallMethod(view, "release", NULL);
    Py_DECREF(view);
    if (type) {
        Py_XDECREF(rel);
        PyErr_Restore(type, value, tb);
    }
    if (!r || !rel) { Py_XDECREF(r); Py_XDECREF(rel); return -1; }
    Py_DECREF(r);
    Py_DECREF(rel);
    b->n = 0;
    return 0;
}

static PyObject *eng_write(Engine *e, PyObject *args) {
    PyObject *files;
    if (!PyArg_ParseTuple(args, "O!", &PyList_Type, &files)) return NULL;
    Py_ssize_t nf = PyList_GET_SIZE(files);
    if (!e->order || nf < 1) { PyErr_SetString(PyExc_ValueError, "nothing created or no files"); return NULL; }
    size_t nvals = (size_t)(e->vocab_size > e->L ? e->vocab_size : e->L);
    if (nvals >= (1u << 21)) { PyErr_SetString(PyExc_ValueError, "vocab too large (>= 2**21 entries)"); return NULL; }
    uint32_t *vt = varint_table(nvals);
    ByteVec *bufs = calloc((size_t)nf, sizeof(ByteVec));
    int32_t *local = malloc(((size_t)e->L + 2 * (size_t)e->P) * sizeof(int32_t));
    if (!bufs || !vt || !local) { free(vt); free(bufs); free(local); return PyErr_NoMemory(); }
    /* an upper bound of one record: 10 bytes per value plus the headers */
    size_t bound = 10 * (3 * (size_t)e->L + 3 * (size_t)e->P + 1) + 512;
    int rc = 0;
    for (size_t k = 0; k < e->ninst && rc == 0; k++) {
        ByteVec *b = &bufs[k % (size_t)nf];
        if (bytes_reserve(b, bound + 16) < 0) { rc = -1; break; }
        uint8_t *rec = b->v + b->n;
        /* the instance's tokens and masks first copied here: it lies at a random place of the pools, and memcpy
         * reads it from memory with many loads in flight, where the encoding loop waited on each (the shuffled
         * order cost 0.41 s a part against 0.25 in creation order; with the copy, 0.35) */
        const Inst *in = &e->insts[e->order[k]];
        memcpy(local, e->itok.v + in->tok_off, (size_t)in->ntok * sizeof(int32_t));
        memcpy(local + e->L, e->imask.v + in->mask_off, 2 * (size_t)in->nmask * sizeof(int32_t));
        size_t len = encode_instance(e, in, vt, rec + 12, local, local + e->L);
        uint64_t len64 = len;
        for (int i = 0; i < 8; i++) rec[i] = (uint8_t)(len64 >> (8 * i));
        put_u32le(rec + 8, masked_crc32c(rec, 8));
        put_u32le(rec + 12 + len, masked_crc32c(rec + 12, len));
        b->n += len + 16;
        if (b->n >= (1u << 20)) rc = flush_to(PyList_GET_ITEM(files, (Py_ssize_t)(k % (size_t)nf)), b);
    }
    for (Py_ssize_t f = 0; f < nf && rc == 0; f++) rc = flush_to(PyList_GET_ITEM(files, f), &bufs[f]);
    for (Py_ssize_t f = 0; f < nf; f++) free(bufs[f].v);
    free(bufs);
    free(vt);
    free(local);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

/* .fill_padded(start, stop, input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids,
 * next_sentence_labels): rows start..stop-1 of the written order as the padded HDF5 holds them, into six
 * C-contiguous writable buffers of (stop - start) rows: int32 x L, int8 x L, int8 x L, int32 x P, int32 x P,
 * int8. The same values encode_instance writes, so the padded HDF5 needs no parse of the TFRecord. */
static PyObject *eng_fill_padded(Engine *e, PyObject *args) {
    Py_ssize_t start, stop;
    Py_buffer b[6];
    memset(b, 0, sizeof b);
    if (!PyArg_ParseTuple(args, "nnw*w*w*w*w*w*", &start, &stop, &b[0], &b[1], &b[2], &b[3], &b[4], &b[5]))
        return NULL;
    PyObject *res = NULL;
    const size_t L = (size_t)e->L, P = (size_t)e->P;
    if (!e->order || start < 0 || stop < start || (size_t)stop > e->ninst) {
        PyErr_SetString(PyExc_IndexError, "fill_padded: no such rows (nothing created?)");
        goto done;
    }
    size_t rows = (size_t)(stop - start);
    const size_t need[6] = {rows * L * 4, rows * L, rows * L, rows * P * 4, rows * P * 4, rows};
    for (int i = 0; i < 6; i++)
        if ((size_t)b[i].len != need[i]) {
            PyErr_Format(PyExc_ValueError, "fill_padded: buffer %d has %zd bytes, expected %zu", i, b[i].len, need[i]);
            goto done;
        }
    int32_t *ids = b[0].buf, *pos = b[3].buf, *lab = b[4].buf;
    int8_t *mask = b[1].buf, *seg = b[2].buf, *nsl = b[5].buf;
    for (size_t r = 0; r < rows; r++) {
        const Inst *in = &e->insts[e->order[(size_t)start + r]];
        const int32_t *tok = e->itok.v + in->tok_off, *mk = e->imask.v + in->mask_off;
        size_t n = (size_t)in->ntok, nm = (size_t)in->nmask, a = (size_t)in->lena + 2;
        int32_t *ri = ids + r * L, *rp = pos + r * P, *rl = lab + r * P;
        int8_t *rm = mask + r * L, *rs = seg + r * L;
        memcpy(ri, tok, n * sizeof(int32_t));
        memset(ri + n, 0, (L - n) * sizeof(int32_t));
        memset(rm, 1, n); memset(rm + n, 0, L - n);
        memset(rs, 0, a); memset(rs + a, 1, n - a); memset(rs + n, 0, L - n);
        for (size_t i = 0; i < nm; i++) { rp[i] = mk[2 * i]; rl[i] = mk[2 * i + 1]; }
        memset(rp + nm, 0, (P - nm) * sizeof(int32_t));
        memset(rl + nm, 0, (P - nm) * sizeof(int32_t));
        nsl[r] = in->is_random ? 1 : 0;
    }
    res = Py_None;
    Py_INCREF(res);
done:
    for (int i = 0; i < 6; i++) if (b[i].obj) PyBuffer_Release(&b[i]);
    return res;
}

#endif /* BERTPIPE_CPD_WRITE_H */
