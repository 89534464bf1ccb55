"""ImageNet's training augmentation and eval crop, on JPEG bytes (TF Model Garden's recipe).

Training (r1 imagenet_preprocessing.py): a box sampled by sample_distorted_bounding_box
(at least 10% of some object box, aspect 3/4-4/3, 5-100% of the area, 100 attempts,
the whole image when none fits), decoded by the fused decode_and_crop_jpeg (only the
crop is decoded), flipped left-right at random, resized to image_size. Eval: the
central square of 87.5% of the shorter side (224 of 256), decoded the same fused way,
resized. Per-channel mean/std normalization (`normalize`) is the model's first op, on
the batch: a SavedModel then takes resized 0-255 RGB pixels.
"""
import tensorflow as tf

MEAN_RGB = (0.485 * 255, 0.456 * 255, 0.406 * 255)
STDDEV_RGB = (0.229 * 255, 0.224 * 255, 0.225 * 255)
MIN_OBJECT_COVERED = 0.1
ASPECT_RATIO_RANGE = (3.0 / 4.0, 4.0 / 3.0)
AREA_RANGE = (0.05, 1.0)
MAX_ATTEMPTS = 100
EVAL_CROP_FRACTION = 0.875
CHANNELS = 3


def distorted_crop_window(image_bytes, bbox, seed=None):
    """[offset_y, offset_x, height, width] of the training crop; bbox: float [1, N, 4]
    (ymin, xmin, ymax, xmax), N may be 0 (the whole image is the object then)."""
    begin, size, _ = tf.image.sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(image_bytes), bounding_boxes=bbox,
        min_object_covered=MIN_OBJECT_COVERED, aspect_ratio_range=ASPECT_RATIO_RANGE,
        area_range=AREA_RANGE, max_attempts=MAX_ATTEMPTS,
        use_image_if_no_bounding_boxes=True, seed=seed)
    offset_y, offset_x, _ = tf.unstack(begin)
    height, width, _ = tf.unstack(size)
    return tf.stack([offset_y, offset_x, height, width])


def central_crop_window(image_bytes):
    """[offset_y, offset_x, size, size]: the central square of EVAL_CROP_FRACTION of the
    shorter side."""
    shape = tf.image.extract_jpeg_shape(image_bytes)
    height, width = shape[0], shape[1]
    size = tf.cast(EVAL_CROP_FRACTION * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    size = tf.maximum(size, 1)
    return tf.stack([(height - size + 1) // 2, (width - size + 1) // 2, size, size])


def normalize(image):
    """float32 pixels 0-255 -> (x - mean) / std per channel: a batch [B, H, W, 3], or any
    rank ending in the channels.

    As x * (1 / std) + (-mean / std), the two 3-vectors first broadcast to one image's
    shape: Eigen broadcasts a 3-vector over the pixels element by element, a whole image
    over the batch in vectorized rows. On a 32 x 224 x 224 batch on one core this costs
    10 CPU-ms where the matmul by diag(1 / std) and bias_add it replaces cost 32 (r1's
    per-image mean subtraction is its broadcast_to and a subtraction too), with the same
    float32 values (tested).
    """
    rank = image.shape.rank
    inner = tf.shape(image)[1:] if rank is not None and rank >= 2 else tf.shape(image)
    scale = tf.broadcast_to(tf.constant([1.0 / s for s in STDDEV_RGB]), inner)
    offset = tf.broadcast_to(tf.constant([-m / s for m, s in zip(MEAN_RGB, STDDEV_RGB)]), inner)
    return image * scale + offset


def _resize(image, image_size):
    return tf.compat.v1.image.resize(image, [image_size, image_size],
                                     method=tf.image.ResizeMethod.BILINEAR,
                                     align_corners=False)


def crop_flip_resize(image_bytes, window, flip, image_size):
    """float32 [image_size, image_size, 3] pixels 0-255 of the crop `window` ([offset_y,
    offset_x, height, width]), flipped left-right when `flip` (a bool tensor), resized.

    The flip is on the uint8 crop, before the resize: the legacy bilinear resize samples
    from the left edge, so a flip after it shifts every sample by (scale - 1) pixels
    (docs/speed.md: 1.3/255 mean, 11/255 worst, on the bench's photos at 224).
    """
    image = tf.image.decode_and_crop_jpeg(image_bytes, window, channels=CHANNELS)
    image = tf.cond(flip, lambda: tf.reverse(image, [1]), lambda: image)
    image = _resize(image, image_size)
    image.set_shape([image_size, image_size, CHANNELS])
    return image


def train_image(image_bytes, bbox, image_size, seed=None):
    """float32 [image_size, image_size, 3] pixels 0-255: crop, flip (at random), resize."""
    window = distorted_crop_window(image_bytes, bbox, seed)
    flip = tf.random.uniform([], seed=seed) < 0.5  # what random_flip_left_right draws
    return crop_flip_resize(image_bytes, window, flip, image_size)


def eval_image(image_bytes, image_size):
    """float32 [image_size, image_size, 3] pixels 0-255: central 87.5% crop, resize."""
    image = tf.image.decode_and_crop_jpeg(image_bytes, central_crop_window(image_bytes),
                                          channels=CHANNELS)
    image = _resize(image, image_size)
    image.set_shape([image_size, image_size, CHANNELS])
    return image
