/* The planner's per-read hot path in C: edbatch.memory._fastplan (optional).
 *
 * A memory plan tells, per batch and operand slot, how the slot is read: an Operand holding
 * a Region (a zero-copy view of consecutive arena rows) or a gather (a read-only slice of
 * the plan's row array). planner._Layout.plan classifies every read in one compiled pass and
 * then builds these objects, two per view, one per gather and a slice, in a Python loop:
 * about 0.5 us a read, 0.36 ms for a BiLSTM mini-batch's ~730 reads. operands() builds the
 * same objects from the same lists here; the Python loop (_operands.operands_py) is its
 * twin, the fallback where this module is not built and the oracle of
 * tests/memory/test_fastplan.py.
 *
 * Operand and Region are frozen slots dataclasses: setup() reads each slot's offset from its
 * member descriptor once (slot_offset, edbatch/_cslots.h, shared with _fastrec);
 * operands() allocates the objects with their type's tp_alloc and writes the slots there
 * (what object.__new__ and the descriptors' __set__ do, which the Python loop calls),
 * reusing the lists' int objects.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define SLOTS_OWNER "_fastplan"
#include "../_cslots.h"  /* slot_offset, SLOT */

static PyTypeObject *OperandType, *RegionType;
static Py_ssize_t off_o_view, off_o_gather, off_o_arena;  /* Operand */
static Py_ssize_t off_r_arena, off_r_start, off_r_stop;   /* Region */
static PyObject *one;  /* the int 1 */

static PyObject *
setup(PyObject *self, PyObject *args)
{
    PyObject *operand, *region;
    if (!PyArg_ParseTuple(args, "O!O!:setup", &PyType_Type, &operand, &PyType_Type, &region))
        return NULL;
    PyTypeObject *ot = (PyTypeObject *)operand, *rt = (PyTypeObject *)region;
    if (slot_offset(ot, "view", &off_o_view) || slot_offset(ot, "gather", &off_o_gather) ||
        slot_offset(ot, "arena", &off_o_arena) || slot_offset(rt, "arena", &off_r_arena) ||
        slot_offset(rt, "start", &off_r_start) || slot_offset(rt, "stop", &off_r_stop))
        return NULL;
    Py_XSETREF(OperandType, (PyTypeObject *)Py_NewRef(operand));
    Py_XSETREF(RegionType, (PyTypeObject *)Py_NewRef(region));
    Py_RETURN_NONE;
}

/* A new instance of a slots class, every slot NULL (as object.__new__ makes it). */
static PyObject *
new_object(PyTypeObject *type)
{
    return type->tp_alloc(type, 0);
}

static int
check_list(PyObject *o, Py_ssize_t n, const char *name)
{
    if (!PyList_CheckExact(o) || PyList_GET_SIZE(o) != n) {
        PyErr_Format(PyExc_TypeError, "_fastplan.operands: %s must be a list of %zd ints",
                     name, n);
        return -1;
    }
    return 0;
}

/* operands(batches, batch, view, arena, lo, hi, first, last, rows) -> per batch a tuple of
 * Operands, in read order: read i of batch batch[i] is a view of rows first[i]..last[i] of
 * arena[i] if view[i] is true, else the gather rows[lo[i]:hi[i]]. */
static PyObject *
operands(PyObject *self, PyObject *args)
{
    Py_ssize_t batches;
    PyObject *batch, *view, *arena, *lo, *hi, *first, *last, *rows;
    if (!PyArg_ParseTuple(args, "nOOOOOOOO:operands", &batches, &batch, &view, &arena, &lo,
                          &hi, &first, &last, &rows))
        return NULL;
    if (OperandType == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_fastplan.operands: call setup() first");
        return NULL;
    }
    if (batches < 0 || !PyList_CheckExact(batch)) {
        PyErr_SetString(PyExc_TypeError, "_fastplan.operands: batches >= 0, batch a list");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(batch);
    if (check_list(view, n, "view") || check_list(arena, n, "arena") ||
        check_list(lo, n, "lo") || check_list(hi, n, "hi") || check_list(first, n, "first") ||
        check_list(last, n, "last"))
        return NULL;
    PyObject *lists = PyList_New(batches), *out = NULL;
    if (lists == NULL)
        return NULL;
    for (Py_ssize_t b = 0; b < batches; b++) {
        PyObject *l = PyList_New(0);
        if (l == NULL)
            goto done;
        PyList_SET_ITEM(lists, b, l);
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_ssize_t b = PyLong_AsSsize_t(PyList_GET_ITEM(batch, i));
        if (b == -1 && PyErr_Occurred())
            goto done;
        if (b < 0 || b >= batches) {
            PyErr_Format(PyExc_IndexError, "_fastplan.operands: read %zd of batch %zd, "
                         "outside [0, %zd)", i, b, batches);
            goto done;
        }
        int is_view = PyObject_IsTrue(PyList_GET_ITEM(view, i));
        if (is_view < 0)
            goto done;
        PyObject *a = PyList_GET_ITEM(arena, i);
        PyObject *o = new_object(OperandType);
        if (o == NULL)
            goto done;
        if (is_view) {
            PyObject *r = new_object(RegionType);
            if (r == NULL) {
                Py_DECREF(o);
                goto done;
            }
            PyObject *stop = PyNumber_Add(PyList_GET_ITEM(last, i), one);
            if (stop == NULL) {
                Py_DECREF(r);
                Py_DECREF(o);
                goto done;
            }
            SLOT(r, off_r_arena) = Py_NewRef(a);
            SLOT(r, off_r_start) = Py_NewRef(PyList_GET_ITEM(first, i));
            SLOT(r, off_r_stop) = stop;
            SLOT(o, off_o_view) = r;
            SLOT(o, off_o_gather) = Py_NewRef(Py_None);
        } else {
            Py_ssize_t l0 = PyLong_AsSsize_t(PyList_GET_ITEM(lo, i));
            Py_ssize_t h0 = PyLong_AsSsize_t(PyList_GET_ITEM(hi, i));
            if ((l0 == -1 || h0 == -1) && PyErr_Occurred()) {
                Py_DECREF(o);
                goto done;
            }
            PyObject *g = PySequence_GetSlice(rows, l0, h0);
            if (g == NULL) {
                Py_DECREF(o);
                goto done;
            }
            SLOT(o, off_o_view) = Py_NewRef(Py_None);
            SLOT(o, off_o_gather) = g;
        }
        SLOT(o, off_o_arena) = Py_NewRef(a);
        int err = PyList_Append(PyList_GET_ITEM(lists, b), o);
        Py_DECREF(o);
        if (err)
            goto done;
    }
    out = PyTuple_New(batches);
    if (out == NULL)
        goto done;
    for (Py_ssize_t b = 0; b < batches; b++) {
        PyObject *t = PyList_AsTuple(PyList_GET_ITEM(lists, b));
        if (t == NULL) {
            Py_CLEAR(out);
            goto done;
        }
        PyTuple_SET_ITEM(out, b, t);
    }
done:
    Py_DECREF(lists);
    return out;
}

static PyMethodDef methods[] = {
    {"setup", setup, METH_VARARGS, "setup(Operand, Region): read their slots' offsets"},
    {"operands", operands, METH_VARARGS,
     "operands(batches, batch, view, arena, lo, hi, first, last, rows): per batch its "
     "Operands (_operands.operands_py's twin)"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastplan",
                                    "The planner's per-read Operand builder in C.", -1,
                                    methods};

PyMODINIT_FUNC
PyInit__fastplan(void)
{
    one = PyLong_FromLong(1);
    if (one == NULL)
        return NULL;
    return PyModule_Create(&module);
}
