"""The measured cases of `estimator-dist bench`; each runs in its own process.

A case is given a JSON spec (see bench.py) and trains one model on one kind of
driver, in the bursts of steps the bench asks for (bench_runner.py):

- `project`: what the `estimator-dist train` command line runs, in this process
  (train flags -> Config -> training.run.train, with the clock as an extra hook);
- `plain`: a hand-written `tf.estimator.Estimator` over the same model_fn and
  input, with no project code around it (RunConfig defaults; at N > 1 only what
  MirroredStrategy over logical CPUs needs: `device_count` and the strategy);
- `keras`: `tf.keras` `Model.fit` on a Keras-layers model of the same
  architecture, batch, optimizer and strategy.

The baselines run on the devices the project case uses (`case_devices`): its
N GPUs when the machine has GPUs, else N logical CPUs.

Every driver marks the end of each step on one clock (an Estimator hook or a
Keras callback), which also holds the process at a gate between bursts. It
reports the seconds from the bench's launch of the process to the end of the
first step, each burst's step times and CPU time, and the peak RSS; the bench
turns them into GLOBAL examples/sec. On "quit" the case leaves at once: what
follows training (the final checkpoint, evaluation, export) is not measured.

Registering here, on import, the bench's MLP (`bench_mlp`) and the in-memory
input (`bench_memory`): the project case runs in this module, so they are registered.
"""
import json
import math
import os
import resource
import sys
import time
from typing import Tuple

import tensorflow as tf

from estimator_dist import process_temp
from estimator_dist.bench import step_split
from estimator_dist.compat import internals
from estimator_dist.serving.heads import classification_spec
from estimator_dist.training.registry import register_input, register_model

IMAGE_SHAPE = (32, 32, 3)
NUM_CLASSES = 10
# In-memory data: this many examples, generated once in the graph, then cached.
MEMORY_POOL = 512
MLP_HPARAMS = {"hidden_units": 256, "hidden_layers": 2, "optimizer": "momentum",
               "learning_rate": 0.01, "momentum": 0.9, "lr_schedule": "constant",
               "weight_decay": 0.0}
TRAIN = tf.estimator.ModeKeys.TRAIN


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


@register_input("bench_memory", prepare=_prepare_memory, data_flags=())
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
        from estimator_dist.training.registry import MODELS

        import model_fns.resnet  # noqa: F401 - registers cifar

        return dict(MODELS.get("cifar").hparams)
    return dict(MLP_HPARAMS)


def onednn_enabled():
    """Whether this TensorFlow runs oneDNN kernels (TF_ENABLE_ONEDNN_OPTS, CPU-dependent default)."""
    return internals.onednn_enabled()


class Gate:
    """The case's side of the bench's pipes (bench_runner.Channel): commands in, reports out."""

    def __init__(self, fds):
        self._commands = os.fdopen(fds[0], "r", encoding="utf-8")
        self._reports = fds[1]

    def report(self, message):
        os.write(self._reports, (json.dumps(message) + "\n").encode())

    def command(self) -> str:
        """The next command; "quit" also when the bench has gone (end of file)."""
        return self._commands.readline().strip() or "quit"


class Clock:
    """Step ends on the monotonic clock the bench launched the process on; past the warm-up,
    steps run only in the bursts the bench asks for.

    After the warm-up the process reports "ready" and waits at the gate; "run K" lets
    K steps through and reports their times: the K - 1 gaps between their ends (the
    first step of a burst, which wakes an idle process up, is not measured), the same
    steps' session runs, and the process CPU time over the burst. "trace K" runs K steps
    traced and reports their shares of input and communication (step_split.py). "quit"
    leaves at once (`process_temp.hard_exit`): the final checkpoint, evaluation and export
    are not what is measured.
    """

    def __init__(self, spec, gate: Gate):
        self.spec = spec
        self.gate = gate
        self.count = 0
        self.first_step_seconds = float("nan")
        self.left = 0
        self.ends = []
        self.runs = []  # each step's session run, seconds (NaN from a driver without)
        self.tracing = False
        self.traced = []  # each traced step's shares (step_split.shares)
        self.cpu_start = 0.0
        self.cpu_reported = 0.0

    def step_done(self, run_seconds: float = float("nan"), run_metadata=None):
        now = time.monotonic()
        self.count += 1
        if self.count == 1:
            self.first_step_seconds = now - self.spec["t0"]
        if self.left:
            self.ends.append(now)
            self.runs.append(run_seconds)
            if self.tracing:
                self.traced.append(None if run_metadata is None else
                                   step_split.shares(run_metadata.step_stats))
            self.left -= 1
            if self.left:
                return
            self.gate.report({"event": "trace", "shares": step_split.trace_summary(self.traced)}
                             if self.tracing else self.burst_report(time.process_time()))
        elif self.count < self.spec["warmup"]:
            return
        else:
            self.gate.report({"event": "ready", "first_step_seconds": self.first_step_seconds,
                              "onednn": onednn_enabled(), "rss_mb": peak_rss_mb()})
        self.cpu_reported = time.process_time()
        self.wait()

    def burst_report(self, cpu_end: float):
        return {"event": "burst", "steps": len(self.ends),
                "step_seconds": [b - a for a, b in zip(self.ends, self.ends[1:])],
                "run_seconds": self.runs[1:],
                "cpu_seconds": cpu_end - self.cpu_start, "rss_mb": peak_rss_mb()}

    def wait(self):
        command = self.gate.command()
        if command.startswith(("run ", "trace ")):
            self.left = int(command.split()[1])
            self.tracing = command.startswith("trace ")
            self.ends, self.runs, self.traced = [], [], []
            # An input pipeline alone refills its buffers at the gate: its burst's CPU time
            # counts from the last report, so that it includes the work of every batch taken.
            self.cpu_start = self.cpu_reported if self.spec.get("cpu_from_report") else \
                time.process_time()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        process_temp.hard_exit(0)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class ClockHook(tf.compat.v1.train.SessionRunHook):
    """Times each session run for the clock; traces it when the clock is tracing."""

    def __init__(self, clock: Clock):
        self._clock = clock
        self._started = 0.0

    def before_run(self, run_context):
        self._started = time.monotonic()
        if not self._clock.tracing:
            return None
        v1 = tf.compat.v1
        return v1.train.SessionRunArgs(None, options=v1.RunOptions(
            trace_level=v1.RunOptions.FULL_TRACE))

    def after_run(self, run_context, run_values):
        self._clock.step_done(time.monotonic() - self._started,
                              run_values.run_metadata if self._clock.tracing else None)


class ClockCallback(tf.keras.callbacks.Callback):
    def __init__(self, clock: Clock):
        super().__init__()
        self._clock = clock
        internals.keep_tf_logs(self)

    def on_train_batch_end(self, batch, logs=None):
        self._clock.step_done()


def run_project(spec, clock: Clock):
    """What `estimator-dist train ...` runs, in this process, with the clock hook added to
    training's hooks (train's extra_hooks; a Horovod rank > 0 gets them too).

    The flags become a Config through training/flags.py, not the CLI; this module's
    models and inputs are registered already (it is running). Returns the exit code the
    command would: 0 when training ended, a reported error's code after its one line.
    """
    from estimator_dist import errors
    from estimator_dist import quiet
    from estimator_dist.guards import signals
    from estimator_dist.guards import stop_messages
    from estimator_dist.guards import storage
    from estimator_dist.guards import checkpoints
    from estimator_dist.training import flags
    from estimator_dist.training import plan as plan_lib
    from estimator_dist.training import run as runner

    argv = ["--model", spec["model"], "--input", spec["input"],
            "--strategy", spec["strategy"], "--num_devices", str(spec["num_devices"]),
            "--batch_size", str(spec["global_batch"]), "--train_steps", str(spec["train_steps"]),
            "--model_dir", spec["model_dir"], "--export", "none", "--eval_steps", "1",
            # bench_memory is one synthetic pool every worker reads whole, on purpose
            "--allow_identical_batches"] + list(spec.get("extra_args", ()))
    if spec.get("data_dir"):
        argv += ["--data_dir", spec["data_dir"]]
    storage.forbid_world_writable()
    try:
        with signals.exit_on_sigterm(stop_messages.outside_the_run):
            args = flags.parse_train_args(argv)
            quiet.configure(args.verbose)
            config = flags.config_from_args(args)
            checkpoints.check_same_model(plan_lib.default_model_dir(config), config.model)
            runner.train(config, extra_hooks=[ClockHook(clock)])
    except errors.ReportedError as e:
        return errors.reported(e)
    except KeyboardInterrupt:
        return errors.interrupted()
    return errors.EXIT_OK


def plain_params(spec, replicas: int):
    return {**hparams_for(spec["model"]), "batch_size": spec["global_batch"] // replicas,
            "train_steps": spec["train_steps"], "num_classes": NUM_CLASSES}


def case_devices(spec, gpus: int) -> Tuple[str, ...]:
    """The devices a baseline case (plain, keras) trains on: the project case's. With GPUs
    (`gpus` of them) its --num_devices GPUs, as `estimator-dist train` resolves them; on a
    CPU-only machine that many logical CPUs."""
    n = max(1, int(spec["num_devices"]))
    if gpus:
        if n > gpus:
            raise ValueError(f"bench case {spec.get('driver')} N={n}: this machine has {gpus} "
                             f"GPU(s)")
        return tuple(f"/gpu:{i}" for i in range(n))
    return tuple(f"/cpu:{i}" for i in range(n))


def machine_gpus() -> list:
    return tf.config.list_physical_devices("GPU")


def keep_gpus(devices: Tuple[str, ...], gpus: list, config_api=None):
    """A baseline on GPUs sees only its GPUs, each growing its memory, as the project case
    does (without it TensorFlow maps every GPU and takes all their memory)."""
    if not devices[0].startswith("/gpu:"):
        return
    config_api = config_api or tf.config
    chosen = gpus[:len(devices)]
    config_api.set_visible_devices(chosen, "GPU")
    for gpu in chosen:
        config_api.experimental.set_memory_growth(gpu, True)


def plain_session_config(devices: Tuple[str, ...]):
    """What a hand-written Estimator needs over `devices`: on logical CPUs their count (else
    MirroredStrategy hangs), on GPUs nothing; None for one device (RunConfig's default)."""
    if len(devices) == 1:
        return None
    cpus = len(devices) if devices[0].startswith("/cpu:") else 1
    return tf.compat.v1.ConfigProto(device_count={"CPU": cpus}, allow_soft_placement=True)


def baseline_devices(spec) -> Tuple[str, ...]:
    """The devices a baseline case computes on (the project case's), the others hidden."""
    gpus = machine_gpus()
    devices = case_devices(spec, len(gpus))
    keep_gpus(devices, gpus)
    return devices


def run_plain(spec, clock: Clock):
    """A hand-written Estimator: the same model_fn and input, no project code around them."""
    devices = baseline_devices(spec)
    n = len(devices)
    if n > 1:
        strategy = tf.distribute.MirroredStrategy(list(devices))
        config = tf.estimator.RunConfig(train_distribute=strategy,
                                        session_config=plain_session_config(devices))
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
    devices = baseline_devices(spec)
    n = len(devices)
    if n > 1:
        if devices[0].startswith("/cpu:"):
            cpu = tf.config.list_physical_devices("CPU")[0]
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
        strategy = tf.distribute.MirroredStrategy(list(devices))
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
