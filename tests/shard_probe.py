"""An input that records which shard each process reads (for the cluster tests).

Imported into cluster tasks with `--import shard_probe`; writes one file per
input_fn call into $SHARD_PROBE_DIR.
"""
import os

import tensorflow as tf

from estimator_dist.training.registry import register_input
from input_fns.digits import digits_input, prepare_digits


@register_input("shard_probe", prepare=prepare_digits)
def shard_probe(mode, params, input_context=None):
    """The digits input, recording its input_context."""
    if mode == tf.estimator.ModeKeys.TRAIN and input_context is not None:
        name = (f"{os.getpid()}-{input_context.input_pipeline_id}-of-"
                f"{input_context.num_input_pipelines}")
        open(os.path.join(os.environ["SHARD_PROBE_DIR"], name), "w").close()
    return digits_input(mode, params, input_context)
