/* core._md5_native: the md5 of many files at once, each file one lane of a multi-stream MD5.
 *
 * MD5 is a chain: one stream runs at ~0.5-0.7 GB/s on a core, whatever the code, bound by the latency of its
 * dependent steps. Several independent files can share the core: 2-3 streams interleaved in scalar code
 * (instruction-level parallelism), or the lanes of a vector: 8 with AVX2 or AVX-512VL (which has the rotate and
 * three-input logic MD5's steps want), 16 with AVX-512 (2-4 GB/s in all). md5_files(paths) gives the same hex
 * digests as hashlib.md5 over each file; it reads the files with read(2) in 256 KiB pieces, each lane taking the next
 * file when its own ends, with the GIL released. md5_files(paths, mapped=True) maps each file of 1 MiB or more
 * instead (mmap(2), read-only) and hashes the page cache's pages where they lie: no copy into the lanes' buffers
 * (~0.1 CPU-s a GB of system time, a quarter of the hash's CPU). Only for files the caller has just written and
 * closed, under names no other process writes: a mapped file cut short while it is hashed (or a page the disk
 * cannot read back) is a SIGBUS, not an OSError. The kernel is chosen at run time from what the CPU has and the
 * number of files (kernel_for(n)); once no file is left to start, the files still being read move to a narrower
 * kernel where that is faster (16 lanes to 8). kernels() lists those this CPU can run. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef BERTPIPE_SOURCES_DIGEST
#define BERTPIPE_SOURCES_DIGEST "unknown"
#endif

#define MD5_MAX_LANES 16
/* 256 KiB a lane: 16 lanes' pieces stay near the core's caches between the read(2) that copies them and the kernel
 * that hashes them (1 MiB pieces cost ~15 % more CPU on 8 files of 0.5-0.7 GB: the copies went out to memory). */
#define MD5_CHUNK (1u << 18)
/* mapped=True: files from this size on are mapped (below it, a read(2) costs less than a mapping) */
#define MD5_MAP_MIN ((off_t)1 << 20)
/* ... and each lane's hashed pages are unmapped every 4 MiB (madvise MADV_DONTNEED: the page cache keeps them),
 * so that the process's RSS holds at most ~4 MiB a lane of the files, not all of them (8 files of 0.5-0.7 GB) */
#define MD5_MAP_DROP ((size_t)4 << 20)
#define MD5_CAT_(a, b) a##b
#define MD5_CAT(a, b) MD5_CAT_(a, b)

static const uint32_t MD5_K[64] = {
    0xd76aa478, 0xe8c7b756, 0x242070db, 0xc1bdceee, 0xf57c0faf, 0x4787c62a, 0xa8304613, 0xfd469501,
    0x698098d8, 0x8b44f7af, 0xffff5bb1, 0x895cd7be, 0x6b901122, 0xfd987193, 0xa679438e, 0x49b40821,
    0xf61e2562, 0xc040b340, 0x265e5a51, 0xe9b6c7aa, 0xd62f105d, 0x02441453, 0xd8a1e681, 0xe7d3fbc8,
    0x21e1cde6, 0xc33707d6, 0xf4d50d87, 0x455a14ed, 0xa9e3e905, 0xfcefa3f8, 0x676f02d9, 0x8d2a4c8a,
    0xfffa3942, 0x8771f681, 0x6d9d6122, 0xfde5380c, 0xa4beea44, 0x4bdecfa9, 0xf6bb4b60, 0xbebfbc70,
    0x289b7ec6, 0xeaa127fa, 0xd4ef3085, 0x04881d05, 0xd9d4d039, 0xe6db99e5, 0x1fa27cf8, 0xc4ac5665,
    0xf4292244, 0x432aff97, 0xab9423a7, 0xfc93a039, 0x655b59c3, 0x8f0ccc92, 0xffeff47d, 0x85845dd1,
    0x6fa87e4f, 0xfe2ce6e0, 0xa3014314, 0x4e0811a1, 0xf7537e82, 0xbd3af235, 0x2ad7d2bb, 0xeb86d391};
static const int MD5_S[64] = {7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                              5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20, 5, 9,  14, 20,
                              4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                              6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21};
#define MD5_G(i) ((i) < 16 ? (i) : (i) < 32 ? (5 * (i) + 1) & 15 : (i) < 48 ? (3 * (i) + 5) & 15 : (7 * (i)) & 15)

typedef void (*md5_kernel)(uint32_t *st, const uint8_t *const *p, size_t nblocks);

#if defined(__GNUC__) && !defined(__clang__)
#define SCALAR_TARGET __attribute__((optimize("no-tree-vectorize")))
#else
#define SCALAR_TARGET
#endif

#define LANES 1
#define VECTOR 0
#define TARGET SCALAR_TARGET
#define NAME md5_scalar1
#include "md5_kernel.h"
#define LANES 2
#define VECTOR 0
#define TARGET SCALAR_TARGET
#define NAME md5_scalar2
#include "md5_kernel.h"
#define LANES 3
#define VECTOR 0
#define TARGET SCALAR_TARGET
#define NAME md5_scalar3
#include "md5_kernel.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define HAVE_X86_KERNELS 1
#define LANES 8
#define VECTOR 1
#define TARGET __attribute__((target("avx2")))
#define NAME md5_avx2x8
#include "md5_kernel.h"
#define LANES 8
#define VECTOR 1
#define TARGET __attribute__((target("avx512f,avx512vl")))
#define NAME md5_avx512vlx8
#include "md5_kernel.h"
#define LANES 16
#define VECTOR 1
#define TARGET __attribute__((target("avx512f")))
#define NAME md5_avx512x16
#include "md5_kernel.h"
#else
#define HAVE_X86_KERNELS 0
#endif

/* Speeds measured with 1, 2, 4, 8 and 16 files of 32 MB in the page cache (MB/s on one core of the 2-core Xeon VM
 * the benchmarks run on, read(2) included): MD5 is a chain of dependent steps, so a kernel runs one lane at about
 * the latency of its instructions and its idle lanes cost little; what pick() compares. */
#define N_SPEEDS 5
typedef struct {
    const char *name;
    md5_kernel fn;
    int lanes;
    double mbs[N_SPEEDS]; /* with 1, 2, 4, 8, 16 files */
    int usable;
} Kernel;

static Kernel KERNELS[] = {
    {"scalar x1", md5_scalar1, 1, {445, 445, 445, 445, 445}, 1},
    {"scalar x2", md5_scalar2, 2, {386, 737, 758, 752, 752}, 1},
    {"scalar x3", md5_scalar3, 3, {337, 622, 650, 680, 680}, 1},
#if HAVE_X86_KERNELS
    {"avx2 x8", md5_avx2x8, 8, {254, 493, 904, 1570, 1570}, 0},
    {"avx512vl x8", md5_avx512vlx8, 8, {438, 809, 1383, 2193, 2193}, 0},
    {"avx512f x16", md5_avx512x16, 16, {395, 732, 1262, 1831, 2673}, 0},
#endif
};
#define N_KERNELS ((int)(sizeof KERNELS / sizeof KERNELS[0]))

static void detect_kernels(void) {
#if HAVE_X86_KERNELS
    __builtin_cpu_init();
    KERNELS[3].usable = __builtin_cpu_supports("avx2");
    KERNELS[4].usable = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl");
    KERNELS[5].usable = __builtin_cpu_supports("avx512f");
#endif
}

/* Kernel k's speed with n files busy (interpolated between the measured counts). */
static double speed(const Kernel *k, Py_ssize_t n) {
    if (n <= 1) return k->mbs[0];
    if (n >= 16) return k->mbs[N_SPEEDS - 1];
    int i = 0;
    while ((2 << i) <= n) i++; /* 2^i <= n < 2^(i+1) */
    double lo = (double)(1 << i), f = ((double)n - lo) / lo;
    return k->mbs[i] + f * (k->mbs[i + 1] - k->mbs[i]);
}

/* Kernel k's time for n files of one size (in units of a file's MB): full rounds of all its lanes, then the rest
 * side by side. Past its lanes a kernel takes the files in rounds, so a speed at n alone misleads: 10 files on 8
 * lanes are 8 at the 8-lane speed and then 2 at the 2-file speed, slower than 10 of 16 lanes at once. */
static double job_time(const Kernel *k, Py_ssize_t n) {
    Py_ssize_t full = n / k->lanes, rest = n % k->lanes;
    double t = full ? (double)(full * k->lanes) / speed(k, k->lanes) : 0.0;
    return rest ? t + (double)rest / speed(k, rest) : t;
}

/* The usable kernel that hashes n files soonest. */
static const Kernel *pick(Py_ssize_t n) {
    const Kernel *best = &KERNELS[0];
    for (int k = 1; k < N_KERNELS; k++)
        if (KERNELS[k].usable && job_time(&KERNELS[k], n) < job_time(best, n)) best = &KERNELS[k];
    return best;
}

/* The usable kernel of that name; NULL with ValueError set if there is none. */
static const Kernel *by_name(const char *name) {
    for (int k = 0; k < N_KERNELS; k++)
        if (KERNELS[k].usable && strcmp(KERNELS[k].name, name) == 0) return &KERNELS[k];
    PyErr_Format(PyExc_ValueError, "md5 kernel %s is not available on this CPU (see kernels())", name);
    return NULL;
}

static const uint32_t MD5_IV[4] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476};

typedef struct {
    int fd;
    Py_ssize_t file; /* index into the paths, -1: idle */
    uint8_t *buf;
    size_t pos, len;
    uint64_t total;
    int eof;
    uint8_t *own;  /* the lane's read buffer (buf points into the mapping while a mapped file is hashed) */
    size_t maplen; /* > 0: buf is a mapping of the whole file, that long */
    size_t dropped; /* the mapping's first bytes already unmapped from the page tables (a multiple of 4 MiB) */
} Lane;

typedef struct {
    const char *const *paths;
    const Py_ssize_t *order; /* the files in the order the lanes take them (largest first); NULL: as given */
    Py_ssize_t n, next;
    uint8_t (*digests)[16];
    Py_ssize_t err_file;
    int err_no;
    int mapped; /* map the files of MD5_MAP_MIN bytes or more (md5_files(..., mapped=True)) */
    const uint8_t *const *bufs; /* md5_buffers: the bytes themselves (no files), lens[i] each */
    const size_t *lens;
} Job;

static void lane_state(uint32_t *st, int l, const uint32_t w[4]) {
    for (int i = 0; i < 4; i++) st[i * MD5_MAX_LANES + l] = w[i];
}

/* The lane back on its own buffer, its file's mapping (if any) removed. */
static void lane_unmap(Lane *ln) {
    if (ln->maplen) munmap(ln->buf, ln->maplen);
    ln->maplen = 0;
    ln->buf = ln->own;
}

/* Map the lane's open file whole when the job maps files and it is large enough: 1 when mapped (its bytes are
 * then all in buf, eof set), 0 to read it (small, or the mapping failed: read(2) is always there). */
static int lane_map(const Job *job, Lane *ln) {
    struct stat sb;
    if (!job->mapped || fstat(ln->fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size < MD5_MAP_MIN) return 0;
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, ln->fd, 0);
    if (p == MAP_FAILED) return 0;
    ln->buf = p;
    ln->dropped = 0;
    ln->maplen = ln->len = (size_t)sb.st_size;
    ln->total = (uint64_t)sb.st_size;
    ln->eof = 1;
    return 1;
}

/* Finish lane l's file: its last < 64 bytes, the padding and the length, through the one-lane kernel. */
static void lane_finish(Job *job, Lane *ln, uint32_t *st, int l) {
    uint8_t tail[128] = {0};
    size_t rest = ln->len - ln->pos;
    memcpy(tail, ln->buf + ln->pos, rest);
    tail[rest] = 0x80;
    size_t blocks = rest + 9 <= 64 ? 1 : 2;
    uint64_t bits = ln->total * 8;
    for (int i = 0; i < 8; i++) tail[64 * blocks - 8 + i] = (uint8_t)(bits >> (8 * i));
    uint32_t one[4 * MD5_MAX_LANES];
    for (int i = 0; i < 4; i++) one[i * MD5_MAX_LANES] = st[i * MD5_MAX_LANES + l];
    const uint8_t *p[1] = {tail};
    md5_scalar1(one, p, blocks);
    for (int i = 0; i < 4; i++) {
        uint32_t w = one[i * MD5_MAX_LANES];
        for (int j = 0; j < 4; j++) job->digests[ln->file][4 * i + j] = (uint8_t)(w >> (8 * j));
    }
    if (ln->fd >= 0) close(ln->fd);
    ln->fd = -1;
    ln->file = -1;
    lane_unmap(ln);
}

/* Top lane l up to at least 64 bytes (or to the end of its file); 0, or -1 with errno set. */
static int lane_fill(Lane *ln) {
    if (ln->len - ln->pos >= 64 || ln->eof) return 0;
    memmove(ln->buf, ln->buf + ln->pos, ln->len - ln->pos);
    ln->len -= ln->pos;
    ln->pos = 0;
    while (ln->len < MD5_CHUNK && !ln->eof) {
        ssize_t r = read(ln->fd, ln->buf + ln->len, MD5_CHUNK - ln->len);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) ln->eof = 1;
        ln->len += (size_t)r;
        ln->total += (uint64_t)r;
    }
    return 0;
}

/* Give lane l the next file (state reset), or leave it idle; 0, or -1 (job->err_*) when a file fails. */
static int lane_next(Job *job, Lane *ln, uint32_t *st, int l) {
    while (job->next < job->n) {
        Py_ssize_t f = job->order ? job->order[job->next] : job->next;
        job->next++;
        if (job->bufs) { /* a buffer: all its bytes at hand, as a mapped file's */
            ln->fd = -1; ln->file = f; ln->pos = 0; ln->eof = 1; ln->maplen = 0;
            ln->buf = (uint8_t *)job->bufs[f];
            ln->len = job->lens[f];
            ln->total = (uint64_t)job->lens[f];
            lane_state(st, l, MD5_IV);
            if (ln->len >= 64) return 0;
            lane_finish(job, ln, st, l);
            continue;
        }
        int fd = open(job->paths[f], O_RDONLY | O_CLOEXEC);
        if (fd < 0) { job->err_file = f; job->err_no = errno; return -1; }
#ifdef POSIX_FADV_SEQUENTIAL
        posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
#endif
        ln->fd = fd; ln->file = f; ln->pos = ln->len = 0; ln->total = 0; ln->eof = 0;
        lane_state(st, l, MD5_IV);
        if (lane_map(job, ln)) return 0; /* at least MD5_MAP_MIN bytes: more than 64 */
        if (lane_fill(ln) < 0) { job->err_file = f; job->err_no = errno; return -1; }
        if (ln->len - ln->pos >= 64) return 0;
        lane_finish(job, ln, st, l); /* a file under 64 bytes */
    }
    return 0;
}

/* The kernel for the lanes still busy once no file is left to start: narrower when that is faster (a wide
 * kernel costs the same for an idle lane as for a busy one); NULL when the job stays on k. */
static const Kernel *narrower(const Kernel *k, int active) {
    const Kernel *best = NULL;
    for (int i = 0; i < N_KERNELS; i++) {
        const Kernel *c = &KERNELS[i];
        if (c->usable && c->lanes >= active && c->lanes < k->lanes && speed(c, active) > speed(k, active) &&
            (!best || speed(c, active) > speed(best, active)))
            best = c;
    }
    return best;
}

static int run_job(Job *job, const Kernel *k, int narrow) {
    static uint8_t zeros[MD5_CHUNK];
    uint32_t st[4 * MD5_MAX_LANES] = {0};
    Lane lanes[MD5_MAX_LANES];
    const uint8_t *ptr[MD5_MAX_LANES];
    int L = k->lanes, L0 = L, rc = 0;
    uint8_t *mem = malloc((size_t)L * MD5_CHUNK);
    if (!mem) { job->err_file = -1; job->err_no = ENOMEM; return -1; }
    for (int l = 0; l < L; l++) /* every lane idle first: an error below cleans up all of them */
        lanes[l] = (Lane){.fd = -1, .file = -1, .buf = mem + (size_t)l * MD5_CHUNK, .own = mem + (size_t)l * MD5_CHUNK};
    for (int l = 0; l < L; l++)
        if (lane_next(job, &lanes[l], st, l) < 0) { rc = -1; goto out; }
    for (;;) {
        size_t nb = SIZE_MAX;
        int active = 0;
        for (int l = 0; l < L; l++) {
            Lane *ln = &lanes[l];
            while (ln->file >= 0) {
                if (lane_fill(ln) < 0) { job->err_file = ln->file; job->err_no = errno; rc = -1; goto out; }
                if (ln->len - ln->pos >= 64) break;
                lane_finish(job, ln, st, l);
                if (lane_next(job, ln, st, l) < 0) { rc = -1; goto out; }
            }
            if (ln->file >= 0) {
                active++;
                /* at most a buffer's worth a step: the idle lanes hash `zeros` (that long), and a mapped file
                 * goes on side by side with the others */
                size_t b = (ln->len - ln->pos) / 64;
                if (b > MD5_CHUNK / 64) b = MD5_CHUNK / 64;
                if (b < nb) nb = b;
                ptr[l] = ln->buf + ln->pos;
            } else {
                ptr[l] = zeros;
            }
        }
        if (!active) break;
        const Kernel *nk = narrow && job->next == job->n && active < L ? narrower(k, active) : NULL;
        if (nk) { /* the tail: the busy lanes moved to the front (their states with them) */
            int to = 0;
            for (int l = 0; l < L; l++) {
                if (lanes[l].file < 0) continue;
                if (l != to) {
                    Lane t = lanes[to]; lanes[to] = lanes[l]; lanes[l] = t;
                    for (int w = 0; w < 4; w++) st[w * MD5_MAX_LANES + to] = st[w * MD5_MAX_LANES + l];
                    ptr[to] = ptr[l];
                }
                to++;
            }
            k = nk;
            L = k->lanes;
        }
        k->fn(st, ptr, nb);
        for (int l = 0; l < L; l++) {
            Lane *ln = &lanes[l];
            if (ln->file < 0) continue;
            ln->pos += 64 * nb;
            size_t done = ln->pos / MD5_MAP_DROP * MD5_MAP_DROP;
            if (ln->maplen && done > ln->dropped) { /* hashed: out of the page tables (and the RSS) */
                madvise(ln->buf + ln->dropped, done - ln->dropped, MADV_DONTNEED);
                ln->dropped = done;
            }
        }
    }
out:
    for (int l = 0; l < L0; l++) {
        if (lanes[l].fd >= 0) close(lanes[l].fd);
        lane_unmap(&lanes[l]);
    }
    free(mem);
    return rc;
}

/* The order in which the lanes take the files: the largest first (stable for equal sizes), so that the long files
 * run side by side from the start and the short ones fill the lanes around them, instead of a long file that
 * starts late running alone (on a one-lane kernel) at the end. NULL (the given order) when a file cannot be
 * stat'ed: the job then meets the error where it would have. */
static Py_ssize_t *largest_first(const char *const *paths, Py_ssize_t n) {
    if (n < 2) return NULL;
    Py_ssize_t *order = malloc((size_t)n * sizeof *order);
    off_t *size = malloc((size_t)n * sizeof *size);
    if (!order || !size) { free(order); free(size); return NULL; }
    for (Py_ssize_t i = 0; i < n; i++) {
        struct stat sb;
        if (stat(paths[i], &sb) != 0) { free(order); free(size); return NULL; }
        size[i] = sb.st_size;
        /* insertion sort by size, descending; equal sizes keep their order */
        Py_ssize_t j = i;
        while (j > 0 && size[order[j - 1]] < size[i]) { order[j] = order[j - 1]; j--; }
        order[j] = i;
    }
    free(size);
    return order;
}

/* The lanes' order for buffers: the longest first (stable), as largest_first's for files. */
static Py_ssize_t *longest_first(const size_t *lens, Py_ssize_t n) {
    if (n < 2) return NULL;
    Py_ssize_t *order = malloc((size_t)n * sizeof *order);
    if (!order) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t j = i;
        while (j > 0 && lens[order[j - 1]] < lens[i]) { order[j] = order[j - 1]; j--; }
        order[j] = i;
    }
    return order;
}

static PyObject *hex_digests(uint8_t (*digests)[16], Py_ssize_t n) {
    PyObject *result = PyList_New(n);
    if (!result) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        char hex[33];
        for (int j = 0; j < 16; j++) snprintf(hex + 2 * j, 3, "%02x", digests[i][j]);
        PyObject *s = PyUnicode_FromStringAndSize(hex, 32);
        if (!s) { Py_DECREF(result); return NULL; }
        PyList_SET_ITEM(result, i, s);
    }
    return result;
}

/* A job's files or buffers hashed with the GIL released, the lanes taking them in their order (largest_first,
 * longest_first). k NULL: the kernel picked for the count (and narrower ones for the last files); a kernel named by
 * the caller is kept. */
static int run_in_order(Job *job, const Kernel *k) {
    int narrow = k == NULL, rc;
    if (!k) k = pick(job->n);
    Py_BEGIN_ALLOW_THREADS
    job->order = job->bufs ? longest_first(job->lens, job->n) : largest_first(job->paths, job->n);
    rc = job->n ? run_job(job, k, narrow) : 0;
    free((void *)job->order);
    job->order = NULL;
    Py_END_ALLOW_THREADS
    return rc;
}

static PyObject *md5_files(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"paths", "kernel", "mapped", NULL};
    PyObject *seq;
    const char *kname = NULL;
    int mapped = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|zp", kwlist, &seq, &kname, &mapped)) return NULL;
    const Kernel *k = NULL;
    if (kname && !(k = by_name(kname))) return NULL;
    PyObject *fast = PySequence_Fast(seq, "md5_files expects a sequence of paths");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
    PyObject **encoded = calloc((size_t)(n ? n : 1), sizeof *encoded);
    const char **paths = calloc((size_t)(n ? n : 1), sizeof *paths);
    uint8_t (*digests)[16] = calloc((size_t)(n ? n : 1), 16);
    PyObject *result = NULL;
    if (!encoded || !paths || !digests) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!PyUnicode_FSConverter(PySequence_Fast_GET_ITEM(fast, i), &encoded[i])) goto done;
        paths[i] = PyBytes_AS_STRING(encoded[i]);
    }
    Job job = {.paths = paths, .order = NULL, .n = n, .next = 0, .digests = digests, .err_file = -1, .err_no = 0,
               .mapped = mapped};
    if (run_in_order(&job, k) < 0) {
        errno = job.err_no;
        if (job.err_file >= 0) PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, PySequence_Fast_GET_ITEM(fast, job.err_file));
        else PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = hex_digests(digests, n);
done:
    if (encoded)
        for (Py_ssize_t i = 0; i < n; i++) Py_XDECREF(encoded[i]);
    free(encoded);
    free((void *)paths);
    free(digests);
    Py_DECREF(fast);
    return result;
}

static PyObject *md5_buffers(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"buffers", "kernel", NULL};
    PyObject *seq;
    const char *kname = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|z", kwlist, &seq, &kname)) return NULL;
    const Kernel *k = NULL;
    if (kname && !(k = by_name(kname))) return NULL;
    PyObject *fast = PySequence_Fast(seq, "md5_buffers expects a sequence of buffers");
    if (!fast) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fast), got = 0;
    Py_buffer *views = calloc((size_t)(n ? n : 1), sizeof *views);
    const uint8_t **bufs = calloc((size_t)(n ? n : 1), sizeof *bufs);
    size_t *lens = calloc((size_t)(n ? n : 1), sizeof *lens);
    uint8_t (*digests)[16] = calloc((size_t)(n ? n : 1), 16);
    PyObject *result = NULL;
    if (!views || !bufs || !lens || !digests) { PyErr_NoMemory(); goto done; }
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(fast, got), &views[got], PyBUF_C_CONTIGUOUS) < 0) goto done;
        bufs[got] = (const uint8_t *)views[got].buf;
        lens[got] = (size_t)views[got].len;
    }
    Job job = {.paths = NULL, .order = NULL, .n = n, .next = 0, .digests = digests, .err_file = -1, .err_no = 0,
               .mapped = 0, .bufs = bufs, .lens = lens};
    if (run_in_order(&job, k) < 0) {
        errno = job.err_no;
        PyErr_SetFromErrno(PyExc_OSError);
        goto done;
    }
    result = hex_digests(digests, n);
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&views[i]);
    free(views);
    free((void *)bufs);
    free(lens);
    free(digests);
    Py_DECREF(fast);
    return result;
}

static PyObject *kernel_for(PyObject *self, PyObject *args) {
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "n", &n)) return NULL;
    return PyUnicode_FromString(pick(n)->name);
}

static PyObject *kernels(PyObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    for (int k = 0; out && k < N_KERNELS; k++)
        if (KERNELS[k].usable) {
            PyObject *s = PyUnicode_FromString(KERNELS[k].name);
            if (!s || PyList_Append(out, s) < 0) { Py_XDECREF(s); Py_CLEAR(out); break; }
            Py_DECREF(s);
        }
    return out;
}

static PyMethodDef methods[] = {
    {"md5_files", (PyCFunction)(void (*)(void))md5_files, METH_VARARGS | METH_KEYWORDS,
     "md5_files(paths, kernel=None, mapped=False) -> [hex md5 of each file], as hashlib; kernel: one of kernels(); "
     "mapped: map files of 1 MiB or more instead of reading them (files just written and closed by the caller)"},
    {"md5_buffers", (PyCFunction)(void (*)(void))md5_buffers, METH_VARARGS | METH_KEYWORDS,
     "md5_buffers(buffers, kernel=None) -> hex md5 of each buffer (bytes-like), side by side as md5_files'"},
    {"kernel_for", kernel_for, METH_VARARGS, "kernel_for(n) -> the kernel md5_files uses for n files"},
    {"kernels", kernels, METH_NOARGS, "kernels() -> the kernels this CPU can run"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moddef = {PyModuleDef_HEAD_INIT, "_md5_native", "md5 of many files at once", -1, methods};

PyMODINIT_FUNC PyInit__md5_native(void) {
    detect_kernels();
    PyObject *m = PyModule_Create(&moddef);
    if (!m) return NULL;
    PyModule_AddIntConstant(m, "ABI", 3);
    PyModule_AddStringConstant(m, "SOURCES_DIGEST", BERTPIPE_SOURCES_DIGEST);
    return m;
}
