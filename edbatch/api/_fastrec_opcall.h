/* The OpCall type of edbatch.api._fastrec: included once, by _fastrec.c (one translation unit, so
 * the slot offsets and types set up there stay static). */

/* ------------------------------------------------------------------------------- OpCall */
enum { ATTR_ANY = 0, ATTR_INT = 1, ATTR_NONE = 2, ATTR_COUNT = 3 };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *current;   /* the batch's Current: its recording, read per call */
    PyObject *kind;      /* the op type's Kind, set on the node's handle */
    PyObject *op_id;     /* int appended to rec.ops */
    PyObject *pool;      /* batch._pool: node id -> handle */
    PyObject *fallback;  /* the Python function: everything but the common case */
    PyObject *shapes;    /* tuple of interned row shapes per operand, or None (no check) */
    PyObject *each;      /* a variadic cell's repeated row shape (None: not checked) */
    Py_ssize_t arity;    /* operands; a variadic op's fixed ones (any number more follow) */
    int variadic;        /* whether the node's operand count goes to rec.counts */
    int attr_mode;       /* ATTR_ANY: any attr, default -1; ATTR_INT: an exact int is
                            required; ATTR_NONE: none or None, recorded as -1; ATTR_COUNT:
                            none, the repeated operands' count recorded (variadic cells) */
} OpCall;

static PyObject *
opcall_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    OpCall *self = (OpCall *)op;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), i;
    PyObject *attr = NULL, *rec, *ops, *operands, *attrs, *h, *old;

    if (!ready || (self->variadic ? nargs < self->arity : nargs != self->arity))
        goto fallback;
    if (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0) {
        if (PyTuple_GET_SIZE(kwnames) != 1 || PyTuple_GET_ITEM(kwnames, 0) != str_attr)
            goto fallback;  /* (a keyword not interned as "attr" takes the Python path) */
        attr = args[nargs];
    }
    switch (self->attr_mode) {
    case ATTR_ANY:
        if (attr == NULL)
            attr = minus_one;
        break;
    case ATTR_INT:
        if (attr == NULL || !PyLong_CheckExact(attr))
            goto fallback;
        break;
    case ATTR_NONE:
        if (attr != NULL && attr != Py_None)
            goto fallback;
        attr = minus_one;
        break;
    default:
        if (attr != NULL)
            goto fallback;
    }
    rec = current_recording(self->current);
    if (rec == NULL)
        goto fallback;
    for (i = 0; i < nargs; i++) {
        PyObject *a = args[i];
        if (!Py_IS_TYPE(a, HandleType) || SLOT(a, off_h_rec) != rec ||
            SLOT(a, off_h_node) == NULL)
            goto fallback;
        if (self->shapes != Py_None) {
            PyObject *k = SLOT(a, off_h_kind);
            if (k == NULL || !Py_IS_TYPE(k, KindType) || SLOT(k, off_k_shape) !=
                (i < self->arity ? PyTuple_GET_ITEM(self->shapes, i) : self->each))
                goto fallback;
        }
    }
    ops = SLOT(rec, off_r_ops);
    operands = SLOT(rec, off_r_operands);
    attrs = SLOT(rec, off_r_attrs);
    if (!is_list(ops) || !is_list(operands) || !is_list(attrs) ||
        (self->variadic && !is_list(SLOT(rec, off_r_counts))) ||
        PyList_GET_SIZE(ops) >= PyList_GET_SIZE(self->pool))
        goto fallback;  /* (a pool too short: the Python function grows it) */
    h = PyList_GET_ITEM(self->pool, PyList_GET_SIZE(ops));
    if (!Py_IS_TYPE(h, HandleType))
        goto fallback;
    if (PyList_Append(ops, self->op_id) < 0)
        goto error;
    for (i = 0; i < nargs; i++)
        if (PyList_Append(operands, SLOT(args[i], off_h_node)) < 0)
            goto error;
    if (self->variadic) {
        PyObject *count = PyLong_FromSsize_t(nargs);
        int bad = count == NULL || PyList_Append(SLOT(rec, off_r_counts), count) < 0;
        Py_XDECREF(count);
        if (bad)
            goto error;
    }
    if (self->attr_mode == ATTR_COUNT) {
        PyObject *repeated = PyLong_FromSsize_t(nargs - self->arity);
        int bad = repeated == NULL || PyList_Append(attrs, repeated) < 0;
        Py_XDECREF(repeated);
        if (bad)
            goto error;
    } else if (PyList_Append(attrs, attr) < 0)
        goto error;
    Py_INCREF(h);
    old = SLOT(h, off_h_rec);
    Py_INCREF(rec);
    SLOT(h, off_h_rec) = rec;
    Py_XDECREF(old);
    old = SLOT(h, off_h_kind);
    Py_INCREF(self->kind);
    SLOT(h, off_h_kind) = self->kind;
    Py_XDECREF(old);
    return h;

error:
    return NULL;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
opcall_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"current", "kind", "op_id", "pool", "fallback", "shapes", "arity",
                            "attr_mode", "variadic", "each", NULL};
    PyObject *current, *kind, *op_id, *pool, *fallback, *shapes, *each = Py_None;
    Py_ssize_t arity;
    int attr_mode, variadic = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OOO!O!OOni|pO:OpCall", names, &current, &kind,
                                     &PyLong_Type, &op_id, &PyList_Type, &pool, &fallback,
                                     &shapes, &arity, &attr_mode, &variadic, &each))
        return NULL;
    if (arity < 0 || attr_mode < ATTR_ANY || attr_mode > ATTR_COUNT ||
        (attr_mode == ATTR_COUNT) != (variadic && shapes != Py_None) ||
        !PyCallable_Check(fallback) || (shapes != Py_None && (!PyTuple_CheckExact(shapes) ||
                                                              PyTuple_GET_SIZE(shapes) != arity))) {
        PyErr_SetString(PyExc_ValueError, "OpCall: arity >= 0, attr_mode 0-3 (3 exactly for "
                        "a variadic cell), a callable fallback and shapes None or a tuple of "
                        "arity shapes");
        return NULL;
    }
    OpCall *self = (OpCall *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = opcall_vectorcall;
    Py_INCREF(current); self->current = current;
    Py_INCREF(kind); self->kind = kind;
    Py_INCREF(op_id); self->op_id = op_id;
    Py_INCREF(pool); self->pool = pool;
    Py_INCREF(fallback); self->fallback = fallback;
    Py_INCREF(shapes); self->shapes = shapes;
    Py_INCREF(each); self->each = each;
    self->variadic = variadic;
    self->arity = arity;
    self->attr_mode = attr_mode;
    return (PyObject *)self;
}

static int
opcall_traverse(OpCall *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->current);
    Py_VISIT(self->kind);
    Py_VISIT(self->op_id);
    Py_VISIT(self->pool);
    Py_VISIT(self->fallback);
    Py_VISIT(self->shapes);
    Py_VISIT(self->each);
    return 0;
}

static int
opcall_clear(OpCall *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->current);
    Py_CLEAR(self->kind);
    Py_CLEAR(self->op_id);
    Py_CLEAR(self->pool);
    Py_CLEAR(self->fallback);
    Py_CLEAR(self->shapes);
    Py_CLEAR(self->each);
    return 0;
}

static void
opcall_dealloc(OpCall *self)
{
    PyObject_GC_UnTrack(self);
    opcall_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef opcall_members[] = {
    {"fallback", T_OBJECT, offsetof(OpCall, fallback), READONLY,
     "the Python function this call passes everything but the common case to"},
    {NULL}
};


static PyTypeObject OpCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "edbatch.api._fastrec.OpCall",
    .tp_doc = "One node of an op type or cell per call (the common case in C; see the "
              "module).",
    .tp_basicsize = sizeof(OpCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = opcall_new,
    .tp_dealloc = (destructor)opcall_dealloc,
    .tp_traverse = (traverseproc)opcall_traverse,
    .tp_clear = (inquiry)opcall_clear,
    .tp_vectorcall_offset = offsetof(OpCall, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dictoffset = offsetof(OpCall, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = opcall_members,
    .tp_getset = call_getset,
    .tp_repr = call_repr,
};

