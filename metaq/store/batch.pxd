# Declarations for Cython's compile of batch.py (metaq.native): the burst writer a C struct whose id generator and
# positions are typed, so a run's ``take`` and ``advance`` are C calls, and ``append_run`` a C call from ``append``.
# The .py stays the one definition; without Cython it runs as it is.
cimport cython

from metaq.store.msgid cimport IdGenerator
from metaq.store.positions cimport LogPositions


cdef class BurstWriter:
    cdef public object log, writer, refusal
    cdef public IdGenerator ids
    cdef public LogPositions positions

    @cython.locals(n=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, ids=IdGenerator, positions=LogPositions, topic=bytes)
    cpdef tuple append(self, object frames, object src, object now_ms)


@cython.locals(k=Py_ssize_t, count=Py_ssize_t)
cpdef Py_ssize_t append_run(list runs, object run_type, object log, object seg_start, object rel, object ready,
                            object src, object frames, Py_ssize_t i, Py_ssize_t j, Py_ssize_t room, object topic,
                            object partition, object p, object off, object now_ms, IdGenerator ids,
                            LogPositions positions, object index, object unit_at, object overhead) except -1
