/* The AddLoss and Lookup types of edbatch.api._fastrec: included once, by _fastrec.c (one translation unit, so
 * the slot offsets and types set up there stay static). */

/* ------------------------------------------------------------------------------ AddLoss */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *current;   /* the batch's Current */
    PyObject *fallback;  /* the bound DynamicBatch.add_loss */
} AddLoss;

static PyObject *
addloss_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    AddLoss *self = (AddLoss *)op;
    PyObject *rec, *h, *k, *losses;
    if (!ready || PyVectorcall_NARGS(nargsf) != 1 ||
        (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0))
        goto fallback;
    rec = current_recording(self->current);
    if (rec == NULL)
        goto fallback;
    h = args[0];
    if (!Py_IS_TYPE(h, HandleType) || SLOT(h, off_h_rec) != rec ||
        SLOT(h, off_h_node) == NULL || (k = SLOT(h, off_h_kind)) == NULL ||
        !Py_IS_TYPE(k, KindType) || SLOT(k, off_k_scalar) != Py_True)
        goto fallback;
    losses = SLOT(rec, off_r_losses);
    if (!is_list(losses))
        goto fallback;
    if (PyList_Append(losses, SLOT(h, off_h_node)) < 0)
        return NULL;
    Py_RETURN_NONE;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
addloss_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"current", "fallback", NULL};
    PyObject *current, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO:AddLoss", names, &current, &fallback))
        return NULL;
    AddLoss *self = (AddLoss *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = addloss_vectorcall;
    Py_INCREF(current); self->current = current;
    Py_INCREF(fallback); self->fallback = fallback;
    return (PyObject *)self;
}

static int
addloss_traverse(AddLoss *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->current);
    Py_VISIT(self->fallback);
    return 0;
}

static int
addloss_clear(AddLoss *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->current);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
addloss_dealloc(AddLoss *self)
{
    PyObject_GC_UnTrack(self);
    addloss_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef addloss_members[] = {
    {"fallback", T_OBJECT, offsetof(AddLoss, fallback), READONLY,
     "the bound DynamicBatch.add_loss this call passes everything but the common case to"},
    {NULL}
};

static PyTypeObject AddLossType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "edbatch.api._fastrec.AddLoss",
    .tp_doc = "DynamicBatch.add_loss with the common case in C (see the module).",
    .tp_basicsize = sizeof(AddLoss),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = addloss_new,
    .tp_dealloc = (destructor)addloss_dealloc,
    .tp_traverse = (traverseproc)addloss_traverse,
    .tp_clear = (inquiry)addloss_clear,
    .tp_vectorcall_offset = offsetof(AddLoss, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dictoffset = offsetof(AddLoss, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = addloss_members,
    .tp_getset = call_getset,
    .tp_repr = call_repr,
};

/* ------------------------------------------------------------------------------- Lookup */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *dict;
    PyObject *current;   /* the batch's Current */
    PyObject *pool;      /* batch._pool */
    PyObject *kinds;     /* batch._lookup_kinds: embedding -> its cell's Kind */
    PyObject *fallback;  /* the bound DynamicBatch.lookup */
} Lookup;

static PyObject *
lookup_vectorcall(PyObject *op, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Lookup *self = (Lookup *)op;
    PyObject *rec, *kind, *index, *rows, *ops, *attrs, *h, *old;
    Py_ssize_t i, n;
    if (!ready || PyVectorcall_NARGS(nargsf) != 2 ||
        (kwnames != NULL && PyTuple_GET_SIZE(kwnames) != 0))
        goto fallback;
    index = args[1];
    if (!PyLong_CheckExact(index))
        goto fallback;
    /* (read num_embeddings first: reading it may run Python code, which could change the
     * kinds dict or start a new recording; rec and kind are read after it) */
    rows = PyObject_GetAttr(args[0], str_num_embeddings);
    if (rows == NULL) {
        PyErr_Clear();  /* (the Python method says what is wrong) */
        goto fallback;
    }
    n = PyLong_CheckExact(rows) ? PyLong_AsSsize_t(rows) : -1;
    Py_DECREF(rows);
    i = PyLong_AsSsize_t(index);
    if (n < 0 || i < 0 || i >= n) {
        PyErr_Clear();  /* (an index past Py_ssize_t: out of range, as the method says) */
        goto fallback;
    }
    kind = PyDict_GetItemWithError(self->kinds, args[0]);  /* borrowed; no code runs below */
    rec = current_recording(self->current);
    if (kind == NULL || rec == NULL || !Py_IS_TYPE(kind, KindType) ||
        SLOT(kind, off_k_op_id) == NULL) {
        PyErr_Clear();  /* (an unhashable embedding: the Python method says what it does) */
        goto fallback;
    }
    ops = SLOT(rec, off_r_ops);
    attrs = SLOT(rec, off_r_attrs);
    if (!is_list(ops) || !is_list(attrs) || PyList_GET_SIZE(ops) >= PyList_GET_SIZE(self->pool))
        goto fallback;
    h = PyList_GET_ITEM(self->pool, PyList_GET_SIZE(ops));
    if (!Py_IS_TYPE(h, HandleType))
        goto fallback;
    if (PyList_Append(ops, SLOT(kind, off_k_op_id)) < 0 || PyList_Append(attrs, index) < 0)
        return NULL;
    Py_INCREF(h);
    old = SLOT(h, off_h_rec);
    Py_INCREF(rec);
    SLOT(h, off_h_rec) = rec;
    Py_XDECREF(old);
    old = SLOT(h, off_h_kind);
    Py_INCREF(kind);
    SLOT(h, off_h_kind) = kind;
    Py_XDECREF(old);
    return h;
fallback:
    return PyObject_Vectorcall(self->fallback, args, nargsf, kwnames);
}

static PyObject *
lookup_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    static char *names[] = {"current", "pool", "kinds", "fallback", NULL};
    PyObject *current, *pool, *kinds, *fallback;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "OO!O!O:Lookup", names, &current, &PyList_Type,
                                     &pool, &PyDict_Type, &kinds, &fallback))
        return NULL;
    Lookup *self = (Lookup *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->vectorcall = lookup_vectorcall;
    Py_INCREF(current); self->current = current;
    Py_INCREF(pool); self->pool = pool;
    Py_INCREF(kinds); self->kinds = kinds;
    Py_INCREF(fallback); self->fallback = fallback;
    return (PyObject *)self;
}

static int
lookup_traverse(Lookup *self, visitproc visit, void *arg)
{
    Py_VISIT(self->dict);
    Py_VISIT(self->current);
    Py_VISIT(self->pool);
    Py_VISIT(self->kinds);
    Py_VISIT(self->fallback);
    return 0;
}

static int
lookup_clear(Lookup *self)
{
    Py_CLEAR(self->dict);
    Py_CLEAR(self->current);
    Py_CLEAR(self->pool);
    Py_CLEAR(self->kinds);
    Py_CLEAR(self->fallback);
    return 0;
}

static void
lookup_dealloc(Lookup *self)
{
    PyObject_GC_UnTrack(self);
    lookup_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef lookup_members[] = {
    {"fallback", T_OBJECT, offsetof(Lookup, fallback), READONLY,
     "the bound DynamicBatch.lookup this call passes everything but the common case to"},
    {NULL}
};

static PyTypeObject LookupType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "edbatch.api._fastrec.Lookup",
    .tp_doc = "DynamicBatch.lookup with the common case in C (see the module).",
    .tp_basicsize = sizeof(Lookup),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = lookup_new,
    .tp_dealloc = (destructor)lookup_dealloc,
    .tp_traverse = (traverseproc)lookup_traverse,
    .tp_clear = (inquiry)lookup_clear,
    .tp_vectorcall_offset = offsetof(Lookup, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dictoffset = offsetof(Lookup, dict),
    .tp_getattro = PyObject_GenericGetAttr,
    .tp_setattro = PyObject_GenericSetAttr,
    .tp_members = lookup_members,
    .tp_getset = call_getset,
    .tp_repr = call_repr,
};

