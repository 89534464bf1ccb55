"""The measured cases of `estimator-dist bench`; each runs alone in its own process.

A case is given a JSON spec (see bench.py) and trains one model on one kind of
driver for `warmup + steps` steps:

- `project`: the `estimator-dist train` command line, run in this process;
- `plain`: a hand-written `tf.estimator.Estimator` over the same model_fn and
  input, with no project code around it (RunConfig defaults; at N > 1 only what
  MirroredStrategy over logical CPUs needs: `device_count` and the strategy);
- `keras`: `tf.keras` `Model.fit` on a Keras-layers model of the same
  architecture, batch, optimizer and strategy.

Every driver marks the end of each step on one clock (an Estimator hook or a
Keras callback). After the last measured step the case writes its result and
leaves at once (`os._exit`): what follows training (the final checkpoint,
evaluation, export) is not what is measured. The result holds the GLOBAL
examples/sec over the measured steps (the warm-up steps are discarded),
seconds from the parent's launch of the process to the end of the first step,
and the process's peak RSS.

Registering here, on import, the bench's MLP (`bench_mlp`) and the in-memory
input (`bench_memory`): the project case loads this module with `--import`.
"""
import json
import math
import os
import resource
import statistics
import sys
import time

import tensorflow as tf

from estimator_dist.heads import classification_spec
from estimator_dist.registry import register_input, register_model

IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
# In-memory data: this many examples, generated once in the graph, then cached.
MEMORY_POOL = 512
MLP_HPARAMS = {"hidden_units": 256, "hidden_layers": 2, "optimizer": "momentum",
               "learning_rate": 0.01, "momentum": 0.9, "lr_schedule": "constant",
               "weight_decay": 0.0}
TRAIN = tf.estimator.ModeKeys.TRAIN
PEER_WAIT_SECONDS = 60.0


def _memory_example(index):
    from input_fns import cifar

    image, label = cifar.synthetic_example(index)
    return {"image": tf.image.per_image_standardization(image)}, label


def memory_dataset(batch_size: int, training: bool = True) -> tf.data.Dataset:
    """Standardized CIFAR-shaped examples held in memory: the same data for every case."""
    ds = tf.data.Dataset.range(MEMORY_POOL).map(_memory_example).cache()
    if training:
        ds = ds.repeat()
    return ds.batch(batch_size, drop_remainder=training).prefetch(tf.data.AUTOTUNE)


def _prepare_memory(params):
    return {"serving_features": {"image": [list(IMAGE_SHAPE), "float32"]},
            "num_classes": NUM_CLASSES}


@register_input("bench_memory", prepare=_prepare_memory)
def memory_input(mode, params):
    """In-memory standardized CIFAR-shaped examples (cached after the first pass)."""
    return memory_dataset(int(params["batch_size"]), training=mode == TRAIN)


@register_model("bench_mlp", hparams=MLP_HPARAMS, default_input="bench_memory",
                run_defaults={"batch_size": 256, "train_steps": 2000})
def mlp_model_fn(features, labels, mode, params):
    """A small MLP on 32x32x3 images (the benchmark's overhead-bound model).

    Keras layers, so that --mixed_precision bfloat16 applies to it.
    """
    layers = tf.keras.layers
    images = features["image"] if isinstance(features, dict) else features
    x = layers.Flatten()(tf.cast(images, tf.float32))
    for i in range(int(params["hidden_layers"])):
        x = layers.Dense(int(params["hidden_units"]), activation="relu", name=f"hidden{i + 1}")(x)
    logits = layers.Dense(int(params.get("num_classes") or NUM_CLASSES), name="logits")(x)
    return classification_spec(logits, labels, mode, params)


def model_fn_for(model: str):
    if model == "cifar":
        from model_fns.resnet import cifar_model_fn

        return cifar_model_fn
    return mlp_model_fn


def hparams_for(model: str):
    if model == "cifar":
        from estimator_dist.registry import MODELS

        import model_fns.resnet  # noqa: F401 - registers cifar

        return dict(MODELS.get("cifar").hparams)
    return dict(MLP_HPARAMS)


def onednn_enabled():
    """Whether this TensorFlow runs oneDNN kernels (TF_ENABLE_ONEDNN_OPTS, CPU-dependent default)."""
    try:
        from tensorflow.python.util import _pywrap_util_port  # pylint: disable=import-outside-toplevel

        return bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):
        return None


class Clock:
    """Step-end times on the monotonic clock the parent started the process on."""

    def __init__(self, spec):
        self.spec = spec
        self.times = []
        self.cpu = []
        self.total = spec["warmup"] + spec["steps"]

    def step_done(self):
        self.times.append(time.monotonic())
        self.cpu.append(time.process_time())
        if len(self.times) == self.total:
            self.finish()

    def result(self):
        warm = self.spec["warmup"]
        window = self.times[-1] - self.times[warm - 1] if warm else self.times[-1] - self.times[0]
        steps = self.spec["steps"] if warm else self.spec["steps"] - 1
        cpu = self.cpu[-1] - self.cpu[warm - 1] if warm else self.cpu[-1] - self.cpu[0]
        step_seconds = [b - a for a, b in zip(self.times[warm:], self.times[warm + 1:])]
        if warm:
            step_seconds.insert(0, self.times[warm] - self.times[warm - 1])
        return {
            # Steady state: the median step, which a burst of another process's load on a
            # shared machine moves far less than it moves the mean over the window.
            "examples_per_sec": self.spec["global_batch"] / max(statistics.median(step_seconds), 1e-9),
            # Every measured step counted, periodic work (summaries, logging) included.
            "window_examples_per_sec": steps * self.spec["global_batch"] / max(window, 1e-9),
            # Process CPU time (all threads) per step: the work done, little moved by
            # other processes' load, unlike wall time.
            "cpu_ms_per_step": 1000.0 * cpu / max(steps, 1),
            "first_step_seconds": self.times[0] - self.spec["t0"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "step_seconds": step_seconds,
            "onednn": onednn_enabled(),
        }

    def finish(self):
        path = self.spec["result"]
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(self.result(), f)
        os.replace(path + ".tmp", path)
        self._wait_for_peers()
        sys.stdout.flush()
        sys.stderr.flush()
        # Leave now: the final checkpoint, evaluation and export are not measured.
        os._exit(0)


    def _wait_for_peers(self):
        """Leave only once every process of a multi-process case has measured all its steps.

        A Horovod rank's background loop talks to rank 0 even between steps, so a rank
        whose peer left at once fails before it can write its own result.
        """
        deadline = time.monotonic() + PEER_WAIT_SECONDS
        while time.monotonic() < deadline and \
                not all(os.path.isfile(p) for p in self.spec.get("peer_results", ())):
            time.sleep(0.05)


class ClockHook(tf.compat.v1.train.SessionRunHook):
    def __init__(self, clock: Clock):
        self._clock = clock

    def after_run(self, run_context, run_values):
        self._clock.step_done()


class ClockCallback(tf.keras.callbacks.Callback):
    def __init__(self, clock: Clock):
        super().__init__()
        self._clock = clock
        self._supports_tf_logs = True  # no per-batch conversion of the logs to numpy

    def on_train_batch_end(self, batch, logs=None):
        self._clock.step_done()


def run_project(spec, clock: Clock):
    """`estimator-dist train ...` in this process, with the clock hook added to Estimator.train.

    (train_and_evaluate trains through Estimator.train; so does a Horovod rank > 0.)
    """
    from estimator_dist import cli

    train = tf.estimator.Estimator.train

    def timed(self, input_fn, hooks=None, **kwargs):
        return train(self, input_fn, hooks=list(hooks or []) + [ClockHook(clock)], **kwargs)

    tf.estimator.Estimator.train = timed
    argv = ["train", "--model", spec["model"], "--input", spec["input"],
            "--strategy", spec["strategy"], "--num_devices", str(spec["num_devices"]),
            "--batch_size", str(spec["global_batch"]), "--train_steps", str(spec["train_steps"]),
            "--model_dir", spec["model_dir"], "--export", "none", "--eval_steps", "1",
            "--import", "estimator_dist.bench_cases"] + list(spec.get("extra_args", ()))
    if spec.get("data_dir"):
        argv += ["--data_dir", spec["data_dir"]]
    return cli.main(argv)


def plain_params(spec, replicas: int):
    return {**hparams_for(spec["model"]), "batch_size": spec["global_batch"] // replicas,
            "train_steps": spec["train_steps"], "num_classes": NUM_CLASSES}


def run_plain(spec, clock: Clock):
    """A hand-written Estimator: the same model_fn and input, no project code around them."""
    n = spec["num_devices"]
    if n > 1:
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
        session = tf.compat.v1.ConfigProto(device_count={"CPU": n}, allow_soft_placement=True)
        config = tf.estimator.RunConfig(train_distribute=strategy, session_config=session)
    else:
        config = tf.estimator.RunConfig()
    params = plain_params(spec, n)
    estimator = tf.estimator.Estimator(model_fn_for(spec["model"]), model_dir=spec["model_dir"],
                                       config=config, params=params)
    estimator.train(lambda: memory_dataset(params["batch_size"]), max_steps=spec["train_steps"],
                    hooks=[ClockHook(clock)])
    return 0


def keras_resnet(depth: int, weight_decay: float):
    """ResNet v1 of model_fns/resnet.py in Keras layers: the same layers, shapes and init."""
    from model_fns import resnet

    layers = tf.keras.layers
    n = resnet.blocks_per_stage(depth)
    decay = tf.keras.regularizers.L2(weight_decay / 2) if weight_decay else None  # = decay x l2_loss

    def conv(x, filters, size, strides):
        return layers.Conv2D(filters, size, strides=strides, padding="same", use_bias=False,
                             kernel_initializer=tf.keras.initializers.VarianceScaling(2.0),
                             kernel_regularizer=decay)(x)

    def bn(x):
        return layers.BatchNormalization(momentum=resnet.BN_MOMENTUM,
                                         epsilon=resnet.BN_EPSILON)(x)

    inputs = tf.keras.Input(IMAGE_SHAPE, name="image")
    x = layers.Lambda(tf.image.per_image_standardization)(inputs)
    x = layers.ReLU()(bn(conv(x, resnet.STAGE_FILTERS[0], 3, 1)))
    for stage, filters in enumerate(resnet.STAGE_FILTERS, start=1):
        for block in range(1, n + 1):
            strides = 2 if stage > 1 and block == 1 else 1
            shortcut = x
            if strides != 1 or x.shape[-1] != filters:
                shortcut = bn(conv(x, filters, 1, strides))
            y = layers.ReLU()(bn(conv(x, filters, 3, strides)))
            y = bn(conv(y, filters, 3, 1))
            x = layers.ReLU()(layers.Add()([y, shortcut]))
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(NUM_CLASSES, kernel_regularizer=decay)(x)
    return tf.keras.Model(inputs, outputs)


def keras_mlp(hidden_units: int, hidden_layers: int):
    layers = tf.keras.layers
    inputs = tf.keras.Input(IMAGE_SHAPE, name="image")
    x = layers.Flatten()(inputs)
    for _ in range(hidden_layers):
        x = layers.Dense(hidden_units, activation="relu")(x)
    return tf.keras.Model(inputs, layers.Dense(NUM_CLASSES)(x))


def keras_learning_rate(hparams, train_steps: int):
    """The model_fn's schedule (train_op.learning_rate) as a Keras schedule."""
    base = float(hparams["learning_rate"])
    if hparams.get("lr_schedule") == "step":
        bounds = [math.ceil(train_steps * 0.5), math.ceil(train_steps * 0.75)]
        return tf.keras.optimizers.schedules.PiecewiseConstantDecay(
            bounds, [base, base * 0.1, base * 0.01])
    return base


def run_keras(spec, clock: Clock):
    """tf.keras Model.fit on the same architecture, data, batch, optimizer and strategy."""
    n = spec["num_devices"]
    if n > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    else:
        strategy = tf.distribute.get_strategy()
    hparams = hparams_for(spec["model"])
    with strategy.scope():
        if spec["model"] == "cifar":
            model = keras_resnet(hparams["depth"], hparams["weight_decay"])
        else:
            model = keras_mlp(hparams["hidden_units"], hparams["hidden_layers"])
        optimizer = tf.keras.optimizers.SGD(keras_learning_rate(hparams, spec["train_steps"]),
                                            momentum=hparams["momentum"])
        model.compile(optimizer, tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
    model.fit(memory_dataset(spec["global_batch"]), epochs=1, steps_per_epoch=spec["train_steps"],
              callbacks=[ClockCallback(clock)], verbose=0)
    return 0


RUNNERS = {"project": run_project, "plain": run_plain, "keras": run_keras}


def main(argv=None) -> int:
    """Run the case whose JSON spec file is argv[0]."""
    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], encoding="utf-8") as f:
        spec = json.load(f)
    clock = Clock(spec)
    code = RUNNERS[spec["driver"]](spec, clock)
    print(f"bench case ended after {len(clock.times)} of {clock.total} steps", file=sys.stderr)
    return code or 1
