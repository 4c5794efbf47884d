/* The MQTT publisher's one-read turn in one C call (metaq.mqtt.wire.read_publishes_py in C; the tests hold the two
 * equal):
 *
 *   mqtt_read_publishes(buf, pos, v5, max_packet, plans, decided, room, count, nbytes)
 *       -> (entries, next pos, how many at QoS 1, their records' bytes, PUBACKs)
 *
 * mqtt_plain_publishes's split and staging (mqttpublishes.c) and the successful PUBACKs of the QoS 1 PUBLISHes it took,
 * in their order, as one byte string (mqtt_pubacks's bytes, mqttwire.c): what the reader stores and answers. */
#include "native.h"

static PyObject *read_publishes(metaq_publishes_in *in, Py_ssize_t *qos1_out, Py_ssize_t *taken,
                                PyObject **acks_out) {
    Py_ssize_t pos = in->pos, qos1;
    PyObject *entries = metaq_plain_split(in, &qos1, taken);
    if (entries == NULL)
        return NULL;
    Py_ssize_t stop = in->pos;
    PyObject *acks = PyBytes_FromStringAndSize(NULL, 4 * qos1);
    if (acks == NULL) {
        Py_DECREF(entries);
        return NULL;
    }
    /* every packet in [pos, stop) is a whole plain PUBLISH the split took: its bounds are valid */
    const unsigned char *buf = (const unsigned char *)in->b.buf;
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
    *qos1_out = qos1;
    *acks_out = acks;
    return entries;
}

PyObject *mqtt_read_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    metaq_publishes_in in;
    Py_ssize_t qos1, taken;
    PyObject *acks;
    if (!metaq_publishes_args(args, nargs, &in))
        return NULL;
    PyObject *entries = read_publishes(&in, &qos1, &taken, &acks);
    PyBuffer_Release(&in.b);
    if (entries == NULL)
        return NULL;
    PyObject *items[5] = {entries, PyLong_FromSsize_t(in.pos), PyLong_FromSsize_t(qos1), PyLong_FromSsize_t(taken),
                          acks};
    return metaq_tuple_of(5, items);
}
