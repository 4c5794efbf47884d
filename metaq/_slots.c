/* Attributes read and written by the C helper's hot paths (metaq_getattr, metaq_setattr; _speedups.h): the same
 * answers as PyObject_GetAttr and PyObject_SetAttr, but an attribute kept in a slot of the object's type (its
 * ``__slots__``: a member descriptor of an object field) is read or written at its offset, found once per type and
 * name and kept in a small table. The interpreter's own attribute loads are specialized the same way; the C API's
 * generic lookup walks the type's dictionaries on every call, a cost paid several times for each MQTT message.
 *
 * An entry is good while the type's version tag is the one it was found at: any change to the type or its bases
 * (a class attribute set or deleted) clears or changes the tag, and a type freed and another made at its address gets
 * a new tag. Anything else (an instance dict, a property, a read-only member, an unset slot: the AttributeError; a
 * type whose attribute access is its own, __getattribute__ or __setattr__) goes to the generic call. The table is used with the GIL held. */
#define PY_SSIZE_T_CLEAN
#include "_speedups.h"
#include <structmember.h>

/* How many (type, name) pairs the table keeps: direct-mapped; a pair that collides is looked up again. */
#define SLOT_TABLE_SIZE 256

typedef struct {
    PyTypeObject *type; /* not a reference: the version tag below says whether it is still the same type */
    PyObject *name;     /* a reference (so no other string takes its address while it is here): compared by identity */
    unsigned int version;
    int readable, writable; /* the type reads / writes attributes the generic way (no __getattribute__, __setattr__) */
    Py_ssize_t offset;
} SlotEntry;

static SlotEntry table[SLOT_TABLE_SIZE];

/* The entry for (tp, name), found or made; NULL when the attribute is not an object slot of tp. */
static SlotEntry *slot_of(PyTypeObject *tp, PyObject *name) {
    size_t h = (((size_t)tp >> 4) ^ ((size_t)name >> 4) * 31u) & (SLOT_TABLE_SIZE - 1);
    SlotEntry *e = &table[h];
    if (e->type == tp && e->name == name && tp->tp_version_tag == e->version &&
        PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG))
        return e->offset > 0 ? e : NULL;
    PyObject *descr = _PyType_Lookup(tp, name); /* borrowed; assigns the type a version tag when it has none */
    if (!PyType_HasFeature(tp, Py_TPFLAGS_VALID_VERSION_TAG))
        return NULL;
    Py_INCREF(name);
    Py_XSETREF(e->name, name);
    e->type = tp;
    e->version = tp->tp_version_tag;
    e->offset = 0; /* not a slot: the generic call (remembered, so it is not looked up again) */
    if (descr != NULL && Py_IS_TYPE(descr, &PyMemberDescr_Type) &&
        PyType_IsSubtype(tp, PyDescr_TYPE(descr))) { /* (a member of tp's layout, not one set from another class) */
        PyMemberDef *m = ((PyMemberDescrObject *)descr)->d_member;
        if (m->type == T_OBJECT_EX && m->offset > 0) {
            e->offset = m->offset;
            e->readable = tp->tp_getattro == PyObject_GenericGetAttr;
            e->writable = tp->tp_setattro == PyObject_GenericSetAttr && !(m->flags & READONLY);
        }
    }
    return e->offset > 0 ? e : NULL;
}

PyObject *metaq_getattr(PyObject *obj, PyObject *name) {
    SlotEntry *e = slot_of(Py_TYPE(obj), name);
    if (e != NULL && e->readable) {
        PyObject *v = *(PyObject **)((char *)obj + e->offset);
        if (v != NULL)
            return Py_NewRef(v);
    }
    return PyObject_GetAttr(obj, name);
}

int metaq_setattr(PyObject *obj, PyObject *name, PyObject *value) {
    SlotEntry *e = value != NULL ? slot_of(Py_TYPE(obj), name) : NULL;
    if (e != NULL && e->writable) {
        PyObject **slot = (PyObject **)((char *)obj + e->offset);
        PyObject *old = *slot;
        *slot = Py_NewRef(value);
        Py_XDECREF(old);
        return 0;
    }
    return PyObject_SetAttr(obj, name, value);
}

PyObject *slot_getattr(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2 || !PyUnicode_Check(args[1]))
        return PyErr_Format(PyExc_TypeError, "slot_getattr(obj, name: str)");
    return metaq_getattr(args[0], args[1]);
}

PyObject *slot_setattr(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3 || !PyUnicode_Check(args[1]))
        return PyErr_Format(PyExc_TypeError, "slot_setattr(obj, name: str, value)");
    if (metaq_setattr(args[0], args[1], args[2]) < 0)
        return NULL;
    Py_RETURN_NONE;
}
