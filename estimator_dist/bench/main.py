"""`estimator-dist bench`: every way to train the same model, measured side by side in one run.

Each case (bench_cases.py) runs in its own process: a fresh TensorFlow runtime,
its own peak RSS, and its start-up time measured from the moment this process
launched it. The cases a target compares form a group whose processes are alive
together and take turns in short bursts of steps (bench_runner.py), so that the
load of a shared machine falls on both sides of a ratio alike; a ratio is the
median of the ratios taken burst by burst. `--rounds R` repeats every group,
the order reversed every other round; a case's figure is then the median over
rounds, a ratio the median of the per-round ratios.

Throughput is GLOBAL examples/sec (every replica and worker) in steady state:
global batch / the median step time after a discarded warm-up (the mean over
the same steps is shown beside it, as "window"), on the same in-memory data,
batch and step count for every case. multi_worker_mirrored and horovod (when
Horovod is installed) run one process per worker or rank, each pinned to one
core, with the per-worker batch fixed (weak scaling, as tf_cnn_benchmarks and
Horovod report scaling).
"""
import csv
import importlib.util
import json
import os
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from estimator_dist.bench import case_runner as bench_runner
from estimator_dist.errors import UserError

DEFAULT_OUTPUT_DIR = os.path.join("runs", "bench")
MODELS = ("cifar", "mlp")
CASE_TIMEOUT_S = 300.0
QUICK_CASE_TIMEOUT_S = 120.0
# The real-input case reads this many CIFAR-10 records written in the binary format.
REAL_RECORDS_PER_FILE = 2000


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
}
QUICK_SETTINGS = {
    "cifar": ModelSettings("cifar", "ResNet-20 (cifar)", batch=8, warmup=1, bursts=2,
                           burst_steps=2),
    "mlp": ModelSettings("bench_mlp", "MLP 3072-256-256-10", batch=32, warmup=2, bursts=2,
                         burst_steps=3),
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

    @property
    def name(self) -> str:
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
        if self.strategy == "horovod":
            return f"{self.model}:{self.name}"
        if self.strategy in PROCESS_STRATEGIES:
            return f"{self.model}:workers"
        kind = "single" if self.strategy == "none" else "strategies"
        return f"{self.model}:N={self.num_devices} {kind}"


def cases_for(model: str) -> List[Case]:
    """Every case of one model, compared pairs next to each other."""
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
}

# (label, numerator, denominator, kind, goal): kind "min" for a ratio that must reach the goal,
# "max" for one that must stay under it, "scaling" for numerator / (2 x denominator);
# goal None: a comparison reported without a goal.
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
] + [target for compressed in ("fp16", "bf16") for target in (
    (f"2-worker scaling, --gradient_compression {compressed}",
     f"project multi_worker_mirrored 2 worker(s) x 1 core {compressed}",
     "project multi_worker_mirrored 1 worker(s) x 1 core", "scaling", 0.80),
    (f"2 workers: --gradient_compression {compressed} / none",
     f"project multi_worker_mirrored 2 worker(s) x 1 core {compressed}",
     "project multi_worker_mirrored 2 worker(s) x 1 core", "min", 1.0))]

MWMS_1 = "project multi_worker_mirrored 1 worker(s) x 1 core"
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
class Measurement:
    """One run of one case."""

    case: Case
    round: int
    ok: bool
    examples_per_sec: float = float("nan")  # from the median step
    burst_examples_per_sec: List[float] = field(default_factory=list)  # each burst's median step
    window_examples_per_sec: float = float("nan")  # over the whole measured window
    first_step_seconds: float = float("nan")
    peak_rss_mb: float = float("nan")
    cpu_ms_per_step: float = float("nan")
    onednn: Optional[bool] = None
    wall_seconds: float = 0.0
    error: str = ""
    log: str = ""


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


def child_main():
    """Entry point of a case process: pin cores, quiet TensorFlow, run the case."""
    spec_path = sys.argv[1]
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    if spec.get("cores"):
        os.sched_setaffinity(0, spec["cores"])
    from estimator_dist import quiet

    quiet.configure(verbose=False)
    from estimator_dist.bench import case_process

    sys.exit(case_process.main([spec_path]))


def write_cifar_files(directory: str, records: int = REAL_RECORDS_PER_FILE, seed: int = 0) -> str:
    """The six CIFAR-10 binary files (label byte + CHW pixels per record), random content."""
    from input_fns import cifar

    os.makedirs(directory, exist_ok=True)
    rng = np.random.RandomState(seed)
    for i, name in enumerate(cifar.ALL_FILES):
        n = records if name != cifar.TEST_FILE else max(1, records // 5)
        data = rng.randint(0, 256, size=(n, cifar.RECORD_BYTES)).astype(np.uint8)
        data[:, 0] = (np.arange(n) + i) % cifar.NUM_CLASSES
        data.tofile(os.path.join(directory, name))
    return directory


def case_spec(options: Options, settings, cifar_dir: str, case: Case, model_dir: str,
              worker: int) -> Dict:
    """What one process of a case runs (case_process.main reads it)."""
    s = settings[case.model]
    return {
        "driver": case.driver,
        "model": {"project": s.registered, "comm": "bench_comm"}.get(case.driver, case.model),
        "input": "cifar" if case.real_input else "bench_memory",
        "data_dir": cifar_dir if case.real_input else "",
        "strategy": case.strategy,
        "num_devices": case.num_devices,
        "global_batch": s.batch * case.workers,
        "warmup": s.warmup,
        "train_steps": s.train_steps,
        "model_dir": model_dir,
        "worker": worker,
        "cores": [worker % (os.cpu_count() or 1)] if case.strategy in PROCESS_STRATEGIES else [],
        "extra_args": _train_flags(options, case, s.registered),
        "tf_defaults": case.tf_defaults,
    }


def _train_flags(options: Options, case: Case, registered: str) -> List[str]:
    """More `train` flags of a case that runs the project's command line."""
    if case.driver == "project":
        return list(options.extra_args) + list(COMPUTE_FLAGS[case.compute])
    if case.driver == "comm":  # the model's step without the model (bench_comm.py)
        return ["--import", "estimator_dist.bench.comm", "--set", f"like={registered}"] + \
            list(COMPUTE_FLAGS[case.compute])
    return []


def process_envs(case: Case):
    """(each process's extra environment, a function that releases what it needs)."""
    if case.strategy == "horovod":
        from estimator_dist.launch import horovod as horovod_launch

        rendezvous = horovod_launch.Rendezvous(case.workers)
        iface = horovod_launch.loopback_interface()
        return [rendezvous.rank_env(r, iface) for r in range(case.workers)], rendezvous.stop
    from estimator_dist.launch import supervisor as launcher

    if case.strategy == "ring":
        ports = ",".join(str(p) for p in launcher.free_ports(case.workers))
        return [{"BENCH_RING_PORTS": ports}] * case.workers, lambda: None
    if case.strategy != "multi_worker_mirrored":
        return [{}], lambda: None

    names = launcher.task_names(case.workers, 0, False)
    configs = launcher.make_tf_configs(names, launcher.free_ports(len(names)))
    return [{"TF_CONFIG": configs[name]} for name in names], lambda: None


def measurement(run: "bench_runner.CaseRun") -> Measurement:
    """A case run's figures (the chief's; peak RSS over all its processes)."""
    wall = run.ended - run.started
    if not run.ok:
        return Measurement(run.case, run.round, ok=False, wall_seconds=wall, log=run.log_path,
                           error=run.error)
    return Measurement(run.case, run.round, ok=True, wall_seconds=wall, log=run.log_path,
                       peak_rss_mb=run.peak_rss_mb, **run.figures())


def options_from_args(args) -> Options:
    """Options from the `bench` subcommand's parsed flags."""
    quick = bool(args.quick)
    return Options(
        output_dir=args.output_dir, quick=quick,
        rounds=1 if args.rounds is None else args.rounds,
        models=_items("--models", args.models) or MODELS,
        case_timeout=(QUICK_CASE_TIMEOUT_S if quick else CASE_TIMEOUT_S)
        if args.case_timeout is None else args.case_timeout,
        only=_items("--cases", args.cases))


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
WORK_ENTRIES = ("model_dirs", "specs", "cifar10")


def check_options(options: Options):
    if not 1 <= options.rounds <= MAX_ROUNDS:
        raise UserError(f"--rounds {options.rounds}: must be 1-{MAX_ROUNDS}")
    unknown = [m for m in options.models if m not in MODELS]
    if unknown or not options.models:
        raise UserError(f"--models {','.join(options.models)}: choose from {', '.join(MODELS)}")
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
                            f"{'; '.join(c.name for c in cases_for(MODELS[0]))}")
    return cases


def schedule(options: Options) -> List[List[List[Case]]]:
    """Each round's groups of cases, in order; every other round all reversed (ABBA)."""
    groups: Dict[str, List[Case]] = {}
    for case in selected_cases(options):
        groups.setdefault(case.group, []).append(case)
    ordered = list(groups.values())
    backwards = [list(reversed(g)) for g in reversed(ordered)]
    return [ordered if r % 2 == 0 else backwards for r in range(options.rounds)]


def _median(values):
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


@dataclass
class Row:
    """A case's figures over the rounds."""

    case: Case
    batch: int
    runs: List[Measurement]

    @property
    def ok_runs(self):
        return [m for m in self.runs if m.ok]

    def _median_of(self, name: str) -> float:
        return _median([getattr(m, name) for m in self.ok_runs])

    examples_per_sec = property(lambda self: self._median_of("examples_per_sec"))
    window_examples_per_sec = property(lambda self: self._median_of("window_examples_per_sec"))
    first_step_seconds = property(lambda self: self._median_of("first_step_seconds"))
    cpu_ms_per_step = property(lambda self: self._median_of("cpu_ms_per_step"))

    @property
    def onednn(self) -> str:
        seen = {m.onednn for m in self.ok_runs}
        return "on" if seen == {True} else "off" if seen == {False} else "?"

    @property
    def peak_rss_mb(self):
        values = [m.peak_rss_mb for m in self.ok_runs]
        return max(values) if values else float("nan")


def make_rows(options: Options, measurements: List[Measurement]) -> List[Row]:
    settings = QUICK_SETTINGS if options.quick else SETTINGS
    rows = []
    for case in selected_cases(options):
        runs = [m for m in measurements if m.case == case]
        rows.append(Row(case, settings[case.model].batch * case.workers, runs))
    return rows


def target_rows(options: Options, measurements: List[Measurement]) -> List[Dict]:
    """Each target per model: the median over rounds of the ratio measured within a round.

    Within a round, two cases of one group are compared burst by burst (the median
    of the ratios of adjacent bursts); cases of different groups by their figures.
    `cpu_ratio` is the same comparison in examples per CPU-second of the (chief)
    process: the work each way costs, which other tenants' load moves far less than
    wall time (it is not what a user waits for, so the targets are judged on wall time).
    """
    out = []
    for model in options.models:
        names = {c.name for c in cases_for(model)}
        for label, num, den, kind, goal in TARGETS:
            if num not in names or den not in names:  # e.g. bfloat16: the MLP only
                continue
            ratios, cpu = [], []
            for r in range(options.rounds):
                a = _find(measurements, model, num, r)
                b = _find(measurements, model, den, r)
                if a is None or b is None:
                    continue
                if kind == "max":
                    ratios.append(a.first_step_seconds / b.first_step_seconds)
                    continue
                # Per-worker (scaling) or global batches are equal within every pair.
                cpu.append(b.cpu_ms_per_step / a.cpu_ms_per_step)
                ratios.append(_rate_ratio(a, b) / (2.0 if kind == "scaling" else 1.0))
            value = _median(ratios)
            met = None if goal is None or value != value else \
                (value <= goal if kind == "max" else value >= goal)
            out.append({"model": model, "target": label, "ratio": value,
                        "goal": "-" if goal is None else f"{'<=' if kind == 'max' else '>='} {goal:g}",
                        "met": met, "rounds": [round(x, 4) for x in ratios],
                        "cpu_ratio": _median(cpu)})
        out += bound_rows(options, measurements, model)
    return out


def bound_rows(options: Options, measurements: List[Measurement], model: str) -> List[Dict]:
    """BOUNDS for one model: within each round, MWMS_1's step / (step + the 2-worker case's
    step - its 1-worker case's), in wall time (`ratio`) and in CPU time (`cpu_ratio`)."""
    settings = QUICK_SETTINGS if options.quick else SETTINGS
    out = []
    for label, two, one in BOUNDS:
        ratios, cpu, costs = [], [], []
        for r in range(options.rounds):
            base, a = _find(measurements, model, MWMS_1, r), _find(measurements, model, two, r)
            b = _find(measurements, model, one, r) if one else None
            if base is None or a is None or (one and b is None):
                continue
            step = _step_seconds(base, settings)
            cost = _step_seconds(a, settings) - (_step_seconds(b, settings) if b else 0.0)
            ratios.append(step / (step + cost))
            costs.append(cost * 1000.0)
            cpu_cost = a.cpu_ms_per_step - (b.cpu_ms_per_step if b else 0.0)
            cpu.append(base.cpu_ms_per_step / (base.cpu_ms_per_step + cpu_cost))
        note = f"all-reduce {_median(costs):.2f} ms/step" if costs else ""
        if costs:
            note += f", {_gradient_megabytes(model, two):.2f} MB of gradients/step"
        out.append({"model": model, "target": label, "ratio": _median(ratios), "goal": "-",
                    "met": None, "rounds": [round(x, 4) for x in ratios], "cpu_ratio": _median(cpu),
                    "note": note})
    return out


def _gradient_megabytes(model: str, case_name: str) -> float:
    """What one worker puts into the step's gradient all-reduce: every trainable value, in
    float32 or the --gradient_compression type the case name ends with."""
    from estimator_dist.bench import comm as bench_comm

    compressed = case_name.rsplit(" ", 1)[-1]
    floats = bench_comm.gradient_floats(SETTINGS[model].registered)
    return floats * GRADIENT_BYTES.get(compressed, 4) / 1e6


def _step_seconds(m: Measurement, settings) -> float:
    """The median step of a case run, from its global examples/sec."""
    return settings[m.case.model].batch * m.case.workers / m.examples_per_sec


def _rate_ratio(a: Measurement, b: Measurement) -> float:
    """a's rate / b's: burst by burst when they ran interleaved, else from their medians."""
    pairs = list(zip(a.burst_examples_per_sec, b.burst_examples_per_sec))
    if a.case.group == b.case.group and pairs:
        return _median([x / y for x, y in pairs])
    return a.examples_per_sec / b.examples_per_sec


def _find(measurements, model, name, round_index) -> Optional[Measurement]:
    for m in measurements:
        if m.case.model == model and m.case.name == name and m.round == round_index and m.ok:
            return m
    return None


def format_table(rows: List[Row], settings) -> str:
    head = f"{'model':<20} {'case':<52} {'batch':>5} {'examples/sec':>12} {'rounds':<15} " \
           f"{'window ex/s':>11} {'1st step s':>10} {'peak RSS MB':>11} {'CPU ms/step':>11} {'oneDNN':>6}"
    lines = [head, "-" * len(head)]
    for row in rows:
        per_round = ", ".join(f"{m.examples_per_sec:.0f}" if m.ok else "failed" for m in row.runs)
        lines.append(f"{settings[row.case.model].title:<20} {row.case.name:<52} {row.batch:>5} "
                     f"{row.examples_per_sec:>12,.1f} {per_round:<15} "
                     f"{row.window_examples_per_sec:>11,.0f} "
                     f"{row.first_step_seconds:>10.1f} {row.peak_rss_mb:>11.0f} "
                     f"{row.cpu_ms_per_step:>11.1f} {row.onednn:>6}")
    return "\n".join(lines)


def format_targets(targets: List[Dict]) -> str:
    """The targets whose cases ran (a --cases or --quick run leaves some out)."""
    head = f"{'model':<6} {'target':<50} {'ratio':>7} {'goal':>7}  result   {'CPU ratio':>9}  " \
           f"per round"
    lines = [head, "-" * len(head)]
    measured = [t for t in targets if t["rounds"]]
    if not measured:
        return "targets: none of their case pairs ran"
    for t in measured:
        verdict = "-" if t["goal"] == "-" else "n/a" if t["met"] is None else \
            ("met" if t["met"] else "MISSED")
        cpu = "" if t["cpu_ratio"] != t["cpu_ratio"] else f"{t['cpu_ratio']:.3f}"
        note = f"  ({t['note']})" if t.get("note") else ""
        lines.append(f"{t['model']:<6} {t['target']:<50} {t['ratio']:>7.3f} {t['goal']:>7}  "
                     f"{verdict:<8} {cpu:>9}  {', '.join(f'{x:.3f}' for x in t['rounds'])}{note}")
    return "\n".join(lines)


def write_csv(path: str, rows: List[Row], settings):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["model", "case", "driver", "strategy", "num_devices", "workers", "input",
                    "global_batch", "warmup_steps", "measured_steps", "examples_per_sec",
                    "examples_per_sec_per_round", "window_examples_per_sec", "first_step_seconds", "peak_rss_mb",
                    "cpu_ms_per_step", "onednn", "failed_runs"])
        for row in rows:
            s = settings[row.case.model]
            w.writerow([row.case.model, row.case.name, row.case.driver, row.case.strategy,
                        row.case.num_devices, row.case.workers,
                        "cifar_binary" if row.case.real_input else "memory", row.batch, s.warmup,
                        s.steps, f"{row.examples_per_sec:.2f}",
                        ";".join(f"{m.examples_per_sec:.2f}" for m in row.ok_runs),
                        f"{row.window_examples_per_sec:.2f}",
                        f"{row.first_step_seconds:.2f}", f"{row.peak_rss_mb:.1f}",
                        f"{row.cpu_ms_per_step:.2f}", row.onednn,
                        len(row.runs) - len(row.ok_runs)])


def write_targets_csv(path: str, targets: List[Dict]):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["model", "target", "ratio", "goal", "met", "ratio_per_round", "cpu_ratio",
                    "note"])
        for t in targets:
            w.writerow([t["model"], t["target"], f"{t['ratio']:.4f}", t["goal"],
                        "" if t["met"] is None else t["met"],
                        ";".join(str(x) for x in t["rounds"]), f"{t['cpu_ratio']:.4f}",
                        t.get("note", "")])


COLOURS = {"project": "#1f77b4", "plain": "#7f7f7f", "keras": "#d62728"}
ALL_REDUCE_DRIVERS = ("comm", "tcp")  # bench_comm.py: in the tables, not in the plot


def write_plot(path: str, rows: List[Row], settings, subtitle: str) -> bool:
    """bench.png of the training cases; False (and no file) when none ran."""
    # The all-reduce cases train no model: their rates would dwarf every bar of the plot.
    rows = [r for r in rows if r.case.driver not in ALL_REDUCE_DRIVERS]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.case.model for r in rows))
    fig, axes = plt.subplots(len(models), 2, figsize=(14, 4.2 * len(models)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1.4]})
    for i, model in enumerate(models):
        mine = [r for r in rows if r.case.model == model]
        names = [r.case.name for r in mine]
        y = np.arange(len(mine))
        colours = [COLOURS[r.case.driver] for r in mine]
        ax = axes[i][0]
        ax.barh(y, [r.examples_per_sec for r in mine], color=colours)
        for k, r in enumerate(mine):
            ax.plot([m.examples_per_sec for m in r.ok_runs], [k] * len(r.ok_runs), "k.", ms=4)
        ax.set_yticks(y)
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("global examples/sec (median of rounds; dots: each round)")
        ax.set_title(f"{settings[model].title}, batch {settings[model].batch} per worker")
        ax2 = axes[i][1]
        ax2.barh(y, [r.first_step_seconds for r in mine], color=colours)
        ax2.set_yticks(y)
        ax2.set_yticklabels([])
        ax2.invert_yaxis()
        ax2.set_xlabel("seconds from process start to first step")
    fig.suptitle(f"estimator-dist bench: {subtitle}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def machine_line() -> str:
    import platform

    load = os.getloadavg()
    return (f"{os.cpu_count()} CPU(s), {platform.processor() or platform.machine()}, "
            f"load average {load[0]:.2f}")


def run(options: Options) -> int:
    """Run every case, print the tables, write bench.csv, targets.csv, bench.json, bench.png."""
    check_options(options)
    rounds = schedule(options)  # an unknown --cases is refused before anything is written
    say = options.emit
    started = time.monotonic()
    out = options.output_dir
    work = os.path.join(out, "work")
    shutil.rmtree(work, ignore_errors=True)
    for sub in ("model_dirs", "specs"):
        os.makedirs(os.path.join(work, sub), exist_ok=True)
    shutil.rmtree(os.path.join(out, "logs"), ignore_errors=True)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    settings = QUICK_SETTINGS if options.quick else SETTINGS
    records = 64 if options.quick else REAL_RECORDS_PER_FILE
    cifar_dir = write_cifar_files(os.path.join(work, "cifar10"), records)
    total = sum(len(g) for r in rounds for g in r)
    say(f"bench: {total} case runs ({len(rounds)} round(s) of {total // len(rounds)}, in "
        f"{len(rounds[0])} interleaved group(s)) on "
        f"{machine_line()}; logs in {os.path.join(out, 'logs')}")
    runner = bench_runner.Runner(
        options, settings, os.path.abspath(work), cifar_dir,
        spec_for=lambda case, model_dir, worker: case_spec(options, settings, cifar_dir, case,
                                                           model_dir, worker),
        envs_for=process_envs)
    measurements = []
    for r, groups in enumerate(rounds):
        for group in groups:
            say(f"{group[0].group}: {len(group)} case(s), started one at a time, then "
                f"{settings[group[0].model].bursts} interleaved bursts")
            for run_ in runner.run_group(group, r):
                m = measurement(run_)
                measurements.append(m)
                figure = (f"{m.examples_per_sec:,.1f} examples/sec, first step "
                          f"{m.first_step_seconds:.1f} s" if m.ok else
                          f"FAILED ({m.error}; see {m.log})")
                say(f"[{len(measurements)}/{total}] {settings[m.case.model].title} | "
                    f"{m.case.name}: {figure} ({m.wall_seconds:.0f} s)")
    rows = make_rows(options, measurements)
    targets = target_rows(options, measurements)
    elapsed = time.monotonic() - started
    subtitle = (f"{'quick, ' if options.quick else ''}{options.rounds} round(s), "
                f"{machine_line()} at the end, {elapsed / 60:.1f} min")
    say("")
    say(format_table(rows, settings))
    say("")
    say(format_targets(targets))
    write_csv(os.path.join(out, "bench.csv"), rows, settings)
    write_targets_csv(os.path.join(out, "targets.csv"), targets)
    with open(os.path.join(out, "bench.json"), "w", encoding="utf-8") as f:
        json.dump({"options": {"quick": options.quick, "rounds": options.rounds,
                               "models": list(options.models),
                               "extra_args": list(options.extra_args)},
                   "settings": {m: vars(settings[m]) for m in options.models},
                   "machine": subtitle,
                   "runs": [{"case": m.case.key, "round": m.round, "ok": m.ok,
                             "examples_per_sec": m.examples_per_sec,
                             "burst_examples_per_sec": m.burst_examples_per_sec,
                             "window_examples_per_sec": m.window_examples_per_sec,
                             "first_step_seconds": m.first_step_seconds,
                             "peak_rss_mb": m.peak_rss_mb, "cpu_ms_per_step": m.cpu_ms_per_step,
                             "onednn": m.onednn, "wall_seconds": m.wall_seconds,
                             "error": m.error} for m in measurements],
                   "targets": targets}, f, indent=2)
    png = os.path.join(out, "bench.png")
    if os.path.exists(png):  # an earlier run's plot would pass for this one's
        os.remove(png)
    plotted = write_plot(png, rows, settings, subtitle)
    shutil.rmtree(work, ignore_errors=True)
    say("")
    say(f"wrote {out}/bench.csv, targets.csv, bench.json"
        f"{', bench.png' if plotted else ' (no bench.png: no case that trains a model ran)'} "
        f"({elapsed / 60:.1f} min)")
    failed = [m for m in measurements if not m.ok]
    if failed:
        say(f"bench: {len(failed)} case run(s) failed; see their logs under {out}/logs")
        return 1
    return 0
