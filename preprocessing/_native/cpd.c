/* preprocessing._cpd_native: the compiled core of the fast create_pretraining_data.
 *
 * One Engine per reference invocation (per part file):
 *   Engine(vocab_words, do_lower_case, unk_id, cls_id, sep_id, mask_id)
 *   .add_file(data, line_fb, chunk_fb)  read one file's bytes. ASCII lines are tokenized here; other
 *                              lines are split into str.split() chunks, ASCII chunks tokenized here,
 *                              the rest by chunk_fb(bytes) -> list[int]; lines that are not UTF-8 or
 *                              need the full rules go to line_fb(line_bytes, offset) -> list | None
 *   .create(mt_state, max_seq_length, max_predictions, dupe_factor, masked_lm_prob, short_seq_prob)
 *                              -> number of instances (documents shuffled, instances made, shuffled)
 *   .write(files)              canonical TFRecords, round-robin over the file objects (.write(bytes))
 *   .instance(k)               (tokens, len_a, positions, labels, is_random_next) of the k-th written
 *   .fill_padded(start, stop, *six_buffers)  rows start..stop-1 (written order) as the padded HDF5's
 *                              six datasets (int32/int8 buffers; the fused tfrecord+hdf5 path)
 *   .tokenize_line(line)       ids of one ASCII line (None when blank), for tests
 * Helpers (vocab hash, MT19937, CRC32C) are in cpd_core.h. See the header comment there.
 */
#define PY_SSIZE_T_CLEAN
#include "cpd_core.h"

#ifndef BERTPIPE_SOURCES_DIGEST /* md5 of the sources, set by setup.py and cpd_fast's compiler call */
#define BERTPIPE_SOURCES_DIGEST ""
#endif

typedef struct { int64_t start; int32_t len; } Seg;
typedef struct { int64_t first; int64_t nseg; } Doc;
typedef struct { int64_t tok_off, mask_off; int32_t ntok, lena, nmask, is_random; } Inst;

typedef struct {
    PyObject_HEAD
    Vocab vocab;
    int lower;
    int32_t unk, cls, sep, msk, vocab_size;
    I32Vec ids;                       /* tokens of all segments */
    Seg *segs; size_t nsegs, segcap;
    Doc *docs; size_t ndocs, doccap;
    int64_t cur_first, cur_nseg;      /* the document being read */
    I32Vec itok, imask;               /* instance tokens; (position, label) pairs */
    Inst *insts; size_t ninst, instcap;
    uint32_t *order;                  /* output order (after the final shuffle) */
    int L, P, created;
} Engine;

/* ASCII byte classes of BasicTokenizer after _clean_text: 0 word, 1 whitespace, 2 deleted, 3 punct */
static uint8_t cls_table[128];
static void init_tables(void) {
    for (int c = 0; c < 128; c++) {
        uint8_t k = 0;
        if (c < 32 || c == 127) k = 2;                /* Cc: removed by _clean_text */
        if (c == ' ' || c == '\t' || c == '\n') k = 1; /* whitespace -> " " */
        if ((c >= 33 && c <= 47) || (c >= 58 && c <= 64) || (c >= 91 && c <= 96) || (c >= 123 && c <= 126)) k = 3;
        cls_table[c] = k;
    }
    cls_table['\r'] = 2; /* GFile.readline deletes \r before anything else sees it */
}
static int strip_space(uint8_t c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f); }

/* WordPiece of one ASCII word (bytes == characters), n <= 200. FNV-1a folds left to right, so the
 * hashes of every candidate w[start:end] come from one pass per start (no rehashing per end). */
static int wordpiece(Engine *e, const uint8_t *w, size_t n, I32Vec *out) {
    if (n > 200) return i32_push(out, e->unk);
    uint64_t ph[201];
    size_t mark = out->n, start = 0;
    while (start < n) {
        uint64_t h = start > 0 ? fnv_step(FNV0, (const uint8_t *)"##", 2) : FNV0;
        for (size_t end = start; end < n; end++) ph[end + 1] = h = (h ^ w[end]) * 1099511628211ULL;
        size_t end = n;
        int id = -1;
        while (start < end) {
            id = vocab_find_h(&e->vocab, ph[end], start > 0, w + start, end - start);
            if (id >= 0) break;
            end--;
        }
        if (id < 0) { out->n = mark; return i32_push(out, e->unk); }
        if (i32_push(out, id) < 0) return -1;
        start = end;
    }
    return 0;
}

/* Tokenize one pure-ASCII line (raw, may hold \r). Returns 1 when blank, 0 otherwise, -1 on error. */
static int ascii_line(Engine *e, const uint8_t *p, size_t n, I32Vec *out) {
    size_t i;
    for (i = 0; i < n && strip_space(p[i]); i++) {}
    if (i == n) return 1;
    uint8_t word[208];
    size_t wl = 0;
    for (i = 0; i < n; i++) {
        uint8_t c = p[i], k = cls_table[c];
        if (k == 0) {
            if (wl < sizeof word) word[wl] = (e->lower && c >= 'A' && c <= 'Z') ? (uint8_t)(c + 32) : c;
            wl++;
        } else if (k != 2) {
            if (wl && wordpiece(e, word, wl > sizeof word ? sizeof word : wl, out) < 0) return -1;
            wl = 0;
            if (k == 3 && wordpiece(e, &c, 1, out) < 0) return -1;
        }
    }
    if (wl && wordpiece(e, word, wl > sizeof word ? sizeof word : wl, out) < 0) return -1;
    return 0;
}

static int append_ids(Engine *e, PyObject *r) {
    if (!PyList_Check(r)) { PyErr_SetString(PyExc_TypeError, "a tokenizer callback must return a list"); return -1; }
    Py_ssize_t m = PyList_GET_SIZE(r);
    if (i32_reserve(&e->ids, (size_t)m) < 0) return -1;
    for (Py_ssize_t j = 0; j < m; j++) {
        long v = PyLong_AsLong(PyList_GET_ITEM(r, j));
        if (v < 0 || v >= e->vocab_size) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a tokenizer callback returned an id outside the vocab");
            return -1;
        }
        e->ids.v[e->ids.n++] = (int32_t)v;
    }
    return 0;
}

static int end_document(Engine *e) {
    if (e->cur_nseg == 0) return 0;
    if (e->ndocs == e->doccap) {
        size_t cap = e->doccap ? e->doccap * 2 : 1024;
        Doc *d = realloc(e->docs, cap * sizeof(Doc));
        if (!d) { PyErr_NoMemory(); return -1; }
        e->docs = d; e->doccap = cap;
    }
    e->docs[e->ndocs++] = (Doc){e->cur_first, e->cur_nseg};
    e->cur_nseg = 0;
    return 0;
}

static int add_segment(Engine *e, size_t start) {
    if (e->ids.n == start) return 0; /* a line that tokenizes to nothing is skipped */
    if (e->nsegs == e->segcap) {
        size_t cap = e->segcap ? e->segcap * 2 : 4096;
        Seg *s = realloc(e->segs, cap * sizeof(Seg));
        if (!s) { PyErr_NoMemory(); return -1; }
        e->segs = s; e->segcap = cap;
    }
    if (e->cur_nseg == 0) e->cur_first = (int64_t)e->nsegs;
    e->segs[e->nsegs++] = (Seg){(int64_t)start, (int32_t)(e->ids.n - start)};
    e->cur_nseg++;
    return 0;
}

/* Hand a whole line (without its \r) to Python: invalid UTF-8, or characters that need the full rules. */
static int python_line(Engine *e, PyObject *fallback, const uint8_t *p, size_t n, size_t offset) {
    PyObject *r = PyObject_CallFunction(fallback, "y#n", (const char *)p, (Py_ssize_t)n, (Py_ssize_t)offset);
    if (!r) return -1;
    if (r == Py_None) { Py_DECREF(r); return end_document(e); }
    size_t start = e->ids.n;
    int rc = append_ids(e, r);
    Py_DECREF(r);
    return rc < 0 ? -1 : add_segment(e, start);
}

/* Length of the UTF-8 sequence at p (strict, like Python's decoder), 0 when invalid. Sets *cp. */
static size_t utf8_char(const uint8_t *p, size_t n, uint32_t *cp) {
    uint8_t c = p[0];
    if (c < 0x80) { *cp = c; return 1; }
    size_t len;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; v = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; v = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; v = c & 0x07; min = 0x10000; }
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xC0) != 0x80) return 0;
        v = (v << 6) | (p[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    *cp = v;
    return len;
}

/* Python's str.isspace() for code points >= 0x80 (U+0085 is handled as a joiner before this). */
static int unicode_space(uint32_t cp) {
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* A line with non-ASCII characters: the reference's tokens are those of its str.split() chunks, each
 * tokenized alone (unless the line holds a character that split() treats as whitespace but _clean_text
 * deletes: \v \f \x1c-\x1f U+0085; then Python takes the whole line). ASCII chunks are tokenized here,
 * the others by chunk_fallback(bytes) -> list[int] (cached on the Python side). */
static int unicode_line(Engine *e, PyObject *line_fb, PyObject *chunk_fb, const uint8_t *p, size_t n,
                        size_t offset) {
    size_t i = 0, start = e->ids.n;
    uint32_t cp;
    int any = 0;
    while (i < n) {
        size_t l = utf8_char(p + i, n - i, &cp);
        if (l == 0 || cp == 0x0B || cp == 0x0C || (cp >= 0x1C && cp <= 0x1F) || cp == 0x85)
            return python_line(e, line_fb, p, n, offset);
        i += l;
    }
    i = 0;
    while (i < n) {
        size_t l = utf8_char(p + i, n - i, &cp);
        if (cp == ' ' || cp == '\t' || cp == '\r' || unicode_space(cp)) { i += l; continue; }
        size_t c0 = i;
        int ascii = 1;
        while (i < n) {
            l = utf8_char(p + i, n - i, &cp);
            if (cp == ' ' || cp == '\t' || cp == '\r' || unicode_space(cp)) break;
            if (cp >= 0x80) ascii = 0;
            i += l;
        }
        any = 1;
        if (ascii) {
            if (ascii_line(e, p + c0, i - c0, &e->ids) < 0) return -1;
        } else {
            PyObject *r = PyObject_CallFunction(chunk_fb, "y#", (const char *)(p + c0), (Py_ssize_t)(i - c0));
            if (!r) return -1;
            int rc = append_ids(e, r);
            Py_DECREF(r);
            if (rc < 0) return -1;
        }
    }
    if (!any) return end_document(e);
    return add_segment(e, start);
}

static PyObject *eng_add_file(Engine *e, PyObject *args) {
    Py_buffer buf;
    PyObject *fallback, *chunk_fb;
    if (!PyArg_ParseTuple(args, "y*OO", &buf, &fallback, &chunk_fb)) return NULL;
    if (e->created) { PyBuffer_Release(&buf); PyErr_SetString(PyExc_RuntimeError, "instances already created"); return NULL; }
    const uint8_t *d = buf.buf;
    size_t n = (size_t)buf.len, pos = 0;
    ByteVec tmp = {0};
    int rc = 0;
    while (pos < n && rc == 0) {
        const uint8_t *nl = memchr(d + pos, '\n', n - pos);
        size_t end = nl ? (size_t)(nl - d) : n;
        const uint8_t *p = d + pos;
        size_t len = end - pos;
        int ascii = 1, only_cr = 1;
        for (size_t i = 0; i < len; i++) {
            if (p[i] & 0x80) ascii = 0;
            if (p[i] != '\r') only_cr = 0;
        }
        if (!nl && only_cr) break; /* end of file, as GFile.readline returns "" */
        if (ascii) {
            size_t start = e->ids.n;
            int blank = ascii_line(e, p, len, &e->ids);
            rc = blank < 0 ? -1 : blank ? end_document(e) : add_segment(e, start);
        } else {
            tmp.n = 0;
            if (bytes_reserve(&tmp, len) < 0) { rc = -1; break; }
            for (size_t i = 0; i < len; i++) if (p[i] != '\r') tmp.v[tmp.n++] = p[i];
            rc = unicode_line(e, fallback, chunk_fb, tmp.v, tmp.n, pos);
        }
        pos = end + 1;
    }
    free(tmp.v);
    PyBuffer_Release(&buf);
    if (rc < 0) return NULL;
    Py_RETURN_NONE;
}

static PyObject *eng_tokenize_line(Engine *e, PyObject *args) {
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    const uint8_t *p = buf.buf;
    for (Py_ssize_t i = 0; i < buf.len; i++)
        if (p[i] & 0x80 || p[i] == '\n') { PyBuffer_Release(&buf); PyErr_SetString(PyExc_ValueError, "not one ASCII line"); return NULL; }
    I32Vec out = {0};
    int blank = ascii_line(e, p, (size_t)buf.len, &out);
    PyBuffer_Release(&buf);
    if (blank < 0) { free(out.v); return NULL; }
    if (blank) { free(out.v); Py_RETURN_NONE; }
    PyObject *r = PyList_New((Py_ssize_t)out.n);
    for (size_t i = 0; r && i < out.n; i++) PyList_SET_ITEM(r, (Py_ssize_t)i, PyLong_FromLong(out.v[i]));
    free(out.v);
    return r;
}

#include "cpd_instances.h"
#include "cpd_write.h"

static int eng_init(Engine *e, PyObject *args, PyObject *kw) {
    PyObject *words;
    int lower;
    if (!PyArg_ParseTuple(args, "O!piiii", &PyList_Type, &words, &lower, &e->unk, &e->cls, &e->sep, &e->msk)) return -1;
    e->lower = lower;
    e->vocab_size = (int32_t)PyList_GET_SIZE(words);
    return vocab_build(&e->vocab, words);
}

static void eng_dealloc(Engine *e) {
    free(e->vocab.slots); free(e->vocab.keys.v); free(e->ids.v); free(e->segs); free(e->docs);
    free(e->itok.v); free(e->imask.v); free(e->insts); free(e->order);
    Py_TYPE(e)->tp_free((PyObject *)e);
}

static PyObject *eng_num_documents(Engine *e, PyObject *unused) {
    return PyLong_FromSize_t(e->ndocs + (e->cur_nseg > 0));
}

static PyMethodDef eng_methods[] = {
    {"add_file", (PyCFunction)eng_add_file, METH_VARARGS, "read one input file's bytes"},
    {"tokenize_line", (PyCFunction)eng_tokenize_line, METH_VARARGS, "ids of one ASCII line, None if blank"},
    {"num_documents", (PyCFunction)eng_num_documents, METH_NOARGS, "documents read so far"},
    {"create", (PyCFunction)eng_create, METH_VARARGS, "shuffle, create and mask instances, shuffle them"},
    {"instance", (PyCFunction)eng_instance, METH_VARARGS, "the k-th instance in output order"},
    {"write", (PyCFunction)eng_write, METH_VARARGS, "write canonical TFRecords round-robin"},
    {"fill_padded", (PyCFunction)eng_fill_padded, METH_VARARGS, "rows of the padded HDF5 into six buffers"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject EngineType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "preprocessing._cpd_native.Engine",
    .tp_basicsize = sizeof(Engine),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)eng_init,
    .tp_dealloc = (destructor)eng_dealloc,
    .tp_methods = eng_methods,
    .tp_doc = "one create_pretraining_data invocation",
};

static PyObject *mod_crc_hw(PyObject *m, PyObject *unused) { return PyBool_FromLong(crc_hw); }

static PyMethodDef mod_methods[] = {
    {"crc32c_hardware", mod_crc_hw, METH_NOARGS, "True when CRC32C uses the SSE4.2 instruction"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_cpd_native", "bertpipe create_pretraining_data core", -1, mod_methods};

PyMODINIT_FUNC PyInit__cpd_native(void) {
    crc_init();
    init_tables();
    if (PyType_Ready(&EngineType) < 0) return NULL;
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    Py_INCREF(&EngineType);
    if (PyModule_AddObject(m, "Engine", (PyObject *)&EngineType) < 0) { Py_DECREF(&EngineType); Py_DECREF(m); return NULL; }
    PyModule_AddIntConstant(m, "ABI", 2);
    PyModule_AddStringConstant(m, "SOURCES_DIGEST", BERTPIPE_SOURCES_DIGEST);
    return m;
}
