"""The ImageNet bench's cases (`bench --models imagenet`): its drivers, in-memory input and models.

Three parts, each a bench "model" (plan.IMAGENET_PARTS), on records that main.py writes
once per run (imagenet_data.py):

- `imagenet_input`: an input pipeline alone, iterated batch by batch: `input` is the
  project's `imagenet` training input (with the model's post-batch normalization, so
  both sides end at normalized float32 batches); `r1input` is Model Garden r1's, as
  published (imagenet_reference.py); `pixels` is r1's less its flip and mean subtraction
  (the floor of any pipeline that gives r1's pixels). Compared per CPU-second of the process.
- `resnet50`: the project's `resnet50` model against Keras `Model.fit` on the same network
  (`keras_resnet50`), and on the real records against in-memory images (`bench_images`).
- `imagenet_overhead`: the `imagenet` input feeding a trivial model (`bench_trivial`: global
  average pool, dense) through the project's Estimator runner against `bare`, a plain
  tf.compat.v1 session loop over the same dataset and the same model_fn's train_op.

Registering here, on import, `bench_images` and `bench_trivial` (case_process imports this
module for a spec marked "imagenet").
"""
import tensorflow as tf

from estimator_dist.bench import cases
from estimator_dist.bench import imagenet_data
from estimator_dist.serving.heads import classification_spec
from estimator_dist.training.registry import INPUTS, register_input, register_model
from input_fns import imagenet
from input_fns import imagenet_preprocessing as preprocessing

TRAIN = tf.estimator.ModeKeys.TRAIN
TRIVIAL_HPARAMS = {"optimizer": "momentum", "learning_rate": 0.01, "momentum": 0.9,
                   "lr_schedule": "constant", "weight_decay": 0.0,
                   "image_size": 64, "zero_based_labels": False, "shuffle_buffer": 10000}


def _prepare_images(params):
    size = imagenet.image_size(params)
    return {"num_classes": imagenet_data.NUM_CLASSES,
            "serving_features": {"image": [[size, size, preprocessing.CHANNELS], "float32"]}}


def memory_images(batch_size: int, size: int, classes: int) -> tf.data.Dataset:
    """0-255 float32 pixels [size, size, 3] and labels 1..classes - 1 (as the records' 1-based
    labels), MEMORY_POOL examples made once in the graph, then cached and repeated."""
    def example(index):
        pixels = tf.random.stateless_uniform([size, size, preprocessing.CHANNELS], [index, 26],
                                             0, 256, dtype=tf.int32)
        label = 1 + tf.cast(index % max(1, classes - 1), tf.int32)
        return {"image": tf.cast(pixels, tf.float32)}, label
    ds = tf.data.Dataset.range(cases.MEMORY_POOL).map(example).cache().repeat()
    return ds.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


@register_input("bench_images", prepare=_prepare_images, data_flags=())
def images_input(mode, params):
    """In-memory ImageNet-shaped images (the model's image_size) of the bench records' classes,
    cached after the first pass."""
    return memory_images(int(params["batch_size"]), imagenet.image_size(params),
                         int(params["num_classes"]))


@register_model("bench_trivial", hparams=TRIVIAL_HPARAMS, default_input="imagenet",
                run_defaults={"batch_size": 32, "train_steps": 2000})
def trivial_model_fn(features, labels, mode, params):
    """Normalization (as resnet50's first op), global average pool, dense: next to nothing."""
    images = features["image"] if isinstance(features, dict) else features
    pooled = tf.reduce_mean(preprocessing.normalize(tf.cast(images, tf.float32)), axis=[1, 2])
    logits = tf.compat.v1.layers.dense(pooled, int(params.get("num_classes") or 1001),
                                       name="logits")
    return classification_spec(logits, labels, mode, params)


def input_params(spec):
    """The `imagenet` input's params for a case (the hparams its models give it)."""
    return {"data_dir": spec["data_dir"], "batch_size": spec["global_batch"],
            "image_size": spec["image_size"], "zero_based_labels": False,
            "shuffle_buffer": TRIVIAL_HPARAMS["shuffle_buffer"], "seed": None}


def run_input(spec, clock):
    """The project's `imagenet` training input alone, normalized per batch as the model does."""
    ds = INPUTS.get("imagenet").fn(TRAIN, input_params(spec))
    ds = ds.map(lambda features, labels: (preprocessing.normalize(features["image"]), labels))
    for _ in ds:
        clock.step_done()
    return 0


def run_r1input(spec, clock, pixels_only=False):
    """Model Garden r1's training input alone (imagenet_reference.py); pixels_only: less its
    flip and mean subtraction, the floor of any pipeline that gives r1's pixels."""
    from estimator_dist.bench import imagenet_reference
    from estimator_dist.records import layout

    files = layout.shard_files(spec["data_dir"], "train")
    parse = imagenet_reference.pixels_only_record if pixels_only else \
        imagenet_reference.parse_record
    for _ in imagenet_reference.input_fn(files, spec["global_batch"], spec["image_size"], parse):
        clock.step_done()
    return 0


def run_pixels_only(spec, clock):
    return run_r1input(spec, clock, pixels_only=True)


def trivial_params(spec):
    from estimator_dist.records import layout

    classes = len(layout.read_labels(spec["data_dir"]) or ()) + 1
    return {**TRIVIAL_HPARAMS, **input_params(spec), "num_classes": classes,
            "train_steps": spec["train_steps"]}


def run_bare(spec, clock):
    """The `imagenet` input and bench_trivial's train_op in a plain session loop: no Estimator,
    no hooks, no project runner (the same model_fn, so the same step)."""
    params = trivial_params(spec)
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        ds = INPUTS.get("imagenet").fn(TRAIN, params)
        features, labels = tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
        train_op = trivial_model_fn(features, labels, TRAIN, params).train_op
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            for _ in range(int(spec["train_steps"])):
                session.run(train_op)
                clock.step_done()
    return 0


def keras_resnet50(size: int, num_classes: int, hparams):
    """model_fns/resnet50.py's ResNet v1.5 in Keras layers: the same layers, padding, batch
    norm, initializers and L2 on every kernel; normalization its first op."""
    from model_fns import resnet
    from model_fns import resnet50

    layers = tf.keras.layers
    blocks, _ = resnet50.layout_of(hparams["depth"])
    decay = tf.keras.regularizers.L2(hparams["weight_decay"] / 2)  # = decay x l2_loss

    def conv(x, filters, kernel, strides):
        padding = "same"
        if strides > 1:
            total = kernel - 1
            x = layers.ZeroPadding2D(((total // 2, total - total // 2),) * 2)(x)
            padding = "valid"
        return layers.Conv2D(filters, kernel, strides=strides, padding=padding, use_bias=False,
                             kernel_initializer=tf.keras.initializers.VarianceScaling(
                                 1.0, "fan_in", "truncated_normal"),
                             kernel_regularizer=decay)(x)

    def bn(x):
        return layers.BatchNormalization(momentum=resnet.BN_MOMENTUM, epsilon=resnet.BN_EPSILON)(x)

    inputs = tf.keras.Input((size, size, preprocessing.CHANNELS), name="image")
    x = layers.Lambda(preprocessing.normalize)(inputs)
    x = layers.ReLU()(bn(conv(x, 64, 7, 2)))
    x = layers.MaxPooling2D(3, 2, padding="same")(x)
    for stage, (count, filters) in enumerate(zip(blocks, resnet50.STAGE_FILTERS), start=1):
        for block in range(1, count + 1):
            strides = 2 if stage > 1 and block == 1 else 1
            shortcut = x
            if strides != 1 or x.shape[-1] != 4 * filters:
                shortcut = bn(conv(x, 4 * filters, 1, strides))
            y = layers.ReLU()(bn(conv(x, filters, 1, 1)))
            y = layers.ReLU()(bn(conv(y, filters, 3, strides)))
            y = bn(conv(y, 4 * filters, 1, 1))
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes, kernel_initializer=tf.keras.initializers.RandomNormal(
        stddev=0.01), kernel_regularizer=decay)(x)
    return tf.keras.Model(inputs, outputs)


def run_keras_resnet50(spec, clock):
    """Keras fit of keras_resnet50 on the in-memory images: resnet50's optimizer (momentum SGD,
    cosine schedule), loss (label smoothing) and the project case's devices."""
    from model_fns import resnet50

    devices = cases.baseline_devices(spec)
    if len(devices) > 1:
        if devices[0].startswith("/cpu:"):
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in devices])
        strategy = tf.distribute.MirroredStrategy(list(devices))
    else:
        strategy = tf.distribute.get_strategy()
    hparams = dict(resnet50.HPARAMS)
    classes = imagenet_data.NUM_CLASSES
    smoothing = float(hparams["label_smoothing"])

    def loss(labels, logits):
        onehot = tf.one_hot(tf.cast(tf.reshape(labels, [-1]), tf.int32), classes)
        return tf.keras.losses.categorical_crossentropy(onehot, logits, from_logits=True,
                                                        label_smoothing=smoothing)

    with strategy.scope():
        model = keras_resnet50(spec["image_size"], classes, hparams)
        schedule = tf.keras.optimizers.schedules.CosineDecay(hparams["learning_rate"],
                                                             spec["train_steps"])
        model.compile(tf.keras.optimizers.SGD(schedule, momentum=hparams["momentum"]), loss,
                      jit_compile=False)
    data = memory_images(spec["global_batch"], spec["image_size"], classes)
    model.fit(data.map(lambda features, labels: (features["image"], labels)), epochs=1,
              steps_per_epoch=spec["train_steps"], callbacks=[cases.ClockCallback(clock)],
              verbose=0)
    return 0


DRIVERS = {"input": run_input, "r1input": run_r1input, "pixels": run_pixels_only, "bare": run_bare,
           "keras": run_keras_resnet50}
