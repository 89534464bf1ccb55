"""`--strategy tower`: the model_fn replicated as one tower per device over ONE set of variables.

The classic multi-GPU recipe (TensorFlow's cifar10_multi_gpu_train, emloop's
`n_gpus`), made exact and general:

- Any batch size. input_fn yields the whole global batch; it is split into N
  towers whose sizes differ by at most one, computed from the batch's runtime
  size, so B % N != 0 and a final short batch work. A batch smaller than N
  leaves towers empty; an empty tower weighs zero (its NaN mean cannot leak).
- Exact. Each tower's loss is the mean over its examples; the applied gradient
  is sum_i (n_i / B) x gradient_i, the gradient of the mean over all B
  examples, so a tower step equals the single-device step on the same batch
  (an unweighted average of the towers is biased when sizes differ).
- One set of variables, with the single-device names (checkpoints interchange
  with every strategy), on `variable_device`. tf.compat.v1 get_variable code is
  shared by variable-scope reuse; Keras layers make new variables on every
  call, so a variable creator hands tower k the variable tower 0 created at the
  same position.
- The model_fn builds its train op with `estimator_dist.minimize(loss, params)`,
  which here records the tower's loss and update ops and returns a placeholder.
- Batch norm keeps tower 0's statistics: tower 0's update ops (UPDATE_OPS and
  Keras updates passed to minimize) run every step, the other towers' are never
  run (as in tf_cnn_benchmarks). Tower 0 is the largest tower, never empty.
  Each tower normalizes with its own batch statistics (like mirrored), so a
  batch-norm model is not step-for-step identical to one device.
- TensorBoard gets `tower_loss/tower_i`; the reported `loss` is the mean over
  the batch's examples (the example-weighted mean of the tower losses).
- EVAL and PREDICT call the model_fn once on the whole batch, exactly the
  single-device graph: same metrics (stateful tf.compat.v1.metrics cannot be
  merged across towers in general), predictions in input order, and exported
  SavedModels are not pinned to N devices.

With no devices the wrapper runs the model_fn as one tower in place, which is
how `--accumulate_steps` works under the other strategies (see accumulate.py).
"""
import contextlib
from dataclasses import dataclass
from typing import Any, List, Optional, Sequence, Tuple

import tensorflow as tf

from estimator_dist.graph import accumulate
from estimator_dist.graph import model_fn_wrap
from estimator_dist.graph import replica_collections
from estimator_dist.graph import train_op as train_op_lib
from estimator_dist.errors import UserError

TRAIN = tf.estimator.ModeKeys.TRAIN


def split_sizes(batch, num_towers: int):
    """int32 [num_towers]: tower sizes for `batch` examples, differing by at most one."""
    batch = tf.cast(batch, tf.int32)
    extra = tf.cast(tf.range(num_towers) < batch % num_towers, tf.int32)
    return batch // num_towers + extra


def batch_size(features):
    """The runtime number of examples in `features` (its first tensor's leading dimension)."""
    leaf = tf.nest.flatten(features)[0]
    if isinstance(leaf, tf.SparseTensor):
        return tf.cast(leaf.dense_shape[0], tf.int32)
    return tf.shape(leaf, out_type=tf.int32)[0]


def split_batch(structure, sizes, num_towers: int) -> List[Any]:
    """`structure` (features or labels, any nesting) cut into consecutive tower slices."""
    parts = [_split(value, sizes, num_towers) for value in tf.nest.flatten(structure)]
    return [tf.nest.pack_sequence_as(structure, [p[i] for p in parts]) for i in range(num_towers)]


def _split(value, sizes, num_towers):
    if value is None:
        return [None] * num_towers
    if value.shape.rank == 0:  # e.g. the distribution guide's unbatched tutorial input
        raise UserError(f"--strategy tower splits each batch along its first dimension, but the "
                        f"input yields a scalar {value.dtype.name} (one example, not batched); "
                        f"batch() its dataset, or use --strategy mirrored")
    if isinstance(value, tf.SparseTensor):
        starts = tf.cast(tf.cumsum(sizes, exclusive=True), tf.int64)
        lengths = tf.cast(sizes, tf.int64)
        rest = value.dense_shape[1:]
        return [tf.sparse.slice(value, tf.concat([starts[i:i + 1], tf.zeros_like(rest)], 0),
                                tf.concat([lengths[i:i + 1], rest], 0))
                for i in range(num_towers)]
    return tf.split(value, sizes, num=num_towers, axis=0)


def combine_gradients(tower_grads: Sequence[Sequence], sizes):
    """sum_i (n_i / B) x g_i per variable; towers with n_i = 0 contribute exactly zero."""
    sizes = tf.cast(sizes, tf.float32)
    weights = sizes / tf.maximum(tf.reduce_sum(sizes), 1.0)
    combined = []
    for per_var in zip(*tower_grads):
        parts = [_scale(g, weights[i], sizes[i] > 0) for i, g in enumerate(per_var) if g is not None]
        combined.append(_add(parts) if parts else None)
    return combined


def _scale(grad, weight, nonempty):
    if isinstance(grad, tf.IndexedSlices):
        values = tf.where(nonempty, grad.values * tf.cast(weight, grad.values.dtype),
                          tf.zeros_like(grad.values))
        return tf.IndexedSlices(values, grad.indices, grad.dense_shape)
    return tf.where(nonempty, grad * tf.cast(weight, grad.dtype), tf.zeros_like(grad))


def _add(parts):
    if len(parts) == 1:
        return parts[0]
    if all(isinstance(p, tf.IndexedSlices) for p in parts):
        return tf.IndexedSlices(tf.concat([p.values for p in parts], 0),
                                tf.concat([p.indices for p in parts], 0), parts[0].dense_shape)
    return tf.add_n([tf.convert_to_tensor(p) for p in parts])


class _Recorder:
    """The minimize() handler inside one tower: remembers the loss, returns a placeholder op."""

    def __init__(self):
        self.calls = []

    def __call__(self, loss, params, update_ops=None, var_list=None, optimizer=None):
        scopes = (tf.compat.v1.get_variable_scope(), tf.compat.v1.get_default_graph().get_name_scope())
        self.calls.append((loss, params, list(update_ops or []), var_list, scopes, optimizer))
        return tf.no_op(name="tower_minimize")


class _VariableSharer:
    """Tower 0 creates the variables (on the variable device); towers 1.. get the same objects.

    get_variable code never reaches the creator in towers > 0 (AUTO_REUSE finds
    the variable by name). Everything else (Keras layers) is matched by creation
    order, which is the same on every call of one model_fn.
    """

    def __init__(self, device: Optional[str]):
        self._device = device
        self._created = []  # tower 0's variables not made by get_variable, in order
        self._tower = 0
        self._next = 0
        self._in_get_variable = 0

    @contextlib.contextmanager
    def tower(self, index: int):
        self._tower, self._next = index, 0
        # Entering the current scope object restores variable-scope name counts on
        # exit, so unnamed v1 layers get the same names ("dense", "dense_1") in every tower.
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                         reuse=tf.compat.v1.AUTO_REUSE, custom_getter=self._getter):
            with tf.variable_creator_scope(self._creator):
                yield

    def _getter(self, getter, *args, **kwargs):
        self._in_get_variable += 1
        try:
            return getter(*args, **kwargs)
        finally:
            self._in_get_variable -= 1

    def _creator(self, next_creator, **kwargs):
        if self._tower == 0 or self._in_get_variable:
            placement = tf.device(self._device) if self._device else contextlib.nullcontext()
            with placement:
                var = next_creator(**kwargs)
            if self._tower == 0 and not self._in_get_variable:
                self._created.append(var)
            return var
        if self._next >= len(self._created):
            raise UserError(f"tower {self._tower} creates more variables than tower 0 "
                            f"({len(self._created)}); a model_fn must build the same "
                            f"variables on every call")
        var = self._created[self._next]
        self._next += 1
        shape = kwargs.get("shape")
        if shape is not None and tf.TensorShape(shape).is_fully_defined() \
                and not tf.TensorShape(shape).is_compatible_with(var.shape):
            raise UserError(f"tower {self._tower} wants a variable of shape {tf.TensorShape(shape)} "
                            f"where tower 0 created {var.name} {var.shape}; a model_fn must "
                            f"build the same variables on every call")
        return var


@dataclass
class Tower:
    """One tower's part of a TRAIN step."""

    spec: tf.estimator.EstimatorSpec
    loss: tf.Tensor
    params: Any  # what minimize() got: the optimizer and its schedule come from here
    update_ops: List
    var_list: Optional[List]
    scopes: Tuple  # (variable scope, name scope) minimize() was called in
    # The model_fn's own optimizer (minimize(optimizer=...)); tower 0's applies the step.
    optimizer: Any = None

    @contextlib.contextmanager
    def minimize_scope(self):
        """Re-enter where minimize() was called: optimizer slots (e.g. `Adam` of a variable
        made in a `variable_scope("m")`) are named after it, as in a single-device run."""
        variable_scope, name_scope = self.scopes
        names = tf.compat.v1.name_scope(name_scope + "/") if name_scope else contextlib.nullcontext()
        with tf.compat.v1.variable_scope(variable_scope, auxiliary_name_scope=False), names:
            yield


def _caller(model_fn):
    """model_fn behind the full signature, given what it takes (as Estimator calls it)."""
    return model_fn_wrap.estimator_call(model_fn)


def _own_train_op_error(model_name):
    return UserError(
        f"model '{model_name}' builds its own train_op; --strategy tower and --accumulate_steps "
        f"need the model_fn to build it with estimator_dist.minimize(loss, params) "
        f"(the other strategies still accept its own)")


def build_tower(call, model_name, features, labels, params, config) -> Tower:
    """Call the model_fn in TRAIN mode with minimize() recording instead of applying."""
    recorder = _Recorder()
    collection = tf.compat.v1.GraphKeys.UPDATE_OPS
    before = len(tf.compat.v1.get_collection(collection))
    with train_op_lib.minimize_handler(recorder):
        spec = call(features, labels, TRAIN, params, config)
    new_updates = tf.compat.v1.get_collection(collection)[before:]
    if not recorder.calls:
        raise _own_train_op_error(model_name)
    if len(recorder.calls) > 1:
        raise UserError(f"model '{model_name}' calls estimator_dist.minimize {len(recorder.calls)} "
                        f"times in one step; --strategy tower and --accumulate_steps support one loss")
    loss, minimize_params, update_ops, var_list, scopes, optimizer = recorder.calls[0]
    return Tower(spec=spec, loss=loss, params=minimize_params,
                 update_ops=list(dict.fromkeys(new_updates + update_ops)), var_list=var_list,
                 scopes=scopes, optimizer=optimizer)


def tower_model_fn(model_fn, model_name: str, devices: Sequence[str] = (),
                   variable_device: Optional[str] = None, accumulate_steps: int = 1):
    """Wrap `model_fn` so TRAIN runs it as towers on `devices` (none: once, in place).

    Args:
      model_fn: an Estimator model_fn that builds its train op with minimize().
      model_name: for error messages.
      devices: one tower per device; empty runs a single tower without placement.
      variable_device: where the one set of variables lives (None: default placement).
      accumulate_steps: apply every K micro-batches (accumulate.py).
    Returns:
      A model_fn `(features, labels, mode, params, config)`.
    """
    call = _caller(model_fn)
    tower_devices = list(devices) or [None]

    def towers_model_fn(features, labels, mode, params, config):
        if mode != TRAIN:
            return call(features, labels, mode, params, config)
        n = len(tower_devices)
        total = batch_size(features)
        sizes = split_sizes(total, n) if n > 1 else tf.reshape(total, [1])
        feature_parts = split_batch(features, sizes, n) if n > 1 else [features]
        label_parts = split_batch(labels, sizes, n) if n > 1 else [labels]
        sharer = _VariableSharer(variable_device) if devices else None
        towers = []
        for i, device in enumerate(tower_devices):
            with _tower_scope(i, device, sharer), _own_collections(i, n):
                towers.append(build_tower(call, model_name, feature_parts[i], label_parts[i],
                                          params, config))
            if i == 0:
                tower0_variables = {id(v) for v in tf.compat.v1.global_variables()}
        extra = [v.name for v in tf.compat.v1.global_variables() if id(v) not in tower0_variables]
        if extra:
            raise UserError(f"model '{model_name}' creates variables in towers > 0 that tower 0 "
                            f"did not ({', '.join(extra[:3])}); a model_fn must build the same "
                            f"variables on every call")
        return _train_spec(towers, sizes, tower_devices, variable_device, accumulate_steps)

    return towers_model_fn


@contextlib.contextmanager
def _tower_scope(index, device, sharer):
    if sharer is None:
        yield
        return
    # Tower 0 is built outside any name scope: Keras names variables after it.
    names = tf.name_scope(f"tower_{index}") if index else contextlib.nullcontext()
    with sharer.tower(index), names, tf.device(device):
        yield


def _own_collections(index, num_towers):
    """Each tower sees the graph's collections as one device would (replica_collections.py);
    afterwards UPDATE_OPS lists tower 0's, the ones that run."""
    if num_towers == 1:
        return contextlib.nullcontext()
    return replica_collections.call(
        index, first_only=replica_collections.FIRST_CALL_ONLY + (tf.compat.v1.GraphKeys.UPDATE_OPS,))


def _placed(device):
    return tf.device(device) if device else contextlib.nullcontext()


def _train_spec(towers: List[Tower], sizes, devices, variable_device, accumulate_steps):
    """Per-tower gradients on their devices, combined and applied once on the variable device."""
    first = towers[0]
    var_list = accumulate.trainable(first.var_list)
    tower_grads = []
    for i, (tower, device) in enumerate(zip(towers, devices)):
        names = tf.name_scope(f"tower_{i}") if len(towers) > 1 else contextlib.nullcontext()
        with _placed(device), names:
            tower_grads.append(accumulate.gradients(tower.loss, var_list))
    with _placed(variable_device):
        grads = combine_gradients(tower_grads, sizes) if len(towers) > 1 else tower_grads[0]
        loss = _mean_loss(towers, sizes)
        with first.minimize_scope():
            optimizer = train_op_lib.optimizer_for(first.params, first.optimizer)
            deps = first.update_ops + [first.spec.train_op]
            train_op, hooks = accumulate.build_train_op(
                optimizer, list(zip(grads, var_list)), tf.reduce_sum(sizes), accumulate_steps, deps,
                loss=loss)
    return first.spec._replace(loss=loss, train_op=train_op,
                               training_hooks=list(first.spec.training_hooks) + hooks)


def _mean_loss(towers, sizes):
    """The loss over the batch's examples; per-tower losses go to TensorBoard."""
    if len(towers) == 1:
        return towers[0].spec.loss
    sizes = tf.cast(sizes, tf.float32)
    weights = sizes / tf.maximum(tf.reduce_sum(sizes), 1.0)
    parts = []
    for i, tower in enumerate(towers):
        loss = tf.where(sizes[i] > 0, tf.cast(tower.spec.loss, tf.float32), 0.0)
        tf.compat.v1.summary.scalar(f"tower_loss/tower_{i}", loss)
        parts.append(weights[i] * loss)
    return tf.add_n(parts, name="tower_mean_loss")
