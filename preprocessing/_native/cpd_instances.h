/* Instance creation for cpd.c: spec §8.3, draw for draw (see create_instances_from_document and
 * create_masked_lm_predictions in preprocessing/mlperf/create_pretraining_data.py, the oracle). */
#ifndef BERTPIPE_CPD_INSTANCES_H
#define BERTPIPE_CPD_INSTANCES_H

typedef struct {
    I32Vec cand;
    uint64_t *bits; size_t bitcap; /* the masked positions of one instance */
} Scratch;

/* random.shuffle(x): for i = n-1 .. 1, j = _randbelow(i + 1), swap x[i] and x[j].
 * Written without a branch on _randbelow's rejections (a rejected word swaps x[i] with itself and keeps i),
 * which a CPU cannot predict: each MT word is one step of the loop, the same words in the same order. */
static void shuffle_u32(MT *m, uint32_t *x, size_t n) {
    if (n < 2) return;
    if (n > 0xFFFFFFFFu) n = 0xFFFFFFFFu; /* callers pass < 2**32 items */
    uint32_t i = (uint32_t)(n - 1);
    int idx = m->index;
    while (i >= 1) {
        if (idx >= 624) { mt_regen(m); idx = 0; }
        /* while i + 1 has the same bit length, getrandbits keeps the same shift */
        int sh = __builtin_clz(i + 1);
        uint32_t ilo = (0x80000000U >> sh) - 1;
        for (; idx < 624 && i >= ilo; idx++) {
            uint32_t r = m->out[idx] >> sh;
            uint32_t take = -(uint32_t)(r <= i);              /* all ones when the word is taken (r < i + 1) */
            uint32_t j = i ^ ((r ^ i) & take);                /* r, or i when rejected */
            uint32_t t = x[i];
            x[i] = x[j];
            x[j] = t;
            i += take;                                        /* i - 1 when taken */
        }
    }
    m->index = idx;
}

/* [CLS] A [SEP] B [SEP], masked, appended to the instance pools. A and B point into the segments' tokens. */
static int make_instance(Engine *e, MT *m, Scratch *s, const int32_t *A, size_t la, const int32_t *B, size_t lb,
                         int is_random, double mlm) {
    size_t n = la + lb + 3;
    if (i32_reserve(&e->itok, n) < 0 || i32_reserve(&s->cand, n) < 0) return -1;
    int32_t *tok = e->itok.v + e->itok.n;
    tok[0] = e->cls;
    memcpy(tok + 1, A, la * sizeof(int32_t));
    tok[la + 1] = e->sep;
    memcpy(tok + la + 2, B, lb * sizeof(int32_t));
    tok[n - 1] = e->sep;

    uint32_t *cand = (uint32_t *)s->cand.v;
    size_t nc = 0;
    int special = 0; /* [CLS] or [SEP] inside A or B: not in text the tokenizer made, but the reference allows it */
    for (size_t i = 1; i <= la; i++) special |= (tok[i] == e->cls) | (tok[i] == e->sep);
    for (size_t i = la + 2; i < n - 1; i++) special |= (tok[i] == e->cls) | (tok[i] == e->sep);
    if (!special) { /* every position but 0, la + 1 and n - 1 */
        for (size_t i = 1; i <= la; i++) cand[nc++] = (uint32_t)i;
        for (size_t i = la + 2; i < n - 1; i++) cand[nc++] = (uint32_t)i;
    } else {
        for (size_t i = 0; i < n; i++)
            if (tok[i] != e->cls && tok[i] != e->sep) cand[nc++] = (uint32_t)i;
    }
    shuffle_u32(m, cand, nc);
    long ntp = (long)rint((double)n * mlm); /* round half to even, like Python 3 round() */
    if (ntp < 1) ntp = 1;
    if (ntp > e->P) ntp = e->P;
    /* the masked positions in increasing order (the reference sorts them): a bitmap of the instance */
    size_t words = (n + 63) / 64;
    if (s->bitcap < words) {
        uint64_t *b = realloc(s->bits, words * sizeof(uint64_t));
        if (!b) { PyErr_NoMemory(); return -1; }
        s->bits = b; s->bitcap = words;
    }
    memset(s->bits, 0, words * sizeof(uint64_t));
    int nm = 0;
    for (size_t k = 0; k < nc && nm < ntp; k++, nm++) {
        uint32_t idx = cand[k];
        int32_t out;
        if (mt_random(m) < 0.8) out = e->msk;
        else if (mt_random(m) < 0.5) out = tok[idx];
        else out = (int32_t)mt_below(m, (uint32_t)e->vocab_size);
        tok[idx] = out;
        s->bits[idx >> 6] |= 1ULL << (idx & 63);
    }
    if (i32_reserve(&e->imask, 2 * (size_t)nm) < 0) return -1;
    if (e->ninst == e->instcap) {
        size_t cap = e->instcap ? e->instcap * 2 : 4096;
        Inst *x = realloc(e->insts, cap * sizeof(Inst));
        if (!x) { PyErr_NoMemory(); return -1; }
        e->insts = x; e->instcap = cap;
        advise_huge(x, cap * sizeof(Inst));
    }
    e->insts[e->ninst++] = (Inst){(int64_t)e->itok.n, (int64_t)e->imask.n, (int32_t)n, (int32_t)la, nm, is_random};
    e->itok.n += n;
    /* label = the token before masking: still in A or B (tok = [CLS] A [SEP] B [SEP]) */
    int32_t *out = e->imask.v + e->imask.n;
    for (size_t w = 0; w < words; w++)
        for (uint64_t bits = s->bits[w]; bits; bits &= bits - 1) {
            size_t idx = w * 64 + (size_t)__builtin_ctzll(bits);
            *out++ = (int32_t)idx;
            *out++ = idx <= la ? A[idx - 1] : B[idx - (la + 2)];
        }
    e->imask.n += 2 * (size_t)nm;
    return 0;
}

static int instances_from_document(Engine *e, MT *m, Scratch *s, const Doc *all, size_t ndocs, size_t d,
                                   double mlm, double ssp) {
    const Doc doc = all[d];
    const int64_t max_num = e->L - 3;
    int64_t target = max_num;
    if (mt_random(m) < ssp) target = 2 + mt_below(m, (uint32_t)(max_num - 1));
    int64_t i = 0, chunk_start = 0, chunk_n = 0, cur_len = 0;
    while (i < doc.nseg) {
        if (chunk_n == 0) chunk_start = i;
        chunk_n++;
        cur_len += e->segs[doc.first + i].len;
        if (i == doc.nseg - 1 || cur_len >= target) {
            int64_t a_end = 1;
            if (chunk_n >= 2) a_end = 1 + mt_below(m, (uint32_t)(chunk_n - 1));
            /* a document's segments lie one after the other in e->ids (checked in eng_create): A and B are ranges */
            const Seg *cs = &e->segs[doc.first + chunk_start];
            const int32_t *A = e->ids.v + cs[0].start, *B;
            size_t la = 0, lb = 0;
            for (int64_t j = 0; j < a_end; j++) la += (size_t)cs[j].len;
            int is_random;
            if (chunk_n == 1 || mt_random(m) < 0.5) {
                is_random = 1;
                int64_t target_b = target - (int64_t)la;
                uint32_t rdi = 0;
                for (int t = 0; t < 10; t++) {
                    rdi = mt_below(m, (uint32_t)ndocs);
                    if (rdi != d) break;
                }
                const Doc rd = all[rdi];
                int64_t j = mt_below(m, (uint32_t)rd.nseg);
                B = e->ids.v + e->segs[rd.first + j].start;
                for (; j < rd.nseg; j++) {
                    lb += (size_t)e->segs[rd.first + j].len;
                    if ((int64_t)lb >= target_b) break;
                }
                i -= chunk_n - a_end; /* unused segments are revisited */
            } else {
                is_random = 0;
                B = A + la;
                for (int64_t j = a_end; j < chunk_n; j++) lb += (size_t)cs[j].len;
            }
            while (la + lb > (size_t)max_num) { /* longer side; ties trim B */
                int front = mt_random(m) < 0.5;
                if (la > lb) { if (front) A++; la--; }
                else { if (front) B++; lb--; }
            }
            if (make_instance(e, m, s, A, la, B, lb, is_random, mlm) < 0) return -1;
            chunk_n = 0;
            cur_len = 0;
        }
        i++;
    }
    return 0;
}

static PyObject *eng_create(Engine *e, PyObject *args) {
    PyObject *state;
    int dupe;
    double mlm, ssp;
    if (!PyArg_ParseTuple(args, "O!iiidd", &PyTuple_Type, &state, &e->L, &e->P, &dupe, &mlm, &ssp)) return NULL;
    if (e->created) { PyErr_SetString(PyExc_RuntimeError, "create() already called"); return NULL; }
    if (PyTuple_GET_SIZE(state) != 625 || e->L < 5 || e->P < 1 || dupe < 1) {
        PyErr_SetString(PyExc_ValueError, "bad MT state or parameters"); return NULL;
    }
    MT m;
    for (int i = 0; i < 624; i++) m.mt[i] = (uint32_t)PyLong_AsUnsignedLong(PyTuple_GET_ITEM(state, i));
    m.index = (int)PyLong_AsLong(PyTuple_GET_ITEM(state, 624));
    if (PyErr_Occurred()) return NULL;
    if (m.index < 0 || m.index > 624) { PyErr_SetString(PyExc_ValueError, "bad MT index"); return NULL; }
    mt_temper_all(&m, 0); /* words before m.index are never read again */
    if (end_document(e) < 0) return NULL;
    for (size_t k = 1; k < e->nsegs; k++)
        if (e->segs[k].start != e->segs[k - 1].start + e->segs[k - 1].len) {
            PyErr_SetString(PyExc_RuntimeError, "create(): the segments' tokens are not contiguous (an earlier "
                            "add_file failed part way?): use a new Engine");
            return NULL;
        }
    e->created = 1;
    size_t nd = e->ndocs;
    if (nd == 0 || nd >= 0xFFFFFFFFu) { PyErr_SetString(PyExc_ValueError, "no documents"); return NULL; }
    uint32_t *perm = malloc(nd * sizeof(uint32_t));
    Doc *all = malloc(nd * sizeof(Doc));
    Scratch s = {0};
    int rc = -1;
    if (!perm || !all) { PyErr_NoMemory(); goto done; }
    for (size_t i = 0; i < nd; i++) perm[i] = (uint32_t)i;
    shuffle_u32(&m, perm, nd);
    for (size_t i = 0; i < nd; i++) all[i] = e->docs[perm[i]];
    /* the pools at about their final size before the first write to them, so they start on huge pages (each
     * token is in ~dupe instances; random B sides add some), not grown by copies */
    size_t est = (size_t)dupe * e->ids.n / 4 * 5 + 4096;
    /* only a head start: where the estimate cannot be had (a strict overcommit limit), the pools grow as needed */
    if (i32_reserve(&e->itok, est) < 0 || i32_reserve(&e->imask, (size_t)((double)est * 2 * mlm) + 4096) < 0)
        PyErr_Clear();
    for (int r = 0; r < dupe; r++)
        for (size_t d = 0; d < nd; d++)
            if (instances_from_document(e, &m, &s, all, nd, d, mlm, ssp) < 0) goto done;
    if (e->ninst >= 0xFFFFFFFFu) { PyErr_SetString(PyExc_OverflowError, "too many instances"); goto done; }
    e->order = malloc((e->ninst ? e->ninst : 1) * sizeof(uint32_t));
    if (!e->order) { PyErr_NoMemory(); goto done; }
    for (size_t i = 0; i < e->ninst; i++) e->order[i] = (uint32_t)i;
    shuffle_u32(&m, e->order, e->ninst);
    rc = 0;
done:
    free(perm); free(all); free(s.cand.v); free(s.bits);
    if (rc < 0) return NULL;
    /* the segments are no longer needed: give their memory back before writing */
    free(e->ids.v); e->ids = (I32Vec){0};
    return PyLong_FromSize_t(e->ninst);
}

static PyObject *eng_instance(Engine *e, PyObject *args) {
    Py_ssize_t k;
    if (!PyArg_ParseTuple(args, "n", &k)) return NULL;
    if (!e->order || k < 0 || (size_t)k >= e->ninst) { PyErr_SetString(PyExc_IndexError, "no such instance"); return NULL; }
    const Inst *in = &e->insts[e->order[k]];
    PyObject *tok = PyList_New(in->ntok), *pos = PyList_New(in->nmask), *lab = PyList_New(in->nmask);
    if (!tok || !pos || !lab) { Py_XDECREF(tok); Py_XDECREF(pos); Py_XDECREF(lab); return NULL; }
    for (int i = 0; i < in->ntok; i++) PyList_SET_ITEM(tok, i, PyLong_FromLong(e->itok.v[in->tok_off + i]));
    for (int i = 0; i < in->nmask; i++) {
        PyList_SET_ITEM(pos, i, PyLong_FromLong(e->imask.v[in->mask_off + 2 * i]));
        PyList_SET_ITEM(lab, i, PyLong_FromLong(e->imask.v[in->mask_off + 2 * i + 1]));
    }
    return Py_BuildValue("(NiNNO)", tok, in->lena, pos, lab, in->is_random ? Py_True : Py_False);
}

#endif /* BERTPIPE_CPD_INSTANCES_H */
