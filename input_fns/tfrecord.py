"""Users' own TFRecords of tf.Examples, read by a feature spec (tfrecord_spec.py).

DATA_DIR holds train-* and validation-* shards (the imagenet input's layout, any
features). The spec comes from the model's hparam `record_features` (--set or a
--config file's hparams) or else from DATA_DIR/features.yaml ({features: ...,
label: ..., num_classes: ...}); the label is --label_column, else features.yaml's
`label`, else `label`. The same sharding by file, interleave and shuffle as imagenet;
variable-length features are padded per batch; jpeg features are decoded and resized
(no augmentation). The serving signature is the spec's features without the label; with
labels.txt (labels 1..N, as `tfrecords` writes them) predictions name the classes.
"""
import os

import tensorflow as tf
import yaml

from estimator_dist.errors import UserError
from estimator_dist.records import layout
from estimator_dist.training.registry import register_input
from input_fns import record_files
from input_fns.tfrecord_spec import parse_spec

SPEC_FILE = "features.yaml"
DEFAULT_LABEL = "label"
TF_DTYPES = {"int64": tf.int64, "float32": tf.float32, "string": tf.string, "jpeg": tf.string}


def _data_dir(params) -> str:
    return record_files.data_dir(params, "tfrecord", "of tf.Examples")


def _spec_file(data_dir: str) -> dict:
    path = os.path.join(data_dir, SPEC_FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as f:
            data = yaml.safe_load(f) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not YAML ({' '.join(str(exc).split())[:120]})") from None
    if not isinstance(data, dict) or "features" not in data or \
            set(data) - {"features", "label", "num_classes"}:
        raise UserError(f"{path}: must be a mapping with 'features' (and optional 'label', "
                        f"'num_classes'), got keys {sorted(data) if isinstance(data, dict) else data!r}")
    return data


def resolve(params):
    """(features {name: Feature} without the label, the label Feature, spec file data)."""
    data_dir = _data_dir(params)
    from_file = _spec_file(data_dir)
    spec = params.get("record_features") or from_file.get("features")
    if not spec:
        raise UserError(f"input 'tfrecord': no feature spec; give the model's hparam "
                        f"record_features (--set record_features=name[=key]:dtype[:shape],...) "
                        f"or write {os.path.join(data_dir, SPEC_FILE)}")
    features = parse_spec(spec)
    label_name = params.get("label_column") or from_file.get("label") or DEFAULT_LABEL
    if label_name not in features:
        raise UserError(f"label '{label_name}' is not in the feature spec "
                        f"({', '.join(features)}); name it with --label_column")
    label = features.pop(label_name)
    if label.dtype == "jpeg" or not features:
        raise UserError(f"label '{label_name}': the spec needs a non-image label and at least "
                        f"one other feature")
    return features, label, from_file


def prepare(params):
    """Check the shards and the spec; returns serving_features (and num_classes if known)."""
    data_dir = _data_dir(params)
    features, _, from_file = resolve(params)
    for split in layout.SPLITS:
        if not layout.shard_files(data_dir, split):
            raise UserError(f"--data_dir {data_dir}: no {split}-* TFRecord shards")
    extra = {"serving_features": {name: f.serving for name, f in features.items()}}
    images = [f for f in features.values() if f.dtype == "jpeg"]
    if len(images) == 1:  # predict --input photo.jpg: decoded and resized as here
        extra["image_files"] = {"feature": images[0].name, "preparation": "resize",
                                "shape": list(images[0].shape)}
    names = layout.read_labels(data_dir)
    if from_file.get("num_classes"):
        extra["num_classes"] = int(from_file["num_classes"])
    elif names:  # written by estimator-dist tfrecords: labels 1..N
        extra["num_classes"] = len(names) + 1
    if names and extra.get("num_classes") == len(names) + 1:  # predictions name the classes
        extra["label_vocabulary"] = ["(none)"] + names
    return extra


def parsing_spec(features):
    """tf.io.parse_single_example's spec for Features."""
    spec = {}
    for f in features:
        dtype = TF_DTYPES[f.dtype]
        if f.shape is None:
            spec[f.key] = tf.io.VarLenFeature(dtype)
        else:
            spec[f.key] = tf.io.FixedLenFeature([] if f.dtype == "jpeg" else list(f.shape), dtype)
    return spec


def decoded(feature, value):
    """A parsed value as the model gets it: dense lists, jpeg decoded to float32 pixels."""
    if feature.shape is None:
        return tf.sparse.to_dense(value)
    if feature.dtype != "jpeg":
        return value
    height, width, channels = feature.shape
    image = tf.io.decode_jpeg(value, channels=channels)
    image = tf.compat.v1.image.resize(image, [height, width])
    image.set_shape([height, width, channels])
    return image


def parser(features, label):
    spec = parsing_spec(list(features.values()) + [label])

    def parse(serialized):
        parsed = tf.io.parse_single_example(serialized, spec)
        return ({name: decoded(f, parsed[f.key]) for name, f in features.items()},
                decoded(label, parsed[label.key]))
    return parse


@register_input("tfrecord", prepare=prepare, data_flags=("data_dir", "label_column"))
def tfrecord_input(mode, params, input_context=None):
    """Your own tf.Example TFRecords, by a feature spec (record_features or features.yaml)."""
    training = mode == tf.estimator.ModeKeys.TRAIN
    data_dir = _data_dir(params)
    features, label, _ = resolve(params)
    split = "train" if training else "validation"
    files = layout.shard_files(data_dir, split)
    if not files:
        raise UserError(f"--data_dir {data_dir}: no {split}-* TFRecord shards")
    ds = record_files.records(files, training, params, input_context, f"{data_dir}/{split}-*")
    return record_files.batched(ds, parser(features, label), int(params["batch_size"]),
                                training, padded=True)
