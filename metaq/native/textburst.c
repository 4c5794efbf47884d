/* The text protocol's put burst: `put` frames scanned from a read buffer, and their result 200 replies written
 * (metaq.protocol.burst's scan_puts_py and encode_put_acks_py in C). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#define REPLY_MAX 96 /* "result 200 <len> <opaque>\r\n<msgId> <partition> <offset>": at most 89 bytes */

#include "native.h"

/* 1..10 decimal digits at *p (before lim) followed by `stop`; advances *p past `stop`. */
static int read_digits(const unsigned char **p, const unsigned char *lim, unsigned char stop, long long *out) {
    const unsigned char *s = *p;
    long long v = 0;
    int n = 0;
    while (s < lim && *s >= '0' && *s <= '9') {
        if (++n > 10)
            return 0;
        v = v * 10 + (*s - '0');
        s++;
    }
    if (n == 0 || s >= lim || *s != stop)
        return 0;
    *p = s + 1;
    *out = v;
    return 1;
}

/* One frame header at q; fills the fields and returns the body start, or NULL if the frame is not taken. */
static const unsigned char *parse_head(const unsigned char *q, const unsigned char *lim, const unsigned char **topic,
                                       Py_ssize_t *tlen, long long *partition, long long *length, long long *flag,
                                       long long *checksum, long long *opaque) {
    const unsigned char *s = q;
    if (lim - s < 4 || memcmp(s, "put ", 4) != 0)
        return NULL;
    s += 4;
    *topic = s;
    while (s < lim && *s >= '!' && *s <= '~')
        s++;
    *tlen = s - *topic;
    if (*tlen == 0 || s >= lim || *s != ' ')
        return NULL;
    s++;
    if (!read_digits(&s, lim, ' ', partition) || !read_digits(&s, lim, ' ', length) ||
        !read_digits(&s, lim, ' ', flag))
        return NULL;
    /* 7 tokens: <checksum> <opaque>; 6 tokens (old clients): <opaque> alone, nothing to verify. */
    const unsigned char *after_flag = s;
    if (lim - s >= 3 && s[0] == '-' && s[1] == '1' && s[2] == ' ') {
        *checksum = -1;
        s += 3;
    } else if (!read_digits(&s, lim, ' ', checksum)) {
        s = after_flag;
        *checksum = -1;
    }
    int negative = 0;
    if (s < lim && *s == '-') {
        negative = 1;
        s++;
    }
    if (!read_digits(&s, lim, '\r', opaque) || s >= lim || *s != '\n')
        return NULL;
    if (negative)
        *opaque = -*opaque;
    return s + 1;
}

/* The index unit's tag hash of data with an attribute block (burst.py _attribute_tag: the CRC of its tags, the
   attribute before its first \x02), or -1 when the block is malformed, holds the idempotent producer's reserved
   properties or a @SYSFLAG (a compressed body, left to the general path, which decompresses it). */
static long attribute_tag(const unsigned char *data, Py_ssize_t n) {
    if (n < 4)
        return -1;
    int32_t alen = (int32_t)(((uint32_t)data[0] << 24) | ((uint32_t)data[1] << 16) | ((uint32_t)data[2] << 8) |
                             data[3]);
    if (alen < 0 || alen > n - 4)
        return -1;
    if (alen >= 10 && (memmem(data + 4, (size_t)alen, "\x02METAQ_PID\x01", 11) != NULL ||
                       memmem(data + 4, (size_t)alen, "\x02METAQ_SEQ\x01", 11) != NULL ||
                       memmem(data + 4, (size_t)alen, "\x02@SYSFLAG\x01", 10) != NULL))
        return -1;
    const unsigned char *sep = memchr(data + 4, 2, (size_t)alen); /* the tags end at the first \x02 (tags.py) */
    return (long)(crc_of(data + 4, sep != NULL ? (Py_ssize_t)(sep - (data + 4)) : alen, 0) & 0x7FFFFFFFul);
}

/* The arguments both burst scanners take, ``(buf, pos, end, max_body, max_line[, max_frames])``: the buffer
   held in *b (released by the caller), the positions checked; -1 with a Python error set otherwise. */
int metaq_scan_args(PyObject *args, Py_buffer *b, Py_ssize_t *pos, Py_ssize_t *end, Py_ssize_t *max_body,
                    Py_ssize_t *max_line, Py_ssize_t *max_frames) {
    PyObject *obj;
    *max_frames = PY_SSIZE_T_MAX;
    if (!PyArg_ParseTuple(args, "Onnnn|n", &obj, pos, end, max_body, max_line, max_frames))
        return -1;
    if (PyObject_GetBuffer(obj, b, PyBUF_SIMPLE) < 0)
        return -1;
    if (*pos < 0 || *pos > *end || *end > b->len) {
        PyErr_Format(PyExc_ValueError, "need 0 <= pos <= end <= %zd", b->len);
        PyBuffer_Release(b);
        return -1;
    }
    return 0;
}

PyObject *scan_puts(PyObject *self, PyObject *args) {
    Py_ssize_t pos, end, max_body, max_line, max_frames;
    Py_buffer b;
    if (metaq_scan_args(args, &b, &pos, &end, &max_body, &max_line, &max_frames) < 0)
        return NULL;
    PyObject *frames = PyList_New(0);
    PyObject *topic_obj = NULL; /* borrowed from the last frame appended */
    const unsigned char *base = (const unsigned char *)b.buf, *lim = base + end;
    if (frames == NULL)
        goto fail;
    while (PyList_GET_SIZE(frames) < max_frames) {
        const unsigned char *q = base + pos, *topic;
        Py_ssize_t tlen;
        long long partition, length, flag, checksum, opaque;
        const unsigned char *body = parse_head(q, lim, &topic, &tlen, &partition, &length, &flag, &checksum, &opaque);
        if (body == NULL)
            break;
        Py_ssize_t head_end = body - base;
        if (head_end - pos - 2 > max_line || partition > INT32_MAX_V || flag > INT32_MAX_V ||
            checksum > INT32_MAX_V || opaque < -INT32_MAX_V - 1 || opaque > INT32_MAX_V || length > max_body ||
            length > end - head_end)
            break;
        unsigned long crc = crc_of(body, (Py_ssize_t)length, 0);
        if (checksum != -1 && checksum != (long long)(crc & 0x7FFFFFFFul))
            break;
        long tag = (flag & 1) ? attribute_tag(body, (Py_ssize_t)length) : 0;
        if (tag < 0)
            break;
        if (topic_obj == NULL || PyBytes_GET_SIZE(topic_obj) != tlen ||
            memcmp(PyBytes_AS_STRING(topic_obj), topic, tlen) != 0) {
            topic_obj = PyBytes_FromStringAndSize((const char *)topic, tlen);
            if (topic_obj == NULL)
                goto fail;
        } else {
            Py_INCREF(topic_obj);
        }
        int size = (flag & 1) ? 8 : 7;
        PyObject *t = PyTuple_New(size);
        if (t == NULL) {
            Py_DECREF(topic_obj);
            goto fail;
        }
        if (size == 8)
            PyTuple_SET_ITEM(t, 7, PyLong_FromLong(tag));
        PyTuple_SET_ITEM(t, 0, topic_obj); /* steals the reference taken above */
        PyTuple_SET_ITEM(t, 1, PyLong_FromLongLong(partition));
        PyTuple_SET_ITEM(t, 2, PyLong_FromLongLong(flag));
        PyTuple_SET_ITEM(t, 3, PyLong_FromLongLong(opaque));
        PyTuple_SET_ITEM(t, 4, PyLong_FromSsize_t(head_end));
        PyTuple_SET_ITEM(t, 5, PyLong_FromLongLong(length));
        PyTuple_SET_ITEM(t, 6, PyLong_FromUnsignedLong(crc));
        for (int k = 1; k < size; k++) {
            if (PyTuple_GET_ITEM(t, k) == NULL) {
                Py_DECREF(t);
                goto fail;
            }
        }
        int appended = PyList_Append(frames, t);
        Py_DECREF(t);
        if (appended < 0)
            goto fail;
        pos = head_end + (Py_ssize_t)length;
    }
    PyBuffer_Release(&b);
    return Py_BuildValue("(Nn)", frames, pos);
fail:
    Py_XDECREF(frames);
    PyBuffer_Release(&b);
    return NULL;
}

/* The result 200 replies of a run of stored frames (see encode_put_acks_py): one pass, one bytes object. */
PyObject *encode_put_acks(PyObject *self, PyObject *args) {
    PyObject *frames;
    Py_ssize_t start, count;
    long long first_id, first_offset;
    long partition;
    if (!PyArg_ParseTuple(args, "OnnLlL", &frames, &start, &count, &first_id, &partition, &first_offset))
        return NULL;
    if (!PyList_Check(frames))
        return PyErr_Format(PyExc_TypeError, "frames must be a list");
    if (count < 0)
        count = 0;
    if (start < 0 || start + count > PyList_GET_SIZE(frames))
        return PyErr_Format(PyExc_IndexError, "frames %zd..%zd of %zd", start, start + count,
                            PyList_GET_SIZE(frames));
    PyObject *result = PyBytes_FromStringAndSize(NULL, count * REPLY_MAX);
    if (result == NULL)
        return NULL;
    char *replies = PyBytes_AS_STRING(result), *w = replies;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *t = PyList_GET_ITEM(frames, start + k);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) < 7) {
            Py_DECREF(result);
            return PyErr_Format(PyExc_TypeError, "a frame is a tuple from scan_puts or scan_idem_burst");
        }
        long long opaque = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 3));
        if (opaque == -1 && PyErr_Occurred()) {
            Py_DECREF(result);
            return NULL;
        }
        if (opaque < -INT32_MAX_V - 1 || opaque > INT32_MAX_V) { /* keeps a reply within REPLY_MAX */
            Py_DECREF(result);
            return PyErr_Format(PyExc_ValueError, "opaque %lld is not a 32-bit int", opaque);
        }
        char body[64];
        int blen = put_decimal(body, first_id + k);
        body[blen++] = ' ';
        blen += put_decimal(body + blen, partition);
        body[blen++] = ' ';
        blen += put_decimal(body + blen, first_offset + k);
        memcpy(w, "result 200 ", 11);
        w += 11;
        w += put_decimal(w, blen);
        *w++ = ' ';
        w += put_decimal(w, opaque);
        *w++ = '\r';
        *w++ = '\n';
        memcpy(w, body, (size_t)blen);
        w += blen;
    }
    if (_PyBytes_Resize(&result, w - replies) < 0) /* frees it on failure */
        return NULL;
    return result;
}

int metaq_decimal(char *p, long long v) {
    return put_decimal(p, v);
}
