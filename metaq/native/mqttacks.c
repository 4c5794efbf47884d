/* The MQTT subscriber's read of acknowledgements (metaq.mqtt.wire.plain_pubacks_py in C; the tests hold the two equal):
 *
 *   mqtt_plain_pubacks(buf, pos, v5, max_packet) -> ([packet ids], next pos)
 *
 * The consecutive plain PUBACKs whole in buf from pos (a non-zero packet id; MQTT 5: an optional reason code a PUBACK
 * may carry and an optional empty property length), within max_packet; it stops before the first other packet.
 * wire.end_pubacks ends their messages in flight. */
#include "native.h"

/* The reason codes a PUBACK may carry (wire._PUB_ACK_CODES). */
static int acks_code(int code) {
    return code == 0x00 || code == 0x10 || code == 0x80 || code == 0x83 || code == 0x87 || code == 0x90 ||
           code == 0x91 || code == 0x97 || code == 0x99;
}

/* The packet id of the plain PUBACK whole at pos in buf[0:end) (its bytes in *size), or 0 when the next packet is not
 * one. */
static long acks_at(const unsigned char *buf, Py_ssize_t end, Py_ssize_t pos, int v5, Py_ssize_t max_packet,
                    Py_ssize_t *size) {
    if (pos > end - 4 || buf[pos] != 0x40)
        return 0;
    Py_ssize_t n = buf[pos + 1];
    if (n < 2 || n > (v5 ? 4 : 2) || 2 + n > max_packet || pos + 2 + n > end)
        return 0;
    long packet_id = ((long)buf[pos + 2] << 8) | buf[pos + 3];
    if (!packet_id || (n >= 3 && (!acks_code(buf[pos + 4]) || (n == 4 && buf[pos + 5]))))
        return 0;
    *size = 2 + n;
    return packet_id;
}

PyObject *mqtt_plain_pubacks(PyObject *self, PyObject *args) {
    Py_buffer b;
    Py_ssize_t pos, max_packet, size = 0;
    int v5;
    if (!PyArg_ParseTuple(args, "y*npn:mqtt_plain_pubacks", &b, &pos, &v5, &max_packet))
        return NULL;
    PyObject *ids = PyList_New(0);
    if (ids == NULL) {
        PyBuffer_Release(&b);
        return NULL;
    }
    if (pos < 0)
        pos = 0;
    long packet_id;
    while ((packet_id = acks_at((const unsigned char *)b.buf, b.len, pos, v5, max_packet, &size)) != 0) {
        PyObject *id = PyLong_FromLong(packet_id);
        if (id == NULL || PyList_Append(ids, id) < 0) {
            Py_XDECREF(id);
            Py_DECREF(ids);
            PyBuffer_Release(&b);
            return NULL;
        }
        Py_DECREF(id);
        pos += size;
    }
    PyBuffer_Release(&b);
    return Py_BuildValue("(Nn)", ids, pos);
}
