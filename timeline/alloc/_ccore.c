/* Optional compiled core of the caching allocator model: the simulator's allocator pass.
 *
 * A line-by-line port of the request path of timeline/alloc/caching.py (the reference the tests
 * compare against, event for event) for what the allocator pass needs: one stream, no
 * record_stream, no expandable segments. It replays a whole device's event stream in one call:
 * each event is an allocation of size[i] bytes (pair[i] < 0) or the free of the allocation made
 * by event pair[i]. Free lists are sorted arrays of (size, address), PyTorch's
 * BlockComparatorSize order; blocks live in one array linked by index like PyTorch's Block.
 *
 * Whenever the run reaches a state the port does not model (a 0-byte request, an address
 * beyond 48 bits, releasing a block that is not a whole segment), replay() returns None and the
 * caller runs the Python model, which then does whatever the reference does. Built by setuptools
 * as an optional extension: without a compiler, the package uses the Python model alone.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MIN_BLOCK 512
#define SMALL_SIZE (1LL << 20)
#define SMALL_BUFFER (2LL << 20)
#define MIN_LARGE_ALLOC (10LL << 20)
#define ROUND_LARGE (2LL << 20)
#define LARGE_BUFFER (20LL << 20)
#define SEGMENT_ALIGN (2LL << 20)
#define FIRST_ADDRESS (1LL << 36)
#define ADDRESS_MASK ((1LL << 48) - 1)

enum { EV_SEGMENT_ALLOC = 0, EV_SEGMENT_FREE = 1, EV_OOM = 2 };

typedef struct {
    int64_t addr, size, requested, seg;
    int32_t prev, next;
    uint8_t allocated, small;
} Block;

typedef struct { int64_t size, addr; int32_t b; } Key;
typedef struct { Key *a; Py_ssize_t n, cap; } FreeList;

typedef struct {
    Block *blocks; int32_t nblocks, cap;
    int32_t *slots; int32_t nslots, slotcap;     /* reusable block indices */
    FreeList pool[2];                           /* 0: large, 1: small */
    int64_t allocated, requested, reserved, next_address, capacity;  /* capacity < 0: none */
    uint64_t mss; int has_mss; int64_t nsr; int divisions[16]; int plain;
    int64_t *sev; Py_ssize_t nsev, sevcap;     /* 6 per segment event */
    int64_t *oom; Py_ssize_t noom, oomcap;     /* 3 per OOM: event, allocated before, reserved */
    int64_t cur; int bail; int nomem;
} Alloc;

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, size_t item) {
    if (need <= *cap) return 0;
    Py_ssize_t c = *cap ? *cap : 64;
    while (c < need) c *= 2;
    void *q = realloc(*p, (size_t)c * item);
    if (!q) return -1;
    *p = q; *cap = c;
    return 0;
}

static int32_t new_block(Alloc *A, int64_t addr, int64_t size, int small, int64_t seg) {
    int32_t b;
    if (A->nslots) b = A->slots[--A->nslots];
    else {
        if (A->nblocks == A->cap) {
            int32_t c = A->cap ? A->cap * 2 : 1024;
            Block *q = realloc(A->blocks, (size_t)c * sizeof(Block));
            if (!q) { A->nomem = 1; return -1; }
            A->blocks = q; A->cap = c;
        }
        b = A->nblocks++;
    }
    Block *k = &A->blocks[b];
    k->addr = addr; k->size = size; k->requested = 0; k->seg = seg;
    k->prev = k->next = -1; k->allocated = 0; k->small = (uint8_t)small;
    return b;
}

static void drop_block(Alloc *A, int32_t b) {
    Py_ssize_t cap = A->slotcap;
    if (grow((void **)&A->slots, &cap, A->nslots + 1, sizeof(int32_t))) { A->nomem = 1; return; }
    A->slotcap = (int32_t)cap;
    A->slots[A->nslots++] = b;
}

/* first index whose (size, addr) >= (size, addr) */
static Py_ssize_t lower(const FreeList *L, int64_t size, int64_t addr) {
    Py_ssize_t lo = 0, hi = L->n;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) >> 1;
        const Key *k = &L->a[mid];
        if (k->size < size || (k->size == size && k->addr < addr)) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static void pool_insert(Alloc *A, int32_t b) {
    Block *k = &A->blocks[b];
    FreeList *L = &A->pool[k->small];
    if (grow((void **)&L->a, &L->cap, L->n + 1, sizeof(Key))) { A->nomem = 1; return; }
    Py_ssize_t i = lower(L, k->size, k->addr);
    memmove(&L->a[i + 1], &L->a[i], (size_t)(L->n - i) * sizeof(Key));
    L->a[i].size = k->size; L->a[i].addr = k->addr; L->a[i].b = b;
    L->n++;
}

static void pool_remove_at(FreeList *L, Py_ssize_t i) {
    memmove(&L->a[i], &L->a[i + 1], (size_t)(L->n - i - 1) * sizeof(Key));
    L->n--;
}

static void pool_remove(Alloc *A, int32_t b) {
    Block *k = &A->blocks[b];
    FreeList *L = &A->pool[k->small];
    Py_ssize_t i = lower(L, k->size, k->addr);
    if (i == L->n || L->a[i].b != b) { A->bail = 1; return; }
    pool_remove_at(L, i);
}

static void event(Alloc *A, int code, int64_t addr, int64_t size) {
    if (grow((void **)&A->sev, &A->sevcap, A->nsev + 6, sizeof(int64_t))) { A->nomem = 1; return; }
    int64_t *e = &A->sev[A->nsev];
    e[0] = A->cur; e[1] = code; e[2] = addr; e[3] = size; e[4] = 0; e[5] = A->reserved;
    A->nsev += 6;
}

static int bitlen(uint64_t x) { return x ? 64 - __builtin_clzll(x) : 0; }

static int64_t round_size(const Alloc *A, int64_t size) {
    if (size < MIN_BLOCK) return MIN_BLOCK;
    if (!A->plain) {
        int index = bitlen((uint64_t)size) - 1 - 20;
        int d = A->divisions[index < 0 ? 0 : (index > 15 ? 15 : index)];
        if (d > 1 && size > (int64_t)MIN_BLOCK * d) {
            if ((size & (size - 1)) == 0) return size;
            int64_t floor = 1LL << (bitlen((uint64_t)size) - 1);
            int64_t step = floor >> (bitlen((uint64_t)d) - 1);
            if (step == 0) return floor << 1;
            int64_t rounded = size & ~(step - 1);
            return rounded == size ? size : rounded + step;
        }
    }
    return (size + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

static int64_t allocation_size(int64_t size) {
    if (size <= SMALL_SIZE) return SMALL_BUFFER;
    if (size < MIN_LARGE_ALLOC) return LARGE_BUFFER;
    return (size + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

static int32_t get_free_block(Alloc *A, int small, int64_t rsize) {
    FreeList *L = &A->pool[small];
    Py_ssize_t i = lower(L, rsize, 0);
    if (i == L->n) return -1;
    int64_t bsize = L->a[i].size;
    if ((uint64_t)rsize < A->mss) {
        if ((uint64_t)bsize >= A->mss) return -1;
    } else if (bsize >= rsize + A->nsr) {
        return -1;
    }
    int32_t b = L->a[i].b;
    pool_remove_at(L, i);
    return b;
}

static int32_t alloc_block(Alloc *A, int small, int64_t rsize, int ignore_capacity) {
    int64_t size = allocation_size(rsize);
    if (!ignore_capacity && A->capacity >= 0 && A->reserved + size > A->capacity) return -1;
    int64_t addr = A->next_address;
    if (addr <= 0 || addr + size > ADDRESS_MASK) { A->bail = 1; return -1; }
    int64_t end = (addr + size + SEGMENT_ALIGN - 1) / SEGMENT_ALIGN * SEGMENT_ALIGN;
    if (end + SEGMENT_ALIGN > A->next_address) A->next_address = end + SEGMENT_ALIGN;
    int32_t b = new_block(A, addr, size, small, addr);
    if (b < 0) return -1;
    A->reserved += size;
    event(A, EV_SEGMENT_ALLOC, addr, size);
    return b;
}

static void release_block(Alloc *A, int32_t b) {
    Block *k = &A->blocks[b];
    if (k->prev != -1 || k->next != -1) { A->bail = 1; return; }  /* not a whole segment */
    pool_remove(A, b);
    A->reserved -= k->size;
    event(A, EV_SEGMENT_FREE, k->addr, k->size);
    drop_block(A, b);
}

static void release_cached_blocks(Alloc *A) {
    for (int small = 0; small < 2 && !A->bail; small++) {  /* large pool first, as PyTorch */
        FreeList *L = &A->pool[small];
        Py_ssize_t n = L->n;
        int32_t *copy = malloc((size_t)(n ? n : 1) * sizeof(int32_t));
        if (!copy) { A->nomem = 1; return; }
        for (Py_ssize_t i = 0; i < n; i++) copy[i] = L->a[i].b;
        for (Py_ssize_t i = 0; i < n && !A->bail; i++) {
            Block *k = &A->blocks[copy[i]];
            if (k->prev == -1 && k->next == -1) release_block(A, copy[i]);
        }
        free(copy);
    }
}

static int release_available_cached_blocks(Alloc *A, int small, int64_t rsize) {
    int64_t mss = (int64_t)A->mss;
    int64_t need = rsize > mss ? rsize : mss;
    FreeList *L = &A->pool[small];
    Py_ssize_t i = lower(L, need, 0);
    if (i < L->n) {
        release_block(A, L->a[i].b);
        return 1;
    }
    int64_t released = 0;
    Py_ssize_t j = i - 1;
    while (released < need && j >= 0) {
        Block *k = &A->blocks[L->a[j].b];
        if (k->size < mss) break;
        if (k->prev == -1 && k->next == -1) {
            released += k->size;
            release_block(A, L->a[j].b);
            if (A->bail) return 0;
        }
        j--;
    }
    return released >= need;
}

static int32_t do_malloc(Alloc *A, int64_t size, int *oom) {
    *oom = 0;
    if (size <= 0) { A->bail = 1; return -1; }
    int64_t rsize = round_size(A, size);
    int small = rsize <= SMALL_SIZE;
    int32_t b = get_free_block(A, small, rsize);
    if (b < 0) {
        b = alloc_block(A, small, rsize, 0);
        if (A->bail) return -1;
        if (b < 0 && A->has_mss && release_available_cached_blocks(A, small, rsize)) b = alloc_block(A, small, rsize, 0);
        if (A->bail) return -1;
        if (b < 0) {
            release_cached_blocks(A);
            if (A->bail) return -1;
            b = alloc_block(A, small, rsize, 0);
        }
        if (A->bail) return -1;
        if (b < 0) {
            *oom = 1;
            event(A, EV_OOM, 0, rsize);
            b = alloc_block(A, small, rsize, 1);
            if (b < 0) { A->bail = 1; return -1; }
        }
    }
    /* alloc_found_block */
    Block *k = &A->blocks[b];
    int64_t remaining = k->size - rsize;
    int split = small ? remaining >= MIN_BLOCK : ((uint64_t)rsize < A->mss && remaining > SMALL_SIZE);
    if (split) {
        int32_t r = new_block(A, k->addr + rsize, remaining, small, k->seg);
        if (r < 0) return -1;
        k = &A->blocks[b];  /* the array may have moved */
        Block *rest = &A->blocks[r];
        rest->prev = b;
        rest->next = k->next;
        if (k->next != -1) A->blocks[k->next].prev = r;
        k->next = r;
        k->size = rsize;
        pool_insert(A, r);
        k = &A->blocks[b];
    }
    k->allocated = 1;
    k->requested = size;
    A->allocated += k->size;
    A->requested += size;
    return b;
}

/* try_merge_blocks: dst (in no list) absorbs its free neighbour src */
static void merge(Alloc *A, int32_t dst, int32_t src) {
    pool_remove(A, src);
    Block *d = &A->blocks[dst], *s = &A->blocks[src];
    if (d->prev == src) {
        d->addr = s->addr;
        d->prev = s->prev;
        if (s->prev != -1) A->blocks[s->prev].next = dst;
    } else {
        d->next = s->next;
        if (s->next != -1) A->blocks[s->next].prev = dst;
    }
    d->size += s->size;
    drop_block(A, src);
}

static void do_free(Alloc *A, int32_t b) {
    Block *k = &A->blocks[b];
    k->allocated = 0;
    A->allocated -= k->size;
    A->requested -= k->requested;
    if (k->prev != -1 && !A->blocks[k->prev].allocated) merge(A, b, k->prev);
    k = &A->blocks[b];
    if (k->next != -1 && !A->blocks[k->next].allocated) merge(A, b, k->next);
    pool_insert(A, b);
}

static int cmp_seg(const void *x, const void *y) {
    int64_t a = ((const int64_t *)x)[0], b = ((const int64_t *)y)[0];
    return (a > b) - (a < b);
}

/* [(segment address, is_small, ((addr, size, requested, allocated), ...)), ...] by address */
static PyObject *end_segments(Alloc *A) {
    Py_ssize_t nheads = 0;
    int64_t *heads = malloc((size_t)(A->nblocks ? A->nblocks : 1) * 2 * sizeof(int64_t));
    if (!heads) return PyErr_NoMemory();
    char *dead = calloc((size_t)(A->nblocks ? A->nblocks : 1), 1);
    if (!dead) { free(heads); return PyErr_NoMemory(); }
    for (int32_t i = 0; i < A->nslots; i++) dead[A->slots[i]] = 1;
    for (int32_t b = 0; b < A->nblocks; b++) {
        if (!dead[b] && A->blocks[b].prev == -1) {
            heads[2 * nheads] = A->blocks[b].addr;
            heads[2 * nheads + 1] = b;
            nheads++;
        }
    }
    free(dead);
    qsort(heads, (size_t)nheads, 2 * sizeof(int64_t), cmp_seg);
    PyObject *out = PyList_New(nheads);
    if (!out) { free(heads); return NULL; }
    for (Py_ssize_t s = 0; s < nheads; s++) {
        int32_t b = (int32_t)heads[2 * s + 1];
        PyObject *blocks = PyList_New(0);
        if (!blocks) { Py_DECREF(out); free(heads); return NULL; }
        for (int32_t c = b; c != -1; c = A->blocks[c].next) {
            Block *k = &A->blocks[c];
            PyObject *t = Py_BuildValue("(LLLi)", (long long)k->addr, (long long)k->size,
                                        (long long)(k->allocated ? k->requested : 0), (int)k->allocated);
            if (!t || PyList_Append(blocks, t)) { Py_XDECREF(t); Py_DECREF(blocks); Py_DECREF(out); free(heads); return NULL; }
            Py_DECREF(t);
        }
        PyObject *seg = Py_BuildValue("(LiN)", (long long)A->blocks[b].addr, (int)A->blocks[b].small, blocks);
        if (!seg) { Py_DECREF(out); free(heads); return NULL; }
        PyList_SET_ITEM(out, s, seg);
    }
    free(heads);
    return out;
}

static PyObject *list_of_tuples(const int64_t *v, Py_ssize_t n, int width) {
    PyObject *out = PyList_New(n / width);
    if (!out) return NULL;
    for (Py_ssize_t i = 0; i < n / width; i++) {
        PyObject *t = PyTuple_New(width);
        if (!t) { Py_DECREF(out); return NULL; }
        for (int j = 0; j < width; j++) {
            PyObject *x = PyLong_FromLongLong(v[i * width + j]);
            if (!x) { Py_DECREF(t); Py_DECREF(out); return NULL; }
            PyTuple_SET_ITEM(t, j, x);
        }
        PyList_SET_ITEM(out, i, t);
    }
    return out;
}

static int get_buffer(PyObject *obj, Py_buffer *view, Py_ssize_t n, int writable) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0)))
        return -1;
    if (view->itemsize != 8 || view->len != n * 8) {
        PyErr_SetString(PyExc_ValueError, "replay: every column must be int64 of the same length");
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(replay_doc,
"replay(size, pair, block, reserved, address, segment, capacity, max_split_size, max_non_split_rounding,\n"
"       divisions) -> (segment_events, ooms, end_segments) | None\n\n"
"Run one device's events through the caching allocator model. size, pair: int64 inputs (pair[i] < 0:\n"
"event i allocates size[i] bytes; else it frees event pair[i]'s block); block, reserved, address,\n"
"segment: int64 outputs filled per event. capacity < 0: unlimited; max_split_size < 0: unlimited.\n"
"segment_events: (event, code 0 alloc / 1 free / 2 oom, address, size, stream, reserved) tuples;\n"
"ooms: (event, allocated bytes before it, reserved after) tuples. None: a state this port does not\n"
"model; run the Python model instead.");

static PyObject *replay(PyObject *self, PyObject *args) {
    PyObject *o_size, *o_pair, *o_block, *o_res, *o_addr, *o_seg, *o_div;
    long long capacity, mss, nsr;
    if (!PyArg_ParseTuple(args, "OOOOOOLLLO", &o_size, &o_pair, &o_block, &o_res, &o_addr, &o_seg,
                          &capacity, &mss, &nsr, &o_div))
        return NULL;
    Py_buffer vs, vp, vb, vr, va, vg;
    Py_ssize_t n = PyObject_Length(o_size);
    if (n < 0) return NULL;
    if (get_buffer(o_size, &vs, n, 0)) return NULL;
    if (get_buffer(o_pair, &vp, n, 0)) { PyBuffer_Release(&vs); return NULL; }
    if (get_buffer(o_block, &vb, n, 1)) { PyBuffer_Release(&vs); PyBuffer_Release(&vp); return NULL; }
    if (get_buffer(o_res, &vr, n, 1)) { PyBuffer_Release(&vs); PyBuffer_Release(&vp); PyBuffer_Release(&vb); return NULL; }
    if (get_buffer(o_addr, &va, n, 1)) {
        PyBuffer_Release(&vs); PyBuffer_Release(&vp); PyBuffer_Release(&vb); PyBuffer_Release(&vr); return NULL;
    }
    if (get_buffer(o_seg, &vg, n, 1)) {
        PyBuffer_Release(&vs); PyBuffer_Release(&vp); PyBuffer_Release(&vb); PyBuffer_Release(&vr);
        PyBuffer_Release(&va); return NULL;
    }
    Alloc A;
    memset(&A, 0, sizeof A);
    A.capacity = capacity;
    A.has_mss = mss >= 0;
    A.mss = mss >= 0 ? (uint64_t)mss : UINT64_MAX;
    A.nsr = nsr;
    A.next_address = FIRST_ADDRESS;
    A.plain = 1;
    PyObject *seq = PySequence_Fast(o_div, "divisions must be a sequence of 16 ints");
    int ok = seq != NULL && PySequence_Fast_GET_SIZE(seq) == 16;
    for (int i = 0; ok && i < 16; i++) {
        long d = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (d == -1 && PyErr_Occurred()) ok = 0;
        A.divisions[i] = (int)d;
        if (d > 1) A.plain = 0;
    }
    Py_XDECREF(seq);
    PyObject *result = NULL;
    int32_t *ev_block = ok ? malloc((size_t)(n ? n : 1) * sizeof(int32_t)) : NULL;
    if (ok && !ev_block) PyErr_NoMemory();
    if (ok && ev_block) {
        const int64_t *size = vs.buf, *pair = vp.buf;
        int64_t *block = vb.buf, *reserved = vr.buf, *address = va.buf, *segment = vg.buf;
        Py_BEGIN_ALLOW_THREADS
        for (Py_ssize_t i = 0; i < n && !A.bail && !A.nomem; i++) {
            A.cur = i;
            int64_t p = pair[i];
            if (p < 0) {
                int oom;
                int32_t b = do_malloc(&A, size[i], &oom);
                if (b < 0) break;
                Block *k = &A.blocks[b];
                ev_block[i] = b;
                block[i] = k->size;
                address[i] = k->addr;
                segment[i] = k->seg;
                if (oom) {
                    if (grow((void **)&A.oom, &A.oomcap, A.noom + 3, sizeof(int64_t))) { A.nomem = 1; break; }
                    A.oom[A.noom++] = i;
                    A.oom[A.noom++] = A.allocated - k->size;
                    A.oom[A.noom++] = A.reserved;
                }
            } else {
                if (p >= i || pair[p] >= 0) { A.bail = 1; break; }
                int32_t b = ev_block[p];
                Block *k = &A.blocks[b];
                if (!k->allocated) { A.bail = 1; break; }
                block[i] = -k->size;
                address[i] = k->addr;
                segment[i] = k->seg;
                do_free(&A, b);
            }
            reserved[i] = A.reserved;
        }
        Py_END_ALLOW_THREADS
        if (A.nomem) PyErr_NoMemory();
        else if (A.bail) { Py_INCREF(Py_None); result = Py_None; }
        else {
            PyObject *sev = list_of_tuples(A.sev, A.nsev, 6);
            PyObject *ooms = sev ? list_of_tuples(A.oom, A.noom, 3) : NULL;
            PyObject *segs = ooms ? end_segments(&A) : NULL;
            if (segs) result = Py_BuildValue("(NNN)", sev, ooms, segs);
            else { Py_XDECREF(sev); Py_XDECREF(ooms); }
        }
    }
    free(ev_block);
    free(A.blocks); free(A.slots); free(A.pool[0].a); free(A.pool[1].a); free(A.sev); free(A.oom);
    PyBuffer_Release(&vs); PyBuffer_Release(&vp); PyBuffer_Release(&vb); PyBuffer_Release(&vr);
    PyBuffer_Release(&va); PyBuffer_Release(&vg);
    return result;
}

static PyMethodDef methods[] = {
    {"replay", replay, METH_VARARGS, replay_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ccore",
    "Compiled core of the caching allocator model's allocator pass (see timeline.alloc.batch).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__ccore(void) { return PyModule_Create(&module); }
