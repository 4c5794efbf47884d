/* A run of plain QoS 1 messages sent from an MQTT publisher's turn to a waiting subscriber in one C call
 * (metaq.mqtt.direct.direct_publishes_py in C; the tests hold the two equal):
 *
 *   mqtt_direct_publishes(fd, staged, i, stop, names, session, topic, partition, offset, window, v5, max_packet)
 *       -> (went, state, rest, err)
 *
 * From staged[i] (MqttPort.write_burst's entries, (topic, partition, flag, data, Publish, name)) up to staged[stop],
 * while each is a QoS 1 PUBLISH without properties whose name is a key of names and the window has room: packet ids
 * taken by the session's rule (the first after session.last_id not in session.inflight), each recorded in flight as
 * MqttSession.sent_next records it (inflight[id] = "publish", where[id] = (1, topic, partition, its offset)), the
 * PUBLISHes made as mqtt_publish_bytes makes them and written by one non-blocking send on fd. One past max_packet is
 * not sent, its id given back; those the send did not take whole are given back too, the one begun kept in flight
 * and its unsent bytes returned. See the twin's docstring for the contract. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "_speedups.h"

#define DIRECT_DONE 0
#define DIRECT_DECIDE 1
#define DIRECT_SHORT 2

static PyObject *direct_keys[8]; /* interned attribute names */
static const char *const DIRECT_KEY_NAMES[8] = {"qos", "properties", "payload", "inflight", "where", "last_id",
                                                "dirty", "publish"};
#define D_QOS 0
#define D_PROPERTIES 1
#define D_PAYLOAD 2
#define D_INFLIGHT 3
#define D_WHERE 4
#define D_LAST_ID 5
#define D_DIRTY 6
#define D_PUBLISH_SENT 7 /* session.PUBLISH_SENT's value */

static int direct_ready(void) {
    for (int k = 0; k < 8; k++) {
        if (direct_keys[k] == NULL && (direct_keys[k] = PyUnicode_InternFromString(DIRECT_KEY_NAMES[k])) == NULL)
            return -1;
    }
    return 0;
}

/* One record the call takes: its name's UTF-8, its payload held, its PUBLISH's size, past max_packet or not. */
typedef struct {
    const char *name;
    Py_ssize_t name_len;
    Py_buffer payload;
    Py_ssize_t size;
    int large;
    long packet_id;
} direct_item;

static int direct_varint(unsigned char *out, Py_ssize_t v) {
    int n = 0;
    do {
        unsigned char b = (unsigned char)(v & 0x7F);
        v >>= 7;
        if (v)
            b |= 0x80;
        out[n++] = b;
    } while (v);
    return n;
}

/* 1 when entry (a staged tuple) is one the call takes, filling it (the payload held); 0 when not; -1 an error. */
static int direct_take(PyObject *entry, PyObject *names, int v5, direct_item *it) {
    if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) < 6)
        return 0;
    PyObject *p = PyTuple_GET_ITEM(entry, 4), *name = PyTuple_GET_ITEM(entry, 5);
    PyObject *qos = metaq_getattr(p, direct_keys[D_QOS]);
    if (qos == NULL)
        return -1;
    int one = PyLong_Check(qos) && PyLong_AsLong(qos) == 1;
    Py_DECREF(qos);
    if (!one)
        return 0;
    PyObject *props = metaq_getattr(p, direct_keys[D_PROPERTIES]);
    if (props == NULL)
        return -1;
    int some = PyObject_IsTrue(props);
    Py_DECREF(props);
    if (some)
        return some < 0 ? -1 : 0;
    if (!PyUnicode_CheckExact(name))
        return 0;
    int known = PyDict_Contains(names, name);
    if (known <= 0)
        return known;
    /* publish_bytes' checks of the name: U+0000 is refused, at most 65,535 bytes */
    Py_ssize_t nul = PyUnicode_FindChar(name, 0, 0, PyUnicode_GET_LENGTH(name), 1);
    if (nul == -2)
        return -1;
    if (nul >= 0) {
        PyErr_SetString(PyExc_ValueError, "an MQTT string must not contain U+0000");
        return -1;
    }
    it->name = PyUnicode_AsUTF8AndSize(name, &it->name_len);
    if (it->name == NULL)
        return -1;
    if (it->name_len > 0xFFFF) {
        PyErr_Format(PyExc_ValueError, "binary data of %zd bytes is past 65,535", it->name_len);
        return -1;
    }
    PyObject *payload = metaq_getattr(p, direct_keys[D_PAYLOAD]);
    if (payload == NULL)
        return -1;
    int got = PyObject_GetBuffer(payload, &it->payload, PyBUF_SIMPLE);
    Py_DECREF(payload);
    if (got < 0)
        return -1;
    Py_ssize_t body = 2 + it->name_len + 2 + (v5 ? 1 : 0) + it->payload.len;
    if (body > 268435455) {
        PyBuffer_Release(&it->payload);
        PyErr_Format(PyExc_ValueError, "variable byte integer %zd out of range", body);
        return -1;
    }
    unsigned char head[5];
    it->size = 1 + direct_varint(head, body) + body;
    return 1;
}

/* The session's next packet id after *last not a key of inflight (room is left: one is free); 0 on an error. */
static long direct_next_id(PyObject *inflight, long last) {
    for (int tries = 0; tries < 65535; tries++) {
        last = last % 65535 + 1;
        PyObject *key = PyLong_FromLong(last);
        if (key == NULL)
            return 0;
        int held = PyDict_Contains(inflight, key);
        Py_DECREF(key);
        if (held < 0)
            return 0;
        if (!held)
            return last;
    }
    PyErr_SetString(PyExc_RuntimeError, "mqtt_direct_publishes: no packet id free with room in flight");
    return 0;
}

/* Record packet_id in flight: inflight[id] = "publish", where[id] = (1, topic, partition, offset). */
static int direct_record(PyObject *inflight, PyObject *where, long packet_id, PyObject *topic, PyObject *partition,
                         long long offset) {
    PyObject *key = PyLong_FromLong(packet_id);
    if (key == NULL)
        return -1;
    PyObject *fields[4] = {PyLong_FromLong(1), Py_NewRef(topic), Py_NewRef(partition), PyLong_FromLongLong(offset)};
    PyObject *place = metaq_tuple_of(4, fields);
    int r = -1;
    if (place != NULL && PyObject_SetItem(inflight, key, direct_keys[D_PUBLISH_SENT]) == 0 &&
        PyObject_SetItem(where, key, place) == 0)
        r = 0;
    Py_XDECREF(place);
    Py_DECREF(key);
    return r;
}

/* Give packet_id back (MqttSession.dropped): out of inflight and where when there. */
static int direct_give_back(PyObject *inflight, PyObject *where, long packet_id) {
    PyObject *key = PyLong_FromLong(packet_id);
    if (key == NULL)
        return -1;
    int r = 0;
    int held = PyDict_Contains(inflight, key);
    if (held < 0 || (held && PyObject_DelItem(inflight, key) < 0))
        r = -1;
    if (r == 0) {
        held = PyDict_Contains(where, key);
        if (held < 0 || (held && PyObject_DelItem(where, key) < 0))
            r = -1;
    }
    Py_DECREF(key);
    return r;
}

static int direct_set_last(PyObject *session, long last) {
    PyObject *v = PyLong_FromLong(last);
    if (v == NULL)
        return -1;
    int r = metaq_setattr(session, direct_keys[D_LAST_ID], v);
    Py_DECREF(v);
    return r;
}

/* The run's work (mqtt_direct_publishes' and MqttDirectPath's): inflight and where the session's dicts; the answer in
 * *went, *state, *rest (a new reference or NULL) and *err. 0, or -1 with an error set. */
int metaq_direct_run(long fd, PyObject *staged, Py_ssize_t i, Py_ssize_t stop, PyObject *names, PyObject *session,
                     PyObject *inflight, PyObject *where, PyObject *topic, PyObject *partition, long long offset,
                     Py_ssize_t window, int v5, Py_ssize_t max_packet, Py_ssize_t *went_out, int *state_out,
                     PyObject **rest_out, int *err_out) {
    if (direct_ready() < 0)
        return -1;
    PyObject *data = NULL, *rest = NULL;
    direct_item *items = NULL;
    Py_ssize_t planned = 0, held = 0, went = 0;
    int state = DIRECT_DONE, err = 0, r = -1;
    if (!PyList_Check(staged) || !PyDict_Check(names) || !PyDict_Check(inflight) || !PyDict_Check(where)) {
        PyErr_SetString(PyExc_TypeError,
                        "mqtt_direct_publishes: staged must be a list, names and the session's inflight and where dicts");
        return -1;
    }
    if (fd < 0 || fd > 0x7FFFFFFF) {
        PyErr_Format(PyExc_ValueError, "mqtt_direct_publishes: bad file descriptor %ld", fd);
        return -1;
    }
    if (i < 0)
        i = 0;
    if (stop > PyList_GET_SIZE(staged))
        stop = PyList_GET_SIZE(staged);
    if (stop <= i)
        goto answer;
    items = PyMem_Calloc((size_t)(stop - i), sizeof(direct_item));
    if (items == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* what it takes, decided before anything changes */
    Py_ssize_t room = window - PyDict_GET_SIZE(inflight), total = 0;
    for (Py_ssize_t k = i; k < stop; k++) {
        direct_item *it = &items[planned];
        int took = direct_take(PyList_GET_ITEM(staged, k), names, v5, it);
        if (took < 0)
            goto done;
        if (!took) {
            state = DIRECT_DECIDE;
            break;
        }
        held++;
        if (room <= 0) {
            state = DIRECT_SHORT;
            break;
        }
        it->large = max_packet >= 0 && it->size > max_packet;
        if (!it->large) {
            room--;
            total += it->size;
        }
        planned++;
    }
    if (!planned)
        goto answer;
    /* the ids taken and recorded in flight, the PUBLISHes written into one buffer */
    PyObject *last_obj = metaq_getattr(session, direct_keys[D_LAST_ID]);
    if (last_obj == NULL)
        goto done;
    long last = PyLong_AsLong(last_obj);
    Py_DECREF(last_obj);
    if (last == -1 && PyErr_Occurred())
        goto done;
    data = PyBytes_FromStringAndSize(NULL, total);
    if (data == NULL)
        goto done;
    unsigned char *w = (unsigned char *)PyBytes_AS_STRING(data);
    for (Py_ssize_t j = 0; j < planned; j++) {
        direct_item *it = &items[j];
        long packet_id = direct_next_id(inflight, last);
        if (packet_id == 0)
            goto done;
        last = it->packet_id = packet_id;
        if (direct_set_last(session, last) < 0)
            goto done;
        if (it->large)
            continue;
        if (direct_record(inflight, where, packet_id, topic, partition, offset + j) < 0)
            goto done;
        *w++ = 0x32;
        Py_ssize_t remaining = 2 + it->name_len + 2 + (v5 ? 1 : 0) + it->payload.len;
        w += direct_varint(w, remaining);
        *w++ = (unsigned char)(it->name_len >> 8);
        *w++ = (unsigned char)it->name_len;
        memcpy(w, it->name, (size_t)it->name_len);
        w += it->name_len;
        *w++ = (unsigned char)(packet_id >> 8);
        *w++ = (unsigned char)packet_id;
        if (v5)
            *w++ = 0x00;
        memcpy(w, it->payload.buf, (size_t)it->payload.len);
        w += it->payload.len;
    }
    if (metaq_setattr(session, direct_keys[D_DIRTY], Py_True) < 0)
        goto done;
    /* one non-blocking send of them all */
    Py_ssize_t n = 0;
    if (total > 0) {
        const char *buf = PyBytes_AS_STRING(data);
        ssize_t sent;
        Py_BEGIN_ALLOW_THREADS
        do {
            sent = send((int)fd, buf, (size_t)total, MSG_DONTWAIT | MSG_NOSIGNAL);
        } while (sent < 0 && errno == EINTR);
        if (sent < 0)
            err = (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : errno;
        Py_END_ALLOW_THREADS
        n = sent < 0 ? 0 : (Py_ssize_t)sent;
    }
    /* what went: whole, begun (kept in flight, its rest returned), or not (given back) */
    Py_ssize_t pos = 0;
    for (Py_ssize_t j = 0; j < planned; j++) {
        Py_ssize_t size = items[j].large ? 0 : items[j].size;
        if (pos + size <= n) {
            went++;
            pos += size;
            continue;
        }
        if (pos < n) {
            rest = PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + n, pos + size - n);
            if (rest == NULL)
                goto done;
            went++;
        }
        break;
    }
    if (went < planned || rest != NULL) {
        state = DIRECT_SHORT;
        Py_ssize_t back = went - (rest != NULL ? 1 : 0);
        if (direct_set_last(session, items[back].packet_id) < 0)
            goto done;
        for (Py_ssize_t j = went; j < planned; j++) {
            if (!items[j].large && direct_give_back(inflight, where, items[j].packet_id) < 0)
                goto done;
        }
    }
answer:
    *went_out = went;
    *state_out = state;
    *rest_out = rest;
    rest = NULL;
    *err_out = err;
    r = 0;
done:
    for (Py_ssize_t k = 0; k < held; k++)
        PyBuffer_Release(&items[k].payload);
    PyMem_Free(items);
    Py_XDECREF(data);
    Py_XDECREF(rest);
    return r;
}

PyObject *mqtt_direct_publishes(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 12) {
        PyErr_Format(PyExc_TypeError, "mqtt_direct_publishes takes 12 arguments (%zd given)", nargs);
        return NULL;
    }
    if (direct_ready() < 0)
        return NULL;
    PyObject *staged = args[1], *names = args[4], *session = args[5], *topic = args[6], *partition = args[7];
    long fd = PyLong_AsLong(args[0]);
    Py_ssize_t i = PyLong_AsSsize_t(args[2]), stop = PyLong_AsSsize_t(args[3]);
    long long offset = PyLong_AsLongLong(args[8]);
    Py_ssize_t window = PyLong_AsSsize_t(args[9]);
    int v5 = PyObject_IsTrue(args[10]);
    Py_ssize_t max_packet = -1;
    if (args[11] != Py_None)
        max_packet = PyLong_AsSsize_t(args[11]);
    if (PyErr_Occurred() || v5 < 0)
        return NULL;
    PyObject *inflight = metaq_getattr(session, direct_keys[D_INFLIGHT]);
    if (inflight == NULL)
        return NULL;
    PyObject *where = metaq_getattr(session, direct_keys[D_WHERE]);
    if (where == NULL) {
        Py_DECREF(inflight);
        return NULL;
    }
    Py_ssize_t went = 0;
    int state = 0, err = 0;
    PyObject *rest = NULL, *result = NULL;
    if (metaq_direct_run(fd, staged, i, stop, names, session, inflight, where, topic, partition, offset, window, v5,
                         max_packet, &went, &state, &rest, &err) == 0) {
        PyObject *fields[4] = {PyLong_FromSsize_t(went), PyLong_FromLong(state),
                               Py_NewRef(rest != NULL ? rest : Py_None), PyLong_FromLong(err)};
        result = metaq_tuple_of(4, fields);
    }
    Py_XDECREF(rest);
    Py_DECREF(inflight);
    Py_DECREF(where);
    return result;
}
