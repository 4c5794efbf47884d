/* What follows a burst's append, each the twin of one Python method (the tests hold each pair equal, state
 * included); each is bound to its object with functools.partial where the object is made, so a burst's wake and
 * count cost no Python frame:
 *
 *   stats_on_puts(stats, topic, count, size) == metaq.server.stats.BrokerStats.on_puts(stats, topic, count, size)
 *   store_should_flush(store, now_ms)        == metaq.store.store.MessageStore.should_flush(store, now_ms)
 *   put_visible(notify, should_flush, wake, keys, now, quiet=None, deliver=None, args=())
 *                                            == metaq.server.putpath.visible_py(...): BrokerWrites.visible
 *
 * The objects' own fields are read and set by name exactly as those methods do. */
#define PY_SSIZE_T_CLEAN
#include "_speedups.h"

static PyObject *s_cmd_put, *s_put_counters, *s_counters_of, *s_count, *s_value, *s_pos, *s_written, *s_flushed,
    *s_last_flush_ms, *s_async, *s_config, *s_unflushed, *s_every, *s_interval;

static int interned(void) {
    if (s_interval != NULL)
        return 1;
#define INTERN(var, name)                                                                                             \
    if ((var = PyUnicode_InternFromString(name)) == NULL)                                                              \
        return 0;
    INTERN(s_cmd_put, "cmd_put")
    INTERN(s_put_counters, "_put_counters")
    INTERN(s_counters_of, "_counters_of")
    INTERN(s_count, "count")
    INTERN(s_value, "value")
    INTERN(s_pos, "_pos")
    INTERN(s_written, "written")
    INTERN(s_flushed, "flushed")
    INTERN(s_last_flush_ms, "_last_flush_ms")
    INTERN(s_async, "_async")
    INTERN(s_config, "config")
    INTERN(s_unflushed, "unflushed_msgs")
    INTERN(s_every, "flush_every_messages")
    INTERN(s_interval, "flush_interval_ms")
#undef INTERN
    return 1;
}

/* obj.name += add (Python ints); 0 with an exception set. */
static int add_attr(PyObject *obj, PyObject *name, PyObject *add) {
    PyObject *v = PyObject_GetAttr(obj, name);
    if (v == NULL)
        return 0;
    PyObject *sum = PyNumber_Add(v, add);
    Py_DECREF(v);
    if (sum == NULL)
        return 0;
    int rc = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return rc == 0;
}

/* list[i] += add; 0 with an exception set. */
static int add_item(PyObject *list, Py_ssize_t i, PyObject *add) {
    PyObject *sum = PyNumber_Add(PyList_GET_ITEM(list, i), add);
    return sum != NULL && PyList_SetItem(list, i, sum) == 0;
}

PyObject *stats_on_puts(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4)
        return PyErr_Format(PyExc_TypeError, "stats_on_puts takes 4 arguments (%zd given)", nargs);
    if (!interned())
        return NULL;
    PyObject *stats = args[0], *topic = args[1], *count = args[2], *size = args[3];
    if (!add_attr(stats, s_cmd_put, count))
        return NULL;
    PyObject *kept = PyObject_GetAttr(stats, s_put_counters);
    if (kept == NULL)
        return NULL;
    PyObject *c = PyDict_GetItemWithError(kept, topic); /* borrowed */
    Py_XINCREF(c);
    Py_DECREF(kept);
    if (c == NULL) {
        if (PyErr_Occurred())
            return NULL;
        c = PyObject_CallMethodOneArg(stats, s_counters_of, topic);
        if (c == NULL)
            return NULL;
    }
    if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 5 || !PyList_Check(PyTuple_GET_ITEM(c, 4)) ||
        PyList_GET_SIZE(PyTuple_GET_ITEM(c, 4)) < 2) {
        Py_DECREF(c);
        return PyErr_Format(PyExc_TypeError, "a topic's put counters must be a 5-tuple ending with a list");
    }
    /* (broker put, broker message_size, topic put, topic message_size, topic totals) */
    PyObject *totals = PyTuple_GET_ITEM(c, 4);
    int ok = add_attr(PyTuple_GET_ITEM(c, 0), s_count, count) && add_attr(PyTuple_GET_ITEM(c, 0), s_value, count) &&
             add_attr(PyTuple_GET_ITEM(c, 1), s_count, count) && add_attr(PyTuple_GET_ITEM(c, 1), s_value, size) &&
             add_attr(PyTuple_GET_ITEM(c, 2), s_count, count) && add_attr(PyTuple_GET_ITEM(c, 2), s_value, count) &&
             add_attr(PyTuple_GET_ITEM(c, 3), s_count, count) && add_attr(PyTuple_GET_ITEM(c, 3), s_value, size) &&
             add_item(totals, 0, count) && add_item(totals, 1, size);
    Py_DECREF(c);
    if (!ok)
        return NULL;
    Py_RETURN_NONE;
}

/* a < b (rich compare); -1 with an exception set. */
static int less(PyObject *a, PyObject *b) {
    return PyObject_RichCompareBool(a, b, Py_LT);
}

PyObject *store_should_flush(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2)
        return PyErr_Format(PyExc_TypeError, "store_should_flush takes 2 arguments (%zd given)", nargs);
    if (!interned())
        return NULL;
    PyObject *store = args[0], *now = args[1];
    PyObject *pos = PyObject_GetAttr(store, s_pos);
    if (pos == NULL)
        return NULL;
    PyObject *written = PyObject_GetAttr(pos, s_written), *flushed = written ? PyObject_GetAttr(pos, s_flushed) : NULL;
    int behind = flushed ? less(flushed, written) : -1; /* not (written <= flushed) */
    Py_XDECREF(written);
    Py_XDECREF(flushed);
    if (behind < 0) {
        Py_DECREF(pos);
        return NULL;
    }
    if (!behind) {
        Py_DECREF(pos);
        if (PyObject_SetAttr(store, s_last_flush_ms, now) < 0)
            return NULL;
        Py_RETURN_FALSE;
    }
    PyObject *is_async = PyObject_GetAttr(store, s_async);
    int a = is_async ? PyObject_IsTrue(is_async) : -1;
    Py_XDECREF(is_async);
    if (a <= 0) {
        Py_DECREF(pos);
        if (a < 0)
            return NULL;
        Py_RETURN_TRUE;
    }
    PyObject *cfg = PyObject_GetAttr(store, s_config);
    PyObject *unflushed = cfg ? PyObject_GetAttr(pos, s_unflushed) : NULL;
    Py_DECREF(pos);
    PyObject *every = unflushed ? PyObject_GetAttr(cfg, s_every) : NULL;
    int due = every ? less(unflushed, every) : -1; /* due: not (unflushed < every) */
    Py_XDECREF(unflushed);
    Py_XDECREF(every);
    if (due >= 0)
        due = !due;
    if (due == 0) { /* or now - last >= interval */
        PyObject *last = PyObject_GetAttr(store, s_last_flush_ms);
        PyObject *since = last ? PyNumber_Subtract(now, last) : NULL;
        PyObject *interval = since ? PyObject_GetAttr(cfg, s_interval) : NULL;
        due = interval ? less(since, interval) : -1;
        if (due >= 0)
            due = !due;
        Py_XDECREF(last);
        Py_XDECREF(since);
        Py_XDECREF(interval);
    }
    Py_XDECREF(cfg);
    if (due < 0)
        return NULL;
    if (!due)
        Py_RETURN_FALSE;
    if (PyObject_SetAttr(store, s_last_flush_ms, now) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

/* put_visible(notify, should_flush, wake, keys, now, quiet=None, deliver=None, args=()): ACK_NOW (0). */
PyObject *put_visible(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 5 || nargs > 8)
        return PyErr_Format(PyExc_TypeError, "put_visible takes 5 to 8 arguments (%zd given)", nargs);
    PyObject *notify = args[0], *should_flush = args[1], *wake = args[2], *keys = args[3], *now = args[4];
    PyObject *quiet = nargs > 5 ? args[5] : Py_None, *deliver = nargs > 6 ? args[6] : Py_None;
    Py_INCREF(quiet);
    if (deliver != Py_None) {
        PyObject *dargs = nargs > 7 ? args[7] : NULL;
        if (dargs != NULL && !PyTuple_Check(dargs)) {
            Py_DECREF(quiet);
            return PyErr_Format(PyExc_TypeError, "put_visible's args must be a tuple");
        }
        PyObject *q = dargs == NULL ? PyObject_CallNoArgs(deliver) : PyObject_Call(deliver, dargs, NULL);
        Py_DECREF(quiet);
        if (q == NULL)
            return NULL;
        quiet = q;
    }
    PyObject *nargs3[3] = {keys, quiet, Py_True};
    PyObject *r = PyObject_Vectorcall(notify, nargs3, 3, NULL);
    Py_DECREF(quiet);
    if (r == NULL)
        return NULL;
    Py_DECREF(r);
    r = PyObject_Vectorcall(should_flush, &now, 1, NULL);
    if (r == NULL)
        return NULL;
    int due = PyObject_IsTrue(r);
    Py_DECREF(r);
    if (due < 0)
        return NULL;
    if (due) {
        r = PyObject_CallNoArgs(wake);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    return PyLong_FromLong(0);
}
