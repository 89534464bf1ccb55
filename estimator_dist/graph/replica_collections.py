"""Every replica's and tower's model_fn call sees the graph's collections as one device would.

Graph collections are global to a graph. Estimator under MirroredStrategy (and
CentralStorage, or any in-graph strategy over several devices) calls the model_fn
once per replica in ONE graph, and `--strategy tower` calls it once per tower. A
model_fn written for one device then collects the earlier calls' entries too:
`tf.compat.v1.losses.get_total_loss()`, or cifar10.py's
`tf.add_n(tf.compat.v1.get_collection('losses'))`, in the second call sums the first
call's losses as well (TF1's tower tutorial passed the tower's name scope to
get_collection; single-device code has none to pass). Measured before this module:
tower N=2 off by max |dw| 0.48 after 5 steps, exit 0.

While a call runs (`call(index)`), the graph's collections are a view. The per-call
collections, PER_CALL and every collection not named in tf.compat.v1.GraphKeys (a
user's, e.g. 'losses'), hold what the graph held before the group's first call plus
what THIS call added. Every other collection (trainable variables, the global step,
savers, init ops, queue runners, tables, iterators) stays shared, as before.

Regularization is counted once in every call, as on one device. A call after the
first reuses the first call's variables, so TF adds no regularization loss for them
(get_variable's `regularizer` runs only on creation; a tf.compat.v1.layers layer
adds it only for a variable not yet in GLOBAL_VARIABLES). Here GLOBAL_VARIABLES is
per-call, so a v1 layer's variable is new to each call, and a get_variable
regularizer is applied again to a reused variable: each call's loss carries its own
regularization, computed in its own replica (under Mirrored, on the replica's copy
of the variable, so its gradient reaches that copy).

After the calls each per-call collection holds, besides what it held before and
what was added outside the calls:
- REGULARIZATION_LOSSES, SUMMARIES: the first call's entries only (one device's:
  each variable's regularization once; TensorBoard shows replica 0's / tower 0's
  summaries, as Estimator's training hooks see replica 0's tensors);
- UPDATE_OPS: the ones that run: every replica's under a tf.distribute strategy
  (each replica's train op runs its own), tower 0's under `tower` (towers.py);
- GLOBAL_VARIABLES: every call's new variables;
- LOSSES, ACTIVATIONS and a user's collections: every call's entries, in call order.
"""
import contextlib
import threading
from typing import Dict, Iterable, Optional

import tensorflow as tf

from estimator_dist.compat import internals
from estimator_dist.graph import model_fn_wrap

KEYS = tf.compat.v1.GraphKeys
# TF's own collections that a model_fn call fills for its replica.
PER_CALL = (KEYS.LOSSES, KEYS.REGULARIZATION_LOSSES, KEYS.UPDATE_OPS, KEYS.SUMMARIES,
            KEYS.ACTIVATIONS, KEYS.GLOBAL_VARIABLES)
FIRST_CALL_ONLY = (KEYS.REGULARIZATION_LOSSES, KEYS.SUMMARIES)
# Collections TF keeps under plain names that are not in GraphKeys: graph-wide state.
_TF_INTERNAL = ("global_step_read_op_cache", "iterator_ops", "saved_model_initializers",
                "train_op", "extra_var_assign_ops", "critical_sections",
                "critical_section_executions")
_TF_KEYS = frozenset(value for key, value in vars(KEYS).items()
                     if key.lstrip("_").isupper() and isinstance(value, str))
_LOCAL = threading.local()  # per thread: the stack of (views, call) being built
_MISSING = object()


def per_call(name) -> bool:
    """Whether collection `name` is a replica's own while its model_fn call runs."""
    if name in PER_CALL:
        return True
    return isinstance(name, str) and name not in _TF_KEYS and not name.startswith("_") \
        and name not in _TF_INTERNAL


class _Call:
    """One model_fn call's own per-call collections (copies of the group's baseline)."""

    def __init__(self, index: int, first: bool, baseline: Dict[str, list]):
        self.index = index
        self.first = first
        self.baseline = baseline
        self.lists: Dict[str, list] = {}
        self.regularized = set()  # ids of reused variables whose regularizer ran here

    def get(self, name) -> Optional[list]:
        if name not in self.lists:
            if name not in self.baseline:
                return None
            self.lists[name] = list(self.baseline[name])
        return self.lists[name]

    def added(self):
        """(name, entries this call added) per collection."""
        for name, items in self.lists.items():
            before = {id(x) for x in self.baseline.get(name, ())}
            new = [x for x in items if id(x) not in before]
            if new:
                yield name, new


class _Views(dict):
    """A graph's `_collections` while calls are isolated: routes each access by the calling
    thread's current call. Stores nothing itself (dict is subclassed for isinstance checks);
    the graph's own dict, `shared`, holds everything outside the calls."""

    def __init__(self, shared: dict):
        super().__init__()
        self.shared = shared
        self.baseline: Optional[Dict[str, list]] = None
        self.first_only: Iterable[str] = FIRST_CALL_ONLY
        self.active = 0

    def current(self) -> Optional[_Call]:
        for views, call in reversed(getattr(_LOCAL, "stack", ())):
            if views is self:
                return call
        return None

    def _call_for(self, name) -> Optional[_Call]:
        return self.current() if per_call(name) else None

    def get(self, name, default=None):
        call = self._call_for(name)
        if call is None:
            return self.shared.get(name, default)
        found = call.get(name)
        return default if found is None else found

    def __getitem__(self, name):
        found = self.get(name, _MISSING)
        if found is _MISSING:
            raise KeyError(name)
        return found

    def __setitem__(self, name, value):
        call = self._call_for(name)
        (self.shared if call is None else call.lists)[name] = value

    def __delitem__(self, name):
        call = self._call_for(name)
        if call is None:
            del self.shared[name]
        else:
            call.lists[name] = []

    def __contains__(self, name):
        return self.get(name, _MISSING) is not _MISSING

    def keys(self):
        call = self.current()
        names = [k for k in self.shared if call is None or not per_call(k)]
        if call is not None:
            names += list(call.baseline) + list(call.lists)
        return list(dict.fromkeys(names))

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self.keys())

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def values(self):
        return [self[k] for k in self.keys()]

    def setdefault(self, name, default=None):
        if name not in self:
            self[name] = default
        return self[name]

    def pop(self, name, *default):
        found = self.get(name, _MISSING)
        if found is _MISSING:
            if default:
                return default[0]
            raise KeyError(name)
        del self[name]
        return found

    def copy(self):
        return dict(self.items())

    def __repr__(self):
        return f"_Views({dict(self.items())!r})"

    def fold(self, call: _Call):
        """Move a finished call's entries into the shared collections (module docstring)."""
        for name, new in call.added():
            if name in self.first_only and not call.first:
                continue
            target = self.shared.setdefault(name, [])
            present = {id(x) for x in target}
            target.extend(x for x in new if id(x) not in present)


def _views(graph) -> _Views:
    views = internals.graph_collections(graph)
    if not isinstance(views, _Views):
        views = _Views(views)
        internals.replace_graph_collections(graph, views)
    return views


@contextlib.contextmanager
def call(index: int, first_only: Iterable[str] = FIRST_CALL_ONLY):
    """Build replica/tower `index`'s part of the graph with its own per-call collections.

    A call with index 0 and no call under way starts a new group (its baseline is what
    the collections hold now); the calls after it join that group.
    """
    graph = tf.compat.v1.get_default_graph()
    views = _views(graph)
    first = views.baseline is None or (index == 0 and not views.active)
    if first:
        views.baseline = {k: list(v) for k, v in views.shared.items() if per_call(k)}
        views.first_only = tuple(first_only)
    this = _Call(index, first, views.baseline)
    _LOCAL.stack = getattr(_LOCAL, "stack", ()) + ((views, this),)
    views.active += 1
    try:
        with _regularizing_reused(this):
            yield
    finally:
        _LOCAL.stack = _LOCAL.stack[:-1]
        views.active -= 1
        views.fold(this)


@contextlib.contextmanager
def _regularizing_reused(this: _Call):
    """tf.compat.v1.get_variable(regularizer=) on a variable an earlier call created: add its
    regularization loss here too (TF adds it only where the variable is created)."""
    if this.first:
        yield
        return

    def regularizing_getter(getter, name, *args, **kwargs):  # TF passes both by keyword
        created = []

        def creator(next_creator, **creator_kwargs):
            created.append(True)
            return next_creator(**creator_kwargs)

        with tf.variable_creator_scope(creator):
            variable = getter(name, *args, **kwargs)
        regularizer = kwargs.get("regularizer")
        if regularizer is not None and not created and id(variable) not in this.regularized:
            this.regularized.add(id(variable))
            with tf.name_scope(name.split("/")[-1] + "/Regularizer"):
                loss = regularizer(variable)
            if loss is not None:
                tf.compat.v1.add_to_collection(KEYS.REGULARIZATION_LOSSES, loss)
        return variable

    scope = tf.compat.v1.get_variable_scope()
    with tf.compat.v1.variable_scope(scope, custom_getter=regularizing_getter,
                                     auxiliary_name_scope=False):
        yield


def _replica_index() -> int:
    """This replica's index among the replicas of the current call_for_each_replica (0 outside)."""
    context = tf.distribute.get_replica_context()
    if context is None:
        return 0
    index = tf.get_static_value(context.replica_id_in_sync_group)
    return int(index) if index is not None else 0


def per_replica(model_fn):
    """`model_fn` with each replica's call isolated (for strategies calling it per device)."""
    def isolated(mode, build):
        with call(_replica_index()):
            return build()

    return model_fn_wrap.around(model_fn, isolated)
