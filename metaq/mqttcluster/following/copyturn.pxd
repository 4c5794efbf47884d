# Declarations for Cython's compile of copyturn.py (metaq.native): a copy's attribute block with its lengths, offsets
# and places C integers (formatted without a Python int's format call), the steps called from each other and the
# frame's walk (recordwalk's) as C functions (cpdef). The .py stays the one definition; without Cython it runs as it is.
cimport cython

from metaq.mqttcluster.following.records cimport kept_attribute, place_properties
from metaq.protocol.recordwalk cimport walk


@cython.locals(count=Py_ssize_t, entries=list, entry=tuple)
cpdef list messages_of(object payload)


@cython.locals(end=Py_ssize_t, props=dict, attribute=unicode, own=unicode, block=bytes)
cpdef tuple kept_copy(cython.longlong origin, object topic, cython.longlong partition, cython.longlong offset,
                      cython.longlong flag, object data, object now_ms, object topics, cython.longlong check,
                      object epoch)


@cython.locals(src=bytearray, frames=list, made=list, last=dict, keys=set, ends=list, moved=dict, served=list,
               taken=Py_ssize_t, i=Py_ssize_t, k=Py_ssize_t, count=Py_ssize_t, start=Py_ssize_t,
               position=cython.longlong)
cpdef tuple take(object origin, object payload, object now, object positions, object path, object topics,
                 Py_ssize_t most_served)
