"""The 8x8 handwritten digits that scikit-learn ships: real data, no download."""
import functools
import importlib.util
import os

import numpy as np
import tensorflow as tf

from estimator_dist.training import position
from estimator_dist.training.registry import register_input
from input_fns.batch_limit import check_training_batch

EVAL_FRACTION = 0.2
SPLIT_SEED = 0  # fixed: the test split never changes between runs
SYNTHETIC_EXAMPLES = 512


def digits_csv() -> str:
    """scikit-learn's digits file, found without importing scikit-learn.

    `load_digits()` reads this file; importing sklearn to call it cost about 2 CPU-seconds
    (scipy and the rest), twice what the whole input costs, in every process that reads
    digits. "" when the file is not where scikit-learn has always kept it.
    """
    found = importlib.util.find_spec("sklearn")
    if not found or not found.origin:
        return ""
    path = os.path.join(os.path.dirname(found.origin), "datasets", "data", "digits.csv.gz")
    return path if os.path.exists(path) else ""


@functools.lru_cache(maxsize=1)
def real_digits():
    """(images [1797,8,8] float64 in 0..16, labels [1797]), as load_digits() gives them."""
    path = digits_csv()
    if not path:
        from sklearn.datasets import load_digits

        digits = load_digits()
        return digits.images, digits.target
    table = np.loadtxt(path, delimiter=",")  # load_digits' own reading: 64 pixels, the label
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)


def load_arrays(synthetic: bool, seed=None):
    """(train_x, train_y, eval_x, eval_y): images [N,8,8,1] float32 in [0,1], labels int32."""
    if synthetic:
        rng = np.random.RandomState(0 if seed is None else seed)
        y = rng.randint(0, 10, SYNTHETIC_EXAMPLES).astype(np.int32)
        x = rng.rand(SYNTHETIC_EXAMPLES, 8, 8, 1).astype(np.float32) * 0.5
        x[np.arange(len(y)), y % 8, :, 0] += 0.5  # a learnable class signal
    else:
        images, labels = real_digits()
        x = (images / 16.0).astype(np.float32)[..., None]
        y = labels.astype(np.int32)
    order = np.random.RandomState(SPLIT_SEED).permutation(len(y))
    n_eval = int(round(len(y) * EVAL_FRACTION))
    ev, tr = order[:n_eval], order[n_eval:]
    return x[tr], y[tr], x[ev], y[ev]


def prepare_digits(params):
    train_x, _, eval_x, _ = load_arrays(bool(params.get("synthetic")))
    return {
        "serving_features": {"image": [[8, 8, 1], "float32"]},
        "num_classes": 10,
        "train_examples": int(len(train_x)),
        "eval_examples": int(len(eval_x)),
    }


@register_input("digits", prepare=prepare_digits, data_flags=("synthetic",))
def digits_input(mode, params, input_context=None):
    """scikit-learn's 8x8 digits, 80/20 fixed split; batches of params['batch_size'].

    Training batches follow training/position.py: the global batch of step k is a
    function of (seed, k), each pipeline takes its slices, from params['start_step'] on.
    """
    train_x, train_y, eval_x, eval_y = load_arrays(bool(params.get("synthetic")), params.get("seed"))
    training = mode == tf.estimator.ModeKeys.TRAIN
    x, y = (train_x, train_y) if training else (eval_x, eval_y)
    if training:
        check_training_batch("digits", params, len(x), input_context)
    if training:  # this pipeline's slices of global batches that are a function of (seed, k)
        return position.gathered(position.index_batches(len(x), params, input_context),
                        {"image": x}, y).prefetch(tf.data.AUTOTUNE)
    ds = tf.data.Dataset.from_tensor_slices(({"image": x}, y))
    if input_context is not None and input_context.num_input_pipelines > 1:
        ds = ds.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return ds.batch(params["batch_size"]).prefetch(tf.data.AUTOTUNE)

