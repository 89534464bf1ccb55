"""Each variable once in GLOBAL_VARIABLES, as the strategy's variable, never its copies.

A Keras optimizer's slots (every canned Estimator's Adagrad or Ftrl accumulators) enter
GLOBAL_VARIABLES with the strategy's own copies beside the strategy's variable (plain
Estimator does the same):
- mirrored: replica 1's copy of each slot, saved as `.../accumulator/replica_1`: a
  checkpoint then holds names no one-device run has, and a run resumed under mirrored from
  a one-device checkpoint would look for them;
- central_storage: the AggregatingVariable and the variable it wraps, under one name: the
  Saver cannot be built ("At least two variables have the same name: training/Adagrad/dnn/
  hiddenlayer_0/bias/accumulator").
The copies are dropped from the collection: the strategy's variable saves and restores
them under the one-device name.
"""
import tensorflow as tf

from estimator_dist.compat import internals


def drop_wrapped_copies(graph: tf.Graph) -> int:
    """Remove from GLOBAL_VARIABLES every variable another entry wraps; returns how many."""
    variables = graph.get_collection_ref(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    wrapped = {id(copy) for variable in variables
               for copy in internals.wrapped_variables(variable)}
    kept = [v for v in variables if id(v) not in wrapped]
    dropped = len(variables) - len(kept)
    variables[:] = kept
    return dropped


class DistinctVariablesHook(tf.compat.v1.train.SessionRunHook):
    """drop_wrapped_copies when the graph is complete, before the session (and its Saver)
    is made."""

    def begin(self):
        drop_wrapped_copies(tf.compat.v1.get_default_graph())
