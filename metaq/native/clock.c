/* The broker's clock: now_ms (metaq.server.clock). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <time.h>

#include "native.h"

/* now_ms() == metaq.server.clock.now_ms_py: milliseconds since the Unix epoch (CLOCK_REALTIME, what time.time
   reads), an int; the stamp of every burst, read once a turn. */
PyObject *now_ms(PyObject *self, PyObject *unused) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0)
        return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLongLong((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}
