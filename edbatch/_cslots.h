/* Shared by edbatch's C extensions (edbatch/api/_fastrec.c, edbatch/memory/_fastplan.c):
 * reading and writing the __slots__ of Python classes from C. A slot's byte offset is read
 * once from its member descriptor (slot_offset); SLOT(o, off) is the slot's PyObject *.
 * Include after Python.h, with SLOTS_OWNER defined as the module's name (error messages). */
#ifndef EDBATCH_CSLOTS_H
#define EDBATCH_CSLOTS_H

#include <structmember.h>

#ifndef Py_T_OBJECT_EX
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif
#ifndef Py_READONLY
#define Py_READONLY READONLY
#endif

#define SLOT(o, off) (*(PyObject **)((char *)(o) + (off)))

/* The offset of type's writable object slot name into *out; -1 and a TypeError if it has
 * none. */
static int
slot_offset(PyTypeObject *type, const char *name, Py_ssize_t *out)
{
    PyObject *d = PyDict_GetItemString(type->tp_dict, name);  /* borrowed */
    if (d == NULL || !Py_IS_TYPE(d, &PyMemberDescr_Type)) {
        PyErr_Format(PyExc_TypeError, SLOTS_OWNER ".setup: %s.%s is not a __slots__ member",
                     type->tp_name, name);
        return -1;
    }
    PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
    if (m->type != Py_T_OBJECT_EX || (m->flags & Py_READONLY)) {
        PyErr_Format(PyExc_TypeError, SLOTS_OWNER ".setup: %s.%s is not a writable object slot",
                     type->tp_name, name);
        return -1;
    }
    *out = m->offset;
    return 0;
}

#endif
