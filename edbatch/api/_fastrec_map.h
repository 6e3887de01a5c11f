/* The MapCall type of edbatch.api._fastrec: Cell.map's common case in C. Included once, by
 * _fastrec.c (one translation unit, so the slot offsets and types set up there stay static).
 *
 * A MapCall wraps the Python closure of _cellcall.map_function (its twin and fallback): every
 * operand a Handles block of the current recording, of the cell's row shape and the call's
 * length, and attrs a list or tuple of exact ints in int64 exactly when the cell takes them.
 * It appends what the closure appends (the op id n times, one block record, the attrs) and
 * returns the same Handles; anything else goes to the closure unchanged. route()
 * (_fastrec_route.h) does the same for _route.route's common case. */

static PyTypeObject *HandlesType, *RoutedType;
static Py_ssize_t off_hs_rec, off_hs_first, off_hs_n, off_hs_kinds, off_hs_shape;  /* Handles */
static Py_ssize_t off_rt_table, off_rt_choices;  /* Routed */
static Py_ssize_t off_r_blocks, off_r_block_firsts;  /* Recording */
static PyObject *str_attrs;
static int bulk_ready;

static PyObject *
fastrec_setup_bulk(PyObject *module, PyObject *args)
{
    PyTypeObject *hs, *rt;
    if (!PyArg_ParseTuple(args, "O!O!:setup_bulk", &PyType_Type, &hs, &PyType_Type, &rt))
        return NULL;
    if (!ready) {
        PyErr_SetString(PyExc_RuntimeError, "_fastrec.setup_bulk: call setup() first");
        return NULL;
    }
    if (slot_offset(hs, "rec", &off_hs_rec) || slot_offset(hs, "first", &off_hs_first) ||
        slot_offset(hs, "n", &off_hs_n) || slot_offset(hs, "kinds", &off_hs_kinds) ||
        slot_offset(hs, "shape", &off_hs_shape) || slot_offset(rt, "table", &off_rt_table) ||
        slot_offset(rt, "choices", &off_rt_choices) ||
        slot_offset(RecordingType, "blocks", &off_r_blocks) ||
        slot_offset(RecordingType, "block_firsts", &off_r_block_firsts))
        return NULL;
    Py_INCREF(hs);
    Py_XSETREF(HandlesType, hs);
    Py_INCREF(rt);
    Py_XSETREF(RoutedType, rt);
    bulk_ready = 1;
    Py_RETURN_NONE;
}

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *current;   /* the batch's Current: its recording, read per call */
    PyObject *kind;      /* the cell's Kind (the Handles' kinds) */
    PyObject *op_id;     /* int appended to rec.ops per node */
    PyObject *shape;     /* the cell's output row shape (the Handles' shape) */
    PyObject *shapes;    /* tuple of the operands' row shapes */
    PyObject *fallback;  /* the Python map_call: everything but the common case */
    int takes_attr;
} MapCall;

/* Append `item` n times to `list`. */
static int
append_repeat(PyObject *list, PyObject *item, Py_ssize_t n)
{
    Py_ssize_t i;
    for (i = 0; i < n; i++)
        if (PyList_Append(list, item) < 0)
            return -1;
    return 0;
}

static int
append_size(PyObject *list, Py_ssize_t v)
{
    PyObject *x = PyLong_FromSsize_t(v);
    int bad = x == NULL || PyList_Append(list, x) < 0;
    Py_XDECREF(x);
    return bad ? -1 : 0;
}

/* Whether every item of list or tuple `attrs` is an exact int in int64 (what
 * array.array("q", attrs) accepts of exact ints). */
static int
all_int64(PyObject *attrs)
{
    Py_ssize_t i, n = PySequence_Fast_GET_SIZE(attrs);
    PyObject **items = PySequence_Fast_ITEMS(attrs);
    for (i = 0; i < n; i++) {
        int overflow;
        long long v;
        if (!PyLong_CheckExact(items[i]))
            return 0;
        v = PyLong_AsLongLongAndOverflow(items[i], &overflow);
        if (overflow || (v == -1 && PyErr_Occurred())) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

static PyObject *
mapcall_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    MapCall *self = (MapCall *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), n, i;
    PyObject *attrs = NULL, *rec, *ops, *blocks, *firsts, *attr_list, *operands, *out, *x;

    if (!bulk_ready || nargs != PyTuple_GET_SIZE(self->shapes))
        goto fallback;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        if (PyTuple_GET_SIZE(kwnames) != 1 || PyTuple_GET_ITEM(kwnames, 0) != str_attrs)
            goto fallback;  /* (a keyword not interned as "attrs" takes the Python path) */
        attrs = args[nargs] == Py_None ? NULL : args[nargs];
    }
    if (attrs == NULL) {
        if (self->takes_attr || nargs == 0 || !Py_IS_TYPE(args[0], HandlesType))
            goto fallback;
        n = PyLong_AsSsize_t(SLOT(args[0], off_hs_n));
        if (n == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto fallback;
        }
    } else {
        if (!self->takes_attr || !(PyList_CheckExact(attrs) || PyTuple_CheckExact(attrs)))
            goto fallback;
        n = PySequence_Fast_GET_SIZE(attrs);
    }
    rec = current_recording(self->current);
    if (rec == NULL)
        goto fallback;
    for (i = 0; i < nargs; i++) {
        PyObject *a = args[i], *an, *want = PyTuple_GET_ITEM(self->shapes, i);
        Py_ssize_t m;
        int ne;
        if (!Py_IS_TYPE(a, HandlesType) || SLOT(a, off_hs_rec) != rec ||
            (an = SLOT(a, off_hs_n)) == NULL || SLOT(a, off_hs_first) == NULL ||
            SLOT(a, off_hs_shape) == NULL)
            goto fallback;
        m = PyLong_AsSsize_t(an);
        if (m == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            goto fallback;
        }
        if (m != n)
            goto fallback;
        ne = PyObject_RichCompareBool(SLOT(a, off_hs_shape), want, Py_NE);
        if (ne < 0) {
            PyErr_Clear();
            goto fallback;
        }
        if (ne)
            goto fallback;
    }
    if (attrs != NULL && !all_int64(attrs))
        goto fallback;
    ops = SLOT(rec, off_r_ops);
    blocks = SLOT(rec, off_r_blocks);
    firsts = SLOT(rec, off_r_block_firsts);
    attr_list = SLOT(rec, off_r_attrs);
    operands = SLOT(rec, off_r_operands);
    if (!is_list(ops) || !is_list(blocks) || !is_list(firsts) || !is_list(attr_list) ||
        !is_list(operands))
        goto fallback;
    out = HandlesType->tp_alloc(HandlesType, 0);
    if (out == NULL)
        return NULL;
    x = PyLong_FromSsize_t(PyList_GET_SIZE(ops));
    if (x == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    SLOT(out, off_hs_first) = x;
    if ((x = PyLong_FromSsize_t(n)) == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    SLOT(out, off_hs_n) = x;
    Py_INCREF(rec); SLOT(out, off_hs_rec) = rec;
    Py_INCREF(self->kind); SLOT(out, off_hs_kinds) = self->kind;
    Py_INCREF(self->shape); SLOT(out, off_hs_shape) = self->shape;
    if (append_repeat(ops, self->op_id, n) < 0)
        goto error;
    if (nargs && n) {  /* one block record (no int per operand) */
        if (append_size(blocks, PyList_GET_SIZE(operands)) < 0 ||
            PyList_Append(blocks, SLOT(out, off_hs_first)) < 0 ||
            PyList_Append(blocks, SLOT(out, off_hs_n)) < 0 ||
            append_size(blocks, PyList_GET_SIZE(firsts)) < 0)
            goto error;
        for (i = 0; i < nargs; i++)
            if (PyList_Append(firsts, SLOT(args[i], off_hs_first)) < 0)
                goto error;
    }
    if (attrs == NULL) {
        if (append_repeat(attr_list, minus_one, n) < 0)
            goto error;
    } else {
        PyObject **items = PySequence_Fast_ITEMS(attrs);
        for (i = 0; i < n; i++)
            if (PyList_Append(attr_list, items[i]) < 0)
                goto error;
    }
    return out;
error:
    Py_DECREF(out);
    return NULL;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
mapcall_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"current", "kind", "op_id", "shape", "shapes", "takes_attr",
                            "fallback", NULL};
    PyObject *current, *kind, *op_id, *shape, *shapes, *fallback;
    int takes_attr;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO!OO!pO:MapCall", names, &current, &kind,
                                     &PyLong_Type, &op_id, &shape, &PyTuple_Type, &shapes,
                                     &takes_attr, &fallback))
        return NULL;
    MapCall *self = (MapCall *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = mapcall_vectorcall;
    Py_INCREF(current); self->current = current;
    Py_INCREF(kind); self->kind = kind;
    Py_INCREF(op_id); self->op_id = op_id;
    Py_INCREF(shape); self->shape = shape;
    Py_INCREF(shapes); self->shapes = shapes;
    Py_INCREF(fallback); self->fallback = fallback;
    self->takes_attr = takes_attr;
    return (PyObject *)self;
}

static int
mapcall_traverse(MapCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->current);
    Py_VISIT(self->kind);
    Py_VISIT(self->op_id);
    Py_VISIT(self->shape);
    Py_VISIT(self->shapes);
    Py_VISIT(self->fallback);
    return 0;
}

static int
mapcall_clear(MapCall *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->current);
    Py_CLEAR(self->kind);
    Py_CLEAR(self->op_id);
    Py_CLEAR(self->shape);
    Py_CLEAR(self->shapes);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
mapcall_dealloc(MapCall *self)
{
    PyObject_GC_UnTrack(self);
    mapcall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef mapcall_members[] = {
    {"fallback", T_OBJECT, offsetof(MapCall, fallback), READONLY,
     "the Python map function this call passes everything but the common case to"},
    {NULL}
};

static PyTypeObject MapCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "edbatch.api._fastrec.MapCall",
    .tp_doc = "Cell.map with the common case in C (see _fastrec_map.h).",
    .tp_basicsize = sizeof(MapCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = mapcall_new,
    .tp_dealloc = (destructor)mapcall_dealloc,
    .tp_traverse = (traverseproc)mapcall_traverse,
    .tp_clear = (inquiry)mapcall_clear,
    .tp_vectorcall_offset = offsetof(MapCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dictoffset = offsetof(MapCall, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = mapcall_members,
    .tp_getset = call_getset,
    .tp_repr = call_repr,
};
