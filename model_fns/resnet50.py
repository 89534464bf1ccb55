"""ResNet v1.5 for ImageNet (He et al. 2016; Model Garden r1 resnet_model.py): depth 18-152.

v1.5: a bottleneck block strides on its 3x3 convolution, not the first 1x1. Channels
last; strided convolutions pad explicitly (the same pixels whatever the input size);
batch norm's moving statistics are updated by the UPDATE_OPS that minimize() runs.
The input images are 0-255 RGB pixels; per-channel mean/std normalization is the
first op, so a SavedModel takes pixels too.
"""
import tensorflow as tf

from estimator_dist.errors import UserError
from estimator_dist.serving.heads import classification_spec
from estimator_dist.graph import hparam_checks
from estimator_dist.training.registry import register_model
from input_fns.imagenet_preprocessing import normalize
from model_fns.resnet import _bn as batch_norm

# depth -> (blocks per stage, bottleneck?)
LAYOUTS = {18: ((2, 2, 2, 2), False), 34: ((3, 4, 6, 3), False),
           50: ((3, 4, 6, 3), True), 101: ((3, 4, 23, 3), True), 152: ((3, 8, 36, 3), True)}
STAGE_FILTERS = (64, 128, 256, 512)
DEFAULT_NUM_CLASSES = 1001

HPARAMS = {
    "depth": 50,
    "image_size": 224,
    "zero_based_labels": False,
    "shuffle_buffer": 10000,
    "optimizer": "momentum",
    # r1: 0.1 per 256 images; scale it with the batch (0.025 for 64).
    "learning_rate": 0.1,
    "momentum": 0.9,
    "weight_decay": 1e-4,
    "label_smoothing": 0.1,
    "lr_schedule": "cosine",
    "warmup_steps": 0,
    # The feature spec of --input tfrecord (input_fns/tfrecord_spec.py); None: none given.
    "record_features": None,
}


def layout_of(depth):
    """(blocks per stage, bottleneck) for a ResNet depth; UserError for any other."""
    if isinstance(depth, bool) or depth not in LAYOUTS:
        raise UserError(f"depth {depth!r} is not an ImageNet ResNet depth; allowed: "
                        f"{', '.join(str(d) for d in LAYOUTS)}; fix it with --set depth=50")
    return LAYOUTS[depth]


def conv(x, filters, kernel_size, strides, name):
    """A convolution without bias; strided ones pad (kernel_size - 1) explicitly, as r1's
    fixed_padding, instead of 'same' padding whose split depends on the input size."""
    padding = "same"
    if strides > 1:
        total = kernel_size - 1
        begin = total // 2
        x = tf.pad(x, [[0, 0], [begin, total - begin], [begin, total - begin], [0, 0]])
        padding = "valid"
    return tf.compat.v1.layers.conv2d(
        x, filters, kernel_size, strides=strides, padding=padding, use_bias=False,
        kernel_initializer=tf.compat.v1.variance_scaling_initializer(), name=name)


def basic_block(x, filters, strides, training):
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = batch_norm(conv(x, filters, 1, strides, "shortcut_conv"), training,
                              "shortcut_bn")
    y = tf.nn.relu(batch_norm(conv(x, filters, 3, strides, "conv1"), training, "bn1"))
    y = batch_norm(conv(y, filters, 3, 1, "conv2"), training, "bn2")
    return tf.nn.relu(y + shortcut)


def bottleneck_block(x, filters, strides, training):
    """1x1 (filters) -> 3x3 (filters, the stride: v1.5) -> 1x1 (4 x filters)."""
    out = 4 * filters
    shortcut = x
    if strides != 1 or x.shape[-1] != out:
        shortcut = batch_norm(conv(x, out, 1, strides, "shortcut_conv"), training, "shortcut_bn")
    y = tf.nn.relu(batch_norm(conv(x, filters, 1, 1, "conv1"), training, "bn1"))
    y = tf.nn.relu(batch_norm(conv(y, filters, 3, strides, "conv2"), training, "bn2"))
    y = batch_norm(conv(y, out, 1, 1, "conv3"), training, "bn3")
    return tf.nn.relu(y + shortcut)


def resnet_logits(images, depth, num_classes, training):
    """Logits [B, num_classes] for normalized float32 images [B, H, W, 3]."""
    blocks, bottleneck = layout_of(depth)
    block_fn = bottleneck_block if bottleneck else basic_block
    with tf.compat.v1.variable_scope("resnet"):
        with tf.compat.v1.variable_scope("initial"):
            x = tf.nn.relu(batch_norm(conv(images, 64, 7, 2, "conv"), training, "bn"))
            x = tf.compat.v1.layers.max_pooling2d(x, 3, 2, padding="same")
        for stage, (count, filters) in enumerate(zip(blocks, STAGE_FILTERS), start=1):
            for block in range(1, count + 1):
                strides = 2 if stage > 1 and block == 1 else 1
                with tf.compat.v1.variable_scope(f"stage{stage}/block{block}"):
                    x = block_fn(x, filters, strides, training)
        x = tf.reduce_mean(x, axis=[1, 2])
        return tf.compat.v1.layers.dense(
            x, num_classes, kernel_initializer=tf.compat.v1.random_normal_initializer(stddev=0.01),
            name="logits")


@register_model("resnet50", hparams=HPARAMS, default_input="imagenet",
                run_defaults={"batch_size": 64, "train_steps": 1000, "eval_steps": 10})
def resnet50_model_fn(features, labels, mode, params):
    """ResNet v1.5 (--set depth=18/34/50/101/152) for ImageNet-layout images, label smoothing."""
    hparam_checks.non_negative_number(params, "weight_decay", 0.0001, default=0.0)
    images = features["image"] if isinstance(features, dict) else features
    images = normalize(tf.cast(images, tf.float32))
    logits = resnet_logits(images, params.get("depth", 50),
                           int(params.get("num_classes") or DEFAULT_NUM_CLASSES),
                           training=mode == tf.estimator.ModeKeys.TRAIN)
    return classification_spec(logits, labels, mode, params)
