/* An MQTT reader's plain PUBLISHes split and staged in one call, and staged puts framed for the store's burst
 * (metaq.mqtt.wire.plain_publishes_py, metaq.mqtt.port.burst_frames_py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "native.h"

/* ======================================================================================================== */
/* MQTT: the plain PUBLISHes of a reader's buffer, split and staged in one call                               */
/* ======================================================================================================== */

/* mqtt_plain_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes)
   -> (entries, next pos, how many at QoS 1, their records' bytes):
   metaq.mqtt.wire.plain_publishes_py in C (see its docstring; the tests hold the two equal). Each entry is the plain
   values (metaq topic, hash % partitions, flag, prefix + payload, name, payload, qos, dup, packet id or None). */
int metaq_publishes_args(PyObject *const *args, Py_ssize_t nargs, metaq_publishes_in *in) {
    if (!metaq_nargs(nargs, 9) || PyObject_GetBuffer(args[0], &in->b, PyBUF_SIMPLE) < 0)
        return 0;
    if (metaq_arg_ssize(args[1], &in->pos) && (in->v5 = PyObject_IsTrue(args[2])) >= 0 &&
        metaq_arg_ll(args[3], &in->max_packet) && metaq_arg_type(5, args[4], &PyDict_Type) &&
        metaq_arg_type(6, args[5], &PyDict_Type) && metaq_arg_ll(args[6], &in->room) &&
        metaq_arg_ssize(args[7], &in->count) && metaq_arg_ll(args[8], &in->nbytes)) {
        in->plans = args[4];
        in->decided = args[5];
        return 1;
    }
    PyBuffer_Release(&in->b);
    return 0;
}

PyObject *metaq_plain_split(metaq_publishes_in *in, Py_ssize_t *qos1_out, Py_ssize_t *taken_out) {
    Py_ssize_t pos = in->pos, count = in->count, qos1 = 0, taken = 0;
    long long max_packet = in->max_packet, room = in->room, nbytes = in->nbytes;
    int v5 = in->v5;
    PyObject *plans = in->plans, *decided = in->decided;
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    const unsigned char *buf = (const unsigned char *)in->b.buf;
    Py_ssize_t end = in->b.len;
    if (pos < 0 || pos > end) {
        PyErr_Format(PyExc_ValueError, "mqtt_plain_publishes: pos %zd is outside the %zd-byte buffer", pos, end);
        goto fail;
    }
    while (count > 0 && nbytes > 0 && end - pos >= 2) {
        unsigned char first = buf[pos];
        if (first != 0x30 && first != 0x32 && first != 0x3A) /* PUBLISH, QoS 0 or 1 (DUP at 1 only), not retained */
            break;
        long long length = 0;
        int shift = 0, i = 1, bad = 0;
        unsigned char c;
        for (;;) {
            if (pos + i >= end) {
                bad = 1;
                break;
            }
            c = buf[pos + i];
            length |= (long long)(c & 0x7F) << shift;
            if (!(c & 0x80))
                break;
            if (i == 4) {
                bad = 1;
                break;
            }
            shift += 7;
            i++;
        }
        if (bad || (i > 1 && !c))
            break;
        long long total = 1 + i + length;
        if (total > max_packet || total > (long long)(end - pos))
            break;
        Py_ssize_t start = pos + 1 + i, stop = pos + (Py_ssize_t)total;
        if (stop - start < 2)
            break;
        Py_ssize_t at = start + 2 + (((Py_ssize_t)buf[start] << 8) | buf[start + 1]);
        if (at > stop)
            break;
        PyObject *key = PyBytes_FromStringAndSize((const char *)buf + start + 2, at - start - 2);
        if (key == NULL)
            goto fail;
        PyObject *plan = PyDict_GetItemWithError(plans, key); /* borrowed */
        Py_DECREF(key);
        if (plan == NULL) {
            if (PyErr_Occurred())
                goto fail;
            break;
        }
        if (!PyTuple_CheckExact(plan) || PyTuple_GET_SIZE(plan) != 6) {
            PyErr_SetString(PyExc_TypeError, "mqtt_plain_publishes: a plan is not a tuple of 6");
            goto fail;
        }
        int qos = (first >> 1) & 1;
        long packet_id = 0;
        if (qos) {
            if (room <= 0 || at + 2 > stop)
                break;
            packet_id = ((long)buf[at] << 8) | buf[at + 1];
            if (!packet_id)
                break;
            at += 2;
        }
        if (v5) {
            if (at >= stop || buf[at])
                break;
            at += 1;
        }
        PyObject *name = PyTuple_GET_ITEM(plan, 0), *topic = PyTuple_GET_ITEM(plan, 1);
        PyObject *hash = PyTuple_GET_ITEM(plan, 2), *flag = PyTuple_GET_ITEM(plan, 3);
        PyObject *prefix = PyTuple_GET_ITEM(plan, 4 + qos);
        PyObject *partitions = PyDict_GetItemWithError(decided, topic); /* borrowed */
        if (partitions == NULL) {
            if (PyErr_Occurred())
                goto fail;
            break;
        }
        long long nparts = PyLong_AsLongLong(partitions);
        if (nparts == -1 && PyErr_Occurred())
            goto fail;
        if (nparts <= 0)
            break;
        unsigned long long crc = PyLong_AsUnsignedLongLong(hash);
        if (crc == (unsigned long long)-1 && PyErr_Occurred())
            goto fail;
        if (!PyBytes_CheckExact(prefix)) {
            PyErr_SetString(PyExc_TypeError, "mqtt_plain_publishes: a plan's record prefix is not bytes");
            goto fail;
        }
        Py_ssize_t plen = PyBytes_GET_SIZE(prefix), n = stop - at;
        PyObject *data = PyBytes_FromStringAndSize(NULL, plen + n);
        if (data != NULL) {
            memcpy(PyBytes_AS_STRING(data), PyBytes_AS_STRING(prefix), plen);
            memcpy(PyBytes_AS_STRING(data) + plen, buf + at, n);
        }
        /* the plan's items, borrowed, stay alive: no Python code runs while the fields are made */
        PyObject *fields[9] = {Py_NewRef(topic), PyLong_FromUnsignedLongLong(crc % (unsigned long long)nparts),
                               Py_NewRef(flag), data, Py_NewRef(name),
                               PyBytes_FromStringAndSize((const char *)buf + at, n), PyLong_FromLong(qos),
                               Py_NewRef((first & 0x08) ? Py_True : Py_False),
                               qos ? PyLong_FromLong(packet_id) : Py_NewRef(Py_None)};
        PyObject *entry = metaq_tuple_of(9, fields);
        if (entry == NULL)
            goto fail;
        int added = PyList_Append(out, entry);
        Py_DECREF(entry);
        if (added < 0)
            goto fail;
        pos = stop;
        count--;
        nbytes -= plen + n;
        taken += plen + n;
        room -= qos;
        qos1 += qos;
    }
    in->pos = pos;
    *qos1_out = qos1;
    *taken_out = taken;
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* A tuple of n new references, stolen (NULL ones too: then none is kept and NULL is returned). */
PyObject *metaq_tuple_of(Py_ssize_t n, PyObject **items) {
    PyObject *t = NULL;
    int bad = 0;
    for (Py_ssize_t k = 0; k < n; k++)
        bad |= items[k] == NULL;
    if (!bad)
        t = PyTuple_New(n);
    for (Py_ssize_t k = 0; k < n; k++) {
        if (t != NULL)
            PyTuple_SET_ITEM(t, k, items[k]);
        else
            Py_XDECREF(items[k]);
    }
    return t;
}

PyObject *mqtt_plain_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    metaq_publishes_in in;
    Py_ssize_t qos1, taken;
    if (!metaq_publishes_args(args, nargs, &in))
        return NULL;
    PyObject *out = metaq_plain_split(&in, &qos1, &taken);
    PyBuffer_Release(&in.b);
    if (out == NULL)
        return NULL;
    PyObject *items[4] = {out, PyLong_FromSsize_t(in.pos), PyLong_FromSsize_t(qos1), PyLong_FromSsize_t(taken)};
    return metaq_tuple_of(4, items);
}

/* mqtt_burst_frames(staged, largest) -> (frames, src, general, names): metaq.mqtt.port.burst_frames_py in C (see its
   docstring; the tests hold the two equal): a frame (topic bytes, partition, flag, 0, start, length, CRC-32) per
   staged entry over src, their data back to back. */
PyObject *mqtt_burst_frames(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    long long largest;
    if (!metaq_nargs(nargs, 2) || !metaq_arg_ll(args[1], &largest))
        return NULL;
    PyObject *staged = args[0];
    PyObject *seq = PySequence_Fast(staged, "staged must be a sequence of entries");
    if (seq == NULL)
        return NULL;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq), total = 0;
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *names = PyDict_New(), *frames = PyList_New(count), *general = PyList_New(0), *src = NULL;
    if (names == NULL || frames == NULL || general == NULL)
        goto fail;
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *e = items[k];
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 4) {
            PyErr_Format(PyExc_TypeError, "mqtt_burst_frames: entry %zd is not a tuple of at least 4", k);
            goto fail;
        }
        PyObject *data = PyTuple_GET_ITEM(e, 3);
        if (!PyBytes_Check(data)) {
            PyErr_Format(PyExc_TypeError, "mqtt_burst_frames: entry %zd's data is %.100s, not bytes", k,
                         Py_TYPE(data)->tp_name);
            goto fail;
        }
        total += PyBytes_GET_SIZE(data);
    }
    src = PyBytes_FromStringAndSize(NULL, total);
    if (src == NULL)
        goto fail;
    char *w = PyBytes_AS_STRING(src);
    Py_ssize_t at = 0;
    PyObject *last_topic = NULL, *last_tb = NULL; /* borrowed: a burst is mostly one topic */
    for (Py_ssize_t k = 0; k < count; k++) {
        PyObject *e = items[k];
        PyObject *topic = PyTuple_GET_ITEM(e, 0), *data = PyTuple_GET_ITEM(e, 3), *tb;
        if (topic == last_topic) {
            tb = last_tb;
        } else {
            tb = PyDict_GetItemWithError(names, topic);
            if (tb == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                if (!PyUnicode_Check(topic)) {
                    PyErr_Format(PyExc_TypeError, "mqtt_burst_frames: entry %zd's topic is %.100s, not str", k,
                                 Py_TYPE(topic)->tp_name);
                    goto fail;
                }
                PyObject *made = PyUnicode_AsASCIIString(topic);
                if (made == NULL)
                    goto fail;
                int bad = PyDict_SetItem(names, topic, made) < 0;
                Py_DECREF(made); /* the dict holds it */
                if (bad)
                    goto fail;
                tb = made;
            }
            if (!PyBytes_Check(tb)) {
                PyErr_SetString(PyExc_TypeError, "mqtt_burst_frames: a topic's encoding is not bytes");
                goto fail;
            }
            last_topic = topic;
            last_tb = tb;
        }
        Py_ssize_t n = PyBytes_GET_SIZE(data);
        if ((long long)n + (long long)PyBytes_GET_SIZE(tb) > largest) {
            PyObject *ix = PyLong_FromSsize_t(k);
            int bad = ix == NULL || PyList_Append(general, ix) < 0;
            Py_XDECREF(ix);
            if (bad)
                goto fail;
        }
        const unsigned char *d = (const unsigned char *)PyBytes_AS_STRING(data);
        PyObject *fields[7] = {Py_NewRef(tb), Py_NewRef(PyTuple_GET_ITEM(e, 1)), Py_NewRef(PyTuple_GET_ITEM(e, 2)),
                               PyLong_FromLong(0), PyLong_FromSsize_t(at), PyLong_FromSsize_t(n),
                               PyLong_FromUnsignedLong(crc_of(d, n, 0) & 0xFFFFFFFFul)};
        PyObject *frame = metaq_tuple_of(7, fields);
        if (frame == NULL)
            goto fail;
        PyList_SET_ITEM(frames, k, frame);
        memcpy(w + at, d, n);
        at += n;
    }
    Py_DECREF(seq);
    PyObject *out[4] = {frames, src, general, names};
    return metaq_tuple_of(4, out);
fail:
    Py_DECREF(seq);
    Py_XDECREF(names);
    Py_XDECREF(frames);
    Py_XDECREF(general);
    Py_XDECREF(src);
    return NULL;
}
