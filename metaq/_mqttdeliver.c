/* An MQTT subscriber's two per-message steps, each one C call kept per subscriber (the tests hold each to its twin):
 *
 *   MqttDirectPath(out)(key, runs, staged, client_id) -> True | False | None
 *       metaq.mqtt.direct.DirectPathPy: a waiting subscriber's share of a publisher's burst, the plain QoS 1 runs
 *       written in one step (metaq_direct_run); None when the general path (direct.deliver_now) is to decide.
 *   MqttAckTurn(subscriptions, conn, state)(parser, data) -> True | False | None
 *       metaq.mqtt.subscriptions.Subscriptions.read_pubacks_py: a read beginning with PUBACKs, their messages in
 *       flight ended (metaq_end_acks), the delivery woken when one of them would have woken it.
 *
 * Each holds the references and fields fixed for its connection's life (made after its CONNECT) and reads the few
 * that move by name at each call; what an owner keeps for it (the plain names of Outbound.plain_names) it drops at
 * the owner's word (drop) or when the stamp it was kept at moves. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>

#include "_speedups.h"

static PyObject *dv_keys[26];
static const char *const DV_KEY_NAMES[26] = {
    "conn",   "session",     "port",         "put_path",        "version",         "client_max_packet",
    "tls",    "outbound_aliases", "client_id", "cursors",       "inflight",        "where",
    "closed", "direct_fd",   "user",         "changes",         "plain_names",     "inflight_window",
    "shared", "keep_unsent", "send_failed",  "mqtt",            "delivery",        "dirty",
    "wake",   "receive_data"};
enum {
    K_CONN, K_SESSION, K_PORT, K_PUT_PATH, K_VERSION, K_CLIENT_MAX_PACKET,
    K_TLS, K_OUTBOUND_ALIASES, K_CLIENT_ID, K_CURSORS, K_INFLIGHT, K_WHERE,
    K_CLOSED, K_DIRECT_FD, K_USER, K_CHANGES, K_PLAIN_NAMES, K_INFLIGHT_WINDOW,
    K_SHARED, K_KEEP_UNSENT, K_SEND_FAILED, K_MQTT, K_DELIVERY, K_DIRTY,
    K_WAKE, K_RECEIVE_DATA
};
/* the parser's own fields, read as MqttParser.end_acks reads them (its C twin) */
static PyObject *dv_buf, *dv_pos, *dv_fatal, *dv_eof, *dv_max_packet, *dv_completed, *dv_read_py;

static int dv_ready(void) {
    if (dv_read_py != NULL)
        return 0;
    for (int k = 0; k < 26; k++) {
        if (dv_keys[k] == NULL && (dv_keys[k] = PyUnicode_InternFromString(DV_KEY_NAMES[k])) == NULL)
            return -1;
    }
    if ((dv_buf = PyUnicode_InternFromString("_buf")) == NULL || (dv_pos = PyUnicode_InternFromString("_pos")) == NULL ||
        (dv_fatal = PyUnicode_InternFromString("_fatal")) == NULL ||
        (dv_eof = PyUnicode_InternFromString("_eof")) == NULL ||
        (dv_max_packet = PyUnicode_InternFromString("max_packet")) == NULL ||
        (dv_completed = PyUnicode_InternFromString("_completed")) == NULL ||
        (dv_read_py = PyUnicode_InternFromString("read_pubacks_py")) == NULL)
        return -1;
    return 0;
}

/* obj.name truthy: 1, 0, or -1 with an error set. */
static int dv_truthy(PyObject *obj, PyObject *name) {
    PyObject *v = metaq_getattr(obj, name);
    if (v == NULL)
        return -1;
    int r = PyObject_IsTrue(v);
    Py_DECREF(v);
    return r;
}

/* obj.name as a C long (-1 with an error set when it is not an int). */
static long dv_long(PyObject *obj, PyObject *name) {
    PyObject *v = metaq_getattr(obj, name);
    if (v == NULL)
        return -1;
    long r = PyLong_AsLong(v);
    Py_DECREF(v);
    return r;
}

/* ==== MqttDirectPath =========================================================================================== */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *out, *conn, *session, *put_path, *client_id, *cursors, *inflight, *where;
    int usable; /* not TLS, no outbound topic aliases */
    int v5;
    Py_ssize_t max_packet; /* -1: none */
    /* what plain_names answered last, and the stamp it stands with: (put path version, user, changes) */
    PyObject *kept_topic, *kept_names, *kept_version, *kept_user, *kept_changes;
    int kept_own;
} DirectPath;

static void dp_drop_kept(DirectPath *p) {
    Py_CLEAR(p->kept_topic);
    Py_CLEAR(p->kept_names);
    Py_CLEAR(p->kept_version);
    Py_CLEAR(p->kept_user);
    Py_CLEAR(p->kept_changes);
}

static int dp_traverse(DirectPath *p, visitproc visit, void *arg) {
    Py_VISIT(p->out);
    Py_VISIT(p->conn);
    Py_VISIT(p->session);
    Py_VISIT(p->put_path);
    Py_VISIT(p->client_id);
    Py_VISIT(p->cursors);
    Py_VISIT(p->inflight);
    Py_VISIT(p->where);
    Py_VISIT(p->kept_topic);
    Py_VISIT(p->kept_names);
    Py_VISIT(p->kept_version);
    Py_VISIT(p->kept_user);
    Py_VISIT(p->kept_changes);
    return 0;
}

static int dp_clear(DirectPath *p) {
    Py_CLEAR(p->out);
    Py_CLEAR(p->conn);
    Py_CLEAR(p->session);
    Py_CLEAR(p->put_path);
    Py_CLEAR(p->client_id);
    Py_CLEAR(p->cursors);
    Py_CLEAR(p->inflight);
    Py_CLEAR(p->where);
    dp_drop_kept(p);
    return 0;
}

static void dp_dealloc(DirectPath *p) {
    PyObject_GC_UnTrack(p);
    dp_clear(p);
    Py_TYPE(p)->tp_free((PyObject *)p);
}

/* The current stamp's parts (new references); -1 with an error set. */
static int dp_stamp(DirectPath *p, PyObject **version, PyObject **user, PyObject **changes) {
    *version = *user = *changes = NULL;
    if ((*version = metaq_getattr(p->put_path, dv_keys[K_VERSION])) == NULL)
        return -1;
    PyObject *core = metaq_getattr(p->conn, dv_keys[K_SESSION]);
    if (core == NULL)
        goto fail;
    *user = metaq_getattr(core, dv_keys[K_USER]);
    Py_DECREF(core);
    if (*user == NULL)
        goto fail;
    if ((*changes = metaq_getattr(p->session, dv_keys[K_CHANGES])) == NULL)
        goto fail;
    return 0;
fail:
    Py_CLEAR(*version);
    Py_CLEAR(*user);
    return -1;
}

static int dp_same(PyObject *a, PyObject *b) {
    if (a == b)
        return 1;
    if (a == NULL || b == NULL)
        return 0;
    return PyObject_RichCompareBool(a, b, Py_EQ);
}

/* The plain names of (topic, own), borrowed from the kept ones; NULL with no error: not sendable (the general path);
 * NULL with an error set: an error. */
static PyObject *dp_names(DirectPath *p, PyObject *topic, int own) {
    PyObject *version, *user, *changes;
    if (dp_stamp(p, &version, &user, &changes) < 0)
        return NULL;
    int same = p->kept_names != NULL && p->kept_own == own;
    if (same)
        same = dp_same(p->kept_topic, topic);
    if (same > 0)
        same = dp_same(p->kept_version, version);
    if (same > 0)
        same = dp_same(p->kept_user, user);
    if (same > 0)
        same = dp_same(p->kept_changes, changes);
    if (same < 0)
        goto fail;
    if (same) {
        Py_DECREF(version);
        Py_DECREF(user);
        Py_DECREF(changes);
        return p->kept_names;
    }
    dp_drop_kept(p);
    PyObject *names = PyObject_CallMethodObjArgs(p->out, dv_keys[K_PLAIN_NAMES], topic, own ? Py_True : Py_False,
                                                 NULL);
    if (names == NULL)
        goto fail;
    if (!PyDict_Check(names)) { /* None: not sendable, the general path says so */
        Py_DECREF(names);
        Py_DECREF(version);
        Py_DECREF(user);
        Py_DECREF(changes);
        return NULL;
    }
    /* kept with the stamp read after the call (plain_names made its own stamp current; nothing yields in it) */
    Py_DECREF(version);
    Py_DECREF(user);
    Py_DECREF(changes);
    if (dp_stamp(p, &version, &user, &changes) < 0) {
        Py_DECREF(names);
        return NULL;
    }
    Py_INCREF(topic);
    p->kept_topic = topic;
    p->kept_names = names;
    p->kept_own = own;
    p->kept_version = version;
    p->kept_user = user;
    p->kept_changes = changes;
    return names;
fail:
    Py_XDECREF(version);
    Py_XDECREF(user);
    Py_XDECREF(changes);
    return NULL;
}

static PyObject *dp_none(void) { Py_RETURN_NONE; }

static long long dv_item_ll(PyObject *tuple, Py_ssize_t i) {
    if (!PyTuple_Check(tuple) || PyTuple_GET_SIZE(tuple) <= i) {
        PyErr_SetString(PyExc_TypeError, "MqttDirectPath: a run must be a BurstRun");
        return -1;
    }
    return PyLong_AsLongLong(PyTuple_GET_ITEM(tuple, i));
}

static PyObject *dp_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    DirectPath *p = (DirectPath *)self;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 4 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "MqttDirectPath takes (key, runs, staged, client_id)");
        return NULL;
    }
    PyObject *key = args[0], *runs = args[1], *staged = args[2], *client_id = args[3];
    if (!p->usable || p->conn == NULL)
        return dp_none();
    int closed = dv_truthy(p->conn, dv_keys[K_CLOSED]);
    if (closed)
        return closed < 0 ? NULL : dp_none();
    long fd = dv_long(p->conn, dv_keys[K_DIRECT_FD]);
    if (fd == -1 && PyErr_Occurred())
        return NULL;
    if (fd < 0)
        return dp_none(); /* not writable by descriptor now: try_send's way */
    if (!PyTuple_Check(key) || PyTuple_GET_SIZE(key) != 2 || !PyList_Check(runs) || PyList_GET_SIZE(runs) == 0) {
        PyErr_SetString(PyExc_TypeError, "MqttDirectPath: key must be (topic, partition), runs a non-empty list");
        return NULL;
    }
    PyObject *cursor = PyDict_GetItemWithError(p->cursors, key); /* borrowed */
    if (cursor == NULL)
        return PyErr_Occurred() ? NULL : dp_none();
    long long offset = PyLong_AsLongLong(cursor);
    PyObject *run0 = PyList_GET_ITEM(runs, 0), *runz = PyList_GET_ITEM(runs, PyList_GET_SIZE(runs) - 1);
    long long first = dv_item_ll(run0, 4);
    long long end = dv_item_ll(runz, 4) + dv_item_ll(runz, 1);
    if (PyErr_Occurred())
        return NULL;
    if (offset < first || offset >= end)
        return dp_none(); /* behind the burst (read from the log) or past it: the general path */
    PyObject *topic = PyTuple_GET_ITEM(key, 0), *partition = PyTuple_GET_ITEM(key, 1);
    int own = PyObject_IsTrue(client_id);
    if (own < 0)
        return NULL;
    own = PyObject_RichCompareBool(own ? client_id : Py_None, p->client_id, Py_EQ);
    if (own < 0)
        return NULL;
    PyObject *names = dp_names(p, topic, own);
    if (names == NULL)
        return PyErr_Occurred() ? NULL : dp_none();
    Py_INCREF(names); /* a call below may drop the kept one */
    PyObject *result = NULL;
    long window_l = dv_long(p->conn, dv_keys[K_INFLIGHT_WINDOW]);
    if (window_l == -1 && PyErr_Occurred())
        goto done;
    Py_ssize_t nruns = PyList_GET_SIZE(runs);
    for (Py_ssize_t r = 0; r < nruns; r++) {
        PyObject *run = PyList_GET_ITEM(runs, r);
        long long start = dv_item_ll(run, 4), count = dv_item_ll(run, 1), at = dv_item_ll(run, 5);
        if (PyErr_Occurred())
            goto done;
        if (offset >= start + count)
            continue;
        Py_ssize_t went = 0;
        int state = 0, err = 0;
        PyObject *rest = NULL;
        if (metaq_direct_run(fd, staged, (Py_ssize_t)(at + offset - start), (Py_ssize_t)(at + count), names,
                             p->session, p->inflight, p->where, topic, partition, offset, (Py_ssize_t)window_l, p->v5,
                             p->max_packet, &went, &state, &rest, &err) < 0)
            goto done;
        offset += went;
        PyObject *now = PyLong_FromLongLong(offset);
        if (now == NULL || PyDict_SetItem(p->cursors, key, now) < 0) {
            Py_XDECREF(now);
            Py_XDECREF(rest);
            goto done;
        }
        Py_DECREF(now);
        if (state == 0)
            continue;
        if (state == 2) { /* SHORT: direct._short */
            PyObject *r2 = NULL;
            if (rest != NULL)
                r2 = PyObject_CallMethodOneArg(p->conn, dv_keys[K_KEEP_UNSENT], rest);
            else if (err) {
                PyObject *e = PyLong_FromLong(err);
                if (e != NULL)
                    r2 = PyObject_CallMethodOneArg(p->conn, dv_keys[K_SEND_FAILED], e);
                Py_XDECREF(e);
            } else
                r2 = Py_NewRef(Py_None);
            Py_XDECREF(rest);
            if (r2 == NULL)
                goto done;
            Py_DECREF(r2);
            result = Py_NewRef(Py_False);
            goto done;
        }
        Py_XDECREF(rest);
        result = dp_none(); /* DECIDE: the general path takes it from the cursor */
        goto done;
    }
    {
        int shared = dv_truthy(p->session, dv_keys[K_SHARED]);
        if (shared < 0)
            goto done;
        result = shared ? dp_none() : Py_NewRef(Py_True); /* a shared group's copy: the general path says */
    }
done:
    Py_DECREF(names);
    return result;
}

static PyObject *dp_drop(PyObject *self, PyObject *unused) {
    dp_drop_kept((DirectPath *)self);
    Py_RETURN_NONE;
}

static PyMethodDef dp_methods[] = {
    {"drop", dp_drop, METH_NOARGS, "drop(): forget the plain names kept (the outbound dropped its own)."},
    {NULL, NULL, 0, NULL}};

static PyObject *dp_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *out;
    if (!PyArg_ParseTuple(args, "O:MqttDirectPath", &out) || dv_ready() < 0)
        return NULL;
    DirectPath *p = (DirectPath *)type->tp_alloc(type, 0);
    if (p == NULL)
        return NULL;
    p->vectorcall = dp_call;
    p->max_packet = -1;
    PyObject *port = NULL, *v = NULL;
    if ((p->out = Py_NewRef(out)) == NULL || (p->conn = metaq_getattr(out, dv_keys[K_CONN])) == NULL ||
        (p->session = metaq_getattr(out, dv_keys[K_SESSION])) == NULL ||
        (port = metaq_getattr(out, dv_keys[K_PORT])) == NULL ||
        (p->put_path = metaq_getattr(port, dv_keys[K_PUT_PATH])) == NULL ||
        (p->client_id = metaq_getattr(p->session, dv_keys[K_CLIENT_ID])) == NULL ||
        (p->cursors = metaq_getattr(p->session, dv_keys[K_CURSORS])) == NULL ||
        (p->inflight = metaq_getattr(p->session, dv_keys[K_INFLIGHT])) == NULL ||
        (p->where = metaq_getattr(p->session, dv_keys[K_WHERE])) == NULL)
        goto fail;
    if (!PyDict_Check(p->cursors) || !PyDict_Check(p->inflight) || !PyDict_Check(p->where)) {
        PyErr_SetString(PyExc_TypeError, "MqttDirectPath: the session's cursors, inflight and where must be dicts");
        goto fail;
    }
    if ((v = metaq_getattr(p->conn, dv_keys[K_VERSION])) == NULL)
        goto fail;
    p->v5 = PyLong_Check(v) && PyLong_AsLong(v) == 5;
    Py_CLEAR(v);
    if ((v = metaq_getattr(p->conn, dv_keys[K_CLIENT_MAX_PACKET])) == NULL)
        goto fail;
    if (v != Py_None && (p->max_packet = PyLong_AsSsize_t(v)) == -1 && PyErr_Occurred())
        goto fail;
    Py_CLEAR(v);
    int tls = dv_truthy(p->conn, dv_keys[K_TLS]);
    if (tls < 0 || (v = metaq_getattr(p->conn, dv_keys[K_OUTBOUND_ALIASES])) == NULL)
        goto fail;
    p->usable = !tls && v == Py_None;
    Py_CLEAR(v);
    Py_DECREF(port);
    return (PyObject *)p;
fail:
    Py_XDECREF(port);
    Py_XDECREF(v);
    Py_DECREF(p);
    return NULL;
}

PyTypeObject MqttDirectPathType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "metaq._speedups.MqttDirectPath",
    .tp_basicsize = sizeof(DirectPath),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "MqttDirectPath(out): metaq.mqtt.direct.DirectPathPy in C: path(key, runs, staged, client_id).",
    .tp_new = dp_new,
    .tp_dealloc = (destructor)dp_dealloc,
    .tp_traverse = (traverseproc)dp_traverse,
    .tp_clear = (inquiry)dp_clear,
    .tp_vectorcall_offset = offsetof(DirectPath, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_methods = dp_methods,
};

/* ==== MqttAckTurn ============================================================================================== */

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *subs, *conn, *state;
    PyObject *session, *inflight, *where; /* the connection's session and its dicts, kept while it is the same */
} AckTurn;

static int at_traverse(AckTurn *a, visitproc visit, void *arg) {
    Py_VISIT(a->subs);
    Py_VISIT(a->conn);
    Py_VISIT(a->state);
    Py_VISIT(a->session);
    Py_VISIT(a->inflight);
    Py_VISIT(a->where);
    return 0;
}

static int at_clear(AckTurn *a) {
    Py_CLEAR(a->subs);
    Py_CLEAR(a->conn);
    Py_CLEAR(a->state);
    Py_CLEAR(a->session);
    Py_CLEAR(a->inflight);
    Py_CLEAR(a->where);
    return 0;
}

static void at_dealloc(AckTurn *a) {
    PyObject_GC_UnTrack(a);
    at_clear(a);
    Py_TYPE(a)->tp_free((PyObject *)a);
}

/* The general way: Subscriptions.read_pubacks_py(parser, data). */
static PyObject *at_general(AckTurn *a, PyObject *parser, PyObject *data) {
    return PyObject_CallMethodObjArgs(a->subs, dv_read_py, parser, data, NULL);
}

static PyObject *at_call(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    AckTurn *a = (AckTurn *)self;
    if (PyVectorcall_NARGS(nargsf) != 2 || kwnames != NULL) {
        PyErr_SetString(PyExc_TypeError, "MqttAckTurn takes (parser, data)");
        return NULL;
    }
    PyObject *parser = args[0], *data = args[1];
    if (a->subs == NULL || !PyBytes_CheckExact(data) || PyBytes_GET_SIZE(data) == 0)
        return at_general(a, parser, data);
    PyObject *session = metaq_getattr(a->conn, dv_keys[K_MQTT]);
    if (session == NULL)
        return NULL;
    if (session != a->session) {
        PyObject *inflight = metaq_getattr(session, dv_keys[K_INFLIGHT]), *where = NULL;
        if (inflight == NULL || (where = metaq_getattr(session, dv_keys[K_WHERE])) == NULL ||
            !PyDict_Check(inflight) || !PyDict_Check(where)) {
            Py_XDECREF(inflight);
            Py_XDECREF(where);
            Py_DECREF(session);
            return PyErr_Occurred() ? NULL : at_general(a, parser, data);
        }
        Py_XSETREF(a->session, Py_NewRef(session));
        Py_XSETREF(a->inflight, inflight);
        Py_XSETREF(a->where, where);
    }
    Py_DECREF(session);
    session = a->session;
    /* MqttParser.end_acks' test: nothing buffered before data, no refusal, not at the end, the version known */
    PyObject *buf = metaq_getattr(parser, dv_buf);
    if (buf == NULL)
        return NULL;
    Py_ssize_t buffered = PyObject_Length(buf);
    Py_DECREF(buf);
    long pos0 = dv_long(parser, dv_pos);
    if (buffered < 0 || (pos0 == -1 && PyErr_Occurred()))
        return NULL;
    PyObject *fatal = metaq_getattr(parser, dv_fatal);
    if (fatal == NULL)
        return NULL;
    int refused = fatal != Py_None;
    Py_DECREF(fatal);
    int eof = dv_truthy(parser, dv_eof);
    if (eof < 0)
        return NULL;
    PyObject *version = metaq_getattr(parser, dv_keys[K_VERSION]);
    if (version == NULL)
        return NULL;
    long level = version == Py_None ? -1 : PyLong_AsLong(version);
    Py_DECREF(version);
    if (level == -1 && PyErr_Occurred())
        return NULL;
    if (pos0 < buffered || refused || eof || level < 0)
        return at_general(a, parser, data);
    long max_packet = dv_long(parser, dv_max_packet);
    if (max_packet == -1 && PyErr_Occurred())
        return NULL;
    Py_ssize_t len = PyBytes_GET_SIZE(data), taken = 0, ended = 0;
    Py_ssize_t pos = metaq_end_acks((const unsigned char *)PyBytes_AS_STRING(data), len, 0, level == 5, max_packet,
                                    a->inflight, a->where, a->state, &taken, &ended);
    if (pos < 0)
        return NULL;
    if (taken) {
        long completed = dv_long(parser, dv_completed);
        if (completed == -1 && PyErr_Occurred())
            return NULL;
        PyObject *c = PyLong_FromLong(completed + (long)taken);
        if (c == NULL || metaq_setattr(parser, dv_completed, c) < 0) {
            Py_XDECREF(c);
            return NULL;
        }
        Py_DECREF(c);
    }
    int rest = pos < len;
    if (rest) { /* what follows them: buffered for the general path */
        PyObject *tail = pos ? PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + pos, len - pos) : Py_NewRef(data);
        if (tail == NULL)
            return NULL;
        PyObject *r = PyObject_CallMethodOneArg(parser, dv_keys[K_RECEIVE_DATA], tail);
        Py_DECREF(tail);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    if (!taken)
        Py_RETURN_NONE;
    if (ended) {
        if (metaq_setattr(session, dv_keys[K_DIRTY], Py_True) < 0)
            return NULL;
        PyObject *delivery = metaq_getattr(a->subs, dv_keys[K_DELIVERY]);
        if (delivery == NULL)
            return NULL;
        if (delivery != Py_None) {
            int wake = dv_truthy(session, dv_keys[K_SHARED]);
            if (wake == 0) {
                long window = dv_long(a->conn, dv_keys[K_INFLIGHT_WINDOW]);
                if (window == -1 && PyErr_Occurred())
                    wake = -1;
                else
                    wake = PyDict_GET_SIZE(a->inflight) + ended >= window;
            }
            PyObject *r = NULL;
            if (wake > 0)
                r = PyObject_CallMethodNoArgs(delivery, dv_keys[K_WAKE]);
            if (wake < 0 || (wake > 0 && r == NULL)) {
                Py_DECREF(delivery);
                return NULL;
            }
            Py_XDECREF(r);
        }
        Py_DECREF(delivery);
    }
    int closed = dv_truthy(a->conn, dv_keys[K_CLOSED]);
    if (closed < 0)
        return NULL;
    if (closed)
        Py_RETURN_FALSE;
    if (rest)
        Py_RETURN_NONE;
    Py_RETURN_TRUE;
}

static PyObject *at_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    PyObject *subs, *conn, *state;
    if (!PyArg_ParseTuple(args, "OOO:MqttAckTurn", &subs, &conn, &state) || dv_ready() < 0)
        return NULL;
    AckTurn *a = (AckTurn *)type->tp_alloc(type, 0);
    if (a == NULL)
        return NULL;
    a->vectorcall = at_call;
    a->subs = Py_NewRef(subs);
    a->conn = Py_NewRef(conn);
    a->state = Py_NewRef(state);
    return (PyObject *)a;
}

PyTypeObject MqttAckTurnType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "metaq._speedups.MqttAckTurn",
    .tp_basicsize = sizeof(AckTurn),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "MqttAckTurn(subscriptions, conn, state): Subscriptions.read_pubacks_py in C: turn(parser, data).",
    .tp_new = at_new,
    .tp_dealloc = (destructor)at_dealloc,
    .tp_traverse = (traverseproc)at_traverse,
    .tp_clear = (inquiry)at_clear,
    .tp_vectorcall_offset = offsetof(AckTurn, vectorcall),
    .tp_call = PyVectorcall_Call,
};
