"""ImageNet-layout TFRecords (train-*/validation-*) as augmented images and labels.

Reads the records `estimator-dist tfrecords` writes, and ImageNet's own (Model Garden
r1 imagenet_main.py): JPEG bytes, a label 1..N (N + 1 classes, class 0 unused; with
the hparam zero_based_labels, label - 1 and N classes) and optional object boxes.
The model's hparams it reads: image_size, zero_based_labels, shuffle_buffer.
"""
import tensorflow as tf

from estimator_dist.errors import UserError
from estimator_dist.records import layout
from estimator_dist.training.registry import register_input
from input_fns import imagenet_preprocessing as preprocessing
from input_fns import record_files

DEFAULT_IMAGE_SIZE = 224
IMAGENET_CLASSES = 1000  # without labels.txt: ImageNet's own files


def _data_dir(params) -> str:
    return record_files.data_dir(params, "imagenet", "(write them with estimator-dist tfrecords)")


def image_size(params) -> int:
    size = params.get("image_size", DEFAULT_IMAGE_SIZE)
    if isinstance(size, bool) or not isinstance(size, int) or size < 8:
        raise UserError(f"image_size {size!r} must be an integer >= 8; fix it with "
                        f"--set image_size=224")
    return size


def num_classes(data_dir: str, zero_based: bool) -> int:
    """Logits the model needs: the labels file's classes (+1 for 1-based labels)."""
    names = layout.read_labels(data_dir)
    classes = len(names) if names else IMAGENET_CLASSES
    return classes if zero_based else classes + 1


def prepare(params):
    """Check the shards exist; returns num_classes, the label names and serving_features."""
    data_dir = _data_dir(params)
    size = image_size(params)
    for split in layout.SPLITS:
        if not layout.shard_files(data_dir, split):
            raise UserError(f"--data_dir {data_dir}: no {split}-* TFRecord shards; write them "
                            f"with estimator-dist tfrecords --images DIR --output {data_dir}")
    zero_based = bool(params.get("zero_based_labels"))
    shape = [size, size, preprocessing.CHANNELS]
    extra = {"num_classes": num_classes(data_dir, zero_based),
             "serving_features": {"image": [shape, "float32"]},
             # predict --input photo.jpg: its eval crop and resize (serving/image_input.py)
             "image_files": {"feature": "image", "preparation": "imagenet_eval", "shape": shape}}
    names = layout.read_labels(data_dir)
    if names:
        extra["label_vocabulary"] = names if zero_based else ["(none)"] + names
    return extra


FEATURES = {
    layout.ENCODED: tf.io.FixedLenFeature([], tf.string),
    layout.LABEL: tf.io.FixedLenFeature([], tf.int64),
    **{key: tf.io.VarLenFeature(tf.float32) for key in layout.BBOX_KEYS},
}


def parse_record(serialized):
    """(JPEG bytes, int32 label as stored, float32 boxes [1, N, 4] ymin/xmin/ymax/xmax)."""
    parsed = tf.io.parse_single_example(serialized, FEATURES)
    coords = [tf.sparse.to_dense(parsed[key]) for key in layout.BBOX_KEYS]
    bbox = tf.expand_dims(tf.stack(coords, axis=1), 0)
    return parsed[layout.ENCODED], tf.cast(parsed[layout.LABEL], tf.int32), bbox


def parser(training: bool, size: int, zero_based: bool):
    """record -> (pixels float32 [size, size, 3] 0-255, int32 label); the model normalizes."""
    def parse(serialized):
        image_bytes, label, bbox = parse_record(serialized)
        if training:
            image = preprocessing.train_image(image_bytes, bbox, size)
        else:
            image = preprocessing.eval_image(image_bytes, size)
        return {"image": image}, label - 1 if zero_based else label
    return parse


@register_input("imagenet", prepare=prepare, data_flags=("data_dir",))
def imagenet_input(mode, params, input_context=None):
    """ImageNet-layout TFRecords: ({"image": float32 [B,S,S,3] 0-255}, int32 [B]), augmented."""
    training = mode == tf.estimator.ModeKeys.TRAIN
    data_dir = _data_dir(params)
    split = "train" if training else "validation"
    files = layout.shard_files(data_dir, split)
    if not files:
        raise UserError(f"--data_dir {data_dir}: no {split}-* TFRecord shards")
    ds = record_files.records(files, training, params, input_context, f"{data_dir}/{split}-*")
    parse = parser(training, image_size(params), bool(params.get("zero_based_labels")))
    return record_files.batched(ds, parse, int(params["batch_size"]), training)
