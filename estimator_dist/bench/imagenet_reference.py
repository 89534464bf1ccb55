"""The bench's reference input pipeline: TF Model Garden r1's ImageNet training input, as published.

Written from tensorflow/models `official/r1/resnet/imagenet_main.py` (`_parse_example_proto`,
`parse_record`, `input_fn`), `imagenet_preprocessing.py` (`_decode_crop_and_flip`,
`_resize_image`, `_mean_image_subtraction`, `preprocess_image` for training) and
`resnet_run_loop.py` (`process_record_dataset`), with the same ops in the same order and
the same parameters. Two changes, neither touching an image: the file list is the
directory's train-* shards (r1 names 1024 of them), and the file shuffle's buffer is
their count (r1: 1024, all of its files). r1's defaults are kept:
`datasets_num_private_threads` None, `drop_remainder` False, float32; the records repeat
without end (`num_epochs` None; r1's training loop passes its epochs between evaluations).
"""
import tensorflow as tf

_R_MEAN = 123.68
_G_MEAN = 116.78
_B_MEAN = 103.94
CHANNEL_MEANS = [_R_MEAN, _G_MEAN, _B_MEAN]
NUM_CHANNELS = 3
SHUFFLE_BUFFER = 10000
CYCLE_LENGTH = 10
# sample_distorted_bounding_box's arguments in r1's _decode_crop_and_flip.
MIN_OBJECT_COVERED = 0.1
ASPECT_RATIO_RANGE = [0.75, 1.33]
AREA_RANGE = [0.05, 1.0]
MAX_ATTEMPTS = 100


def parse_example_proto(example_serialized):
    """r1's _parse_example_proto: (JPEG bytes, int32 label, float32 boxes [1, N, 4])."""
    feature_map = {
        "image/encoded": tf.io.FixedLenFeature([], dtype=tf.string, default_value=""),
        "image/class/label": tf.io.FixedLenFeature([], dtype=tf.int64, default_value=-1),
        "image/class/text": tf.io.FixedLenFeature([], dtype=tf.string, default_value=""),
    }
    sparse_float32 = tf.io.VarLenFeature(dtype=tf.float32)
    feature_map.update({k: sparse_float32 for k in ["image/object/bbox/xmin",
                                                     "image/object/bbox/ymin",
                                                     "image/object/bbox/xmax",
                                                     "image/object/bbox/ymax"]})
    features = tf.io.parse_single_example(serialized=example_serialized, features=feature_map)
    label = tf.cast(features["image/class/label"], dtype=tf.int32)
    xmin = tf.expand_dims(features["image/object/bbox/xmin"].values, 0)
    ymin = tf.expand_dims(features["image/object/bbox/ymin"].values, 0)
    xmax = tf.expand_dims(features["image/object/bbox/xmax"].values, 0)
    ymax = tf.expand_dims(features["image/object/bbox/ymax"].values, 0)
    bbox = tf.concat([ymin, xmin, ymax, xmax], 0)
    bbox = tf.expand_dims(bbox, 0)
    bbox = tf.transpose(a=bbox, perm=[0, 2, 1])
    return features["image/encoded"], label, bbox


def crop_window(image_buffer, bbox):
    """r1's sampled crop: [offset_y, offset_x, height, width]."""
    sample_distorted_bounding_box = tf.image.sample_distorted_bounding_box(
        tf.image.extract_jpeg_shape(image_buffer), bounding_boxes=bbox,
        min_object_covered=MIN_OBJECT_COVERED, aspect_ratio_range=ASPECT_RATIO_RANGE,
        area_range=AREA_RANGE, max_attempts=MAX_ATTEMPTS, use_image_if_no_bounding_boxes=True)
    bbox_begin, bbox_size, _ = sample_distorted_bounding_box
    offset_y, offset_x, _ = tf.unstack(bbox_begin)
    target_height, target_width, _ = tf.unstack(bbox_size)
    return tf.stack([offset_y, offset_x, target_height, target_width])


def resize_image(image, height, width):
    """r1's _resize_image."""
    return tf.compat.v1.image.resize(image, [height, width],
                                     method=tf.image.ResizeMethod.BILINEAR, align_corners=False)


def mean_image_subtraction(image, means):
    """r1's _mean_image_subtraction."""
    means = tf.broadcast_to(means, tf.shape(image))
    return image - means


def preprocess_window(image_buffer, window, flip, size):
    """r1's training preprocessing for a given crop window and flip (r1 draws both): the
    fused decode-and-crop, the flip, the resize, the mean subtraction."""
    cropped = tf.image.decode_and_crop_jpeg(image_buffer, window, channels=NUM_CHANNELS)
    cropped = tf.cond(flip, lambda: tf.image.flip_left_right(cropped), lambda: cropped)
    image = resize_image(cropped, size, size)
    image.set_shape([size, size, NUM_CHANNELS])
    return mean_image_subtraction(image, CHANNEL_MEANS)


def preprocess_image(image_buffer, bbox, size):
    """r1's preprocess_image(is_training=True)."""
    cropped = tf.image.decode_and_crop_jpeg(image_buffer, crop_window(image_buffer, bbox),
                                            channels=NUM_CHANNELS)
    cropped = tf.image.random_flip_left_right(cropped)
    image = resize_image(cropped, size, size)
    image.set_shape([size, size, NUM_CHANNELS])
    return mean_image_subtraction(image, CHANNEL_MEANS)


def parse_record(raw_record, size, dtype=tf.float32):
    """r1's parse_record for training."""
    image_buffer, label, bbox = parse_example_proto(raw_record)
    image = preprocess_image(image_buffer, bbox, size)
    return tf.cast(image, dtype), label


def pixels(image_buffer, window, size):
    """r1's pixels of a crop window before its flip and mean subtraction: decode-and-crop,
    resize. Not r1's code: the bench's pixels-only floor (imagenet_cases.run_pixels_only)."""
    cropped = tf.image.decode_and_crop_jpeg(image_buffer, window, channels=NUM_CHANNELS)
    image = resize_image(cropped, size, size)
    image.set_shape([size, size, NUM_CHANNELS])
    return image


def pixels_only_record(raw_record, size):
    """parse_record less the flip and the mean subtraction: only the ops that make r1's
    pixels (parse, crop window, decode-and-crop, resize), the floor of any pipeline that
    must give them."""
    image_buffer, label, bbox = parse_example_proto(raw_record)
    return pixels(image_buffer, crop_window(image_buffer, bbox), size), label


def input_fn(filenames, batch_size, size, parse_record_fn=parse_record):
    """r1's input_fn(is_training=True, num_epochs=None) over these train-* files
    (parse_record_fn: r1's own unless the bench's pixels-only floor is measured)."""
    dataset = tf.data.Dataset.from_tensor_slices(list(filenames))
    dataset = dataset.shuffle(buffer_size=len(filenames))
    dataset = dataset.interleave(tf.data.TFRecordDataset, cycle_length=CYCLE_LENGTH,
                                 num_parallel_calls=tf.data.experimental.AUTOTUNE)
    return process_record_dataset(dataset, batch_size, SHUFFLE_BUFFER,
                                  lambda value: parse_record_fn(value, size))


def process_record_dataset(dataset, batch_size, shuffle_buffer, parse_record_fn):
    """r1's process_record_dataset(is_training=True), its defaults otherwise."""
    options = tf.data.Options()
    options.threading.max_intra_op_parallelism = 1
    dataset = dataset.with_options(options)
    dataset = dataset.prefetch(buffer_size=batch_size)
    dataset = dataset.shuffle(buffer_size=shuffle_buffer)
    dataset = dataset.repeat(None)
    dataset = dataset.map(parse_record_fn, num_parallel_calls=tf.data.experimental.AUTOTUNE)
    dataset = dataset.batch(batch_size, drop_remainder=False)
    return dataset.prefetch(buffer_size=tf.data.experimental.AUTOTUNE)
