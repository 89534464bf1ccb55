"""What the bench runs: the models' settings, the cases, the targets and bounds, the options."""
import importlib.util
import os
from dataclasses import dataclass, field
from typing import Dict, List


from estimator_dist.distribute import specs
from estimator_dist.errors import UserError


DEFAULT_OUTPUT_DIR = os.path.join("runs", "bench")


MODELS = ("cifar", "mlp")  # the default --models


# `--models imagenet` (opt-in: a few minutes more) stands for its three parts (issue 26):
# the input pipeline alone, the ResNet-50 step, the Estimator's overhead over a bare loop.
IMAGENET_PARTS = ("imagenet_input", "resnet50", "imagenet_overhead")
OPT_IN = {"imagenet": IMAGENET_PARTS}
KNOWN_MODELS = MODELS + IMAGENET_PARTS


# Pixels of the ResNet-50 and overhead cases' images (this CPU trains ResNet-50 at 224 at a
# few images a second); the input pipeline alone runs at these and at ImageNet's 224.
IMAGENET_SIZE = 64
PIPELINE_SIZES = (224, IMAGENET_SIZE)


CASE_TIMEOUT_S = 300.0


QUICK_CASE_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class ModelSettings:
    """How one model is benchmarked: the same for every one of its cases."""

    registered: str
    title: str
    batch: int
    warmup: int
    bursts: int
    burst_steps: int  # the first step of a burst is not measured (it wakes the process up)
    train_steps: int = 2000  # what schedules and log/summary intervals see, as in a real run

    @property
    def steps(self) -> int:
        """Measured steps per case and round."""
        return self.bursts * (self.burst_steps - 1)


SETTINGS = {
    "cifar": ModelSettings("cifar", "ResNet-20 (cifar)", batch=64, warmup=5, bursts=8,
                           burst_steps=5),
    "mlp": ModelSettings("bench_mlp", "MLP 3072-256-256-10", batch=256, warmup=20, bursts=8,
                         burst_steps=26),
    # Long bursts: a pipeline alone fills its prefetch buffers while it waits at the gate.
    "imagenet_input": ModelSettings("imagenet", "ImageNet input", batch=32, warmup=6,
                                    bursts=6, burst_steps=24),
    "resnet50": ModelSettings("resnet50", f"ResNet-50 {IMAGENET_SIZE} px", batch=16, warmup=3,
                              bursts=6, burst_steps=4),
    "imagenet_overhead": ModelSettings("bench_trivial", "ImageNet->trivial",
                                       batch=32, warmup=6, bursts=8, burst_steps=24),
}


QUICK_SETTINGS = {
    "cifar": ModelSettings("cifar", "ResNet-20 (cifar)", batch=8, warmup=1, bursts=2,
                           burst_steps=2),
    "mlp": ModelSettings("bench_mlp", "MLP 3072-256-256-10", batch=32, warmup=2, bursts=2,
                         burst_steps=3),
    "imagenet_input": ModelSettings("imagenet", "ImageNet input", batch=8, warmup=1,
                                    bursts=2, burst_steps=2),
    "resnet50": ModelSettings("resnet50", f"ResNet-50 {IMAGENET_SIZE} px", batch=4, warmup=1,
                              bursts=2, burst_steps=2),
    "imagenet_overhead": ModelSettings("bench_trivial", "ImageNet->trivial",
                                       batch=8, warmup=1, bursts=2, burst_steps=2),
}


# Strategies run as one process per worker (or Horovod rank), each pinned to one core;
# "ring" is bench_comm's bare TCP all-reduce.
PROCESS_STRATEGIES = ("multi_worker_mirrored", "horovod", "ring")


def horovod_installed() -> bool:
    return importlib.util.find_spec("horovod") is not None


@dataclass(frozen=True)
class Case:
    """One way to train: a driver, a strategy over devices or workers, an input."""

    model: str
    driver: str  # project | plain | keras | comm (the step without the model) | tcp (bench_comm)
    strategy: str = "none"
    num_devices: int = 1
    workers: int = 1
    real_input: bool = False
    tf_defaults: bool = False  # TensorFlow's own environment defaults, not the CLI's (oneDNN)
    compute: str = ""  # a key of COMPUTE_FLAGS: more flags of the project case
    image_size: int = 0  # the ImageNet bench's pixels (0: another model's)

    @property
    def name(self) -> str:
        if self.driver in PIPELINE_DRIVERS:
            return f"{PIPELINE_DRIVERS[self.driver]} input alone {self.image_size} px"
        if self.strategy in PROCESS_STRATEGIES:
            return f"{self.driver} {self.strategy} {self.workers} worker(s) x 1 core" + \
                (f" {self.compute}" if self.compute else "")
        text = f"{self.driver} {self.strategy} N={self.num_devices}"
        return text + (" real input" if self.real_input else "") + \
            (" TF default env" if self.tf_defaults else "") + \
            (f" {self.compute}" if self.compute else "")

    @property
    def key(self) -> str:
        return f"{self.model}:{self.name}"

    @property
    def group(self) -> str:
        """Cases of a group run interleaved; every target compares two of one group but
        Horovod's (no goal): an idle rank's background loop keeps polling its peer, so each
        Horovod case runs alone."""
        if self.driver in PIPELINE_DRIVERS:
            return f"{self.model}:{self.image_size} px"
        if specs.is_horovod(self.strategy):
            return f"{self.model}:{self.name}"
        if self.strategy in PROCESS_STRATEGIES:
            return f"{self.model}:workers"
        kind = "single" if self.strategy == "none" else "strategies"
        return f"{self.model}:N={self.num_devices} {kind}"


# The ImageNet bench's input pipelines alone: driver -> whose pipeline (imagenet_cases.py).
PIPELINE_DRIVERS = {"input": "project", "r1input": "Model Garden r1", "pixels": "r1 pixels-only"}


def imagenet_cases(model: str) -> List[Case]:
    """The cases of one part of `--models imagenet` (imagenet_cases.py)."""
    c = lambda driver, strategy="none", n=1, **kw: Case(  # noqa: E731
        model, driver, strategy, n, image_size=kw.pop("image_size", IMAGENET_SIZE), **kw)
    if model == "imagenet_input":
        return [c(driver, image_size=size) for size in PIPELINE_SIZES
                for driver in PIPELINE_DRIVERS]
    if model == "resnet50":
        return [c("project"), c("keras"), c("project", real_input=True),
                c("project", "mirrored", 2), c("keras", "mirrored", 2)]
    return [c("project", real_input=True), c("bare", real_input=True)]


def cases_for(model: str) -> List[Case]:
    """Every case of one model, compared pairs next to each other."""
    if model in IMAGENET_PARTS:
        return imagenet_cases(model)
    c = lambda driver, strategy="none", n=1, **kw: Case(model, driver, strategy, n, **kw)  # noqa: E731
    return [
        c("plain", tf_defaults=True), c("plain"), c("project"), c("keras"),
        c("project", real_input=True), c("project", real_input=True, compute="reader_nice0"),
        c("project", compute="jit"),
    ] + ([c("project", compute="bfloat16")] if model == "mlp" else []) + [
        c("project", "tower"), c("project", "mirrored"), c("project", "central_storage"),
        c("plain", "mirrored", 2), c("project", "mirrored", 2), c("keras", "mirrored", 2),
        c("project", "tower", 2), c("project", "central_storage", 2),
        c("project", "multi_worker_mirrored", workers=1), c("project", "multi_worker_mirrored", workers=2),
        c("comm", "multi_worker_mirrored", workers=1), c("comm", "multi_worker_mirrored", workers=2),
        c("tcp", "ring", workers=2),
    ] + [c(driver, "multi_worker_mirrored", workers=2, compute=compressed)
         for compressed in ("fp16", "bf16") for driver in ("project", "comm")] + ([c("project", "horovod", workers=1), c("project", "horovod", workers=2)]
         if horovod_installed() else [])


COMPUTE_FLAGS = {"": (), "jit": ("--jit",), "bfloat16": ("--mixed_precision", "bfloat16"),
                 "reader_nice0": ("--reader_nice", "0"),
                 "fp16": ("--gradient_compression", "fp16"),
                 "bf16": ("--gradient_compression", "bf16")}


# Bytes a gradient value takes in the all-reduce of a case (its `compute`).
GRADIENT_BYTES = {"fp16": 2, "bf16": 2}


# --quick: every driver and code path once, at tiny sizes.
QUICK_CASES = {
    "mlp": ("plain none N=1", "project none N=1", "keras none N=1", "project none N=1 real input",
            "project none N=1 bfloat16",
            "project mirrored N=2", "keras mirrored N=2", "project tower N=2",
            "project multi_worker_mirrored 1 worker(s) x 1 core",
            "project multi_worker_mirrored 2 worker(s) x 1 core",
            "comm multi_worker_mirrored 1 worker(s) x 1 core",
            "comm multi_worker_mirrored 2 worker(s) x 1 core", "tcp ring 2 worker(s) x 1 core",
            "project horovod 2 worker(s) x 1 core"),
    "cifar": ("keras none N=1",),
    "imagenet_input": tuple(f"{who} input alone 64 px" for who in PIPELINE_DRIVERS.values()),
    # No project mirrored N=2: mlp's runs the same driver; Keras ResNet-50 has its own.
    "resnet50": ("project none N=1", "keras none N=1", "project none N=1 real input",
                 "keras mirrored N=2"),
    "imagenet_overhead": ("project none N=1 real input", "bare none N=1 real input"),
}


# (label, numerator, denominator, kind, goal): kind "min" for a ratio that must reach the goal,
# "max" for one that must stay under it, "scaling" for numerator / (2 x denominator), "cpu"
# for examples per CPU-second of the process (numerator / denominator, at least the goal);
# goal None: a comparison reported without a goal. A target applies to every model that has
# both cases (resnet50 meets the Keras and real-input targets under their cifar/mlp labels).
TARGETS = [
    ("project none / plain Estimator, N=1", "project none N=1", "plain none N=1", "min", 0.98),
    ("project mirrored / plain Estimator mirrored, N=2", "project mirrored N=2",
     "plain mirrored N=2", "min", 0.98),
    ("project none / Keras fit, N=1", "project none N=1", "keras none N=1", "min", 1.0),
    ("project mirrored / Keras fit mirrored, N=2", "project mirrored N=2", "keras mirrored N=2",
     "min", 1.0),
    ("tower / mirrored, N=1", "project tower N=1", "project mirrored N=1", "min", 0.95),
    ("tower / mirrored, N=2", "project tower N=2", "project mirrored N=2", "min", 0.95),
    ("real input / in-memory, N=1", "project none N=1 real input", "project none N=1", "min", 0.95),
    ("time to first step: project / plain Estimator", "project none N=1", "plain none N=1",
     "max", 1.2),
    ("2-worker scaling efficiency (MWMS, 1 core each)",
     "project multi_worker_mirrored 2 worker(s) x 1 core",
     "project multi_worker_mirrored 1 worker(s) x 1 core", "scaling", 0.90),
    ("real input: reader at nice 19 (default) / at nice 0", "project none N=1 real input",
     "project none N=1 real input reader_nice0", "min", None),
    ("XLA --jit / without, N=1", "project none N=1 jit", "project none N=1", "min", None),
    ("--mixed_precision bfloat16 / float32, N=1", "project none N=1 bfloat16", "project none N=1",
     "min", None),
    ("horovod / multi_worker_mirrored, 2 processes x 1 core",
     "project horovod 2 worker(s) x 1 core",
     "project multi_worker_mirrored 2 worker(s) x 1 core", "min", None),
    ("2-rank scaling efficiency (horovod, 1 core each)", "project horovod 2 worker(s) x 1 core",
     "project horovod 1 worker(s) x 1 core", "scaling", None),
] + [(f"input alone, per CPU-second: project / r1, {size} px",
       f"project input alone {size} px", f"Model Garden r1 input alone {size} px", "cpu", 1.3)
      for size in PIPELINE_SIZES] + [
    # The most a pipeline that gives r1's pixels (within 2/255) can save: r1 less its flip
    # and mean subtraction, decode-and-crop and resize left (docs/speed.md).
    (f"input alone, per CPU-second: r1 pixels-only / r1, {size} px",
     f"r1 pixels-only input alone {size} px", f"Model Garden r1 input alone {size} px", "cpu",
     None) for size in PIPELINE_SIZES] + [
    ("trivial model: project Estimator / bare tf.data loop", "project none N=1 real input",
     "bare none N=1 real input", "min", 0.95),
] + [target for compressed in ("fp16", "bf16") for target in (
    (f"2-worker scaling, --gradient_compression {compressed}",
     f"project multi_worker_mirrored 2 worker(s) x 1 core {compressed}",
     "project multi_worker_mirrored 1 worker(s) x 1 core", "scaling", 0.80),
    (f"2 workers: --gradient_compression {compressed} / none",
     f"project multi_worker_mirrored 2 worker(s) x 1 core {compressed}",
     "project multi_worker_mirrored 2 worker(s) x 1 core", "min", 1.0))]


MWMS_1 = "project multi_worker_mirrored 1 worker(s) x 1 core"


def starts_alone(case: Case) -> bool:
    """Whether a case starts alone, the others of its group idle at their gates: where a
    target compares its start-up time, which a neighbour's start would inflate. The others
    start as many at once as the machine has cores (start_waves)."""
    return any(kind == "max" and case.name in (num, den)
               for _, num, den, kind, _ in TARGETS)


def start_waves(group: List[Case], cores: int) -> List[List[Case]]:
    """The group's cases packed, first fit, into waves of at most `cores` processes. A case
    that starts alone (starts_alone) is a wave of its own, and so is one of process
    strategies: its processes are pinned to cores 0, 1, ..., which another case's would share."""
    def apart(case: Case) -> bool:
        return starts_alone(case) or case.strategy in PROCESS_STRATEGIES

    waves: List[List[Case]] = []
    for case in group:
        room = [w for w in waves if not apart(w[0]) and not apart(case) and
                sum(c.workers for c in w) + case.workers <= cores]
        if room:
            room[0].append(case)
        else:
            waves.append([case])
    return waves


# (label, the 2-worker case whose step costs what the all-reduce adds, its 1-worker case or
# None): the scaling efficiency that cost leaves at most, MWMS_1's step / (step + cost),
# since on one core per worker nothing overlaps the all-reduce (bench_comm.py). No goal:
# they say how far the 2-worker scaling target can be met at all.
BOUNDS = [
    ("2-worker scaling bound: MWMS all-reduce alone", "comm multi_worker_mirrored 2 worker(s) x 1 core",
     "comm multi_worker_mirrored 1 worker(s) x 1 core"),
    ("2-worker scaling bound: bare TCP ring alone", "tcp ring 2 worker(s) x 1 core", None),
] + [(f"2-worker scaling bound: MWMS {compressed} all-reduce alone",
      f"comm multi_worker_mirrored 2 worker(s) x 1 core {compressed}",
      "comm multi_worker_mirrored 1 worker(s) x 1 core") for compressed in ("fp16", "bf16")]


@dataclass
class Options:
    output_dir: str = DEFAULT_OUTPUT_DIR
    quick: bool = False
    rounds: int = 2
    models: tuple = MODELS
    case_timeout: float = CASE_TIMEOUT_S
    extra_args: tuple = ()  # more train flags for every project case
    only: tuple = ()  # run only the cases whose name contains one of these
    emit: object = field(default=print)


def options_from_args(args) -> Options:
    """Options from the `bench` subcommand's parsed flags."""
    quick = bool(args.quick)
    return Options(
        output_dir=args.output_dir, quick=quick,
        rounds=1 if args.rounds is None else args.rounds,
        models=expand_models(_items("--models", args.models)) or MODELS,
        case_timeout=(QUICK_CASE_TIMEOUT_S if quick else CASE_TIMEOUT_S)
        if args.case_timeout is None else args.case_timeout,
        only=_items("--cases", args.cases))


def expand_models(models: tuple) -> tuple:
    """--models with `imagenet` replaced by its parts (each once, in order)."""
    return tuple(dict.fromkeys(part for m in models for part in OPT_IN.get(m, (m,))))


def _items(flag: str, text: str) -> tuple:
    """The comma-separated items of a flag; an empty item ("a,,b", ",") is refused (an empty
    --cases filter would have run every case)."""
    if not text:
        return ()
    items = tuple(t.strip() for t in text.split(","))
    if not all(items):
        raise UserError(f"{flag} {text!r}: an empty item; give comma-separated names, e.g. "
                        f"{flag} {'cifar,mlp' if flag == '--models' else 'project none,plain none'}")
    return items


MAX_ROUNDS = 100  # a round of the full bench takes minutes


# What a bench run writes into --output_dir; work/ and logs/ are replaced by each run.
OUTPUTS = ("bench.csv", "targets.csv", "bench.json", "bench.png", "work", "logs")


WORK_ENTRIES = ("model_dirs", "specs", "cifar10", "imagenet")


def check_options(options: Options):
    if not 1 <= options.rounds <= MAX_ROUNDS:
        raise UserError(f"--rounds {options.rounds}: must be 1-{MAX_ROUNDS}")
    unknown = [m for m in options.models if m not in KNOWN_MODELS]
    if unknown or not options.models:
        raise UserError(f"--models {','.join(unknown or options.models)}: choose from "
                        f"{', '.join(MODELS + tuple(OPT_IN))} (imagenet: its parts "
                        f"{', '.join(IMAGENET_PARTS)}, which may be given alone)")
    if not 0 < options.case_timeout < float("inf"):  # NaN fails too
        raise UserError(f"--case_timeout {options.case_timeout}: must be a number of seconds > 0")
    check_output_dir(options.output_dir)


def check_output_dir(out: str):
    """--output_dir may hold only a bench run's outputs: each run replaces its work/ and
    logs/ (a user's files in them were deleted)."""
    if not os.path.isdir(out):
        if os.path.exists(out):
            raise UserError(f"--output_dir {out}: is a file; give a directory")
        return
    foreign = sorted(n for n in os.listdir(out) if n not in OUTPUTS)
    logs = os.path.join(out, "logs")
    if os.path.isdir(logs):
        foreign += [os.path.join("logs", n) for n in sorted(os.listdir(logs))
                    if not n.endswith(".log")]
    work = os.path.join(out, "work")
    if os.path.isdir(work):
        foreign += [os.path.join("work", n) for n in sorted(os.listdir(work))
                    if n not in WORK_ENTRIES]
    if foreign:
        raise UserError(f"--output_dir {out}: holds {', '.join(foreign[:3])}, which a bench run "
                        f"did not write; give an empty directory or an earlier bench's")


def selected_cases(options: Options) -> List[Case]:
    """The cases `--models`, `--quick` and `--cases` ask for, in table order."""
    cases = [case for model in options.models for case in cases_for(model)]
    if options.quick:
        cases = [c for c in cases if c.name in QUICK_CASES[c.model]]
    if options.only:
        cases = [c for c in cases if any(text in c.name for text in options.only)]
        if not cases:
            raise UserError(f"--cases {','.join(options.only)}: matches no case; case names: "
                            f"{'; '.join(dict.fromkeys(c.name for m in options.models for c in cases_for(m)))}")
    return cases


def schedule(options: Options) -> List[List[List[Case]]]:
    """Each round's groups of cases, in order; every other round all reversed (ABBA)."""
    groups: Dict[str, List[Case]] = {}
    for case in selected_cases(options):
        groups.setdefault(case.group, []).append(case)
    ordered = list(groups.values())
    backwards = [list(reversed(g)) for g in reversed(ordered)]
    return [ordered if r % 2 == 0 else backwards for r in range(options.rounds)]
