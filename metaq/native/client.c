/* The text client's bytes: putb bodies encoded from payloads, a get reply's records scanned, their payloads
 * gathered as an Arrow column (metaq.protocol.putbatch, metaq.protocol.message, metaq.idempotence.wire). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "native.h"

/* A putb body from payloads (see metaq.protocol.putbatch.encode_sub_records_py): one sub-record per payload,
   `put <topic> <partition> <len> 0 <checksum> <seq>\r\n<payload>`, seq counting from seq0; one bytes object.
   With pid >= 0 a putb_idem body (metaq.idempotence.wire.encode_idem_sub_records_py): one put_idem frame per
   payload, `put_idem <topic> <partition> <len> 0 <checksum> <pid> <seq> 0\r\n<payload>`. */
static PyObject *encode_records(Py_buffer *topic, long long partition, PyObject *payloads, long long pid,
                                long long seq0) {
    PyObject *seq = PySequence_Fast(payloads, "payloads must be a sequence of bytes");
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t total = 0, line = 9 + topic->len + 5 * 21 + 2 + 12 + 2;
    for (Py_ssize_t k = 0; k < count; k++) {
        if (!PyBytes_CheckExact(items[k])) {
            Py_DECREF(seq);
            return PyErr_Format(PyExc_TypeError, "payload %zd is %.100s, not bytes", k, Py_TYPE(items[k])->tp_name);
        }
        total += PyBytes_GET_SIZE(items[k]) + line;
    }
    PyObject *result = PyBytes_FromStringAndSize(NULL, total);
    if (result == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    char *w = PyBytes_AS_STRING(result);
    for (Py_ssize_t k = 0; k < count; k++) {
        const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(items[k]);
        Py_ssize_t n = PyBytes_GET_SIZE(items[k]);
        if (pid >= 0) {
            memcpy(w, "put_idem ", 9);
            w += 9;
        } else {
            memcpy(w, "put ", 4);
            w += 4;
        }
        memcpy(w, topic->buf, topic->len);
        w += topic->len;
        *w++ = ' ';
        w += put_decimal(w, partition);
        *w++ = ' ';
        w += put_decimal(w, n);
        memcpy(w, " 0 ", 3);
        w += 3;
        w += put_decimal(w, (long long)(crc_of(data, n, 0) & 0x7FFFFFFFul));
        *w++ = ' ';
        if (pid >= 0) {
            w += put_decimal(w, pid);
            *w++ = ' ';
        }
        w += put_decimal(w, seq0 + k);
        if (pid >= 0) {
            memcpy(w, " 0", 2);
            w += 2;
        }
        *w++ = '\r';
        *w++ = '\n';
        memcpy(w, data, n);
        w += n;
    }
    Py_DECREF(seq);
    if (_PyBytes_Resize(&result, w - PyBytes_AS_STRING(result)) < 0)
        return NULL;
    return result;
}

PyObject *encode_sub_records(PyObject *self, PyObject *args) {
    Py_buffer topic;
    long long partition, seq0;
    PyObject *payloads;
    if (!PyArg_ParseTuple(args, "y*LOL", &topic, &partition, &payloads, &seq0))
        return NULL;
    PyObject *result = encode_records(&topic, partition, payloads, -1, seq0);
    PyBuffer_Release(&topic);
    return result;
}

/* A putb_idem body from payloads (see metaq.idempotence.wire.encode_idem_sub_records_py): one put_idem frame per
   payload, `put_idem <topic> <partition> <len> 0 <checksum> <pid> <seq> 0\r\n<payload>`, seq counting from seq0;
   one bytes object. Numbers are C long longs: OverflowError past 64 bits, or when seq0's count runs past it. */
PyObject *encode_idem_sub_records(PyObject *self, PyObject *args) {
    Py_buffer topic;
    long long partition, pid, seq0;
    PyObject *payloads;
    if (!PyArg_ParseTuple(args, "y*LOLL", &topic, &partition, &payloads, &pid, &seq0))
        return NULL;
    if (pid < 0) {
        PyBuffer_Release(&topic);
        return PyErr_Format(PyExc_ValueError, "producer id %lld < 0", pid);
    }
    Py_ssize_t count = PyObject_Length(payloads);
    if (count < 0) {
        PyBuffer_Release(&topic);
        return NULL;
    }
    if (count > 0 && seq0 > LLONG_MAX - (long long)(count - 1)) {
        PyBuffer_Release(&topic);
        return PyErr_Format(PyExc_OverflowError, "sequences %lld.. of %zd payloads run past 2**63-1", seq0, count);
    }
    PyObject *result = encode_records(&topic, partition, payloads, pid, seq0);
    PyBuffer_Release(&topic);
    return result;
}

/* A get reply's records in one pass (see metaq.protocol.message.scan_reply_py): for each whole record, six
   native int64s (msg_id, flag, attribute start, attribute end, payload start, payload end) packed in one bytes
   object; the walk stops at a cut-off final record, or at a fault named in the result's 4th item. */
PyObject *scan_reply(PyObject *self, PyObject *args) {
    Py_buffer b;
    int verify = 1;
    if (!PyArg_ParseTuple(args, "y*|p", &b, &verify))
        return NULL;
    const unsigned char *buf = (const unsigned char *)b.buf;
    Py_ssize_t size = b.len, pos = 0, count = 0;
    PyObject *index = PyBytes_FromStringAndSize(NULL, (size / 20 + 1) * 6 * (Py_ssize_t)sizeof(int64_t));
    if (index == NULL) {
        PyBuffer_Release(&b);
        return NULL;
    }
    int64_t *w = (int64_t *)PyBytes_AS_STRING(index);
    PyObject *fault = NULL;
    while (size - pos >= 20) {
        const unsigned char *h = buf + pos;
        int32_t msg_len = (int32_t)(((uint32_t)h[0] << 24) | ((uint32_t)h[1] << 16) | ((uint32_t)h[2] << 8) | h[3]);
        int32_t checksum = (int32_t)(((uint32_t)h[4] << 24) | ((uint32_t)h[5] << 16) | ((uint32_t)h[6] << 8) | h[7]);
        uint64_t id = 0;
        for (int k = 8; k < 16; k++)
            id = (id << 8) | h[k];
        int32_t flag = (int32_t)(((uint32_t)h[16] << 24) | ((uint32_t)h[17] << 16) | ((uint32_t)h[18] << 8) | h[19]);
        if (msg_len < 0) {
            fault = Py_BuildValue("(snl)", "length", pos, (long)msg_len);
            break;
        }
        Py_ssize_t start = pos + 20, end = start + msg_len;
        if (end > size)
            break;
        if (verify) {
            long long actual = (long long)(crc_of(buf + start, msg_len, 0) & 0x7FFFFFFFul);
            if (actual != checksum) {
                fault = Py_BuildValue("(snlL)", "checksum", pos, (long)checksum, actual);
                break;
            }
        }
        int64_t attr_start = -1, attr_end = -1, payload_start = start;
        if (flag & 1) {
            if (msg_len < 4) {
                attr_start = attr_end = -2;
            } else {
                int32_t attr_len = (int32_t)(((uint32_t)buf[start] << 24) | ((uint32_t)buf[start + 1] << 16) |
                                             ((uint32_t)buf[start + 2] << 8) | buf[start + 3]);
                if (attr_len < 0 || (Py_ssize_t)attr_len + 4 > msg_len) {
                    attr_start = attr_end = -2;
                } else {
                    attr_start = start + 4;
                    attr_end = payload_start = start + 4 + attr_len;
                }
            }
        }
        w[0] = (int64_t)id;
        w[1] = flag;
        w[2] = attr_start;
        w[3] = attr_end;
        w[4] = payload_start;
        w[5] = end;
        w += 6;
        count++;
        pos = end;
    }
    PyBuffer_Release(&b);
    if (fault == NULL && PyErr_Occurred()) {
        Py_DECREF(index);
        return NULL;
    }
    if (_PyBytes_Resize(&index, count * 6 * (Py_ssize_t)sizeof(int64_t)) < 0) {
        Py_XDECREF(fault);
        return NULL;
    }
    if (fault == NULL) {
        fault = Py_None;
        Py_INCREF(fault);
    }
    return Py_BuildValue("(NnnN)", index, count, pos, fault);
}

/* The payloads a scan_reply index names, gathered for an Arrow binary column (see
   metaq.protocol.message.gather_payloads_py): (offsets, data), offsets ``count + 1`` native int32s starting at
   ``base`` (the payloads' running ends), data the payloads back to back. ValueError for an index that does not fit
   the buffer or a column past 2 GiB. */
PyObject *gather_payloads(PyObject *self, PyObject *args) {
    Py_buffer b, ix;
    Py_ssize_t count;
    long long base = 0;
    if (!PyArg_ParseTuple(args, "y*y*n|L", &b, &ix, &count, &base))
        return NULL;
    PyObject *offsets = NULL, *data = NULL;
    const int64_t *q = (const int64_t *)ix.buf;
    Py_ssize_t total = 0;
    if (count < 0 || ix.len < count * 6 * (Py_ssize_t)sizeof(int64_t)) {
        PyErr_SetString(PyExc_ValueError, "gather_payloads: the index holds fewer records than count");
        goto done;
    }
    for (Py_ssize_t k = 0; k < count; k++) {
        int64_t s = q[6 * k + 4], e = q[6 * k + 5];
        if (s < 0 || e < s || e > b.len) {
            PyErr_Format(PyExc_ValueError, "gather_payloads: record %zd's payload %lld..%lld is outside the %zd-byte "
                         "reply", k, (long long)s, (long long)e, b.len);
            goto done;
        }
        total += (Py_ssize_t)(e - s);
    }
    if (base < 0 || base + (long long)total > INT32_MAX_V) {
        PyErr_SetString(PyExc_ValueError, "gather_payloads: the column would pass 2 GiB (int32 offsets)");
        goto done;
    }
    offsets = PyBytes_FromStringAndSize(NULL, (count + 1) * (Py_ssize_t)sizeof(int32_t));
    data = PyBytes_FromStringAndSize(NULL, total);
    if (offsets == NULL || data == NULL)
        goto done;
    int32_t *o = (int32_t *)PyBytes_AS_STRING(offsets);
    char *d = PyBytes_AS_STRING(data);
    const char *src = (const char *)b.buf;
    long long at = base;
    o[0] = (int32_t)at;
    for (Py_ssize_t k = 0; k < count; k++) {
        int64_t s = q[6 * k + 4], e = q[6 * k + 5];
        memcpy(d, src + s, (size_t)(e - s));
        d += e - s;
        at += e - s;
        o[k + 1] = (int32_t)at;
    }
done:
    PyBuffer_Release(&b);
    PyBuffer_Release(&ix);
    if (PyErr_Occurred()) {
        Py_XDECREF(offsets);
        Py_XDECREF(data);
        return NULL;
    }
    return Py_BuildValue("(NN)", offsets, data);
}
