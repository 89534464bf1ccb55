"""The loss Estimator reports, found through the EstimatorSpec's own loss: what the progress
line shows and the train-op check reads."""
import tensorflow as tf

# Graph collection: the loss of every EstimatorSpec the run's model_fn returned in TRAIN
# mode (one per replica under mirrored), recorded by estimator.build_model_fn.
SPEC_LOSSES = "estimator_dist_spec_losses"
# How far back from a loss summary's input to look for a recorded spec loss: Estimator's
# reduction over replicas is a few ops (copies, a sum, a division).
_REDUCTION_OPS = 200


def record_spec_loss(loss):
    """Remember the loss of an EstimatorSpec the model_fn returned (find_reported_loss)."""
    if loss is not None:
        tf.compat.v1.add_to_collection(SPEC_LOSSES, loss)


def find_reported_loss(graph):
    """The loss tensor Estimator reports (reduced over replicas): the input of the scalar
    summary Estimator writes of the EstimatorSpec's loss.

    Found through the spec's loss, never by a name: a model_fn whose own loss tensor is
    named `loss` (TF's CIFAR-10 tutorial: `tf.reduce_mean(..., name='loss')`) makes
    Estimator's summary `loss_1`. A graph with no recorded spec loss (not built by the
    run's model_fn) falls back to the summary named `loss`.
    """
    summaries = [op for op in graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
                 if op.op.type == "ScalarSummary"]
    recorded = {t.op for t in graph.get_collection(SPEC_LOSSES)}
    if not recorded:
        for op in summaries:
            if op.op.name == "loss" or op.op.name.endswith("/loss"):
                return op.op.inputs[1]
        return None
    for op in reversed(summaries):  # Estimator's summary is made after every model_fn call
        if _reaches(op.op.inputs[1].op, recorded):
            return op.op.inputs[1]
    return None


def _reaches(start, targets) -> bool:
    """Whether `start` is one of `targets` or computed from one, within a few ops."""
    seen, todo = set(), [start]
    while todo and len(seen) < _REDUCTION_OPS:
        op = todo.pop(0)
        if op in targets:
            return True
        if op in seen:
            continue
        seen.add(op)
        todo.extend(t.op for t in op.inputs)
    return False
