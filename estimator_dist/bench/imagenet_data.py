"""The bench's ImageNet-like records: JPEGs of ImageNet's sizes, written by `tfrecords`' own code.

ImageNet's training JPEGs average about 400 x 350 pixels and 110 KB; most are 500 x 375,
500 x 333 or their portrait forms. The bench makes a fixed set of that kind, the same
every run: crops of scikit-learn's two sample photos (427 x 640) at random places and
scales, resized to one of those sizes, and generated scenes (smooth colour fields with
fine-grained texture, as photos have), saved as quality-95 JPEGs (about 95 KB on average) in class folders and
written into train-*/validation-* shards by records/image_folder.py, as
`estimator-dist tfrecords` would.
"""
import os
from typing import Dict

import numpy as np

# (height, width) of ImageNet's common shapes.
SIZES = ((375, 500), (333, 500), (500, 375), (500, 333), (400, 400), (350, 467))
JPEG_QUALITY = 95
PHOTO_GRAIN = 6.0  # sensor noise: resized, the photos alone are smoother (and smaller) than photos
SEED = 26
SHARDS = 4
CLASSES = ("china", "flower", "scene")
NUM_CLASSES = len(CLASSES) + 1  # logits: labels are 1-based (labels.txt's count + 1)


def _photos():
    from sklearn.datasets import load_sample_images

    return load_sample_images().images  # china.jpg, flower.jpg: 427 x 640 RGB


def _photo_crop(photo, rng, size, grain):
    """A random crop of 40-100% of the photo's side with the target's aspect, resized, with
    a camera's sensor noise (standard deviation `grain`)."""
    from PIL import Image

    height, width = size
    scale = rng.uniform(0.4, 1.0)
    ch = int(min(photo.shape[0], photo.shape[1] * height / width) * scale)
    cw = int(ch * width / height)
    y = rng.randint(0, photo.shape[0] - ch + 1)
    x = rng.randint(0, photo.shape[1] - cw + 1)
    crop = Image.fromarray(photo[y:y + ch, x:x + cw])
    if rng.rand() < 0.5:
        crop = crop.transpose(Image.FLIP_LEFT_RIGHT)
    pixels = np.asarray(crop.resize((width, height), Image.BICUBIC), np.float32)
    noisy = pixels + rng.normal(0, grain, pixels.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def _scene(rng, size):
    """Smooth colour fields (a coarse random grid upsampled) with texture and edges."""
    from PIL import Image

    height, width = size
    coarse = rng.randint(0, 256, (6, 8, 3)).astype(np.uint8)
    base = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC), np.float32)
    yy, xx = np.mgrid[0:height, 0:width]
    stripes = 25 * np.sin(xx / rng.uniform(2, 9) + yy / rng.uniform(3, 11))[..., None]
    grain = rng.normal(0, 12, (height, width, 3))
    pixels = np.clip(base + stripes + grain, 0, 255).astype(np.uint8)
    return Image.fromarray(pixels)


def write_images(root: str, count: int, seed: int = SEED, grain: float = PHOTO_GRAIN) -> Dict[str, int]:
    """`count` JPEGs of ImageNet's sizes in class folders under root, in turn from each photo
    (classes china, flower) and generated (class scene)."""
    rng = np.random.RandomState(seed)
    photos = _photos()
    written: Dict[str, int] = {}
    for i in range(count):
        size = SIZES[rng.randint(len(SIZES))]
        kind = i % 3
        if kind == 2:
            name, image = CLASSES[kind], _scene(rng, size)
        else:
            name, image = CLASSES[kind], _photo_crop(photos[kind], rng, size, grain)
        folder = os.path.join(root, name)
        os.makedirs(folder, exist_ok=True)
        image.save(os.path.join(folder, f"{i:04d}.jpg"), quality=JPEG_QUALITY)
        written[name] = written.get(name, 0) + 1
    return written


def write_records(directory: str, count: int) -> str:
    """`count` images written as ImageNet-layout shards into directory/records (the images
    stay in directory/images); returns the records directory."""
    from estimator_dist.records import image_folder

    images = os.path.join(directory, "images")
    records = os.path.join(directory, "records")
    write_images(images, count)
    image_folder.write_records(images, records, shards=SHARDS, validation_fraction=0.1)
    return records
