/* route() of edbatch.api._fastrec: _route.route's common case in C. Included once, by
 * _fastrec.c after _fastrec_map.h (whose Handles and Routed slot offsets it uses). */

/* A new Handles(rec, first, n, kinds, shape) (slots set as its __init__ sets them). */
static PyObject *
new_handles(PyObject *rec, Py_ssize_t first, Py_ssize_t n, PyObject *kinds, PyObject *shape)
{
    PyObject *out = HandlesType->tp_alloc(HandlesType, 0), *a, *b;
    if (out == NULL)
        return NULL;
    a = PyLong_FromSsize_t(first);
    b = PyLong_FromSsize_t(n);
    if (a == NULL || b == NULL) {
        Py_XDECREF(a);
        Py_XDECREF(b);
        Py_DECREF(out);
        return NULL;
    }
    SLOT(out, off_hs_first) = a;
    SLOT(out, off_hs_n) = b;
    Py_INCREF(rec); SLOT(out, off_hs_rec) = rec;
    Py_INCREF(kinds); SLOT(out, off_hs_kinds) = kinds;
    Py_INCREF(shape); SLOT(out, off_hs_shape) = shape;
    return out;
}

/* route(rec, top, operands, shapes, op_ids, kinds, shape): _route.route's common case (top a
 * non-empty list of equally long lists or tuples of exact ints in 0..len(op_ids)-1, every
 * operand a Handles block of rec, of len(top) nodes and its row shape in shapes): per slot
 * j, the op ids op_ids[top[i][j]] appended, one block record, and Handles(rec, at, n,
 * Routed(kinds, column j as a tuple), shape); then the attrs. None (nothing recorded) for
 * anything else. */
static PyObject *
fastrec_route(PyObject *module, PyObject *args)
{
    PyObject *rec, *top, *operands, *shapes, *op_ids, *kinds, *shape;
    PyObject *cols = NULL, *out = NULL, *ops, *blocks, *firsts, *attr_list, *operand_list;
    Py_ssize_t n, k, i, j, nargs, nops, at;
    if (!PyArg_ParseTuple(args, "OO!O!OO!OO:route", &rec, &PyList_Type, &top, &PyTuple_Type,
                          &operands, &shapes, &PyTuple_Type, &op_ids, &kinds, &shape))
        return NULL;
    if (!PyTuple_CheckExact(shapes))  /* (a list of shapes: the Python path) */
        Py_RETURN_NONE;
    n = PyList_GET_SIZE(top);
    nargs = PyTuple_GET_SIZE(operands);
    nops = PyTuple_GET_SIZE(op_ids);
    if (!bulk_ready || !Py_IS_TYPE(rec, RecordingType) || n == 0 ||
        nargs != PyTuple_GET_SIZE(shapes))
        Py_RETURN_NONE;
    ops = SLOT(rec, off_r_ops);
    blocks = SLOT(rec, off_r_blocks);
    firsts = SLOT(rec, off_r_block_firsts);
    attr_list = SLOT(rec, off_r_attrs);
    operand_list = SLOT(rec, off_r_operands);
    if (!is_list(ops) || !is_list(blocks) || !is_list(firsts) || !is_list(attr_list) ||
        !is_list(operand_list))
        Py_RETURN_NONE;
    for (i = 0; i < nargs; i++) {
        PyObject *a = PyTuple_GET_ITEM(operands, i), *an;
        Py_ssize_t m;
        int ne;
        if (!Py_IS_TYPE(a, HandlesType) || SLOT(a, off_hs_rec) != rec ||
            (an = SLOT(a, off_hs_n)) == NULL || SLOT(a, off_hs_first) == NULL ||
            SLOT(a, off_hs_shape) == NULL)
            Py_RETURN_NONE;
        m = PyLong_AsSsize_t(an);
        if (m != n) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
        ne = PyObject_RichCompareBool(SLOT(a, off_hs_shape), PyTuple_GET_ITEM(shapes, i), Py_NE);
        if (ne != 0) {
            PyErr_Clear();
            Py_RETURN_NONE;
        }
    }
    {
        PyObject *row0 = PyList_GET_ITEM(top, 0);
        if (!PyList_CheckExact(row0) && !PyTuple_CheckExact(row0))
            Py_RETURN_NONE;
        k = PySequence_Fast_GET_SIZE(row0);
    }
    if (k == 0)
        Py_RETURN_NONE;
    cols = PyList_New(k);  /* per slot its choices, a tuple (the Routed keeps it) */
    if (cols == NULL)
        return NULL;
    for (j = 0; j < k; j++) {
        PyObject *col = PyTuple_New(n);
        if (col == NULL)
            goto error;
        PyList_SET_ITEM(cols, j, col);
    }
    for (i = 0; i < n; i++) {  /* check every choice before recording anything */
        PyObject *row = PyList_GET_ITEM(top, i), **items;
        if ((!PyList_CheckExact(row) && !PyTuple_CheckExact(row)) ||
            PySequence_Fast_GET_SIZE(row) != k)
            goto none;
        items = PySequence_Fast_ITEMS(row);
        for (j = 0; j < k; j++) {
            PyObject *c = items[j];
            Py_ssize_t v;
            if (!PyLong_CheckExact(c))
                goto none;
            v = PyLong_AsSsize_t(c);
            if (v < 0 || v >= nops) {
                PyErr_Clear();
                goto none;
            }
            Py_INCREF(c);
            PyTuple_SET_ITEM(PyList_GET_ITEM(cols, j), i, c);
        }
    }
    out = PyList_New(k);
    if (out == NULL)
        goto error;
    at = PyList_GET_SIZE(ops);
    for (j = 0; j < k; j++) {
        PyObject *col = PyList_GET_ITEM(cols, j), *routed, *hs;
        for (i = 0; i < n; i++) {
            Py_ssize_t v = PyLong_AsSsize_t(PyTuple_GET_ITEM(col, i));
            if (PyList_Append(ops, PyTuple_GET_ITEM(op_ids, v)) < 0)
                goto error;
        }
        if (nargs) {
            if (append_size(blocks, PyList_GET_SIZE(operand_list)) < 0 ||
                append_size(blocks, at) < 0 || append_size(blocks, n) < 0 ||
                append_size(blocks, PyList_GET_SIZE(firsts)) < 0)
                goto error;
            for (i = 0; i < nargs; i++)
                if (PyList_Append(firsts, SLOT(PyTuple_GET_ITEM(operands, i), off_hs_first)) < 0)
                    goto error;
        }
        routed = RoutedType->tp_alloc(RoutedType, 0);
        if (routed == NULL)
            goto error;
        Py_INCREF(kinds); SLOT(routed, off_rt_table) = kinds;
        Py_INCREF(col); SLOT(routed, off_rt_choices) = col;
        hs = new_handles(rec, at, n, routed, shape);
        Py_DECREF(routed);
        if (hs == NULL)
            goto error;
        PyList_SET_ITEM(out, j, hs);
        at += n;
    }
    if (append_repeat(attr_list, minus_one, n * k) < 0)
        goto error;
    Py_DECREF(cols);
    return out;
none:
    Py_DECREF(cols);
    Py_RETURN_NONE;
error:
    Py_XDECREF(cols);
    Py_XDECREF(out);
    return NULL;
}
