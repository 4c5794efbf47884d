/*
 * metaq.native._bytes.encode_fields: the twin of metaq.rmq5.messagebytes.encode_fields_py (see its docstring;
 * tests/rmq5/test_messagebytes.py holds the two equal).
 *
 * fields: a tuple or list of field numbers and values, one after the other. Each value is written by its type:
 * an int as a varint (wire type 0; a negative one as its 64-bit two's complement), bytes or another buffer as
 * length-delimited bytes, a str as its UTF-8 (length-delimited), a tuple or list as a nested message of the same
 * form (length-delimited); None is left out. Sizes are counted first, then the bytes written once into the result.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "native.h"

/* Nesting deeper than this is refused (a served message is three deep). */
#define MAX_DEPTH 16

static Py_ssize_t varint_size(uint64_t v) {
    Py_ssize_t n = 1;
    while (v > 0x7F) {
        v >>= 7;
        n++;
    }
    return n;
}

static unsigned char *put_varint(unsigned char *p, uint64_t v) {
    while (v > 0x7F) {
        *p++ = (unsigned char)((v & 0x7F) | 0x80);
        v >>= 7;
    }
    *p++ = (unsigned char)v;
    return p;
}

/* An int's 64-bit value as protobuf writes it; -1 with an error set when it fits neither int64 nor uint64. */
static int int_value(PyObject *o, uint64_t *out) {
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred())
            return -1;
        *out = (uint64_t)u;
        return 0;
    }
    if (overflow < 0) {
        PyErr_SetString(PyExc_OverflowError, "a field's int is below -2**63");
        return -1;
    }
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (uint64_t)v;
    return 0;
}

static Py_ssize_t fields_size(PyObject *fields, int depth);

/* A value's own bytes (a nested message's, a string's): its size, or -1 with an error set. */
static Py_ssize_t payload_size(PyObject *value, int depth) {
    if (PyBytes_Check(value))
        return PyBytes_GET_SIZE(value);
    if (PyUnicode_Check(value)) {
        Py_ssize_t n;
        if (PyUnicode_AsUTF8AndSize(value, &n) == NULL)
            return -1;
        return n;
    }
    if (PyTuple_Check(value) || PyList_Check(value))
        return fields_size(value, depth + 1);
    if (PyObject_CheckBuffer(value)) {
        Py_buffer b;
        if (PyObject_GetBuffer(value, &b, PyBUF_SIMPLE) < 0)
            return -1;
        Py_ssize_t n = b.len;
        PyBuffer_Release(&b);
        return n;
    }
    PyErr_Format(PyExc_TypeError, "a field's value may be an int, bytes, str, a tuple or list, or None, not %.100s",
                 Py_TYPE(value)->tp_name);
    return -1;
}

static Py_ssize_t fields_size(PyObject *fields, int depth) {
    if (depth > MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "fields nested too deep");
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fields), total = 0;
    PyObject **items = PySequence_Fast_ITEMS(fields);
    if (n % 2) {
        PyErr_SetString(PyExc_ValueError, "fields: field numbers and values, one after the other");
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i += 2) {
        PyObject *value = items[i + 1];
        if (value == Py_None)
            continue;
        if (!PyLong_CheckExact(items[i])) { /* an int only: no __index__ runs between the two passes */
            PyErr_SetString(PyExc_TypeError, "a field number is an int");
            return -1;
        }
        long field = PyLong_AsLong(items[i]);
        if (field == -1 && PyErr_Occurred())
            return -1;
        if (field < 1 || field > 536870911) {
            PyErr_Format(PyExc_ValueError, "field number %ld: 1..2**29-1", field);
            return -1;
        }
        total += varint_size((uint64_t)field << 3);
        if (PyLong_Check(value)) {
            uint64_t v;
            if (int_value(value, &v) < 0)
                return -1;
            total += varint_size(v);
        } else {
            Py_ssize_t len = payload_size(value, depth);
            if (len < 0)
                return -1;
            total += varint_size((uint64_t)len) + len;
        }
    }
    return total;
}

/* Writes fields (already sized by fields_size, so no error is left to meet but a buffer's) at p; NULL on error. */
static unsigned char *put_fields(unsigned char *p, PyObject *fields, int depth) {
    Py_ssize_t n = PySequence_Fast_GET_SIZE(fields);
    PyObject **items = PySequence_Fast_ITEMS(fields);
    for (Py_ssize_t i = 0; i < n; i += 2) {
        PyObject *value = items[i + 1];
        if (value == Py_None)
            continue;
        uint64_t field = (uint64_t)PyLong_AsLong(items[i]);
        if (PyLong_Check(value)) {
            uint64_t v;
            if (int_value(value, &v) < 0)
                return NULL;
            p = put_varint(p, field << 3);
            p = put_varint(p, v);
            continue;
        }
        p = put_varint(p, field << 3 | 2);
        if (PyBytes_Check(value)) {
            Py_ssize_t len = PyBytes_GET_SIZE(value);
            p = put_varint(p, (uint64_t)len);
            memcpy(p, PyBytes_AS_STRING(value), (size_t)len);
            p += len;
        } else if (PyUnicode_Check(value)) {
            Py_ssize_t len;
            const char *s = PyUnicode_AsUTF8AndSize(value, &len);
            if (s == NULL)
                return NULL;
            p = put_varint(p, (uint64_t)len);
            memcpy(p, s, (size_t)len);
            p += len;
        } else if (PyTuple_Check(value) || PyList_Check(value)) {
            Py_ssize_t len = fields_size(value, depth + 1);
            if (len < 0)
                return NULL;
            p = put_varint(p, (uint64_t)len);
            p = put_fields(p, value, depth + 1);
            if (p == NULL)
                return NULL;
        } else {
            Py_buffer b;
            if (PyObject_GetBuffer(value, &b, PyBUF_SIMPLE) < 0)
                return NULL;
            p = put_varint(p, (uint64_t)b.len);
            memcpy(p, b.buf, (size_t)b.len);
            p += b.len;
            PyBuffer_Release(&b);
        }
    }
    return p;
}

PyObject *encode_fields(PyObject *self, PyObject *args) {
    PyObject *fields;
    if (!PyArg_ParseTuple(args, "O:encode_fields", &fields))
        return NULL;
    if (!PyTuple_Check(fields) && !PyList_Check(fields)) {
        PyErr_SetString(PyExc_TypeError, "encode_fields takes a tuple or list");
        return NULL;
    }
    Py_ssize_t size = fields_size(fields, 0);
    if (size < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, size);
    if (out == NULL)
        return NULL;
    unsigned char *start = (unsigned char *)PyBytes_AS_STRING(out);
    unsigned char *end = put_fields(start, fields, 0);
    if (end == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    if (end - start != size) { /* a buffer or list that changed size between the two passes */
        Py_DECREF(out);
        PyErr_SetString(PyExc_RuntimeError, "encode_fields: a value changed while it was written");
        return NULL;
    }
    return out;
}

/* grpc_frames(items): the gRPC messages items (bytes-like, each under 4 GiB) as length-prefixed, uncompressed
 * messages one after another: b"".join(map(wire.frame, items)) (metaq/rmq5/wire.py, frames_py its twin) in one
 * copy, without a prefix and a concatenation a message. */
PyObject *grpc_frames(PyObject *self, PyObject *items) {
    PyObject *seq = PySequence_Fast(items, "grpc_frames takes a sequence of bytes");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0;
    Py_buffer *views = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    PyObject *out = NULL;
    Py_ssize_t got = 0;
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_ITEMS(seq)[got], &views[got], PyBUF_SIMPLE) < 0)
            goto done;
        if ((unsigned long long)views[got].len > 0xFFFFFFFFULL) {
            got++;
            PyErr_SetString(PyExc_OverflowError, "grpc_frames: a message of 4 GiB or more");
            goto done;
        }
        total += 5 + views[got].len;
    }
    out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        goto done;
    unsigned char *p = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t len = (uint32_t)views[i].len;
        p[0] = 0;
        p[1] = (unsigned char)(len >> 24);
        p[2] = (unsigned char)(len >> 16);
        p[3] = (unsigned char)(len >> 8);
        p[4] = (unsigned char)len;
        memcpy(p + 5, views[i].buf, (size_t)len);
        p += 5 + len;
    }
done:
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_DECREF(seq);
    return out;
}
