# Declarations for Cython's compile of direct.py (metaq.native): the per-subscriber path and the port's waiting
# deliveries C structs, the one step's counts and its run's bounds C integers, the serving of a burst's waiting
# deliveries a C function with its tables typed. The .py stays the one definition; without Cython it runs as it is.
cimport cython


cdef class DirectPath:
    cdef public object out, conn, session, put_path, client_id, max_packet
    cdef public dict cursors
    cdef public object kept_names, kept_topic, kept_version, kept_user, kept_changes
    cdef public bint usable, v5, kept_own

    cpdef drop(self)
    cpdef object send(self, object key, list runs, object staged, object client_id)
    cdef object _names(self, object topic, bint own)


cdef class WaitingDeliveries:
    cdef public dict waiting
    cdef public object readers, keep_decoded, follows
    cdef public Py_ssize_t most

    cpdef dict serve(self, object keys, object staged, list runs, object client_id, object now)


@cython.locals(caught_up=dict, found=dict, made=dict, left=Py_ssize_t, served=Py_ssize_t, path=DirectPath)
cpdef dict serve_waiting(dict waiting, object readers, object keep_decoded, object deliver, Py_ssize_t most,
                         object keys, object staged, list runs, object client_id, object now)


@cython.locals(room=Py_ssize_t, total=Py_ssize_t, taken=Py_ssize_t, j=Py_ssize_t, went=Py_ssize_t,
               pos=Py_ssize_t, after=Py_ssize_t, n=Py_ssize_t, packet_id=long, last=long, k=Py_ssize_t,
               where=dict, ids=list, chunks=list)
cpdef tuple direct_publishes(object fd, object staged, Py_ssize_t i, Py_ssize_t stop, object names, object session,
                             object topic, object partition, object offset, object window, object v5,
                             object max_packet)


cpdef tuple send_now(object fd, object data)
