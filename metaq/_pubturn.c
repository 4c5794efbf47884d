/* The MQTT publisher's plain read stored and acknowledged in one C call (metaq.mqtt.publishes.plain_turn_py in C;
 * the tests hold the two equal, seeded), and the write of a burst's PUBACKs from the reader's turn that it and
 * metaq.mqtt.acks.Acknowledgements.pubacks share (metaq.mqtt.acks.pubacks_now_py in C):
 *
 *   mqtt_plain_turn(append, counted, path, store, deliver, client_id, acks, conn, largest, frames_of, publish,
 *                   most, most_bytes, data, v5, max_packet, plans, decided, room, now)
 *       -> None | True | (entries, how many at QoS 1, their records' bytes, PUBACKs, next pos, taken)
 *   mqtt_pubacks_now(acks, conn, data) -> True (written, all or a part) | False (the caller queues them)
 *
 * A device's read holding whole packets, nothing buffered before it: the plain PUBLISHes it begins with split and
 * staged with their PUBACKs (mqtt_read_publishes, _mqttturn.c), the client's unacknowledged count raised by the QoS
 * 1 ones (``acks.unacked``); when they are the whole read their burst frames made (``frames_of``, the C helper's
 * mqtt_burst_frames), appended by the store's burst writer (``append``), each run counted (``counted``), the put
 * path's ``burst_written`` of now called with the delivery (``deliver(keys, entries, runs, client_id, now)``) and
 * the PUBACKs written at once when they may be (the mode ACK_NOW: pubacks_now below, C to C), else queued
 * (``acks.queue_pubacks``) with the wait the mode asks (the store's ``log_cuts`` read before the wake): True. None:
 * the read does not begin with one (nothing taken). The tuple: what the caller goes on with, as the general path
 * (other bytes follow from ``next pos``, a record the burst writer does not take, or the burst writer stopped
 * short: then ``taken`` is ``(frames, src, frames written, log end, keys, runs)``, else None). The objects are the
 * caller's, called through their public methods and attributes; bound with functools.partial once per connection
 * (metaq/mqtt/publishes.py), so the turn costs its caller one call. */
#define PY_SSIZE_T_CLEAN
#include <errno.h>
#include <sys/socket.h>

#include "_speedups.h"

static PyObject *s_log_cuts, *s_burst_written, *s_unacked, *s_queue_pubacks, *s_pending, *s_try_send, *s_queue,
    *s_direct_fd, *s_keep_unsent, *s_send_failed, *s_sent, *s_set, *s_empty;

static int interned(void) {
    if (s_empty != NULL)
        return 1;
#define INTERN(var, name)                                                                                             \
    if ((var = PyUnicode_InternFromString(name)) == NULL)                                                              \
        return 0;
    INTERN(s_log_cuts, "log_cuts")
    INTERN(s_burst_written, "burst_written")
    INTERN(s_unacked, "unacked")
    INTERN(s_pending, "pending")
    INTERN(s_try_send, "try_send")
    INTERN(s_queue, "queue")
    INTERN(s_queue_pubacks, "queue_pubacks")
    INTERN(s_direct_fd, "direct_fd")
    INTERN(s_keep_unsent, "keep_unsent")
    INTERN(s_send_failed, "send_failed")
    INTERN(s_sent, "sent")
    INTERN(s_set, "set")
#undef INTERN
    if ((s_empty = PyBytes_FromStringAndSize(NULL, 0)) == NULL)
        return 0;
    return 1;
}

/* acks.unacked += qos1; -1 with an exception set. */
static int add_unacked(PyObject *acks, Py_ssize_t qos1) {
    PyObject *had = metaq_getattr(acks, s_unacked);
    if (had == NULL)
        return -1;
    PyObject *add = PyLong_FromSsize_t(qos1);
    PyObject *now = add == NULL ? NULL : PyNumber_Add(had, add);
    Py_XDECREF(add);
    Py_DECREF(had);
    if (now == NULL)
        return -1;
    int r = metaq_setattr(acks, s_unacked, now);
    Py_DECREF(now);
    return r;
}

/* metaq.mqtt.acks.pubacks_now_py in C: a burst's PUBACKs ``data`` (bytes) written from the reader's turn when they
 * may go now (``acks.pending`` 0: nothing queued before them, no writer), by the socket's descriptor while it may be
 * written that way (``conn.direct_fd`` >= 0: one send, MSG_DONTWAIT | MSG_NOSIGNAL, as the delivery's; a part
 * written: the rest kept by ``conn.keep_unsent`` and ``acks.queue(b"")`` for the writer to finish it; a full buffer:
 * nothing; another error: ``conn.send_failed(errno)``), else by ``conn.try_send``. Some written: ``acks.unacked``
 * lowered by the PUBACKs, ``acks.sent`` set when there is one, 1. None written: 0 (the caller queues them). -1 with an
 * exception set. */
static int pubacks_now(PyObject *acks, PyObject *conn, PyObject *data) {
    if (!interned())
        return -1;
    if (!PyBytes_Check(data)) {
        PyErr_SetString(PyExc_TypeError, "the PUBACKs must be bytes");
        return -1;
    }
    PyObject *pending = metaq_getattr(acks, s_pending);
    if (pending == NULL)
        return -1;
    int busy = PyObject_IsTrue(pending);
    Py_DECREF(pending);
    if (busy)
        return busy < 0 ? -1 : 0;
    if (PyBytes_GET_SIZE(data) == 0) /* nothing to write (as the twin's send_now) */
        return 0;
    PyObject *fd_obj = metaq_getattr(conn, s_direct_fd);
    if (fd_obj == NULL)
        return -1;
    long fd = PyLong_AsLong(fd_obj);
    Py_DECREF(fd_obj);
    if (fd == -1 && PyErr_Occurred())
        return -1;
    const char *buf = PyBytes_AS_STRING(data);
    Py_ssize_t size = PyBytes_GET_SIZE(data), n;
    if (fd >= 0) {
        ssize_t sent;
        do {
            sent = send((int)fd, buf, (size_t)size, MSG_DONTWAIT | MSG_NOSIGNAL);
        } while (sent < 0 && errno == EINTR);
        if (sent < 0) {
            int err = errno;
            if (err == EAGAIN || err == EWOULDBLOCK)
                return 0;
            PyObject *e = PyLong_FromLong(err);
            if (e == NULL)
                return -1;
            PyObject *r = PyObject_CallMethodOneArg(conn, s_send_failed, e);
            Py_DECREF(e);
            if (r == NULL)
                return -1;
            Py_DECREF(r);
            return 0;
        }
        n = (Py_ssize_t)sent;
        if (n > 0 && n < size) {
            PyObject *rest = PyBytes_FromStringAndSize(buf + n, size - n);
            if (rest == NULL)
                return -1;
            PyObject *r = PyObject_CallMethodOneArg(conn, s_keep_unsent, rest);
            Py_DECREF(rest);
            if (r == NULL)
                return -1;
            Py_DECREF(r);
        }
    } else {
        PyObject *sent = PyObject_CallMethodOneArg(conn, s_try_send, data);
        if (sent == NULL)
            return -1;
        n = PyLong_Check(sent) ? PyLong_AsSsize_t(sent) : 0;
        Py_DECREF(sent);
        if (n == -1 && PyErr_Occurred())
            return -1;
    }
    if (n <= 0)
        return 0;
    if (add_unacked(acks, -(size >> 2)) < 0)
        return -1;
    if (n < size) { /* the writer writes what the connection keeps first */
        PyObject *q = PyObject_CallMethodOneArg(acks, s_queue, s_empty);
        if (q == NULL)
            return -1;
        Py_DECREF(q);
    }
    PyObject *event = metaq_getattr(acks, s_sent);
    if (event == NULL)
        return -1;
    if (event != Py_None) {
        PyObject *q = PyObject_CallMethodNoArgs(event, s_set);
        Py_DECREF(event);
        if (q == NULL)
            return -1;
        Py_DECREF(q);
    } else {
        Py_DECREF(event);
    }
    return 1;
}

PyObject *mqtt_pubacks_now(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3)
        return PyErr_Format(PyExc_TypeError, "mqtt_pubacks_now takes 3 arguments (%zd given)", nargs);
    int r = pubacks_now(args[0], args[1], args[2]);
    if (r < 0)
        return NULL;
    return Py_NewRef(r ? Py_True : Py_False);
}

/* The read's split: its entries, next pos, how many at QoS 1, their records' bytes and PUBACKs. */
typedef struct {
    PyObject *entries, *pubacks;
    Py_ssize_t pos, qos1, nbytes;
} turn_split;

/* The hand-back tuple: (entries, qos1, nbytes, pubacks, pos, taken). */
static PyObject *handed_back(const turn_split *sp, PyObject *taken) {
    PyObject *items[6] = {Py_NewRef(sp->entries), PyLong_FromSsize_t(sp->qos1), PyLong_FromSsize_t(sp->nbytes),
                          Py_NewRef(sp->pubacks), PyLong_FromSsize_t(sp->pos), Py_NewRef(taken)};
    return metaq_tuple_of(6, items);
}

PyObject *mqtt_plain_turn(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 20)
        return PyErr_Format(PyExc_TypeError, "mqtt_plain_turn takes 20 arguments (%zd given)", nargs);
    if (!interned())
        return NULL;
    PyObject *append = args[0], *counted = args[1], *path = args[2], *store = args[3], *deliver = args[4],
             *client_id = args[5], *acks = args[6], *conn = args[7], *largest = args[8], *frames_of = args[9],
             *publish = args[10], *most = args[11], *most_bytes = args[12], *data = args[13], *v5 = args[14],
             *max_packet = args[15], *plans = args[16], *decided = args[17], *room = args[18], *now = args[19];
    PyObject *zero = PyLong_FromLong(0);
    if (zero == NULL)
        return NULL;
    PyObject *sargs[10] = {data, zero, v5, max_packet, plans, decided, room, most, most_bytes, publish};
    metaq_publishes_in in;
    turn_split sp;
    int parsed = metaq_publishes_args(sargs, 10, &in);
    Py_DECREF(zero);
    if (!parsed)
        return NULL;
    Py_ssize_t size = in.b.len;
    sp.entries = metaq_read_publishes(&in, &sp.qos1, &sp.nbytes, &sp.pubacks);
    PyBuffer_Release(&in.b);
    if (sp.entries == NULL)
        return NULL;
    sp.pos = in.pos;
    PyObject *entries = sp.entries;
    Py_ssize_t n = PyList_GET_SIZE(entries);
    if (n == 0) {
        Py_DECREF(sp.entries);
        Py_DECREF(sp.pubacks);
        Py_RETURN_NONE;
    }
    PyObject *result = NULL, *fr = NULL, *appended = NULL, *keys = NULL, *cuts = NULL, *written_fn = NULL,
             *log_end = NULL; /* held: the runs go to Python with the wake */
    if (add_unacked(acks, sp.qos1) < 0)
        goto done;
    if (sp.pos < size) { /* other bytes follow them: the caller's */
        result = handed_back(&sp, Py_None);
        goto done;
    }
    PyObject *fr_args[2] = {entries, largest};
    fr = PyObject_Vectorcall(frames_of, fr_args, 2, NULL);
    if (fr == NULL)
        goto done;
    if (!PyTuple_Check(fr) || PyTuple_GET_SIZE(fr) != 4) {
        PyErr_SetString(PyExc_TypeError, "frames_of must return (frames, src, general, names)");
        goto done;
    }
    int general = PyObject_IsTrue(PyTuple_GET_ITEM(fr, 2));
    if (general < 0)
        goto done;
    if (general) { /* a record the burst writer does not take: the general path's */
        result = handed_back(&sp, Py_None);
        goto done;
    }
    PyObject *frames = PyTuple_GET_ITEM(fr, 0), *src = PyTuple_GET_ITEM(fr, 1);
    PyObject *append_args[3] = {frames, src, now};
    appended = PyObject_Vectorcall(append, append_args, 3, NULL);
    if (appended == NULL)
        goto done;
    if (!PyTuple_Check(appended) || PyTuple_GET_SIZE(appended) != 2 || !PyList_Check(PyTuple_GET_ITEM(appended, 1))) {
        PyErr_SetString(PyExc_TypeError, "append must return (taken, [runs])");
        goto done;
    }
    Py_ssize_t took = PyLong_AsSsize_t(PyTuple_GET_ITEM(appended, 0));
    if (took == -1 && PyErr_Occurred())
        goto done;
    PyObject *runs = PyTuple_GET_ITEM(appended, 1);
    keys = PySet_New(NULL);
    if (keys == NULL)
        goto done;
    Py_ssize_t nruns = PyList_GET_SIZE(runs);
    for (Py_ssize_t k = 0; k < nruns; k++) {
        PyObject *run = PyList_GET_ITEM(runs, k);
        if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) < 7 || !PyTuple_Check(PyTuple_GET_ITEM(run, 0)) ||
            PyTuple_GET_SIZE(PyTuple_GET_ITEM(run, 0)) < 1) {
            PyErr_SetString(PyExc_TypeError, "a run must be a BurstRun");
            goto done;
        }
        PyObject *key = PyTuple_GET_ITEM(run, 0);
        PyObject *counted_args[3] = {PyTuple_GET_ITEM(key, 0), PyTuple_GET_ITEM(run, 1), PyTuple_GET_ITEM(run, 2)};
        PyObject *c = PyObject_Vectorcall(counted, counted_args, 3, NULL);
        if (c == NULL)
            goto done;
        Py_DECREF(c);
        if (PySet_Add(keys, key) < 0)
            goto done;
    }
    log_end = nruns ? Py_NewRef(PyTuple_GET_ITEM(PyList_GET_ITEM(runs, nruns - 1), 6)) : NULL;
    if (took < n) { /* the burst writer stopped short: the rest through the general path */
        PyObject *zero_end = log_end ? NULL : PyLong_FromLong(0);
        if (!log_end && zero_end == NULL)
            goto done;
        PyObject *taken = PyTuple_Pack(6, frames, src, PyTuple_GET_ITEM(appended, 0), log_end ? log_end : zero_end,
                                       keys, runs);
        Py_XDECREF(zero_end);
        if (taken == NULL)
            goto done;
        result = handed_back(&sp, taken);
        Py_DECREF(taken);
        goto done;
    }
    /* all stored: nothing yielded since the writes, so the log's cuts are read now (the wake may yield) */
    cuts = metaq_getattr(store, s_log_cuts);
    if (cuts == NULL)
        goto done;
    written_fn = metaq_getattr(path, s_burst_written);
    if (written_fn == NULL)
        goto done;
    PyObject *dargs = PyTuple_Pack(5, keys, entries, runs, client_id, now);
    if (dargs == NULL)
        goto done;
    PyObject *mode = PyObject_CallFunctionObjArgs(written_fn, keys, now, Py_None, deliver, dargs, NULL);
    Py_DECREF(dargs);
    if (mode == NULL)
        goto done;
    int ack_now = PyLong_Check(mode) && PyLong_AsLong(mode) == 0;
    Py_DECREF(mode);
    PyObject *pubacks = sp.pubacks;
    if (PyBytes_Check(pubacks) && PyBytes_GET_SIZE(pubacks) > 0) {
        PyObject *wait;
        if (ack_now) {
            int sent = pubacks_now(acks, conn, pubacks);
            if (sent < 0)
                goto done;
            if (sent) {
                result = Py_NewRef(Py_True);
                goto done;
            }
            wait = Py_NewRef(Py_None);
        } else {
            PyObject *zero_end = log_end ? NULL : PyLong_FromLong(0);
            if (!log_end && zero_end == NULL)
                goto done;
            wait = PyTuple_Pack(4, keys, log_end ? log_end : zero_end, now, cuts);
            Py_XDECREF(zero_end);
            if (wait == NULL)
                goto done;
        }
        PyObject *r = PyObject_CallMethodObjArgs(acks, s_queue_pubacks, pubacks, wait, NULL);
        Py_DECREF(wait);
        if (r == NULL)
            goto done;
        Py_DECREF(r);
    }
    result = Py_NewRef(Py_True);
done:
    Py_XDECREF(log_end);
    Py_XDECREF(written_fn);
    Py_XDECREF(cuts);
    Py_XDECREF(keys);
    Py_XDECREF(appended);
    Py_XDECREF(fr);
    Py_DECREF(sp.entries);
    Py_DECREF(sp.pubacks);
    return result;
}
