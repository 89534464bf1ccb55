"""Checks run before anything is written: what would otherwise fail only at the first
evaluation, at the final export or deep inside a graph build (scratch graphs)."""
import contextlib
import os
import re

import tensorflow as tf

from estimator_dist.guards import checkpoints as checkpoints_lib
from estimator_dist.serving import checkpoint_choice
from estimator_dist.serving import export as export_lib
from estimator_dist.errors import UserError, first_line
from estimator_dist.training.estimator import build_model_fn, make_input_fn
from estimator_dist.training.plan import Plan


def check_eval_metric_names(p: Plan):
    """The EVAL graph builds, and --early_stop and --export best's --best_metric name a
    metric evaluation reports.

    Checked on a scratch EVAL graph before the first step, as the PREDICT graph is
    (check_predict_graph): a model_fn whose EVAL branch fails (TF1 code calling a name
    TensorFlow 2 moved) trained the whole run and failed at the first evaluation; a
    metric typo showed only there, or never.
    """
    t = p.config.train
    asked = [(flag, metric) for flag, metric in (("--early_stop", t.early_stop),
                                                 ("--best_metric", t.best_metric))
             if metric and (flag == "--early_stop" or t.export == "best")]
    known = checkpoints_lib.in_scratch_graph(
        build_model_fn(p), make_input_fn(p, tf.estimator.ModeKeys.EVAL), p.params(),
        tf.estimator.ModeKeys.EVAL, None, lambda spec: sorted({"loss", *spec.eval_metric_ops}))
    for flag, metric in asked:
        if metric not in known:
            raise UserError(f"{flag} {metric}: not an eval metric of this model; it reports "
                            f"{', '.join(known)}")


def check_predict_graph(p: Plan):
    """A model_fn that cannot build its PREDICT graph (it uses labels whatever the mode)
    trained the whole run and failed at the final export: built first in a scratch graph,
    as export builds it (serving placeholders, labels=None), when the run exports."""
    if p.config.train.export == "none":
        return
    checkpoints_lib.in_scratch_graph(
        build_model_fn(p), export_lib.receiver_fn(p.serving_input),
        p.params(), tf.estimator.ModeKeys.PREDICT, None, lambda spec: None)


def check_eval_input_ends(p: Plan):
    """With --eval_steps 0 an evaluation runs until its input ends: an eval dataset that
    repeat()s forever (TF1 code often repeats in every mode) hung after training, silently.

    Its tf.data cardinality, read in a scratch graph before anything is written.
    """
    if p.config.train.eval_steps:
        return
    input_fn = make_input_fn(p, tf.estimator.ModeKeys.EVAL)
    with tf.Graph().as_default() as graph:
        data = input_fn()
        if not isinstance(data, tf.data.Dataset):
            return  # tensors: check_input_result refuses them with --eval_steps 0
        cardinality = tf.data.experimental.cardinality(data)
        try:
            with tf.compat.v1.Session(graph=graph) as session:
                value = session.run(cardinality)
        except tf.errors.OpError:
            return  # cannot tell here; Estimator runs the input as it is
    if value == tf.data.experimental.INFINITE_CARDINALITY:
        raise UserError(f"input '{p.input.name}' repeats forever in its eval call (its "
                        f"dataset's cardinality is infinite): with --eval_steps 0 (the whole "
                        f"eval set) the evaluation would never end; give --eval_steps N, or "
                        f"repeat() only in TRAIN mode")


def warm_start_settings(p: Plan):
    """--warm_start_from: a checkpoint, or a model_dir's latest; used only by a new run."""
    source = p.config.train.warm_start_from
    if not source:
        return None
    if os.path.isdir(source):
        latest = tf.train.latest_checkpoint(source)
        if not latest:
            raise UserError(f"--warm_start_from {source}: the directory holds no checkpoint")
        source = latest
    pattern = p.config.train.warm_start_vars
    try:
        stored = dict(tf.train.list_variables(source))
    except (tf.errors.OpError, ValueError) as e:
        raise UserError(f"--warm_start_from {source}: not a readable checkpoint "
                        f"({first_line(e)}); give a model_dir or a checkpoint prefix such as "
                        f"DIR/model.ckpt-1000 (no .index/.data suffix)") from None
    if not stored:
        raise UserError(f"--warm_start_from {source}: no checkpoint there; give a model_dir or a "
                        f"checkpoint prefix such as DIR/model.ckpt-1000 (no .index/.data suffix)")
    if not any(re.match(pattern, name) for name in stored):
        raise UserError(f"--warm_start_vars {pattern!r} matches none of the {len(stored)} variables "
                        f"of {source} (e.g. {', '.join(sorted(stored)[:3])}); the run would start "
                        f"from scratch: fix the regex (matched from the start of the name)")
    check_warm_start_fits(p, source, pattern, stored)
    return tf.estimator.WarmStartSettings(source, vars_to_warm_start=pattern)


def check_warm_start_fits(p: Plan, source: str, pattern: str, stored):
    """Every trainable variable the regex picks must be in the checkpoint with its shape
    (Estimator's warm start raises a ValueError deep in graph building otherwise)."""
    picked = checkpoints_lib.in_scratch_graph(
        build_model_fn(p), make_input_fn(p, tf.estimator.ModeKeys.TRAIN), p.params(),
        tf.estimator.ModeKeys.TRAIN, None, lambda spec: {
            v.op.name: v.shape.as_list() for v in tf.compat.v1.trainable_variables()
            if re.match(pattern, v.op.name)})
    problems = checkpoints_lib.compare(picked, {k: list(v) for k, v in stored.items()},
                                       extras=False)
    if problems:
        raise UserError(f"--warm_start_from {source}: {'; '.join(problems)}; narrow "
                        f"--warm_start_vars (now {pattern!r}) to the variables that still fit")


GRPC_START_FAILED = "Could not start gRPC server"


@contextlib.contextmanager
def own_server_checked(p: Plan):
    """A cluster task whose own TensorFlow server cannot listen on its TF_CONFIG address
    (another process holds the port) is one line (a traceback, or "training failed")."""
    try:
        yield
    except tf.errors.UnknownError as e:
        if not p.role.in_cluster or GRPC_START_FAILED not in str(e):
            raise
        raise UserError(f"TF_CONFIG task {p.role.task} could not listen on {p.role.address} "
                        f"({GRPC_START_FAILED}): another process may hold that port; give "
                        f"this task a free port in TF_CONFIG's cluster") from None


def restorable_checkpoint(p: Plan, checkpoint: str) -> str:
    """For evaluate/export: the named or latest checkpoint, read back whole, fitting the model."""
    variables = checkpoint_choice.predict_variables(build_model_fn(p), p.serving_input, p.params())
    return checkpoint_choice.resolve_checkpoint(p.model_dir, checkpoint, variables)
