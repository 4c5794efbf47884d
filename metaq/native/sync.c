/*
 * metaq.native._bytes: SyncWorker, fdatasync in a thread of its own that never takes the GIL
 * (metaq/server/flusher.py). Compiled into the same extension; module.c registers the type.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <pthread.h>
#include <unistd.h>

#include "native.h"

/*
 * A Python thread that runs os.fdatasync must take the GIL back before it can say the sync is done, and
 * a busy event loop holds the GIL: measured here, a group commit's ack waited 0.5 ms (p50) for that, more
 * than the fdatasync itself. This thread waits on a pthread condition variable, syncs the descriptors it
 * was given and writes a 4-byte result (0 or the errno, native byte order) to `notify_fd`, a pipe the
 * event loop watches, all without the GIL. One job at a time: submit() refuses a second one until the
 * result of the first has been written. The descriptors must stay open until then (the caller owns them).
 */

#define SYNC_MAX_FDS 16

typedef struct {
    PyObject_HEAD
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int started, stop, pending, busy, notify_fd, nfds;
    int fds[SYNC_MAX_FDS];
} SyncWorker;

static void *sync_worker_main(void *arg) {
    SyncWorker *w = (SyncWorker *)arg;
    int fds[SYNC_MAX_FDS];
    for (;;) {
        pthread_mutex_lock(&w->mu);
        while (!w->pending && !w->stop)
            pthread_cond_wait(&w->cv, &w->mu);
        if (!w->pending) { /* stop, nothing left to do */
            pthread_mutex_unlock(&w->mu);
            return NULL;
        }
        int n = w->nfds;
        memcpy(fds, w->fds, sizeof(int) * (size_t)n);
        w->pending = 0;
        w->busy = 1;
        pthread_mutex_unlock(&w->mu);
        int32_t result = 0;
        for (int k = 0; k < n; k++) {
            if (fdatasync(fds[k]) != 0) {
                result = errno ? errno : EIO;
                break;
            }
        }
        pthread_mutex_lock(&w->mu);
        w->busy = 0; /* before the result is written: the loop may submit again as soon as it reads it */
        pthread_mutex_unlock(&w->mu);
        const char *p = (const char *)&result;
        size_t left = sizeof result;
        while (left > 0) {
            ssize_t k = write(w->notify_fd, p, left);
            if (k < 0 && errno == EINTR)
                continue;
            if (k <= 0)
                break; /* the pipe is gone: the owner closed it, nobody waits */
            p += k;
            left -= (size_t)k;
        }
    }
}

static int sync_worker_init(SyncWorker *w, PyObject *args, PyObject *kwds) {
    int notify_fd;
    if (!PyArg_ParseTuple(args, "i", &notify_fd))
        return -1;
    if (w->started) {
        PyErr_SetString(PyExc_RuntimeError, "SyncWorker already started");
        return -1;
    }
    w->notify_fd = notify_fd;
    w->stop = w->pending = w->busy = w->nfds = 0;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int err = pthread_create(&w->thread, NULL, sync_worker_main, w);
    if (err != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    w->started = 1;
    return 0;
}

static PyObject *sync_worker_submit(SyncWorker *w, PyObject *arg) {
    if (!w->started)
        return PyErr_Format(PyExc_RuntimeError, "SyncWorker not running");
    PyObject *seq = PySequence_Fast(arg, "submit() takes a sequence of file descriptors");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    int fds[SYNC_MAX_FDS];
    if (n < 1 || n > SYNC_MAX_FDS) {
        Py_DECREF(seq);
        return PyErr_Format(PyExc_ValueError, "submit() takes 1 to %d descriptors, got %zd", SYNC_MAX_FDS, n);
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, k));
        if (fd == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        if (fd < 0 || fd > INT_MAX) {
            Py_DECREF(seq);
            return PyErr_Format(PyExc_ValueError, "bad file descriptor %ld", fd);
        }
        fds[k] = (int)fd;
    }
    Py_DECREF(seq);
    pthread_mutex_lock(&w->mu);
    if (w->pending || w->busy || w->stop) {
        int stopped = w->stop;
        pthread_mutex_unlock(&w->mu);
        return PyErr_Format(PyExc_RuntimeError, stopped ? "SyncWorker closed" : "a sync is already in progress");
    }
    memcpy(w->fds, fds, sizeof(int) * (size_t)n);
    w->nfds = (int)n;
    w->pending = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    Py_RETURN_NONE;
}

static void sync_worker_stop(SyncWorker *w) {
    if (!w->started)
        return;
    pthread_mutex_lock(&w->mu);
    w->stop = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    Py_BEGIN_ALLOW_THREADS
    pthread_join(w->thread, NULL); /* a job in progress finishes first */
    Py_END_ALLOW_THREADS
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    w->started = 0;
}

static PyObject *sync_worker_close(SyncWorker *w, PyObject *unused) {
    sync_worker_stop(w);
    Py_RETURN_NONE;
}

static void sync_worker_dealloc(SyncWorker *w) {
    sync_worker_stop(w);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef sync_worker_methods[] = {
    {"submit", (PyCFunction)sync_worker_submit, METH_O,
     "submit(fds): fdatasync each in the worker thread, then write the 4-byte result (0 or errno) to notify_fd"},
    {"close", (PyCFunction)sync_worker_close, METH_NOARGS, "close(): finish a job in progress, stop the thread"},
    {NULL, NULL, 0, NULL},
};

PyTypeObject SyncWorkerType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "metaq.native._bytes.SyncWorker",
    .tp_basicsize = sizeof(SyncWorker),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "SyncWorker(notify_fd): fdatasync in a thread that never takes the GIL",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)sync_worker_init,
    .tp_dealloc = (destructor)sync_worker_dealloc,
    .tp_methods = sync_worker_methods,
};
