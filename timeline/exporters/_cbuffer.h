/* What both compiled writers share: a growing output buffer handed to the caller's write(), and
 * int64 column views. Included by _cpickle.c and _ctext.c (each extension gets its own copy of
 * these static functions). */
#ifndef TIMELINE_CBUFFER_H
#define TIMELINE_CBUFFER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define FLUSH_BYTES (1 << 20)  /* hand the caller about this much at a time */

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
} Out;

static int out_reserve(Out *o, Py_ssize_t extra) {
    if (o->len + extra <= o->cap) return 0;
    Py_ssize_t c = o->cap ? o->cap : 1 << 16;
    while (c < o->len + extra) c *= 2;
    char *p = PyMem_Realloc(o->buf, (size_t)c);
    if (!p) { PyErr_NoMemory(); return -1; }
    o->buf = p;
    o->cap = c;
    return 0;
}

static int out_put(Out *o, const char *s, Py_ssize_t n) {
    if (out_reserve(o, n)) return -1;
    memcpy(o->buf + o->len, s, (size_t)n);
    o->len += n;
    return 0;
}

/* the caller's write(bytes), then the buffer is reused */
static int out_flush(Out *o, PyObject *write) {
    if (!o->len) return 0;
    PyObject *chunk = PyBytes_FromStringAndSize(o->buf, o->len);
    if (!chunk) return -1;
    PyObject *r = PyObject_CallOneArg(write, chunk);
    Py_DECREF(chunk);
    if (!r) return -1;
    Py_DECREF(r);
    o->len = 0;
    return 0;
}

static int int64_view(PyObject *obj, Py_buffer *v, const char *what) {
    if (PyObject_GetBuffer(obj, v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT)) return -1;
    if (v->itemsize != 8 || (v->format && strchr("qlLQ", v->format[0]) == NULL)) {
        PyErr_Format(PyExc_ValueError, "%s must be an int64 array", what);
        PyBuffer_Release(v);
        return -1;
    }
    return 0;
}

#endif
