"""An image folder (one subfolder per class) -> TFRecord shards in the ImageNet layout.

What build_imagenet_data.py does for ImageNet itself: every image is stored as RGB
JPEG (others are re-encoded, quality 95), its label is the class's index plus 1
(ImageNet's 1..1000), and the training records are shuffled across shards so each
shard holds every class. All shards are written under temporary names and renamed
only when every image was read: an unreadable image leaves nothing behind.
"""
import io
import os
import random
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import tensorflow as tf

from estimator_dist import files
from estimator_dist.errors import UserError
from estimator_dist.records import layout

JPEG_QUALITY = 95
SPLIT_SEED = 0  # fixed: the same folder always gives the same split and shard order
TEMP_PREFIX = ".tmp-"


@dataclass(frozen=True)
class Image:
    path: str
    label: int
    text: str


@dataclass(frozen=True)
class Written:
    """What write_records wrote: shard paths per split, examples per split, classes."""

    shards: dict
    counts: dict
    classes: List[str]
    labels_file: str


def class_folders(images_dir: str) -> List[Tuple[str, List[str]]]:
    """[(class name, sorted image paths)] of images_dir, classes sorted by name."""
    if not os.path.isdir(images_dir):
        raise UserError(f"--images {images_dir}: not a directory; give a folder with one "
                        f"subfolder of images per class")
    classes = []
    for name in sorted(os.listdir(images_dir)):
        folder = os.path.join(images_dir, name)
        if name.startswith(".") or not os.path.isdir(folder):
            continue
        paths = sorted(os.path.join(folder, f) for f in os.listdir(folder)
                       if not f.startswith(".") and os.path.isfile(os.path.join(folder, f)))
        if not paths:
            raise UserError(f"--images {images_dir}: class folder '{name}' holds no images; "
                            f"add some or remove it")
        classes.append((name, paths))
    if not classes:
        raise UserError(f"--images {images_dir}: no class subfolders; give a folder with one "
                        f"subfolder of images per class (e.g. {images_dir}/cat/1.jpg)")
    return classes


def split_images(classes, validation_fraction: float):
    """(train, validation) Images: per class the same fraction for validation, by a fixed
    shuffle; train shuffled across classes."""
    if not 0.0 <= validation_fraction < 1.0:
        raise UserError(f"--validation_fraction {validation_fraction}: must be in [0, 1)")
    rng = random.Random(SPLIT_SEED)
    train, validation = [], []
    for index, (name, paths) in enumerate(classes):
        images = [Image(p, index + 1, name) for p in paths]
        rng.shuffle(images)
        held = int(round(len(images) * validation_fraction))
        validation.extend(images[:held])
        train.extend(images[held:])
    rng.shuffle(train)
    return train, validation


def jpeg_of(path: str) -> Tuple[bytes, int, int]:
    """(RGB JPEG bytes, height, width) of the image file; UserError naming it if unreadable."""
    from PIL import Image as PILImage, UnidentifiedImageError

    try:
        with open(path, "rb") as f:
            data = f.read()
        with PILImage.open(io.BytesIO(data)) as image:
            image.load()  # a truncated or corrupt file fails here, not at training time
            if image.format == "JPEG" and image.mode == "RGB":
                return data, image.height, image.width
            rgb = image.convert("RGB")
    except (OSError, SyntaxError, ValueError) as exc:  # PIL's errors for broken files
        reason = "not a format PIL reads" if isinstance(exc, UnidentifiedImageError) else \
            " ".join(str(exc).split()) or type(exc).__name__
        raise UserError(f"{path}: not a readable image ({reason}); remove or replace it "
                        f"(nothing was written)") from None
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=JPEG_QUALITY)
    return out.getvalue(), rgb.height, rgb.width


def _bytes(values):
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=values))


def _ints(values):
    return tf.train.Feature(int64_list=tf.train.Int64List(value=values))


def _floats(values):
    return tf.train.Feature(float_list=tf.train.FloatList(value=values))


def example_bytes(jpeg: bytes, label: int, height: int, width: int, text: str = "",
                  filename: str = "", boxes: Optional[Sequence[Sequence[float]]] = None) -> bytes:
    """A serialized tf.Example in the ImageNet layout; boxes: [[ymin, xmin, ymax, xmax]] as
    fractions of the image (none: the reader crops from the whole image)."""
    boxes = list(boxes or [])
    feature = {
        layout.ENCODED: _bytes([jpeg]),
        layout.LABEL: _ints([label]),
        layout.TEXT: _bytes([text.encode()]),
        layout.HEIGHT: _ints([height]),
        layout.WIDTH: _ints([width]),
        layout.CHANNELS: _ints([3]),
        layout.FORMAT: _bytes([b"JPEG"]),
        layout.FILENAME: _bytes([os.path.basename(filename).encode()]),
    }
    for i, key in enumerate(layout.BBOX_KEYS):
        feature[key] = _floats([float(b[i]) for b in boxes])
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def _check_output(output_dir: str):
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise UserError(f"--output {output_dir}: is a file; give a directory")
    existing = [p for s in layout.SPLITS for p in layout.shard_files(output_dir, s)]
    if existing:
        raise UserError(f"--output {output_dir}: already holds records "
                        f"({os.path.basename(existing[0])}, ...); give an empty or new directory")


def write_records(images_dir: str, output_dir: str, shards: int = 4,
                  validation_shards: int = 0, validation_fraction: float = 0.1) -> Written:
    """Write images_dir as train-*/validation-* shards and labels.txt into output_dir.

    Args:
      shards: training shards; validation_shards: 0 means max(1, shards // 8), as
        ImageNet's 1024/128.
    Raises:
      UserError: no class folders, an unreadable image (named), bad counts, or an
        output directory that already holds records. Nothing is left written then.
    """
    if shards < 1 or validation_shards < 0:
        raise UserError(f"--shards {shards}: must be >= 1 (and --validation_shards >= 0)")
    classes = class_folders(images_dir)
    _check_output(output_dir)
    train, validation = split_images(classes, validation_fraction)
    plan = {"train": (train, shards),
            "validation": (validation, validation_shards or max(1, shards // 8))}
    created = files.missing_dirs(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    temps, final = [], []
    try:
        for split, (items, count) in plan.items():
            count = min(count, max(1, len(items)))
            for index in range(count):
                name = layout.shard_name(split, index, count)
                temp = os.path.join(output_dir, TEMP_PREFIX + name)
                temps.append(temp)
                final.append(os.path.join(output_dir, name))
                with tf.io.TFRecordWriter(temp) as writer:
                    for image in items[index::count]:
                        jpeg, height, width = jpeg_of(image.path)
                        writer.write(example_bytes(jpeg, image.label, height, width,
                                                   image.text, image.path))
        labels_temp = os.path.join(output_dir, TEMP_PREFIX + layout.LABELS_FILE)
        temps.append(labels_temp)
        final.append(os.path.join(output_dir, layout.LABELS_FILE))
        with open(labels_temp, "w") as f:
            f.writelines(f"{name}\n" for name, _ in classes)
    except BaseException as e:
        for temp in temps:
            if os.path.exists(temp):
                os.remove(temp)
        files.remove_empty_dirs(created)
        if isinstance(e, (tf.errors.OpError, OSError)) and files.reason_in(e):
            raise files.storage_error(e, f"writing records into {output_dir}",
                                      "the partial shards were removed, nothing was "
                                      "written") from None
        raise
    for temp, path in zip(temps, final):
        os.replace(temp, path)
    written = {s: [p for p in final if os.path.basename(p).startswith(s + "-")]
               for s in layout.SPLITS}
    return Written(written, {"train": len(train), "validation": len(validation)},
                   [name for name, _ in classes], final[-1])
