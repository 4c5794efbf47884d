/* The deliveries waiting on a publisher's burst served from its turn, in one C call (metaq.mqtt.direct.serve_waiting_py
 * in C; the tests hold the two equal):
 *
 *   mqtt_serve_waiting(waiting, readers, keep_decoded, deliver, most, keys, staged, runs, client_id, now)
 *       -> {key: {events}}
 *
 * ``waiting``: the port's {(topic, partition): {Delivery: None}}; ``readers``: the fan-out readers by the same keys;
 * ``keep_decoded(key, kruns, staged, client_id, now, made)`` and ``deliver(out, key, kruns, staged, client_id, now,
 * made)`` (direct.deliver_now): the port's and the module's Python steps, called only off the common path; ``most``:
 * how many deliveries a burst serves at most (limits.MQTT_DIRECT_DELIVERIES). Bound with functools.partial once per
 * port (MqttPort.deliver_now), so the burst's wake costs one C call: each waiting delivery's ``path`` (its
 * MqttDirectPath) is called without a Python frame between. */
#define PY_SSIZE_T_CLEAN
#include "_speedups.h"

static PyObject *s_path, *s_event, *s_out;

static int interned(void) {
    if (s_out != NULL)
        return 1;
    if ((s_path = PyUnicode_InternFromString("path")) == NULL || (s_event = PyUnicode_InternFromString("event")) == NULL)
        return 0;
    return (s_out = PyUnicode_InternFromString("out")) != NULL;
}

/* {key: [run, ...]} of the runs of partitions some delivery waits on, in log order; NULL with an exception set. */
static PyObject *runs_waited(PyObject *waiting, PyObject *runs) {
    PyObject *found = PyDict_New();
    if (found == NULL)
        return NULL;
    Py_ssize_t n = PyList_Check(runs) ? PyList_GET_SIZE(runs) : -1;
    if (n < 0) {
        Py_DECREF(found);
        PyErr_SetString(PyExc_TypeError, "runs must be a list");
        return NULL;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *run = PyList_GET_ITEM(runs, k);
        if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) < 1) {
            PyErr_SetString(PyExc_TypeError, "a run must be a BurstRun");
            goto fail;
        }
        PyObject *rkey = PyTuple_GET_ITEM(run, 0);
        int in = PyDict_Contains(waiting, rkey);
        if (in < 0)
            goto fail;
        if (!in)
            continue;
        PyObject *kruns = PyDict_GetItemWithError(found, rkey);
        if (kruns == NULL) {
            if (PyErr_Occurred())
                goto fail;
            kruns = PyList_New(0);
            if (kruns == NULL)
                goto fail;
            int bad = PyDict_SetItem(found, rkey, kruns) < 0;
            Py_DECREF(kruns); /* the dict holds it */
            if (bad)
                goto fail;
        }
        if (PyList_Append(kruns, run) < 0)
            goto fail;
    }
    return found;
fail:
    Py_DECREF(found);
    return NULL;
}

/* caught_up[key].add(event); -1 with an exception set. */
static int add_caught_up(PyObject *caught_up, PyObject *key, PyObject *event) {
    PyObject *events = PyDict_GetItemWithError(caught_up, key);
    if (events == NULL) {
        if (PyErr_Occurred())
            return -1;
        events = PySet_New(NULL);
        if (events == NULL)
            return -1;
        int bad = PyDict_SetItem(caught_up, key, events) < 0;
        Py_DECREF(events);
        if (bad)
            return -1;
    }
    return PySet_Add(events, event);
}

PyObject *mqtt_serve_waiting(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 10)
        return PyErr_Format(PyExc_TypeError, "mqtt_serve_waiting takes 10 arguments (%zd given)", nargs);
    PyObject *waiting = args[0], *readers = args[1], *keep_decoded = args[2], *deliver = args[3], *keys = args[5],
             *staged = args[6], *runs = args[7], *client_id = args[8], *now = args[9];
    if (!PyDict_Check(waiting) || !PyDict_Check(readers))
        return PyErr_Format(PyExc_TypeError, "waiting and readers must be dicts");
    Py_ssize_t left = PyLong_AsSsize_t(args[4]);
    if (left == -1 && PyErr_Occurred())
        return NULL;
    if (!interned())
        return NULL;
    PyObject *caught_up = PyDict_New();
    if (caught_up == NULL || PyDict_GET_SIZE(waiting) == 0)
        return caught_up;
    PyObject *found = NULL, *made = NULL, *it = PyObject_GetIter(keys), *key;
    if (it == NULL)
        goto fail;
    while ((key = PyIter_Next(it)) != NULL) {
        /* held: a path may take its delivery out of ``waiting``, and the dict out with the last one */
        PyObject *ds = PyDict_GetItemWithError(waiting, key);
        Py_XINCREF(ds);
        Py_ssize_t had = ds == NULL ? 0 : PyObject_Length(ds);
        if (had <= 0) {
            Py_XDECREF(ds);
            Py_DECREF(key);
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        if (found == NULL && (found = runs_waited(waiting, runs)) == NULL) {
            Py_DECREF(ds);
            Py_DECREF(key);
            goto fail;
        }
        PyObject *kruns = PyDict_GetItemWithError(found, key); /* borrowed: found holds it */
        if (kruns == NULL) {
            Py_DECREF(ds);
            Py_DECREF(key);
            if (PyErr_Occurred())
                goto fail;
            continue;
        }
        PyObject *listed = PySequence_List(ds);
        if (listed == NULL) {
            Py_DECREF(ds);
            Py_DECREF(key);
            goto fail;
        }
        Py_ssize_t served = 0, nds = PyList_GET_SIZE(listed);
        int bad = 0;
        for (Py_ssize_t k = 0; k < nds && !bad; k++) {
            if (left <= 0)
                break;
            left--;
            PyObject *d = PyList_GET_ITEM(listed, k);
            PyObject *path = metaq_getattr(d, s_path);
            if (path == NULL) {
                bad = 1;
                break;
            }
            PyObject *pargs[4] = {key, kruns, staged, client_id};
            PyObject *went = PyObject_Vectorcall(path, pargs, 4, NULL);
            Py_DECREF(path);
            if (went == Py_None) { /* not decided: the general path from the cursor it left */
                Py_DECREF(went);
                if (made == NULL && (made = PyDict_New()) == NULL) {
                    bad = 1;
                    break;
                }
                PyObject *out = metaq_getattr(d, s_out);
                if (out == NULL) {
                    bad = 1;
                    break;
                }
                PyObject *dargs[7] = {out, key, kruns, staged, client_id, now, made};
                went = PyObject_Vectorcall(deliver, dargs, 7, NULL);
                Py_DECREF(out);
            }
            if (went == NULL) {
                bad = 1;
                break;
            }
            int yes = PyObject_IsTrue(went);
            Py_DECREF(went);
            if (yes < 0) {
                bad = 1;
                break;
            }
            if (yes) {
                PyObject *event = metaq_getattr(d, s_event);
                if (event == NULL || add_caught_up(caught_up, key, event) < 0)
                    bad = 1;
                Py_XDECREF(event);
                served++;
            }
        }
        Py_DECREF(listed);
        if (!bad) {
            /* the ones it did not serve or leave caught up, and the fan-out reader, read the log later */
            Py_ssize_t now_len = PyObject_Length(ds);
            int keep = now_len < 0 ? -1 : served < now_len;
            if (keep == 0)
                keep = PyDict_Contains(readers, key);
            if (keep < 0) {
                bad = 1;
            } else if (keep) {
                if (made == NULL && (made = PyDict_New()) == NULL) {
                    bad = 1;
                } else {
                    PyObject *kargs[6] = {key, kruns, staged, client_id, now, made};
                    PyObject *r = PyObject_Vectorcall(keep_decoded, kargs, 6, NULL);
                    if (r == NULL)
                        bad = 1;
                    Py_XDECREF(r);
                }
            }
        }
        Py_DECREF(ds);
        Py_DECREF(key);
        if (bad)
            goto fail;
    }
    if (PyErr_Occurred())
        goto fail;
    Py_DECREF(it);
    Py_XDECREF(found);
    Py_XDECREF(made);
    return caught_up;
fail:
    Py_XDECREF(it);
    Py_XDECREF(found);
    Py_XDECREF(made);
    Py_DECREF(caught_up);
    return NULL;
}
