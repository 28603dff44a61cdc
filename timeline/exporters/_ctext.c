/* Optional compiled writer of text lines from columns: the Chrome trace's slices and counters.
 *
 * format_rows() fills one text template per row from int, ns, table and float columns (the
 * op slices and counter samples of timeline/exporters/chrome_trace.py, through
 * timeline/exporters/text_rows.py, whose Python path is the reference); clip_nested() is
 * trace_common.nest's loop. Built by setuptools as an optional extension: without a compiler the
 * package runs the Python code (timeline/exporters/compiled.py says which is active).
 */
#include "_cbuffer.h"

/* ---------------------------------------------------------------- text rows */

/* a float's repr(), as float_repr in Objects/floatobject.c spells it, remembered per bit
 * pattern in a small open-addressing table (counter columns repeat few values) */
typedef struct {
    uint64_t *key;
    int64_t *off;                 /* into text; -1: empty slot */
    int32_t *len;
    Py_ssize_t mask, used;
    Out text;
} ReprCache;

/* splitmix64's finalizer: a float's bits end in runs of zeros, the slot must depend on every bit */
static Py_ssize_t slot_of(uint64_t x, Py_ssize_t mask) {
    x ^= x >> 30; x *= 0xBF58476D1CE4E5B9ULL;
    x ^= x >> 27; x *= 0x94D049BB133111EBULL;
    x ^= x >> 31;
    return (Py_ssize_t)(x & (uint64_t)mask);
}

static int cache_init(ReprCache *c, Py_ssize_t want) {
    Py_ssize_t n = 1024;
    while (n < 2 * want && n < (1 << 22)) n *= 2;
    c->key = PyMem_Malloc((size_t)n * sizeof(uint64_t));
    c->off = PyMem_Malloc((size_t)n * sizeof(int64_t));
    c->len = PyMem_Malloc((size_t)n * sizeof(int32_t));
    if (!c->key || !c->off || !c->len) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < n; i++) c->off[i] = -1;
    c->mask = n - 1;
    return 0;
}

static void cache_free(ReprCache *c) {
    PyMem_Free(c->key); PyMem_Free(c->off); PyMem_Free(c->len); PyMem_Free(c->text.buf);
}

static int cache_grow(ReprCache *c) {
    ReprCache bigger;
    memset(&bigger, 0, sizeof bigger);
    Py_ssize_t n = (c->mask + 1) * 2;
    bigger.key = PyMem_Malloc((size_t)n * sizeof(uint64_t));
    bigger.off = PyMem_Malloc((size_t)n * sizeof(int64_t));
    bigger.len = PyMem_Malloc((size_t)n * sizeof(int32_t));
    if (!bigger.key || !bigger.off || !bigger.len) {
        PyMem_Free(bigger.key); PyMem_Free(bigger.off); PyMem_Free(bigger.len);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) bigger.off[i] = -1;
    bigger.mask = n - 1;
    for (Py_ssize_t i = 0; i <= c->mask; i++) {
        if (c->off[i] < 0) continue;
        Py_ssize_t h = slot_of(c->key[i], bigger.mask);
        while (bigger.off[h] >= 0) h = (h + 1) & bigger.mask;
        bigger.key[h] = c->key[i]; bigger.off[h] = c->off[i]; bigger.len[h] = c->len[i];
    }
    PyMem_Free(c->key); PyMem_Free(c->off); PyMem_Free(c->len);
    c->key = bigger.key; c->off = bigger.off; c->len = bigger.len; c->mask = bigger.mask;
    return 0;
}

/* The writers below append to o->buf without checks: format_rows reserves each row's bound first. */
#define REPR_MAX 32  /* repr() of a double is at most 24 characters ("-2.2250738585072014e-308") */

static int put_repr(Out *o, ReprCache *c, double x) {
    uint64_t bits;
    memcpy(&bits, &x, 8);
    Py_ssize_t h = slot_of(bits, c->mask);
    while (c->off[h] >= 0) {
        if (c->key[h] == bits) {
            memcpy(o->buf + o->len, c->text.buf + c->off[h], (size_t)c->len[h]);
            o->len += c->len[h];
            return 0;
        }
        h = (h + 1) & c->mask;
    }
    char *s = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (!s) return -1;
    Py_ssize_t n = (Py_ssize_t)strlen(s);
    if (n > REPR_MAX) { PyMem_Free(s); PyErr_SetString(PyExc_ValueError, "float repr too long"); return -1; }
    c->key[h] = bits; c->off[h] = c->text.len; c->len[h] = (int32_t)n;
    memcpy(o->buf + o->len, s, (size_t)n);
    o->len += n;
    int err = out_put(&c->text, s, n);
    PyMem_Free(s);
    if (err) return -1;
    if (++c->used * 2 > c->mask) return cache_grow(c);
    return 0;
}

static void put_int(Out *o, int64_t v) {
    char d[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do { d[23 - n++] = (char)('0' + u % 10); u /= 10; } while (u);
    if (v < 0) d[23 - n++] = '-';
    memcpy(o->buf + o->len, d + 24 - n, (size_t)n);
    o->len += n;
}

/* trace_common.fmt_us: integer ns as µs with exactly three decimals, "-" before a negative */
static void put_us(Out *o, int64_t ns) {
    uint64_t u = ns < 0 ? (uint64_t)0 - (uint64_t)ns : (uint64_t)ns;
    char d[32];
    int n = 0;
    uint64_t frac = u % 1000, whole = u / 1000;
    d[31 - n++] = (char)('0' + frac % 10);
    d[31 - n++] = (char)('0' + frac / 10 % 10);
    d[31 - n++] = (char)('0' + frac / 100);
    d[31 - n++] = '.';
    do { d[31 - n++] = (char)('0' + whole % 10); whole /= 10; } while (whole);
    if (ns < 0) d[31 - n++] = '-';
    memcpy(o->buf + o->len, d + 32 - n, (size_t)n);
    o->len += n;
}

static void put_raw(Out *o, const char *s, Py_ssize_t n) {
    memcpy(o->buf + o->len, s, (size_t)n);
    o->len += n;
}

typedef struct {
    char kind;                    /* 'd' int, 'u' ns as µs, 's' table index, 'r' float repr */
    Py_buffer view;
    PyObject *fast;               /* 's': the table, a sequence of bytes */
    Py_ssize_t widest;            /* the most bytes one value takes */
} Slot;

PyDoc_STRVAR(format_rows_doc,
"format_rows(pieces, slots, sep, write) -> None\n\n"
"For each row: sep, pieces[0], slot 0's text, pieces[1], ..., pieces[-1], handed to write(bytes)\n"
"in chunks of about 1 MiB. pieces: n+1 bytes; slots: n (kind, column, table) with kind b'd'\n"
"(int64: decimal), b'u' (int64 ns: µs with three decimals, as trace_common.fmt_us), b's' (int64\n"
"index into table, a sequence of bytes) or b'r' (float64: repr()); every column has the same length.");

static PyObject *format_rows(PyObject *self, PyObject *args) {
    PyObject *o_pieces, *o_slots, *write;
    const char *sep;
    Py_ssize_t nsep;
    if (!PyArg_ParseTuple(args, "OOy#O", &o_pieces, &o_slots, &sep, &nsep, &write)) return NULL;
    PyObject *pieces = PySequence_Fast(o_pieces, "pieces must be a sequence");
    if (!pieces) return NULL;
    PyObject *slots = PySequence_Fast(o_slots, "slots must be a sequence");
    if (!slots) { Py_DECREF(pieces); return NULL; }
    Py_ssize_t ns = PySequence_Fast_GET_SIZE(slots), rows = -1, bound = nsep;
    PyObject *result = NULL;
    Slot *sl = PyMem_Calloc((size_t)ns + 1, sizeof(Slot));
    ReprCache cache;
    memset(&cache, 0, sizeof cache);
    Out o = {0};
    int ok = sl != NULL;
    if (!ok) PyErr_NoMemory();
    if (ok && PySequence_Fast_GET_SIZE(pieces) != ns + 1) {
        PyErr_SetString(PyExc_ValueError, "one more piece than slots");
        ok = 0;
    }
    for (Py_ssize_t i = 0; ok && i <= ns; i++) {
        PyObject *piece = PySequence_Fast_GET_ITEM(pieces, i);
        if (!PyBytes_Check(piece)) { PyErr_SetString(PyExc_TypeError, "pieces are bytes"); ok = 0; }
        else bound += PyBytes_GET_SIZE(piece);
    }
    for (Py_ssize_t i = 0; ok && i < ns; i++) {
        const char *k;
        Py_ssize_t nk;
        PyObject *col, *table;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(slots, i), "y#OO", &k, &nk, &col, &table) || nk != 1) {
            if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "a slot's kind is one letter");
            ok = 0;
            break;
        }
        sl[i].kind = k[0];
        sl[i].widest = k[0] == 'r' ? REPR_MAX : 24;
        if (PyObject_GetBuffer(col, &sl[i].view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) { ok = 0; break; }
        if (sl[i].view.itemsize != 8 || !strchr("dusr", k[0])) {
            PyErr_SetString(PyExc_ValueError, "columns are 8-byte (int64, or float64 for 'r')");
            ok = 0;
            break;
        }
        Py_ssize_t n = sl[i].view.len / 8;
        if (rows >= 0 && n != rows) { PyErr_SetString(PyExc_ValueError, "columns differ in length"); ok = 0; break; }
        rows = n;
        if (k[0] == 's') {
            sl[i].fast = PySequence_Fast(table, "a table is a sequence of bytes");
            if (!sl[i].fast) { ok = 0; break; }
            Py_ssize_t nt = PySequence_Fast_GET_SIZE(sl[i].fast);
            sl[i].widest = 0;
            for (Py_ssize_t j = 0; j < nt; j++) {
                PyObject *t = PySequence_Fast_GET_ITEM(sl[i].fast, j);
                if (!PyBytes_Check(t)) { PyErr_SetString(PyExc_TypeError, "a table holds bytes"); ok = 0; break; }
                if (PyBytes_GET_SIZE(t) > sl[i].widest) sl[i].widest = PyBytes_GET_SIZE(t);
            }
            const int64_t *idx = sl[i].view.buf;
            for (Py_ssize_t r = 0; ok && r < n; r++)
                if (idx[r] < 0 || idx[r] >= nt) { PyErr_SetString(PyExc_IndexError, "table index out of range"); ok = 0; }
        }
        if (k[0] == 'r' && !cache.key && cache_init(&cache, 4096)) ok = 0;
        bound += sl[i].widest;
    }
    if (rows < 0) rows = 0;
    for (Py_ssize_t r = 0; ok && r < rows; r++) {
        if (out_reserve(&o, bound)) { ok = 0; break; }
        put_raw(&o, sep, nsep);
        for (Py_ssize_t i = 0; ok && i <= ns; i++) {
            PyObject *piece = PySequence_Fast_GET_ITEM(pieces, i);
            put_raw(&o, PyBytes_AS_STRING(piece), PyBytes_GET_SIZE(piece));
            if (i == ns) break;
            const int64_t v = ((const int64_t *)sl[i].view.buf)[r];
            switch (sl[i].kind) {
            case 'd': put_int(&o, v); break;
            case 'u': put_us(&o, v); break;
            case 'r': ok = !put_repr(&o, &cache, ((const double *)sl[i].view.buf)[r]); break;
            default: {
                PyObject *t = PySequence_Fast_GET_ITEM(sl[i].fast, v);
                put_raw(&o, PyBytes_AS_STRING(t), PyBytes_GET_SIZE(t));
            }
            }
        }
        if (ok && o.len >= FLUSH_BYTES && out_flush(&o, write)) ok = 0;
    }
    if (ok && !out_flush(&o, write)) {
        result = Py_None;
        Py_INCREF(result);
    }
    for (Py_ssize_t i = 0; sl && i < ns; i++) {
        if (sl[i].view.obj) PyBuffer_Release(&sl[i].view);
        Py_XDECREF(sl[i].fast);
    }
    PyMem_Free(sl);
    cache_free(&cache);
    PyMem_Free(o.buf);
    Py_DECREF(pieces);
    Py_DECREF(slots);
    return result;
}
/* ---------------------------------------------------------------- nesting */

PyDoc_STRVAR(clip_nested_doc,
"clip_nested(start, end) -> int\n\n"
"trace_common.nest's loop: over slices sorted by (start, longer first), clip each end (int64,\n"
"in place) to the end of the innermost slice still open at its start; returns how many were clipped.");

static PyObject *clip_nested(PyObject *self, PyObject *args) {
    PyObject *o_s, *o_e;
    if (!PyArg_ParseTuple(args, "OO", &o_s, &o_e)) return NULL;
    Py_buffer vs, ve;
    if (int64_view(o_s, &vs, "start")) return NULL;
    if (PyObject_GetBuffer(o_e, &ve, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE)) { PyBuffer_Release(&vs); return NULL; }
    if (ve.itemsize != 8 || ve.len != vs.len) {
        PyErr_SetString(PyExc_ValueError, "start and end: int64 of one length");
        PyBuffer_Release(&vs); PyBuffer_Release(&ve);
        return NULL;
    }
    Py_ssize_t n = vs.len / 8, top = 0, clipped = 0;
    const int64_t *s = vs.buf;
    int64_t *e = ve.buf;
    int64_t *stack = PyMem_Malloc((size_t)(n ? n : 1) * sizeof(int64_t));
    if (!stack) { PyBuffer_Release(&vs); PyBuffer_Release(&ve); return PyErr_NoMemory(); }
    for (Py_ssize_t i = 0; i < n; i++) {
        while (top && stack[top - 1] <= s[i]) top--;
        if (top && e[i] > stack[top - 1]) { e[i] = stack[top - 1]; clipped++; }
        stack[top++] = e[i];
    }
    PyMem_Free(stack);
    PyBuffer_Release(&vs);
    PyBuffer_Release(&ve);
    return PyLong_FromSsize_t(clipped);
}
static PyMethodDef methods[] = {
    {"format_rows", format_rows, METH_VARARGS, format_rows_doc},
    {"clip_nested", clip_nested, METH_VARARGS, clip_nested_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_ctext",
    "Compiled writer of the Chrome trace's lines (see timeline.exporters.compiled).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__ctext(void) { return PyModule_Create(&module); }
