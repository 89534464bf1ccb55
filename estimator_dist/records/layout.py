"""The ImageNet TFRecord layout (Model Garden r1 imagenet_main.py, build_imagenet_data.py).

Shards are named train-00000-of-01024 / validation-00000-of-00128; each record is a
tf.Example with the JPEG bytes, a class label (1..1000 in ImageNet's files: 1001
classes, class 0 unused) and any number of bounding boxes (fractions of the image).
"""
import glob
import os

ENCODED = "image/encoded"
LABEL = "image/class/label"
TEXT = "image/class/text"
HEIGHT = "image/height"
WIDTH = "image/width"
CHANNELS = "image/channels"
FORMAT = "image/format"
FILENAME = "image/filename"
BBOX_KEYS = ("image/object/bbox/ymin", "image/object/bbox/xmin",
             "image/object/bbox/ymax", "image/object/bbox/xmax")
SPLITS = ("train", "validation")
LABELS_FILE = "labels.txt"  # one class name a line, in label order


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}"


def shard_files(data_dir: str, split: str):
    """The split's shard files in data_dir, sorted (temporary '.' files are not shards)."""
    return sorted(p for p in glob.glob(os.path.join(data_dir, f"{split}-*"))
                  if os.path.isfile(p))


def read_labels(data_dir: str):
    """The class names of data_dir/labels.txt, or None without that file."""
    path = os.path.join(data_dir, LABELS_FILE)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return [line.rstrip("\n") for line in f if line.strip()]
