# Declarations for Cython's compile of records.py (metaq.native): a kept record's attribute read and an inbox record's
# own properties written with their lengths, offsets and places C integers (formatted without a Python int's format
# call), both C functions the one-step copy (copyturn.pxd) cimports. The .py stays the one definition.
cimport cython


@cython.locals(end=Py_ssize_t, props=dict)
cpdef tuple kept_attribute(object topic, cython.longlong flag, object data, object now_ms, object topics)


@cython.locals(e0=cython.longlong, e1=cython.longlong, text=unicode)
cpdef unicode place_properties(unicode key, cython.longlong origin, unicode topic, cython.longlong partition,
                               cython.longlong offset, cython.longlong check, object epoch)
