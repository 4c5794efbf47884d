/* The MQTT publisher's one-read turn in one C call (metaq.mqtt.wire.read_publishes_py in C; the tests hold the two
 * equal):
 *
 *   mqtt_read_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes, publish)
 *       -> (entries, next pos, how many at QoS 1, their records' bytes, PUBACKs)
 *
 * mqtt_plain_publishes's split and staging (_speedups.c) and the successful PUBACKs of the QoS 1 PUBLISHes it took,
 * in their order, as one byte string (mqtt_pubacks's bytes, _mqttwire.c): what the reader stores and answers.
 *
 *   mqtt_plain_read(parser, publish, data, plans, decided, room, count, nbytes) == MqttParser.plain_read (below). */
#include "_speedups.h"

PyObject *mqtt_read_publishes(PyObject *self, PyObject *args) {
    PyObject *split = mqtt_plain_publishes(self, args);
    if (split == NULL)
        return NULL;
    Py_ssize_t qos1 = PyLong_AsSsize_t(PyTuple_GET_ITEM(split, 2));
    Py_ssize_t stop = PyLong_AsSsize_t(PyTuple_GET_ITEM(split, 1));
    Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(args, 1));
    PyObject *acks = PyBytes_FromStringAndSize(NULL, 4 * (qos1 > 0 ? qos1 : 0));
    if (acks == NULL || PyErr_Occurred()) {
        Py_XDECREF(acks);
        Py_DECREF(split);
        return NULL;
    }
    if (qos1 > 0) {
        Py_buffer b;
        if (PyObject_GetBuffer(PyTuple_GET_ITEM(args, 0), &b, PyBUF_SIMPLE) < 0) {
            Py_DECREF(acks);
            Py_DECREF(split);
            return NULL;
        }
        /* every packet in [pos, stop) is a whole plain PUBLISH mqtt_plain_publishes took: its bounds are valid */
        const unsigned char *buf = (const unsigned char *)b.buf;
        unsigned char *out = (unsigned char *)PyBytes_AS_STRING(acks);
        Py_ssize_t n = 0;
        while (pos < stop && n < qos1) {
            unsigned char first = buf[pos];
            Py_ssize_t length = 0, i = 1;
            int shift = 0;
            for (;;) {
                unsigned char c = buf[pos + i];
                length |= (Py_ssize_t)(c & 0x7F) << shift;
                if (!(c & 0x80))
                    break;
                shift += 7;
                i++;
            }
            Py_ssize_t start = pos + 1 + i;
            if (first & 0x02) { /* QoS 1: the packet id follows the topic name */
                Py_ssize_t at = start + 2 + ((buf[start] << 8) | buf[start + 1]);
                out[4 * n] = 0x40;
                out[4 * n + 1] = 0x02;
                out[4 * n + 2] = buf[at];
                out[4 * n + 3] = buf[at + 1];
                n++;
            }
            pos = start + length;
        }
        PyBuffer_Release(&b);
    }
    PyObject *r = PyTuple_Pack(5, PyTuple_GET_ITEM(split, 0), PyTuple_GET_ITEM(split, 1), PyTuple_GET_ITEM(split, 2),
                               PyTuple_GET_ITEM(split, 3), acks);
    Py_DECREF(acks);
    Py_DECREF(split);
    return r;
}

/* mqtt_plain_read(parser, publish, data, plans, decided, room, count, nbytes) == metaq.mqtt.wire.MqttParser.plain_read
 * (parser, data, plans, decided, room, count, nbytes), ``publish`` its wire.Publish: a read with nothing buffered
 * before it split from its own bytes (mqtt_read_publishes), what follows the PUBLISHes taken given to the parser's
 * receive_data; any other read through the parser's own _plain_buffered. The parser's fields are read and set as the
 * method reads and sets them. */
static PyObject *s_pos, *s_buf, *s_fatal, *s_eof, *s_version, *s_max_packet, *s_completed, *s_receive_data,
    *s_plain_buffered;

static int interned(void) {
    if (s_plain_buffered != NULL)
        return 1;
#define INTERN(var, name)                                                                                             \
    if ((var = PyUnicode_InternFromString(name)) == NULL)                                                              \
        return 0;
    INTERN(s_pos, "_pos")
    INTERN(s_buf, "_buf")
    INTERN(s_fatal, "_fatal")
    INTERN(s_eof, "_eof")
    INTERN(s_version, "version")
    INTERN(s_max_packet, "max_packet")
    INTERN(s_completed, "_completed")
    INTERN(s_receive_data, "receive_data")
    INTERN(s_plain_buffered, "_plain_buffered")
#undef INTERN
    return 1;
}

/* 1 when the parser must take the read through _plain_buffered, 0 when it is split from its own bytes; -1 with an
   exception set. *v5 and *max_packet are set when 0. */
static int buffered_read(PyObject *parser, PyObject *data, PyObject **version, PyObject **max_packet) {
    Py_ssize_t n = PyObject_Length(data);
    if (n < 0)
        return -1;
    if (n == 0)
        return 1;
    PyObject *v = PyObject_GetAttr(parser, s_pos);
    if (v == NULL)
        return -1;
    Py_ssize_t pos = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    if (pos == -1 && PyErr_Occurred())
        return -1;
    if ((v = PyObject_GetAttr(parser, s_buf)) == NULL)
        return -1;
    Py_ssize_t len = PyObject_Length(v);
    Py_DECREF(v);
    if (len < 0)
        return -1;
    if (pos < len)
        return 1;
    if ((v = PyObject_GetAttr(parser, s_fatal)) == NULL)
        return -1;
    int fatal = v != Py_None;
    Py_DECREF(v);
    if (fatal)
        return 1;
    if ((v = PyObject_GetAttr(parser, s_eof)) == NULL)
        return -1;
    int eof = PyObject_IsTrue(v);
    Py_DECREF(v);
    if (eof)
        return eof < 0 ? -1 : 1;
    if ((*version = PyObject_GetAttr(parser, s_version)) == NULL)
        return -1;
    if (*version == Py_None) {
        Py_CLEAR(*version);
        return 1;
    }
    if ((*max_packet = PyObject_GetAttr(parser, s_max_packet)) == NULL) {
        Py_CLEAR(*version);
        return -1;
    }
    return 0;
}

PyObject *mqtt_plain_read(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8)
        return PyErr_Format(PyExc_TypeError, "mqtt_plain_read takes 8 arguments (%zd given)", nargs);
    if (!interned())
        return NULL;
    PyObject *parser = args[0], *publish = args[1], *data = args[2];
    PyObject *version = NULL, *max_packet = NULL;
    int buffered = buffered_read(parser, data, &version, &max_packet);
    if (buffered < 0)
        return NULL;
    if (buffered)
        return PyObject_VectorcallMethod(s_plain_buffered, (PyObject *[]){parser, data, args[3], args[4], args[5],
                                                                         args[6], args[7]},
                                         7 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    PyObject *five = PyLong_FromLong(5); /* wire.MQTT_5 */
    int v5 = five == NULL ? -1 : PyObject_RichCompareBool(version, five, Py_EQ);
    Py_XDECREF(five);
    Py_DECREF(version);
    if (v5 < 0) {
        Py_DECREF(max_packet);
        return NULL;
    }
    PyObject *zero = PyLong_FromLong(0);
    PyObject *call = zero == NULL ? NULL
                                  : PyTuple_Pack(10, data, zero, v5 ? Py_True : Py_False, max_packet, args[3], args[4],
                                                 args[5], args[6], args[7], publish);
    Py_XDECREF(zero);
    Py_DECREF(max_packet);
    if (call == NULL)
        return NULL;
    PyObject *r = mqtt_read_publishes(self, call); /* (entries, next pos, qos1, their bytes, PUBACKs) */
    Py_DECREF(call);
    if (r == NULL)
        return NULL;
    PyObject *entries = PyTuple_GET_ITEM(r, 0);
    Py_ssize_t taken = PyObject_Length(entries);
    if (taken < 0)
        goto fail;
    if (taken > 0) {
        PyObject *c = PyObject_GetAttr(parser, s_completed), *add = c ? PyLong_FromSsize_t(taken) : NULL;
        PyObject *sum = add ? PyNumber_Add(c, add) : NULL;
        Py_XDECREF(c);
        Py_XDECREF(add);
        int rc = sum == NULL ? -1 : PyObject_SetAttr(parser, s_completed, sum);
        Py_XDECREF(sum);
        if (rc < 0)
            goto fail;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(PyTuple_GET_ITEM(r, 1)), n = PyObject_Length(data);
    if ((pos == -1 && PyErr_Occurred()) || n < 0)
        goto fail;
    int rest = pos < n;
    if (rest) { /* receive_data(data[pos:] if pos else data) */
        PyObject *tail = pos ? PySequence_GetSlice(data, pos, n) : (Py_INCREF(data), data);
        PyObject *done = tail == NULL ? NULL : PyObject_CallMethodOneArg(parser, s_receive_data, tail);
        Py_XDECREF(tail);
        if (done == NULL)
            goto fail;
        Py_DECREF(done);
    }
    PyObject *out = PyTuple_Pack(5, entries, PyTuple_GET_ITEM(r, 2), PyTuple_GET_ITEM(r, 3), PyTuple_GET_ITEM(r, 4),
                                 rest ? Py_True : Py_False);
    Py_DECREF(r);
    return out;
fail:
    Py_DECREF(r);
    return NULL;
}
