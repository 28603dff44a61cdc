/* Optional compiled writer of snapshot.pickle: pickle.dump's bytes for an object graph in arrays.
 *
 * pickle_graph() writes a pickle (protocol 4) of an object graph given as arrays -- the snapshot
 * of timeline/exporters/memviz_snapshot.py without a Python dict per trace entry, built by
 * timeline/exporters/pickle_graph.py -- with the bytes CPython's C pickler writes for the same
 * objects (Modules/_pickle.c at v3.11.7, the same rules in v3.12.1 and v3.13.0: save, save_long,
 * save_unicode via write_unicode_binary, save_tuple, save_list with batch_list_exact, save_dict
 * with batch_dict_exact, memo_put, memo_get, _Pickler_Write, _Pickler_OpcodeBoundary,
 * _Pickler_CommitFrame, dump). Where each rule lives is said beside it. Object identity is the
 * caller's: a node pickled twice is a memo reference, two equal strings are two nodes.
 *
 * Built by setuptools as an optional extension: without a compiler the package pickles the
 * snapshot dict with pickle.dump (timeline/exporters/compiled.py says which is active).
 */
#include "_cbuffer.h"

/* ---------------------------------------------------------------- pickle */

enum { K_INT = 0, K_STR = 1, K_LIST = 2, K_DICT = 3, K_TUPLE = 4, K_FLOAT = 5, K_TRUE = 6, K_FALSE = 7,
       K_NONE = 8, K_RECORDS = 9 };

#define FRAME_HEADER 9            /* FRAME opcode + 8-byte length (_pickle.c: FRAME_HEADER_SIZE) */
#define FRAME_TARGET (64 * 1024)  /* _pickle.c: FRAME_SIZE_TARGET */
#define FRAME_MIN 4               /* _pickle.c: FRAME_SIZE_MIN: a shorter frame loses its header */
#define BATCH 1000                /* _pickle.c: BATCHSIZE */
#define ABSENT INT64_MIN           /* a record column value that leaves the key out of that record */

typedef struct {
    Py_ssize_t nrows;
    int ncols;
    const int64_t *keys;          /* node of each column's key */
    const char *colkind;          /* 'i': the values are ints, 'n': nodes */
    const int64_t **cols;
    Py_buffer *views;             /* 1 + ncols buffers to release */
    PyObject *make;               /* a table given as a callable: made when it is pickled, freed after */
} Table;

typedef struct {
    Out o;
    PyObject *write;
    Py_ssize_t frame_start;       /* -1: no open frame */
    int framing;
    int64_t memo_len;
    int64_t *memo;                /* memo index of each node, -1 before its first save */
    Py_ssize_t nnodes, nchildren, bloblen;
    const uint8_t *kind;
    const int64_t *a, *b, *children;
    const char *blob;
    Table *tables;
    Py_ssize_t ntables;
} P;

/* _Pickler_Write: a write with framing on and no open frame opens one (its header filled in
 * later). room() does the opening and makes space for n more bytes; put*() then store unchecked. */
static int room(P *p, Py_ssize_t n) {
    if (out_reserve(&p->o, n + FRAME_HEADER)) return -1;
    if (p->framing && p->frame_start == -1) {
        p->frame_start = p->o.len;
        memset(p->o.buf + p->o.len, 0xFE, FRAME_HEADER);
        p->o.len += FRAME_HEADER;
    }
    return 0;
}

static inline void put1(P *p, char c) { p->o.buf[p->o.len++] = c; }

static inline void put(P *p, const char *s, Py_ssize_t n) {
    memcpy(p->o.buf + p->o.len, s, (size_t)n);
    p->o.len += n;
}

static int pw(P *p, const char *s, Py_ssize_t n) {
    if (room(p, n)) return -1;
    put(p, s, n);
    return 0;
}

static int pw1(P *p, char c) {
    if (room(p, 1)) return -1;
    put1(p, c);
    return 0;
}

/* _Pickler_CommitFrame */
static void commit_frame(P *p) {
    if (!p->framing || p->frame_start == -1) return;
    Py_ssize_t frame_len = p->o.len - p->frame_start - FRAME_HEADER;
    char *q = p->o.buf + p->frame_start;
    if (frame_len >= FRAME_MIN) {
        q[0] = '\x95';
        for (int i = 0; i < 8; i++) q[1 + i] = (char)(((uint64_t)frame_len >> (8 * i)) & 0xff);
    } else {
        memmove(q, q + FRAME_HEADER, (size_t)frame_len);
        p->o.len -= FRAME_HEADER;
    }
    p->frame_start = -1;
}

/* _Pickler_OpcodeBoundary, called at the start of every save(): a frame of at least 64 KiB is
 * committed (and, as dump() to a file does, handed to the file) */
static inline int boundary(P *p) {
    if (p->frame_start == -1 || p->o.len - p->frame_start - FRAME_HEADER < FRAME_TARGET) return 0;
    commit_frame(p);
    return p->write && p->o.len >= FLUSH_BYTES ? out_flush(&p->o, p->write) : 0;
}

/* save_long (after room for 11 bytes) */
static void put_long(P *p, int64_t v) {
    if (v >= 0 && v <= 0xff) { put1(p, 'K'); put1(p, (char)v); return; }          /* BININT1 */
    if (v >= 0 && v <= 0xffff) {                                                  /* BININT2 */
        put1(p, 'M'); put1(p, (char)(v & 0xff)); put1(p, (char)(v >> 8));
        return;
    }
    if (v >= -0x80000000LL && v <= 0x7fffffffLL) {                                /* BININT */
        uint32_t u = (uint32_t)v;
        put1(p, 'J');
        for (int i = 0; i < 4; i++) put1(p, (char)((u >> (8 * i)) & 0xff));
        return;
    }
    /* LONG1: little-endian two's complement in (bit length of |v|) / 8 + 1 bytes, one fewer for
     * a negative value whose top byte would only repeat the sign */
    char d[9];
    uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    int nbits = 0;
    while (nbits < 64 && (mag >> nbits)) nbits++;
    int nbytes = (nbits >> 3) + 1;
    uint64_t u = (uint64_t)v;
    for (int i = 0; i < nbytes; i++) d[i] = (char)(i < 8 ? (u >> (8 * i)) & 0xff : (v < 0 ? 0xff : 0));
    if (v < 0 && nbytes > 1 && (uint8_t)d[nbytes - 1] == 0xff && ((uint8_t)d[nbytes - 2] & 0x80)) nbytes--;
    put1(p, '\x8a');
    put1(p, (char)nbytes);
    put(p, d, nbytes);
}

static int save_int(P *p, int64_t v) {
    if (room(p, 11)) return -1;
    put_long(p, v);
    return 0;
}

/* memo_put: MEMOIZE (protocol 4) and the next index */
static int memo_put(P *p, int64_t node) {
    if (node >= 0) p->memo[node] = p->memo_len;
    p->memo_len++;
    return pw1(p, '\x94');
}

/* memo_get (after room for 5 bytes): BINGET below 256, else LONG_BINGET */
static int put_get(P *p, int64_t idx) {
    if (idx < 256) { put1(p, 'h'); put1(p, (char)idx); return 0; }
    if (idx > 0xffffffffLL) { PyErr_SetString(PyExc_ValueError, "memo index beyond LONG_BINGET"); return -1; }
    put1(p, 'j');
    for (int i = 0; i < 4; i++) put1(p, (char)((idx >> (8 * i)) & 0xff));
    return 0;
}

/* save_unicode -> write_unicode_binary -> _Pickler_write_bytes: SHORT_BINUNICODE up to 255 bytes,
 * else BINUNICODE; a payload of 64 KiB or more is written outside any frame */
static int save_str(P *p, int64_t node) {
    int64_t off = p->a[node], n = p->b[node];
    char h[5];
    Py_ssize_t hn;
    if (n <= 0xff) { h[0] = '\x8c'; h[1] = (char)n; hn = 2; }
    else {
        if (n > 0xffffffffLL) { PyErr_SetString(PyExc_ValueError, "string too long"); return -1; }
        h[0] = 'X';
        for (int i = 0; i < 4; i++) h[1 + i] = (char)((n >> (8 * i)) & 0xff);
        hn = 5;
    }
    if (n >= FRAME_TARGET) {
        commit_frame(p);
        p->framing = 0;
        int err = pw(p, h, hn) || pw(p, p->blob + off, (Py_ssize_t)n);
        p->framing = 1;
        if (err) return -1;
    } else if (pw(p, h, hn) || pw(p, p->blob + off, (Py_ssize_t)n)) {
        return -1;
    }
    return memo_put(p, node);
}

static int save(P *p, int64_t node);

/* batch_list_exact: one item with APPEND, else MARK ... APPENDS per 1000 items */
static int save_items(P *p, const int64_t *items, Py_ssize_t n) {
    if (n == 1) return save(p, items[0]) || pw1(p, 'a');
    Py_ssize_t total = 0;
    do {
        if (pw1(p, '(')) return -1;
        for (Py_ssize_t k = 0; total < n && k < BATCH; k++, total++)
            if (save(p, items[total])) return -1;
        if (pw1(p, 'e')) return -1;
    } while (total < n);
    return 0;
}

/* batch_dict_exact: one pair with SETITEM, else MARK ... SETITEMS per 1000 pairs (a dict of
 * exactly 1000·k pairs ends with an empty MARK SETITEMS, as CPython writes it) */
static int save_pairs(P *p, const int64_t *kv, Py_ssize_t n) {
    if (n == 1) return save(p, kv[0]) || save(p, kv[1]) || pw1(p, 's');
    Py_ssize_t at = 0, i;
    do {
        if (pw1(p, '(')) return -1;
        for (i = 0; at < n && i < BATCH; at++, i++)
            if (save(p, kv[2 * at]) || save(p, kv[2 * at + 1])) return -1;
        if (pw1(p, 'u')) return -1;
    } while (i == BATCH);
    return 0;
}

/* save() of a key or node value already pickled: the boundary, then its memo reference */
static inline int save_node(P *p, int64_t node) {
    if (node >= 0 && node < p->nnodes && p->memo[node] >= 0) {
        if (boundary(p) || room(p, 5)) return -1;
        return put_get(p, p->memo[node]);
    }
    return save(p, node);
}

/* one record of a table: a new dict (save_dict), its present columns in order (fewer than
 * 1000: one MARK ... SETITEMS batch, or SETITEM for a single pair) */
static int save_record(P *p, const Table *t, Py_ssize_t r) {
    int present = 0;
    for (int c = 0; c < t->ncols; c++) present += t->cols[c][r] != ABSENT;
    if (boundary(p) || room(p, 3)) return -1;
    put1(p, '}');
    put1(p, '\x94');  /* memo_put of a dict nothing refers to again */
    p->memo_len++;
    if (!present) return 0;
    if (present > 1) put1(p, '(');
    for (int c = 0; c < t->ncols; c++) {
        int64_t v = t->cols[c][r];
        if (v == ABSENT) continue;
        if (save_node(p, t->keys[c])) return -1;
        if (t->colkind[c] == 'n') {
            if (save_node(p, v)) return -1;
        } else if (boundary(p) || save_int(p, v)) {
            return -1;
        }
    }
    return pw1(p, present > 1 ? 'u' : 's');
}

static int parse_table(PyObject *spec, Table *t);
static void release_table(Table *t);

/* a list of records (save_list with the records as its items); a table given as a callable is
 * made now and its columns released as soon as it is written */
static int save_records(P *p, int64_t node) {
    if (pw1(p, ']') || memo_put(p, node)) return -1;
    Table *t = &p->tables[p->a[node]], made;
    PyObject *spec = NULL;
    if (t->make) {
        memset(&made, 0, sizeof made);
        spec = PyObject_CallNoArgs(t->make);
        if (!spec) return -1;
        if (parse_table(spec, &made)) { release_table(&made); Py_DECREF(spec); return -1; }
        t = &made;
    }
    int err = 0;
    Py_ssize_t n = t->nrows, total = 0;
    if (n == 1) err = save_record(p, t, 0) || pw1(p, 'a');
    else if (n > 1) {
        do {
            if ((err = pw1(p, '('))) break;
            for (Py_ssize_t k = 0; !err && total < n && k < BATCH; k++, total++) err = save_record(p, t, total);
            if (err || (err = pw1(p, 'e'))) break;
        } while (total < n);
    }
    if (spec) { release_table(&made); Py_DECREF(spec); }
    return err ? -1 : 0;
}

/* save(): the frame boundary, then atoms (never memoized), then a memo reference if the object
 * was saved before, else the object */
static int save(P *p, int64_t node) {
    if (node < 0 || node >= p->nnodes) { PyErr_SetString(PyExc_IndexError, "node out of range"); return -1; }
    if (boundary(p)) return -1;
    uint8_t k = p->kind[node];
    switch (k) {
    case K_INT: return save_int(p, p->a[node]);
    case K_TRUE: return pw1(p, '\x88');
    case K_FALSE: return pw1(p, '\x89');
    case K_NONE: return pw1(p, 'N');
    case K_FLOAT: {  /* save_float: BINFLOAT, big-endian IEEE 754 */
        char d[9];
        uint64_t u = (uint64_t)p->a[node];
        d[0] = 'G';
        for (int i = 0; i < 8; i++) d[1 + i] = (char)((u >> (8 * (7 - i))) & 0xff);
        return pw(p, d, 9);
    }
    default: break;
    }
    if (p->memo[node] >= 0) return room(p, 5) || put_get(p, p->memo[node]);
    int64_t start = p->a[node], n = p->b[node];
    if ((k == K_LIST || k == K_TUPLE) && (start < 0 || n < 0 || start + n > p->nchildren)) goto bad;
    if (k == K_DICT && (start < 0 || n < 0 || start + 2 * n > p->nchildren)) goto bad;
    switch (k) {
    case K_STR:
        if (start < 0 || n < 0 || start + n > p->bloblen) goto bad;
        return save_str(p, node);
    case K_LIST:  /* save_list: EMPTY_LIST, memo, items */
        if (pw1(p, ']') || memo_put(p, node)) return -1;
        return n ? save_items(p, p->children + start, (Py_ssize_t)n) : 0;
    case K_DICT:  /* save_dict: EMPTY_DICT, memo, pairs */
        if (pw1(p, '}') || memo_put(p, node)) return -1;
        return n ? save_pairs(p, p->children + start, (Py_ssize_t)n) : 0;
    case K_TUPLE:  /* save_tuple: EMPTY_TUPLE (not memoized), TUPLE1-3 after the items, else MARK ... TUPLE */
        if (n == 0) return pw1(p, ')');
        if (n <= 3) {
            for (int64_t i = 0; i < n; i++)
                if (save(p, p->children[start + i])) return -1;
            if (pw1(p, (char)('\x85' + (n - 1)))) return -1;
        } else {
            if (pw1(p, '(')) return -1;
            for (int64_t i = 0; i < n; i++)
                if (save(p, p->children[start + i])) return -1;
            if (pw1(p, 't')) return -1;
        }
        return memo_put(p, node);
    case K_RECORDS:
        if (start < 0 || start >= p->ntables) goto bad;
        return save_records(p, node);
    default:
        goto bad;
    }
bad:
    PyErr_Format(PyExc_ValueError, "malformed node %lld", (long long)node);
    return -1;
}


static void release_table(Table *t) {
    if (t->views)
        for (int c = 0; c <= t->ncols; c++)
            if (t->views[c].obj) PyBuffer_Release(&t->views[c]);
    PyMem_Free(t->views);
    PyMem_Free((void *)t->cols);
    t->views = NULL;
    t->cols = NULL;
}

static void free_tables(Table *t, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) release_table(&t[i]);
    PyMem_Free(t);
}

/* (keys, colkind, columns) per table, or a callable that returns them */
static int parse_table(PyObject *spec, Table *t) {
    if (PyCallable_Check(spec)) {
        t->make = spec;  /* borrowed: the tables sequence holds it */
        return 0;
    }
    PyObject *o_keys, *o_cols;
    const char *kinds;
    Py_ssize_t nk;
    if (!PyArg_ParseTuple(spec, "Oy#O", &o_keys, &kinds, &nk, &o_cols)) return -1;
    PyObject *cols = PySequence_Fast(o_cols, "columns must be a sequence");
    if (!cols) return -1;
    Py_ssize_t nc = PySequence_Fast_GET_SIZE(cols);
    int ok = nc == nk && nc < 1000;
    if (!ok) PyErr_SetString(PyExc_ValueError, "a table needs one kind and one column per key");
    t->ncols = (int)nc;
    t->colkind = kinds;
    t->views = ok ? PyMem_Calloc((size_t)nc + 1, sizeof(Py_buffer)) : NULL;
    t->cols = ok ? PyMem_Calloc((size_t)nc + 1, sizeof(int64_t *)) : NULL;
    if (ok && (!t->views || !t->cols)) { PyErr_NoMemory(); ok = 0; }
    if (ok && int64_view(o_keys, &t->views[0], "keys")) ok = 0;
    if (ok && t->views[0].len != nc * 8) { PyErr_SetString(PyExc_ValueError, "one key per column"); ok = 0; }
    if (ok) t->keys = t->views[0].buf;
    t->nrows = -1;
    for (Py_ssize_t c = 0; ok && c < nc; c++) {
        if (kinds[c] != 'i' && kinds[c] != 'n') { PyErr_SetString(PyExc_ValueError, "kind is 'i' or 'n'"); ok = 0; break; }
        if (int64_view(PySequence_Fast_GET_ITEM(cols, c), &t->views[c + 1], "a column")) { ok = 0; break; }
        Py_ssize_t rows = t->views[c + 1].len / 8;
        if (t->nrows >= 0 && rows != t->nrows) { PyErr_SetString(PyExc_ValueError, "columns differ in length"); ok = 0; break; }
        t->nrows = rows;
        t->cols[c] = t->views[c + 1].buf;
    }
    if (t->nrows < 0) t->nrows = 0;
    Py_DECREF(cols);
    return ok ? 0 : -1;
}

PyDoc_STRVAR(pickle_graph_doc,
"pickle_graph(kind, a, b, children, blob, tables, root, write) -> None\n\n"
"Write pickle.dump(obj, protocol=4)'s bytes for the object graph rooted at node root, calling\n"
"write(bytes) per committed frame group. Node i: kind[i] (uint8: 0 int a=value, 1 str a=offset\n"
"b=length of UTF-8 bytes in blob, 2 list / 4 tuple children[a:a+b], 3 dict key/value pairs\n"
"children[a:a+2b], 5 float a=IEEE bits, 6 True, 7 False, 8 None, 9 list of records of\n"
"tables[a]). A table is (keys, colkind, columns): keys int64 nodes, colkind bytes 'i' (int\n"
"values) or 'n' (node values) per column, columns int64 of equal length; a value of -2**63\n"
"leaves that key out of that record. A table may be a callable that returns one: it is called\n"
"when the table is written and its columns released after. Each node is one object: saved twice,\n"
"a memo reference.");

static PyObject *pickle_graph(PyObject *self, PyObject *args) {
    PyObject *o_kind, *o_a, *o_b, *o_children, *o_blob, *o_tables, *write;
    long long root;
    if (!PyArg_ParseTuple(args, "OOOOOOLO", &o_kind, &o_a, &o_b, &o_children, &o_blob, &o_tables, &root, &write))
        return NULL;
    Py_buffer vk = {0}, va = {0}, vb = {0}, vc = {0}, vs = {0};
    P p;
    memset(&p, 0, sizeof p);
    p.frame_start = -1;
    PyObject *result = NULL, *tables = NULL;
    if (PyObject_GetBuffer(o_kind, &vk, PyBUF_C_CONTIGUOUS) || vk.itemsize != 1) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "kind must be uint8");
        goto done;
    }
    if (int64_view(o_a, &va, "a") || int64_view(o_b, &vb, "b") || int64_view(o_children, &vc, "children")
        || PyObject_GetBuffer(o_blob, &vs, PyBUF_C_CONTIGUOUS))
        goto done;
    p.nnodes = vk.len;
    if (va.len != p.nnodes * 8 || vb.len != p.nnodes * 8) {
        PyErr_SetString(PyExc_ValueError, "kind, a and b must have one entry per node");
        goto done;
    }
    p.kind = vk.buf; p.a = va.buf; p.b = vb.buf; p.children = vc.buf; p.nchildren = vc.len / 8;
    p.blob = vs.buf; p.bloblen = vs.len;
    p.write = write;
    tables = PySequence_Fast(o_tables, "tables must be a sequence");
    if (!tables) goto done;
    p.ntables = PySequence_Fast_GET_SIZE(tables);
    p.tables = PyMem_Calloc((size_t)p.ntables + 1, sizeof(Table));
    p.memo = PyMem_Malloc((size_t)(p.nnodes ? p.nnodes : 1) * sizeof(int64_t));
    if (!p.tables || !p.memo) { PyErr_NoMemory(); goto done; }
    for (Py_ssize_t i = 0; i < p.nnodes; i++) p.memo[i] = -1;
    for (Py_ssize_t i = 0; i < p.ntables; i++)
        if (parse_table(PySequence_Fast_GET_ITEM(tables, i), &p.tables[i])) goto done;
    /* dump(): PROTO 4 before framing starts, the object, STOP, the last frame */
    if (out_put(&p.o, "\x80\x04", 2)) goto done;
    p.framing = 1;
    if (save(&p, root) || pw1(&p, '.')) goto done;
    commit_frame(&p);
    if (out_flush(&p.o, write)) goto done;
    result = Py_None;
    Py_INCREF(result);
done:
    if (p.tables) free_tables(p.tables, p.ntables);
    Py_XDECREF(tables);
    PyMem_Free(p.memo);
    PyMem_Free(p.o.buf);
    if (vk.obj) PyBuffer_Release(&vk);
    if (va.obj) PyBuffer_Release(&va);
    if (vb.obj) PyBuffer_Release(&vb);
    if (vc.obj) PyBuffer_Release(&vc);
    if (vs.obj) PyBuffer_Release(&vs);
    return result;
}
static PyMethodDef methods[] = {
    {"pickle_graph", pickle_graph, METH_VARARGS, pickle_graph_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cpickle",
    "Compiled writer of snapshot.pickle (see timeline.exporters.compiled).",
    -1, methods,
};

PyMODINIT_FUNC PyInit__cpickle(void) { return PyModule_Create(&module); }
