/* The MQTT publisher's one-read turn in one C call (metaq.mqtt.wire.read_publishes_py in C; the tests hold the two
 * equal):
 *
 *   mqtt_read_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes, publish)
 *       -> (entries, next pos, how many at QoS 1, their records' bytes, PUBACKs)
 *
 * mqtt_plain_publishes's split and staging (_speedups.c) and the successful PUBACKs of the QoS 1 PUBLISHes it took,
 * in their order, as one byte string (mqtt_pubacks's bytes, _mqttwire.c): what the reader stores and answers. */
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
