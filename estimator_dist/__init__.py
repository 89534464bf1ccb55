"""estimator-dist: Estimator-based data-parallel training (TensorFlow 2.15, tf.compat.v1 surface).

Public names are imported lazily so that the CLI can quiet TensorFlow's logging
before TensorFlow is first imported.
"""
import importlib

__version__ = "0.7.0"

_PUBLIC = {
    "UserError": "estimator_dist.errors",
    "register_model": "estimator_dist.training.registry",
    "register_input": "estimator_dist.training.registry",
    "minimize": "estimator_dist.graph.train_op",
    "classification_spec": "estimator_dist.serving.heads",
    "regression_spec": "estimator_dist.serving.heads",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name):
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'estimator_dist' has no attribute '{name}'")
