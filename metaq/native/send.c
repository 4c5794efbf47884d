/* Writes by descriptor: a read's log ranges to one socket (send_ranges), one packet run to many (send_each). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "native.h"

#define SEND_IOV_MAX 1024 /* Linux's IOV_MAX */
#define SEND_SMALL 8      /* packets or sockets send_each holds on the stack */

/* send_ranges(fd, head, log, ranges, pos) == metaq.server.zerocopy.send_ranges_py: one non-blocking sendmsg (MSG_DONTWAIT,
 * MSG_NOSIGNAL) of ``head`` then the ranges of ``log`` (check_ranges' pairs), from byte ``pos`` of that whole, at
 * most SEND_IOV_MAX pieces; returns the bytes the kernel took. Raises OSError (BlockingIOError when the socket is
 * full). The GIL is released for the call; the buffers are held (exported) until it returns. */
PyObject *send_ranges(PyObject *self, PyObject *args) {
    int fd;
    PyObject *log_obj;
    Py_buffer hb, rb, lb;
    Py_ssize_t pos;
    if (!PyArg_ParseTuple(args, "iy*Oy*n", &fd, &hb, &log_obj, &rb, &pos))
        return NULL;
    if (PyObject_GetBuffer(log_obj, &lb, PyBUF_SIMPLE) < 0) {
        PyBuffer_Release(&hb);
        PyBuffer_Release(&rb);
        return NULL;
    }
    struct iovec iov[SEND_IOV_MAX];
    int n = 0;
    const int64_t *r = (const int64_t *)rb.buf;
    Py_ssize_t nr = rb.len / (Py_ssize_t)(2 * sizeof(int64_t));
    PyObject *err = NULL;
    if (pos < 0)
        pos = 0;
    if (pos < hb.len) {
        iov[n].iov_base = (char *)hb.buf + pos;
        iov[n].iov_len = (size_t)(hb.len - pos);
        n++;
        pos = 0;
    } else {
        pos -= hb.len;
    }
    for (Py_ssize_t k = 0; k < nr && n < SEND_IOV_MAX; k++) {
        int64_t a = r[2 * k], b = r[2 * k + 1];
        if (a < 0 || b < a || b > lb.len) {
            err = PyExc_ValueError;
            break;
        }
        if (pos >= b - a) {
            pos -= b - a;
            continue;
        }
        iov[n].iov_base = (char *)lb.buf + a + pos;
        iov[n].iov_len = (size_t)(b - a - pos);
        pos = 0;
        n++;
    }
    ssize_t sent = 0;
    int saved = 0;
    if (err == NULL && n > 0) {
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)n;
        Py_BEGIN_ALLOW_THREADS
        do {
            sent = sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        } while (sent < 0 && errno == EINTR);
        saved = errno;
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&lb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&hb);
    if (err != NULL)
        return PyErr_Format(err, "a range lies outside the buffer");
    if (sent < 0) {
        errno = saved;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromSsize_t(sent);
}

/* send_each(packets, fds) == metaq.mqtt.fanout.send_each_py: ``packets`` (a sequence of bytes-like objects,
 * at most SEND_IOV_MAX) written in order by one non-blocking sendmsg (MSG_DONTWAIT | MSG_NOSIGNAL, EINTR retried)
 * to each file descriptor of ``fds`` (a sequence of ints), one after the other, none waited for. Returns
 * ``[(i, n), ...]`` for each ``fds[i]`` that did not take all of it, in order: ``n`` the bytes it took (0 when its
 * buffer was full: EAGAIN), or ``-errno`` when the send failed; ``[]`` when every socket took everything. The GIL is
 * released for the sends; the buffers are held (exported) until they end. */
PyObject *send_each(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (!metaq_nargs(nargs, 2))
        return NULL;
    PyObject *packets_obj = args[0], *fds_obj = args[1];
    PyObject *packets = PySequence_Fast(packets_obj, "send_each: packets must be a sequence of buffers");
    if (packets == NULL)
        return NULL;
    PyObject *fdseq = PySequence_Fast(fds_obj, "send_each: fds must be a sequence of ints");
    if (fdseq == NULL) {
        Py_DECREF(packets);
        return NULL;
    }
    Py_ssize_t np = PySequence_Fast_GET_SIZE(packets), nf = PySequence_Fast_GET_SIZE(fdseq);
    PyObject *result = NULL;
    Py_buffer *bufs = NULL;
    int *fds = NULL;
    ssize_t *took = NULL;
    int *errs = NULL;
    Py_ssize_t held = 0;
    struct iovec iov[SEND_IOV_MAX];
    size_t total = 0;
    if (np > SEND_IOV_MAX) {
        PyErr_Format(PyExc_ValueError, "send_each: %zd packets, at most %d", np, SEND_IOV_MAX);
        goto done;
    }
    /* a few packets to a few sockets (a subscriber's run, a PUBACK run) on the stack; more on the heap */
    Py_buffer small_bufs[SEND_SMALL];
    int small_fds[SEND_SMALL], small_errs[SEND_SMALL];
    ssize_t small_took[SEND_SMALL];
    if (np <= SEND_SMALL) {
        memset(small_bufs, 0, sizeof small_bufs);
        bufs = small_bufs;
    } else {
        bufs = PyMem_Calloc((size_t)np, sizeof(Py_buffer));
    }
    if (nf <= SEND_SMALL) {
        fds = small_fds, took = small_took, errs = small_errs;
    } else {
        fds = PyMem_Malloc((size_t)nf * sizeof(int));
        took = PyMem_Malloc((size_t)nf * sizeof(ssize_t));
        errs = PyMem_Malloc((size_t)nf * sizeof(int));
    }
    if (bufs == NULL || fds == NULL || took == NULL || errs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t k = 0; k < np; k++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(packets, k), &bufs[k], PyBUF_SIMPLE) < 0)
            goto done;
        held++;
        iov[k].iov_base = bufs[k].buf;
        iov[k].iov_len = (size_t)bufs[k].len;
        total += (size_t)bufs[k].len;
    }
    for (Py_ssize_t i = 0; i < nf; i++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(fdseq, i));
        if (fd == -1 && PyErr_Occurred())
            goto done;
        if (fd < 0 || fd > INT32_MAX_V) {
            PyErr_Format(PyExc_ValueError, "send_each: bad file descriptor %ld", fd);
            goto done;
        }
        fds[i] = (int)fd;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < nf; i++) {
        struct msghdr msg;
        memset(&msg, 0, sizeof msg);
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)np;
        ssize_t sent;
        do {
            sent = sendmsg(fds[i], &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
        } while (sent < 0 && errno == EINTR);
        took[i] = sent;
        errs[i] = sent < 0 ? errno : 0;
    }
    Py_END_ALLOW_THREADS
    result = PyList_New(0);
    if (result == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < nf; i++) {
        long long n;
        if (took[i] >= 0) {
            if ((size_t)took[i] == total)
                continue;
            n = (long long)took[i];
        } else {
            n = (errs[i] == EAGAIN || errs[i] == EWOULDBLOCK) ? 0 : -(long long)errs[i];
        }
        PyObject *item = Py_BuildValue("(nL)", i, n);
        if (item == NULL || PyList_Append(result, item) < 0) {
            Py_XDECREF(item);
            Py_CLEAR(result);
            goto done;
        }
        Py_DECREF(item);
    }
done:
    for (Py_ssize_t k = 0; k < held; k++)
        PyBuffer_Release(&bufs[k]);
    if (bufs != small_bufs)
        PyMem_Free(bufs);
    if (fds != small_fds) {
        PyMem_Free(fds);
        PyMem_Free(took);
        PyMem_Free(errs);
    }
    Py_DECREF(fdseq);
    Py_DECREF(packets);
    return result;
}
