# Declarations for Cython's compile of plainturn.py (metaq.native): the turn's two steps of this module called from it
# as C functions (cpdef), their counts C integers. The .py stays the one definition; without Cython it runs as it is.
cimport cython

from metaq.serving.putpath cimport PutPath


@cython.locals(out=list, d=dict)
cpdef list entries_of(object split)


@cython.locals(size=Py_ssize_t)
cpdef bint pubacks_now(object acks, object conn, object data) except -1


cpdef object plain_turn(object port, PutPath path, object acks, object conn, object client_id, object most,
                        object most_bytes, object data, object v5, object max_packet, object plans, object decided,
                        object room, object now)
