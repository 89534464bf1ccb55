"""Which checkpoint evaluate, predict and export restore: the one named by --checkpoint or the
latest, refused unless it is whole and fits the PREDICT graph it is restored into."""
import os
import re
from typing import Any, Mapping, Optional

import tensorflow as tf

from estimator_dist.errors import UserError
from estimator_dist.guards import checkpoints
from estimator_dist.serving.export import receiver_fn


def predict_variables(model_fn, serving_features: Mapping[str, Any],
                      params) -> checkpoints.Variables:
    """A function building the graph export restores into; it returns that graph's {name: shape}.

    The PREDICT graph export builds (global step, serving placeholders,
    model_fn): it needs no data, and has none of the training-only variables
    (optimizer slots, accumulators) a checkpoint also holds.
    """
    return lambda: checkpoints.model_variables(model_fn, receiver_fn(serving_features), params,
                                               mode=tf.estimator.ModeKeys.PREDICT)


# The files of a checkpoint prefix P: P.index, P.data-00000-of-00001, (P.meta).
CHECKPOINT_FILE_SUFFIX = r"\.(index|meta|data-\d{5}-of-\d{5})$"


def resolve_checkpoint(model_dir: str, checkpoint: str = "",
                       variables: Optional[checkpoints.Variables] = None) -> str:
    """A named checkpoint (path or model.ckpt-N in model_dir) or the latest, read back whole.

    Refuses when there is none (TensorFlow would silently use random weights),
    when it is damaged, or when it does not fit `variables()`, the PREDICT
    graph it is to be restored into (checkpoints.check_restore). An unusable
    `checkpoint` state file is worked around read-only (checkpoints.find_latest).
    """
    if checkpoint:
        if os.path.isdir(checkpoint):
            latest = tf.train.latest_checkpoint(checkpoint)
            raise UserError(f"--checkpoint {checkpoint}: is a directory; name one checkpoint, "
                            f"e.g. {latest or os.path.join(checkpoint, 'model.ckpt-N')}")
        prefix = re.sub(CHECKPOINT_FILE_SUFFIX, "", checkpoint)
        if prefix != checkpoint:  # it read the one file as a whole checkpoint, and "lacked" all
            raise UserError(f"--checkpoint {checkpoint}: names one file of a checkpoint; give its "
                            f"prefix, {prefix}")
        candidates = [checkpoint, os.path.join(model_dir, checkpoint)]
        for path in candidates:
            if tf.compat.v1.train.checkpoint_exists(path):
                return checkpoints.check_restore(path, model_dir, variables)
        raise UserError(f"--checkpoint {checkpoint}: no such checkpoint (looked at "
                        f"{', '.join(candidates)}); list the model.ckpt-* files in {model_dir}")
    latest = checkpoints.latest_readable(model_dir, variables)
    if not latest:
        raise UserError(f"'{model_dir}' has no checkpoint; train first (estimator-dist train "
                        f"--model_dir {model_dir})")
    return latest
