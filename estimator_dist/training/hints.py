"""The advice that fits a failure of the user's code (users_code says it): TF1-only names,
params used as an object, TF1 Dataset methods. None: the caller's own advice fits."""
import linecache
import re
import traceback
from typing import Optional

import tensorflow as tf

# tf.contrib names TF1 tutorials use, and what replaces them in TF 2.15's tf.compat.v1 surface.
CONTRIB = {
    "tf.contrib.layers.batch_norm": "tf.compat.v1.layers.batch_normalization (decay -> "
                                    "momentum, is_training -> training)",
    "tf.contrib.training.HParams": "a dict: the run passes params as one, read params['x']",
    "tf.contrib.layers.l2_regularizer": "tf.keras.regularizers.l2",
    "tf.contrib.layers.xavier_initializer": "tf.compat.v1.glorot_uniform_initializer",
    "tf.contrib.layers.variance_scaling_initializer":
        "tf.compat.v1.variance_scaling_initializer",
    "tf.contrib.layers.flatten": "tf.compat.v1.layers.flatten",
    "tf.contrib.layers.fully_connected": "tf.compat.v1.layers.dense",
    "tf.contrib.training.GreedyLoadBalancingStrategy": "nothing: the strategy places variables "
                                                       "(--strategy, --variable_device)",
    "tf.contrib.learn": "tf.estimator (estimator-dist runs train_and_evaluate)",
}
_TF_NAME = re.compile(r"\btf\.[A-Za-z_][\w.]*")
_NO_MODULE_ATTRIBUTE = re.compile(r"module '(tensorflow[\w.]*)' has no attribute '(\w+)'")
_NO_OBJECT_ATTRIBUTE = re.compile(r"'(\w+)' object has no attribute '(\w+)'")
_DATASET_METHODS = ("make_one_shot_iterator", "make_initializable_iterator", "output_shapes",
                    "output_types", "output_classes")


def for_error(error: BaseException) -> Optional[str]:
    """The fix for `error`, when it is a known TF1-to-TF2 or Estimator-to-estimator-dist one."""
    if not isinstance(error, AttributeError):
        return None
    text = str(error)
    module = _NO_MODULE_ATTRIBUTE.search(text)
    if module:
        return _tf1_only(module.group(2), _failing_tf_name(error, module.group(2)))
    obj = _NO_OBJECT_ATTRIBUTE.search(text)
    if obj and obj.group(1) == "dict":
        return (f"params is a dict here, not tf.contrib.training.HParams: read "
                f"params[{obj.group(2)!r}] instead of params.{obj.group(2)}")
    if obj and obj.group(2) in _DATASET_METHODS:
        return (f"Dataset.{obj.group(2)} is TF1-only: use tf.compat.v1.data.{obj.group(2)}"
                f"(dataset), or better return the dataset itself from the input_fn"
                if obj.group(2).startswith("make_") else
                f"Dataset.{obj.group(2)} is TF1-only: use "
                f"tf.compat.v1.data.get_{obj.group(2)}(dataset) or dataset.element_spec")
    return None


def _tf1_only(attribute: str, name: Optional[str]) -> str:
    """A `tf.X` that TF 2 no longer has: its tf.compat.v1 name, or its replacement."""
    upgrade = "run tf_upgrade_v2 on the file (it rewrites TF1 names to tf.compat.v1.*)"
    if name and name.startswith("tf.contrib"):
        known = next((f"{key} -> {value}" for key, value in CONTRIB.items()
                      if name.startswith(key)), None)
        return (f"{name} is TF1-only (tf.contrib is gone in TF 2): "
                f"{known or 'use its tf.compat.v1 or tf.keras replacement'}; {upgrade}")
    if attribute == "contrib":
        return f"tf.contrib is TF1-only (gone in TF 2): use its tf.compat.v1 or tf.keras replacement; {upgrade}"
    if name and _exists("tf.compat.v1." + name[len("tf."):]):
        return f"{name} is TF1-only: use tf.compat.v1.{name[len('tf.'):]}; {upgrade}"
    return f"tf.{attribute} is TF1-only; {upgrade}"


def _failing_tf_name(error: BaseException, attribute: str) -> Optional[str]:
    """The `tf.a.b.c` on the line that raised, whose path holds `attribute`."""
    frames = traceback.extract_tb(error.__traceback__)
    for frame in reversed(frames):
        line = frame.line or linecache.getline(frame.filename, frame.lineno)
        for name in _TF_NAME.findall(line or ""):
            parts = name.split(".")
            if attribute in parts:
                return ".".join(parts[:max(parts.index(attribute) + 1,
                                           min(len(parts), 4))]).rstrip(".")
    return None


def _exists(name: str) -> bool:
    value = tf
    for part in name.split(".")[1:]:
        value = getattr(value, part, None)
        if value is None:
            return False
    return True
