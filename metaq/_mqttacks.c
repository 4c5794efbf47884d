/* The MQTT subscriber's read of acknowledgements in one C call (metaq.mqtt.wire.end_pubacks_py in C; the tests hold
 * the two equal):
 *
 *   mqtt_end_pubacks(buf, pos, v5, max_packet, inflight, where, state) -> (PUBACKs taken, messages ended, next pos)
 *
 * The consecutive plain PUBACKs whole in buf from pos (a non-zero packet id; MQTT 5: an optional reason code a PUBACK
 * may carry and an optional empty property length), within max_packet; it stops before the first other packet. Each
 * ends its packet id's message in flight when inflight (the session's, a dict or an OrderedDict) holds it in state
 * (MqttSession.acknowledged's test): deleted from inflight (through its own mapping, so an OrderedDict's order stays
 * whole) and from where. */
#include "_speedups.h"

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

/* End packet_id's message in flight when inflight holds it in state: 1 ended, 0 not, -1 an error. */
static int acks_end(PyObject *inflight, PyObject *where, PyObject *state, long packet_id) {
    PyObject *key = PyLong_FromLong(packet_id);
    if (key == NULL)
        return -1;
    int ended = 0;
    PyObject *now = PyDict_GetItemWithError(inflight, key); /* borrowed */
    if (now != NULL) {
        Py_INCREF(now);
        ended = PyObject_RichCompareBool(now, state, Py_EQ);
        Py_DECREF(now);
        if (ended == 1 && PyObject_DelItem(inflight, key) < 0)
            ended = -1;
        if (ended == 1) {
            int held = PyDict_Contains(where, key);
            if (held < 0 || (held && PyObject_DelItem(where, key) < 0))
                ended = -1;
        }
    } else if (PyErr_Occurred()) {
        ended = -1;
    }
    Py_DECREF(key);
    return ended;
}

Py_ssize_t metaq_end_acks(const unsigned char *buf, Py_ssize_t end, Py_ssize_t pos, int v5, Py_ssize_t max_packet,
                          PyObject *inflight, PyObject *where, PyObject *state, Py_ssize_t *taken_out,
                          Py_ssize_t *ended_out) {
    Py_ssize_t taken = 0, ended = 0, size = 0;
    if (pos < 0)
        pos = 0;
    long packet_id;
    while ((packet_id = acks_at(buf, end, pos, v5, max_packet, &size)) != 0) {
        int one = acks_end(inflight, where, state, packet_id);
        if (one < 0)
            return -1;
        ended += one;
        taken++;
        pos += size;
    }
    *taken_out = taken;
    *ended_out = ended;
    return pos;
}

PyObject *mqtt_end_pubacks(PyObject *self, PyObject *args) {
    PyObject *data, *inflight, *where, *state;
    Py_ssize_t pos, max_packet;
    int v5;
    if (!PyArg_ParseTuple(args, "OnpnO!O!O:mqtt_end_pubacks", &data, &pos, &v5, &max_packet, &PyDict_Type, &inflight,
                          &PyDict_Type, &where, &state))
        return NULL;
    Py_buffer b;
    if (PyObject_GetBuffer(data, &b, PyBUF_SIMPLE) < 0)
        return NULL;
    Py_ssize_t taken = 0, ended = 0;
    pos = metaq_end_acks((const unsigned char *)b.buf, b.len, pos, v5, max_packet, inflight, where, state, &taken,
                         &ended);
    PyBuffer_Release(&b);
    if (pos < 0)
        return NULL;
    return Py_BuildValue("(nnn)", taken, ended, pos);
}
