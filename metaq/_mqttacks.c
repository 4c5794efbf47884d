/* The MQTT subscriber's read of acknowledgements in one C call (metaq.mqtt.wire.plain_pubacks_py in C; the tests hold
 * the two equal):
 *
 *   mqtt_plain_pubacks(buf, pos, v5, max_packet) -> (packet ids, next pos)
 *
 * The consecutive plain PUBACKs whole in buf from pos (a non-zero packet id; MQTT 5: an optional reason code a PUBACK
 * may carry and an optional empty property length), within max_packet; it stops before the first other packet. */
#include "_speedups.h"

/* The reason codes a PUBACK may carry (wire._PUB_ACK_CODES). */
static int acks_code(int code) {
    return code == 0x00 || code == 0x10 || code == 0x80 || code == 0x83 || code == 0x87 || code == 0x90 ||
           code == 0x91 || code == 0x97 || code == 0x99;
}

PyObject *mqtt_plain_pubacks(PyObject *self, PyObject *args) {
    PyObject *data;
    Py_ssize_t pos, max_packet;
    int v5;
    if (!PyArg_ParseTuple(args, "Onpn:mqtt_plain_pubacks", &data, &pos, &v5, &max_packet))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    const unsigned char *buf = (const unsigned char *)b.buf;
    Py_ssize_t end = b.len;
    if (pos < 0)
        pos = 0;
    PyObject *ids = PyList_New(0);
    if (ids == NULL) {
        PyBuffer_Release(&b);
        return NULL;
    }
    while (pos <= end - 4 && buf[pos] == 0x40) {
        Py_ssize_t n = buf[pos + 1];
        if (n < 2 || n > (v5 ? 4 : 2) || 2 + n > max_packet || pos + 2 + n > end)
            break;
        long packet_id = ((long)buf[pos + 2] << 8) | buf[pos + 3];
        if (!packet_id || (n >= 3 && (!acks_code(buf[pos + 4]) || (n == 4 && buf[pos + 5]))))
            break;
        PyObject *id = PyLong_FromLong(packet_id);
        if (id == NULL || PyList_Append(ids, id) < 0) {
            Py_XDECREF(id);
            Py_DECREF(ids);
            PyBuffer_Release(&b);
            return NULL;
        }
        Py_DECREF(id);
        pos += 2 + n;
    }
    PyBuffer_Release(&b);
    PyObject *r = Py_BuildValue("(Nn)", ids, pos);
    return r;
}
