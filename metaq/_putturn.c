/* What follows a burst's append, each the twin of one Python method (the tests hold each pair equal, state
 * included); each is bound to its object with functools.partial where the object is made, so a burst's wake costs
 * no Python frame:
 *
 *   store_should_flush(store, now_ms)        == metaq.store.store.MessageStore.should_flush(store, now_ms)
 *   put_visible(notify, should_flush, wake, keys, now, quiet=None, deliver=None, args=())
 *                                            == metaq.server.putpath.visible_py(...): BrokerWrites.visible
 *   waiters_notify(waiters, sleep, new_partition, keys, quiet=None, settle=False)
 *                                            == metaq.server.longpoll.PartitionWaiters.notify(waiters, keys, quiet,
 *                                               settle), ``gevent.sleep`` and ``NEW_PARTITION`` given
 *
 * The objects' own fields are read and set by name exactly as those methods do. */
#define PY_SSIZE_T_CLEAN
#include "_speedups.h"

static PyObject *s_pos, *s_written, *s_flushed, *s_last_flush_ms, *s_async, *s_config, *s_unflushed, *s_every,
    *s_interval;

static int interned(void) {
    if (s_interval != NULL)
        return 1;
#define INTERN(var, name)                                                                                             \
    if ((var = PyUnicode_InternFromString(name)) == NULL)                                                              \
        return 0;
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
    PyObject *pos = metaq_getattr(store, s_pos);
    if (pos == NULL)
        return NULL;
    PyObject *written = metaq_getattr(pos, s_written), *flushed = written ? metaq_getattr(pos, s_flushed) : NULL;
    int behind = flushed ? less(flushed, written) : -1; /* not (written <= flushed) */
    Py_XDECREF(written);
    Py_XDECREF(flushed);
    if (behind < 0) {
        Py_DECREF(pos);
        return NULL;
    }
    if (!behind) {
        Py_DECREF(pos);
        if (metaq_setattr(store, s_last_flush_ms, now) < 0)
            return NULL;
        Py_RETURN_FALSE;
    }
    PyObject *is_async = metaq_getattr(store, s_async);
    int a = is_async ? PyObject_IsTrue(is_async) : -1;
    Py_XDECREF(is_async);
    if (a <= 0) {
        Py_DECREF(pos);
        if (a < 0)
            return NULL;
        Py_RETURN_TRUE;
    }
    PyObject *cfg = metaq_getattr(store, s_config);
    PyObject *unflushed = cfg ? metaq_getattr(pos, s_unflushed) : NULL;
    Py_DECREF(pos);
    PyObject *every = unflushed ? metaq_getattr(cfg, s_every) : NULL;
    int due = every ? less(unflushed, every) : -1; /* due: not (unflushed < every) */
    Py_XDECREF(unflushed);
    Py_XDECREF(every);
    if (due >= 0)
        due = !due;
    if (due == 0) { /* or now - last >= interval */
        PyObject *last = metaq_getattr(store, s_last_flush_ms);
        PyObject *since = last ? PyNumber_Subtract(now, last) : NULL;
        PyObject *interval = since ? metaq_getattr(cfg, s_interval) : NULL;
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
    if (metaq_setattr(store, s_last_flush_ms, now) < 0)
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

static PyObject *s_waits, *s_made, *s_get, *s_set, *s_intersection_update;

static int interned_waits(void) {
    if (s_intersection_update != NULL)
        return 1;
    if ((s_waits = PyUnicode_InternFromString("_waits")) == NULL ||
        (s_made = PyUnicode_InternFromString("_made")) == NULL || (s_get = PyUnicode_InternFromString("get")) == NULL ||
        (s_set = PyUnicode_InternFromString("set")) == NULL ||
        (s_intersection_update = PyUnicode_InternFromString("intersection_update")) == NULL)
        return 0;
    return 1;
}

/* Set every Event of the iterable evs; 1 when there was one, 0 when none, -1 with an exception set. */
static int set_all(PyObject *evs) {
    PyObject *it = PyObject_GetIter(evs);
    if (it == NULL)
        return -1;
    int woke = 0;
    PyObject *ev;
    while ((ev = PyIter_Next(it)) != NULL) {
        woke = 1;
        PyObject *r = PyObject_CallMethodNoArgs(ev, s_set);
        Py_DECREF(ev);
        if (r == NULL) {
            Py_DECREF(it);
            return -1;
        }
        Py_DECREF(r);
    }
    Py_DECREF(it);
    return PyErr_Occurred() ? -1 : woke;
}

/* One key of notify: its waits (those quiet leaves waiting kept) woken. 1 when one was, 0, -1 with an error set. */
static int wake_key(PyObject *waits, PyObject *key, PyObject *quiet, int has_quiet) {
    PyObject *evs = PyDict_GetItemWithError(waits, key); /* borrowed */
    if (evs == NULL)
        return PyErr_Occurred() ? -1 : 0;
    Py_INCREF(evs);
    PyObject *stay = NULL;
    if (has_quiet) {
        stay = PyDict_Check(quiet) ? PyDict_GetItemWithError(quiet, key) : NULL;
        if (stay != NULL) {
            Py_INCREF(stay);
        } else if (PyErr_Occurred()) {
            Py_DECREF(evs);
            return -1;
        } else if (!PyDict_Check(quiet)) {
            stay = PyObject_CallMethodOneArg(quiet, s_get, key);
            if (stay == NULL) {
                Py_DECREF(evs);
                return -1;
            }
        }
    }
    int keep = stay == NULL ? 0 : PyObject_IsTrue(stay);
    PyObject *wake = evs; /* a new reference in every branch below */
    Py_INCREF(wake);
    if (keep < 0)
        goto fail;
    if (!keep) {
        if (PyDict_DelItem(waits, key) < 0)
            goto fail;
    } else {
        int all = PyObject_RichCompareBool(evs, stay, Py_LE);
        if (all < 0)
            goto fail;
        if (all) {
            Py_DECREF(wake);
            Py_DECREF(evs);
            Py_DECREF(stay);
            return 0; /* every wait there has it already: the map stays as it is */
        }
        PyObject *kept = PyNumber_And(evs, stay);
        if (kept == NULL)
            goto fail;
        int any = PyObject_IsTrue(kept);
        if (any > 0) {
            Py_DECREF(wake);
            wake = PyNumber_Subtract(evs, kept);
            PyObject *r = wake == NULL ? NULL : PyObject_CallMethodOneArg(evs, s_intersection_update, kept);
            Py_DECREF(kept);
            if (r == NULL)
                goto fail;
            Py_DECREF(r);
        } else {
            Py_DECREF(kept);
            if (any < 0 || PyDict_DelItem(waits, key) < 0)
                goto fail;
        }
    }
    Py_XDECREF(stay);
    Py_DECREF(evs);
    int woke = set_all(wake);
    Py_DECREF(wake);
    return woke;
fail:
    Py_XDECREF(wake);
    Py_XDECREF(stay);
    Py_DECREF(evs);
    return -1;
}

/* waiters_notify(waiters, sleep, new_partition, keys, quiet=None, settle=False) == PartitionWaiters.notify(waiters,
   keys, quiet, settle) with gevent.sleep and longpoll.NEW_PARTITION given. */
PyObject *waiters_notify(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 4 || nargs > 6)
        return PyErr_Format(PyExc_TypeError, "waiters_notify takes 4 to 6 arguments (%zd given)", nargs);
    if (!interned_waits())
        return NULL;
    PyObject *waiters = args[0], *sleep = args[1], *new_partition = args[2], *keys = args[3];
    PyObject *quiet = nargs > 4 ? args[4] : Py_None;
    int settle = 0;
    if (nargs > 5 && (settle = PyObject_IsTrue(args[5])) < 0)
        return NULL;
    PyObject *waits = metaq_getattr(waiters, s_waits);
    if (waits == NULL)
        return NULL;
    if (!PyDict_Check(waits)) {
        Py_DECREF(waits);
        return PyErr_Format(PyExc_TypeError, "the waiters' waits must be a dict");
    }
    if (PyDict_GET_SIZE(waits) == 0) {
        Py_DECREF(waits);
        Py_RETURN_FALSE;
    }
    int made = 0, has_quiet = 0, woke = 0, w;
    PyObject *made_obj = metaq_getattr(waiters, s_made);
    if (made_obj == NULL || (made = PyObject_IsTrue(made_obj)) < 0 ||
        (made && metaq_setattr(waiters, s_made, Py_False) < 0) ||
        (has_quiet = quiet == Py_None ? 0 : PyObject_IsTrue(quiet)) < 0) {
        Py_XDECREF(made_obj);
        Py_DECREF(waits);
        return NULL;
    }
    Py_DECREF(made_obj);
    PyObject *it = PyObject_GetIter(keys), *key;
    if (it == NULL) {
        Py_DECREF(waits);
        return NULL;
    }
    while ((key = PyIter_Next(it)) != NULL) {
        w = wake_key(waits, key, quiet, has_quiet);
        Py_DECREF(key);
        if (w < 0)
            break;
        woke |= w;
    }
    Py_DECREF(it);
    if (!PyErr_Occurred() && made && (w = wake_key(waits, new_partition, quiet, has_quiet)) > 0)
        woke = 1;
    Py_DECREF(waits);
    if (PyErr_Occurred())
        return NULL;
    if (woke && settle) {
        PyObject *zero = PyLong_FromLong(0);
        PyObject *r = zero == NULL ? NULL : PyObject_CallOneArg(sleep, zero);
        Py_XDECREF(zero);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
    }
    return PyBool_FromLong(woke);
}
