/* The recorder's per-node hot path in C: edbatch.api._fastrec (optional; see _fast.py).
 *
 * An OpCall wraps the Python function that records one node of an op type or cell (the
 * closures of _builtins.py and _cellcall.py, its twin): it takes the common case itself
 * (operands that are Handles of the batch's current Recording, of the registered row shapes
 * where the cell has them, the attr as the Python function accepts it inline, the node's
 * pooled handle present) and appends to the recording's lists exactly what the Python
 * function appends; anything else is passed on to the Python function unchanged, which
 * records it or raises its usual error. AddLoss does the same for DynamicBatch.add_loss.
 *
 * Handles, kinds and recordings are Python classes with __slots__: setup() reads each slot's
 * offset from its member descriptor once, and the calls read and write the slots there.
 * The call types are in _fastrec_opcall.h, _fastrec_methods.h, _fastrec_map.h and
 * _fastrec_route.h (included below); here the shared state, the pool's new handles, the
 * held-handle scan and the assembly's packer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define SLOTS_OWNER "_fastrec"
#include "../_cslots.h"  /* slot_offset, SLOT */

static PyTypeObject *HandleType, *KindType, *RecordingType, *CurrentType;
static Py_ssize_t off_h_rec, off_h_kind, off_h_node;  /* Handle */
static Py_ssize_t off_k_shape, off_k_scalar, off_k_op_id;  /* Kind */
/* Recording */
static Py_ssize_t off_r_ops, off_r_operands, off_r_attrs, off_r_losses, off_r_counts;
static Py_ssize_t off_c_rec;  /* Current */
static PyObject *str_attr, *str_num_embeddings, *minus_one;
static int ready;

static PyObject *
fastrec_setup(PyObject *module, PyObject *args)
{
    PyTypeObject *h, *k, *r, *c;
    if (!PyArg_ParseTuple(args, "O!O!O!O!:setup", &PyType_Type, &h, &PyType_Type, &k,
                          &PyType_Type, &r, &PyType_Type, &c))
        return NULL;
    if (slot_offset(h, "_rec", &off_h_rec) || slot_offset(h, "_kind", &off_h_kind) ||
        slot_offset(h, "node_id", &off_h_node) || slot_offset(k, "shape", &off_k_shape) ||
        slot_offset(k, "scalar", &off_k_scalar) || slot_offset(k, "op_id", &off_k_op_id) ||
        slot_offset(r, "ops", &off_r_ops) || slot_offset(r, "counts", &off_r_counts) ||
        slot_offset(r, "operands", &off_r_operands) || slot_offset(r, "attrs", &off_r_attrs) ||
        slot_offset(r, "losses", &off_r_losses) || slot_offset(c, "rec", &off_c_rec))
        return NULL;
    Py_INCREF(h); Py_INCREF(k); Py_INCREF(r); Py_INCREF(c);
    Py_XSETREF(HandleType, h);
    Py_XSETREF(KindType, k);
    Py_XSETREF(RecordingType, r);
    Py_XSETREF(CurrentType, c);
    ready = 1;
    Py_RETURN_NONE;
}

/* The batch's current Recording (borrowed: the Current holds it), or NULL to fall back. */
static inline PyObject *
current_recording(PyObject *current)
{
    PyObject *rec;
    if (!Py_IS_TYPE(current, CurrentType))
        return NULL;
    rec = SLOT(current, off_c_rec);
    return rec != NULL && Py_IS_TYPE(rec, RecordingType) ? rec : NULL;
}

static inline int
is_list(PyObject *o)
{
    return o != NULL && PyList_CheckExact(o);
}

/* ----------------------------------------------------------------- shared by the calls */
static PyObject *
call_repr(PyObject *self)
{
    PyObject *name = PyObject_GetAttrString(self, "__name__"), *out;
    if (name == NULL) {
        PyErr_Clear();
        return PyUnicode_FromFormat("<%s object at %p>", Py_TYPE(self)->tp_name, self);
    }
    out = PyUnicode_FromFormat("<recording function %S>", name);
    Py_DECREF(name);
    return out;
}

static PyGetSetDef call_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL}
};

#include "_fastrec_opcall.h"
#include "_fastrec_methods.h"
#include "_fastrec_map.h"
#include "_fastrec_route.h"

/* ------------------------------------------------------------------------------ handles */
static PyObject *
fastrec_handles(PyObject *module, PyObject *args)
{
    Py_ssize_t start, stop, i;
    PyObject *out;
    if (!PyArg_ParseTuple(args, "nn:handles", &start, &stop))
        return NULL;
    if (!ready || start < 0 || stop < start) {
        PyErr_SetString(PyExc_ValueError, "handles(start, stop): 0 <= start <= stop, after "
                        "setup()");
        return NULL;
    }
    out = PyList_New(stop - start);
    if (out == NULL)
        return NULL;
    for (i = start; i < stop; i++) {
        PyObject *h = HandleType->tp_alloc(HandleType, 0), *id;
        if (h == NULL || (id = PyLong_FromSsize_t(i)) == NULL) {
            Py_XDECREF(h);
            Py_DECREF(out);
            return NULL;
        }
        SLOT(h, off_h_node) = id;
        PyList_SET_ITEM(out, i - start, h);
    }
    return out;
}

/* Append the exact ints of list `items` to buf as int32 (size 4) or int64 (size 8); 0 when
 * an item is something else or out of range. */
static int
pack_into(PyObject *items, int size, char *buf)
{
    Py_ssize_t i, n = PyList_GET_SIZE(items);
    for (i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        int overflow;
        long long v;
        if (!PyLong_CheckExact(item))
            return 0;
        v = PyLong_AsLongLongAndOverflow(item, &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
        if (size == 4) {
            int32_t x = (int32_t)v;
            if (v < INT32_MIN || v > INT32_MAX)
                return 0;
            memcpy(buf + 4 * i, &x, 4);
        } else {
            int64_t x = (int64_t)v;
            memcpy(buf + 8 * i, &x, 8);
        }
    }
    return 1;
}

static PyObject *
fastrec_pack(PyObject *module, PyObject *args)
{
    PyObject *items, *more, *out;
    int size;
    if (!PyArg_ParseTuple(args, "O!iO!:pack", &PyList_Type, &items, &size, &PyList_Type, &more))
        return NULL;
    if (size != 4 && size != 8) {
        PyErr_SetString(PyExc_ValueError, "pack: size 4 (int32) or 8 (int64)");
        return NULL;
    }
    out = PyBytes_FromStringAndSize(NULL, (PyList_GET_SIZE(items) + PyList_GET_SIZE(more)) * size);
    if (out == NULL)
        return NULL;
    if (!pack_into(items, size, PyBytes_AS_STRING(out)) ||
        !pack_into(more, size, PyBytes_AS_STRING(out) + PyList_GET_SIZE(items) * size)) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

static PyObject *
fastrec_held(PyObject *module, PyObject *args)
{
    PyObject *pool, *out, *id;
    Py_ssize_t used, free, i;
    if (!PyArg_ParseTuple(args, "O!nn:held", &PyList_Type, &pool, &used, &free))
        return NULL;
    out = PyList_New(0);
    if (out == NULL)
        return NULL;
    if (used > PyList_GET_SIZE(pool))
        used = PyList_GET_SIZE(pool);
    for (i = 0; i < used; i++) {
        if (Py_REFCNT(PyList_GET_ITEM(pool, i)) <= free)
            continue;
        id = PyLong_FromSsize_t(i);
        if (id == NULL || PyList_Append(out, id) < 0) {
            Py_XDECREF(id);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(id);
    }
    return out;
}

/* ------------------------------------------------------------------------------- module */
static PyMethodDef fastrec_methods[] = {
    {"pack", fastrec_pack, METH_VARARGS,
     "pack(items, size, more): the ints of the lists items then more as native int32 (size "
     "4) or int64 (size 8) bytes, as struct.pack packs them; None if one is no exact int "
     "or out of range (then struct decides)."},
    {"held", fastrec_held, METH_VARARGS,
     "held(pool, used, free): the node ids below used whose handle's reference count is "
     "above free (someone besides the pool holds it)."},
    {"handles", fastrec_handles, METH_VARARGS,
     "handles(start, stop): new Handles of node ids start..stop-1 (node_id set, nothing "
     "else), as _handles._fresh makes them one by one."},
    {"setup_bulk", fastrec_setup_bulk, METH_VARARGS,
     "setup_bulk(Handles, Routed): read their slots' offsets and the recording's block slots' "
     "(once, after setup(), before any MapCall or route)."},
    {"route", fastrec_route, METH_VARARGS,
     "route(rec, top, operands, shapes, op_ids, kinds, shape): _route.route's common case "
     "recorded, its Handles per slot; None (nothing recorded) for anything else."},
    {"setup", fastrec_setup, METH_VARARGS,
     "setup(Handle, Kind, Recording, Current): read the slots' offsets (once, before any call)."},
    {NULL}
};

static struct PyModuleDef fastrec_module = {
    PyModuleDef_HEAD_INIT, "_fastrec",
    "The recorder's per-node hot path in C (edbatch.api._fast uses it).", -1,
    fastrec_methods,
};

PyMODINIT_FUNC
PyInit__fastrec(void)
{
    PyObject *m;
    if (PyType_Ready(&OpCallType) < 0 || PyType_Ready(&AddLossType) < 0 ||
        PyType_Ready(&LookupType) < 0 || PyType_Ready(&MapCallType) < 0)
        return NULL;
    str_attr = PyUnicode_InternFromString("attr");
    str_num_embeddings = PyUnicode_InternFromString("num_embeddings");
    str_attrs = PyUnicode_InternFromString("attrs");
    minus_one = PyLong_FromLong(-1);
    if (str_attr == NULL || str_attrs == NULL || str_num_embeddings == NULL || minus_one == NULL)
        return NULL;
    m = PyModule_Create(&fastrec_module);
    if (m == NULL)
        return NULL;
    Py_INCREF(&OpCallType);
    Py_INCREF(&AddLossType);
    Py_INCREF(&LookupType);
    Py_INCREF(&MapCallType);
    if (PyModule_AddObject(m, "OpCall", (PyObject *)&OpCallType) < 0 ||
        PyModule_AddObject(m, "AddLoss", (PyObject *)&AddLossType) < 0 ||
        PyModule_AddObject(m, "Lookup", (PyObject *)&LookupType) < 0 ||
        PyModule_AddObject(m, "MapCall", (PyObject *)&MapCallType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
