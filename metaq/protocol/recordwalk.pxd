# Declarations for Cython's compile of recordwalk.py (metaq.native): the walk's lengths, offsets and fields C
# integers, the walk a C function to the modules that cimport it (mqttcluster.following.copyturn). The .py stays the
# one definition; without Cython it runs as it is.
cimport cython


@cython.locals(end=Py_ssize_t, last=Py_ssize_t, head=Py_ssize_t, kind=int, message=int, shared=int, epoch=int,
               tlen=Py_ssize_t, dlen=Py_ssize_t, partition=cython.longlong, flag=cython.longlong,
               offset=cython.longlong, ts=cython.longlong, entries=list)
cpdef tuple walk(object payload, Py_ssize_t count, Py_ssize_t n, Py_ssize_t at, Py_ssize_t most)
