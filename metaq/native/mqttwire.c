/*
 * The MQTT wire's per-packet steps in C (metaq.native._bytes; declared in native.h), each the exact twin of a
 * pure-Python function of metaq/mqtt/wire.py that runs when the helper was not built (tests/mqtt/test_wire_c.py
 * holds them equal):
 *
 *   mqtt_split(buf, pos, max_packet, version, names)                    == metaq.mqtt.wire.split_py
 *   mqtt_publish_bytes(first, topic, packet_id, props, payload)         == metaq.mqtt.wire.publish_bytes_py
 *   mqtt_pubacks(packet_ids)                                            == metaq.mqtt.wire.encode_pubacks_py
 *
 * See those docstrings for what they do.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "native.h"

/* split_py's answers when it returns no packet (its second field; the third is the packet's size for TOO_LARGE). */
#define SPLIT_NEED_DATA (-1)
#define SPLIT_TOO_LONG (-2)
#define SPLIT_NOT_SHORTEST (-3)
#define SPLIT_TOO_LARGE (-4)

/* The fields (PUBLISH, topic, payload, qos, retain, dup, packet id) of a PUBLISH body buf[start:end] without
   properties whose topic name is a key of ``names`` (wire._known_names: names already checked, by their bytes), as
   wire._known_publish decodes it; Py_None when it is not such a one (NULL on an error). */
static PyObject *wire_known_publish(const unsigned char *buf, Py_ssize_t start, Py_ssize_t end, int flags, int v5,
                                    PyObject *names) {
    int qos = (flags >> 1) & 0x03;
    if (qos == 3 || ((flags & 0x08) && !qos) || end - start < 2)
        Py_RETURN_NONE;
    Py_ssize_t at = start + 2 + (((Py_ssize_t)buf[start] << 8) | buf[start + 1]);
    if (at > end)
        Py_RETURN_NONE;
    PyObject *raw = PyBytes_FromStringAndSize((const char *)buf + start + 2, at - start - 2);
    if (raw == NULL)
        return NULL;
    PyObject *topic = PyDict_GetItemWithError(names, raw); /* borrowed */
    Py_DECREF(raw);
    if (topic == NULL)
        return PyErr_Occurred() ? NULL : Py_NewRef(Py_None);
    long packet_id = 0;
    if (qos) {
        if (at + 2 > end)
            Py_RETURN_NONE;
        packet_id = ((long)buf[at] << 8) | buf[at + 1];
        if (!packet_id)
            Py_RETURN_NONE;
        at += 2;
    }
    if (v5) {
        if (at >= end || buf[at])
            Py_RETURN_NONE; /* properties (or none at all): the general decoder */
        at += 1;
    }
    Py_INCREF(topic); /* held before anything is made: the tuple takes this reference */
    PyObject *fields[7] = {PyLong_FromLong(3), topic, PyBytes_FromStringAndSize((const char *)buf + at, end - at),
                           PyLong_FromLong(qos), Py_NewRef((flags & 0x01) ? Py_True : Py_False),
                           Py_NewRef((flags & 0x08) ? Py_True : Py_False),
                           qos ? PyLong_FromLong(packet_id) : Py_NewRef(Py_None)}; /* 3: PUBLISH */
    return metaq_tuple_of(7, fields);
}

/* The reason codes a PUBACK may carry (wire._PUB_ACK_CODES). */
static int wire_puback_code(int code) {
    return code == 0x00 || code == 0x10 || code == 0x80 || code == 0x83 || code == 0x87 || code == 0x90 ||
           code == 0x91 || code == 0x97 || code == 0x99;
}

/* The fields (PUBACK, packet id, reason code) of a PUBACK body buf[start:end] with a non-zero packet id and no
   properties, as wire._plain_puback decodes it; Py_None for any other (NULL on an error). */
static PyObject *wire_plain_puback(const unsigned char *buf, Py_ssize_t start, Py_ssize_t end, int v5) {
    Py_ssize_t n = end - start;
    int code = 0;
    if (n < 2 || (!v5 && n != 2) || n > 4)
        Py_RETURN_NONE;
    long packet_id = ((long)buf[start] << 8) | buf[start + 1];
    if (!packet_id)
        Py_RETURN_NONE;
    if (n >= 3) {
        code = buf[start + 2];
        if (!wire_puback_code(code) || (n == 4 && buf[start + 3]))
            Py_RETURN_NONE;
    }
    PyObject *fields[3] = {PyLong_FromLong(4), PyLong_FromLong(packet_id), PyLong_FromLong(code)}; /* PUBACK */
    return metaq_tuple_of(3, fields);
}

static PyObject *wire_split_answer(PyObject *packet, Py_ssize_t a, long long b) {
    return Py_BuildValue("(Nnl)", packet, a, (long)b);
}

/* mqtt_split(buf, pos, max_packet, version, names) -> (fields, a, b): wire.split_py in C. */
PyObject *mqtt_split(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "mqtt_split takes 5 arguments");
        return NULL;
    }
    PyObject *names = args[4];
    if (!PyDict_Check(names)) {
        PyErr_SetString(PyExc_TypeError, "mqtt_split: names must be a dict");
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    if (pos == -1 && PyErr_Occurred())
        return NULL;
    long long max_packet = PyLong_AsLongLong(args[2]);
    if (max_packet == -1 && PyErr_Occurred())
        return NULL;
    long version = args[3] == Py_None ? 0 : PyLong_AsLong(args[3]);
    if (version == -1 && PyErr_Occurred())
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(args[0], &b, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *answer = NULL;
    const unsigned char *buf = (const unsigned char *)b.buf;
    if (pos < 0 || pos > b.len) {
        PyErr_Format(PyExc_ValueError, "mqtt_split: pos %zd is outside the %zd-byte buffer", pos, b.len);
        goto done;
    }
    Py_ssize_t available = b.len - pos;
    if (available < 2) {
        answer = wire_split_answer(Py_NewRef(Py_None), SPLIT_NEED_DATA, 0);
        goto done;
    }
    long long length = 0;
    int shift = 0, i = 1;
    for (;;) {
        if (i >= available) {
            answer = wire_split_answer(Py_NewRef(Py_None), SPLIT_NEED_DATA, 0);
            goto done;
        }
        unsigned char c = buf[pos + i];
        length |= (long long)(c & 0x7F) << shift;
        if (!(c & 0x80)) {
            if (i > 1 && !c) {
                answer = wire_split_answer(Py_NewRef(Py_None), SPLIT_NOT_SHORTEST, 0);
                goto done;
            }
            break;
        }
        if (i == 4) {
            answer = wire_split_answer(Py_NewRef(Py_None), SPLIT_TOO_LONG, 0);
            goto done;
        }
        shift += 7;
        i++;
    }
    long long total = 1 + i + length;
    if (total > max_packet) {
        answer = wire_split_answer(Py_NewRef(Py_None), SPLIT_TOO_LARGE, total);
        goto done;
    }
    if ((long long)available < total) {
        answer = wire_split_answer(Py_NewRef(Py_None), SPLIT_NEED_DATA, 0);
        goto done;
    }
    Py_ssize_t start = pos + 1 + i, end = pos + (Py_ssize_t)total;
    unsigned char first = buf[pos];
    PyObject *packet = Py_None;
    if (version == 4 || version == 5) {
        if (first >> 4 == 3)
            packet = wire_known_publish(buf, start, end, first & 0x0F, version == 5, names);
        else if (first == 0x40)
            packet = wire_plain_puback(buf, start, end, version == 5);
        else
            Py_INCREF(packet);
    } else {
        Py_INCREF(packet);
    }
    if (packet == NULL)
        goto done;
    answer = wire_split_answer(packet, packet == Py_None ? start : end, end);
done:
    PyBuffer_Release(&b);
    return answer;
}

/* The variable byte integer of v (0..268,435,455) at out; its length. */
static int wire_varint(unsigned char *out, Py_ssize_t v) {
    int n = 0;
    do {
        unsigned char c = v & 0x7F;
        v >>= 7;
        out[n++] = v ? (c | 0x80) : c;
    } while (v);
    return n;
}

/* mqtt_publish_bytes(first, topic, packet_id, props, payload) -> bytes: wire.publish_bytes_py in C. */
PyObject *mqtt_publish_bytes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long first_l, packet_id;
    if (!metaq_nargs(nargs, 5) || !metaq_arg_long(args[0], &first_l) || !metaq_arg_type(2, args[1], &PyUnicode_Type)
        || !metaq_arg_long(args[2], &packet_id))
        return NULL;
    if (first_l > INT_MAX || first_l < INT_MIN) { /* 'i' */
        PyErr_SetString(PyExc_OverflowError, first_l > 0 ? "signed integer is greater than maximum"
                                                          : "signed integer is less than minimum");
        return NULL;
    }
    int first = (int)first_l;
    PyObject *topic = args[1], *props = args[3];
    Py_buffer payload;
    if (PyUnicode_Check(args[4])) { /* 'y*' */
        PyErr_Format(PyExc_TypeError, "argument 5 must be a bytes-like object, not str");
        return NULL;
    }
    if (PyObject_GetBuffer(args[4], &payload, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = NULL;
    Py_ssize_t props_len = 0;
    const char *props_at = NULL;
    if (props != Py_None) {
        if (!PyBytes_Check(props)) {
            PyErr_SetString(PyExc_TypeError, "mqtt_publish_bytes: props must be bytes or None");
            goto done;
        }
        props_len = PyBytes_GET_SIZE(props);
        props_at = PyBytes_AS_STRING(props);
    }
    Py_ssize_t nul = PyUnicode_FindChar(topic, 0, 0, PyUnicode_GET_LENGTH(topic), 1);
    if (nul == -2)
        goto done;
    if (nul >= 0) {
        PyErr_SetString(PyExc_ValueError, "an MQTT string must not contain U+0000");
        goto done;
    }
    Py_ssize_t tlen;
    const char *t = PyUnicode_AsUTF8AndSize(topic, &tlen);
    if (t == NULL)
        goto done;
    if (tlen > 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "binary data of %zd bytes is past 65,535", tlen);
        goto done;
    }
    if (packet_id < 0 || packet_id > 0xFFFF) { /* the twin's int.to_bytes(2): never a truncated id on the wire */
        PyErr_Format(PyExc_OverflowError, "packet identifier %ld does not fit 2 bytes", packet_id);
        goto done;
    }
    if (first < 0 || first > 0xFF) { /* the twin's bytes((first,)) */
        PyErr_Format(PyExc_ValueError, "fixed-header byte %d is not 0..255", first);
        goto done;
    }
    Py_ssize_t body = 2 + tlen + (packet_id ? 2 : 0) + props_len + payload.len;
    if (body > 268435455) {
        PyErr_Format(PyExc_ValueError, "variable byte integer %zd out of range", body);
        goto done;
    }
    unsigned char head[5];
    head[0] = (unsigned char)first;
    int hlen = 1 + wire_varint(head + 1, body);
    out = PyBytes_FromStringAndSize(NULL, hlen + body);
    if (out == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    memcpy(w, head, hlen);
    w += hlen;
    *w++ = (unsigned char)(tlen >> 8);
    *w++ = (unsigned char)tlen;
    memcpy(w, t, tlen);
    w += tlen;
    if (packet_id) {
        *w++ = (unsigned char)(packet_id >> 8);
        *w++ = (unsigned char)packet_id;
    }
    if (props_len) {
        memcpy(w, props_at, props_len);
        w += props_len;
    }
    memcpy(w, payload.buf, payload.len);
done:
    PyBuffer_Release(&payload);
    return out;
}

/* mqtt_pubacks(packet_ids) -> bytes: wire.encode_pubacks_py in C. */
PyObject *mqtt_pubacks(PyObject *self, PyObject *ids) {
    PyObject *seq = PySequence_Fast(ids, "packet_ids must be a sequence of ints");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyBytes_FromStringAndSize(NULL, 4 * n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(out);
    for (Py_ssize_t k = 0; k < n; k++) {
        long id = PyLong_AsLong(items[k]);
        if (id == -1 && PyErr_Occurred())
            goto fail;
        if (id < 0 || id > 0xFFFF) {
            PyErr_SetString(PyExc_ValueError, "a packet identifier is not 0..65535");
            goto fail;
        }
        w[4 * k] = 0x40;
        w[4 * k + 1] = 0x02;
        w[4 * k + 2] = (unsigned char)(id >> 8);
        w[4 * k + 3] = (unsigned char)id;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}
