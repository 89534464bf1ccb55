"""The run configuration's dataclasses; each field is also a `train` flag.

A field's metadata (`flag(...)`) is the one place its flag is described: the `--help`
text, the README table's row, and for a str flag what to give instead of an empty value.
training/flags.py builds the argparse flags and the README table from it.
"""
import dataclasses
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Dict, Mapping, Optional, Tuple

MAX_READER_NICE = 19
# DataConfig.reader_nice when the run does not set it: an input with reader threads uses
# reader_priority.DEFAULT_NICE (19); one without them refuses only a value that was given.
NO_READER_NICE = -1
# TensorFlow reduces a graph-level seed modulo 2**31 - 1 (random_seed._truncate_seed), so a
# larger one would silently alias a smaller one; -1 is TrainConfig's "no seed".
MAX_SEED = 2**31 - 2
NO_SEED = -1


@dataclass(frozen=True)
class FlagDoc:
    """How one `train` flag is described.

    help: its `--help` text. doc, default: the README table's meaning and default
    columns. metavar: shown after the flag in the README (the --help of a config field
    keeps argparse's). empty: for a str flag, (what to give, what leaving it out means):
    an explicit '' is refused with that fix (flags.or_leave_out), never taken for unset.
    """

    help: str
    doc: str
    default: str = ""
    metavar: str = ""
    empty: Optional[Tuple[str, str]] = None


def flag(help: str, doc: Optional[str] = None, default: str = "", metavar: str = "",
         empty: Optional[Tuple[str, str]] = None) -> Dict[str, FlagDoc]:
    """Field metadata of a config field's `train` flag (doc defaults to help)."""
    return {"flag": FlagDoc(help, help if doc is None else doc, default, metavar, empty)}


def flag_doc(f: dataclasses.Field) -> FlagDoc:
    return f.metadata["flag"]


@dataclass(frozen=True)
class DataConfig:
    """Where the examples come from."""

    input: str = field(default="", metadata=flag(
        "registered input (default: the model's own)", "registered input", "the model's own",
        empty=("a registered input (see 'estimator-dist list')", "the model's own")))
    data_dir: str = field(default="", metadata=flag(
        "directory with the input's data files",
        "directory holding the input's files (e.g. CIFAR-10 binaries)", "input's default",
        empty=("a directory", "the input's default")))
    data_path: str = field(default="", metadata=flag(
        "a data file, e.g. the CSV for --model tabular", "a data file (the CSV for `tabular`)",
        empty=("a data file", "the input's default data")))
    label_column: str = field(default="", metadata=flag(
        "the label column of --data_path", "the label column of `--data_path`",
        empty=("a column of --data_path", "the input's default")))
    synthetic: bool = field(default=False, metadata=flag(
        "use generated in-memory data of the right shapes",
        "generated in-memory data of the right shapes (no files needed)", "off"))
    reader_nice: int = field(default=NO_READER_NICE, metadata=flag(  # not given: DEFAULT_NICE
        "0-19: nice value of the input's reader threads, which run under SCHED_BATCH (Linux), "
        "so that on a CPU the reader uses cores the training step leaves idle; 0 = the step's "
        "priority (default 19). Only an input with reader threads reads it (built-in: cifar); "
        "others refuse it",
        "0-19: nice value of the input's reader threads, which run under `SCHED_BATCH` (Linux), "
        "so that on a CPU the reader runs on cores the training step leaves idle; 0 = the "
        "step's priority (see \"Performance\"). Only an input that declares reader threads "
        "reads it (built-in: `cifar`, with or without `--synthetic`); `digits` and `tabular` "
        "refuse it, 0 included",
        "19 where the input has reader threads (`-1` in a config file: not given)", "N"))


@dataclass(frozen=True)
class TrainConfig:
    """How long and how to train, checkpoint, evaluate and export."""

    batch_size: int = field(default=64, metadata=flag(
        "GLOBAL batch per step (per micro-batch with --accumulate_steps); each of R replicas "
        "gets batch_size / R; tower splits any size over its towers",
        "the GLOBAL batch per step, per micro-batch with `--accumulate_steps` (see \"Batch "
        "rule\")", "model's, else 64"))
    train_steps: int = field(default=1000, metadata=flag(
        "global step to train to (optimizer updates)",
        "the global step to train to (counts optimizer updates)", "model's, else 1000"))
    eval_steps: int = field(default=0, metadata=flag(
        "batches per evaluation (0 = the whole eval set)",
        "batches per evaluation; 0 = the whole eval set", "model's, else 0"))
    eval_every: int = field(default=0, metadata=flag(
        "steps between evaluations (sets the checkpoint interval)",
        "steps between evaluations; sets the checkpoint interval, since Estimator evaluates "
        "after each checkpoint", "`--save_checkpoints_steps`"))
    save_checkpoints_steps: int = field(default=0, metadata=flag(
        "steps between checkpoints (default 500 or the model's)",
        "steps between checkpoints (and evaluations)", "model's, else min(500, train_steps)"))
    keep_checkpoint_max: int = field(default=5, metadata=flag(
        "checkpoints (and latest/best exports) to keep", default="5"))
    seed: int = field(default=NO_SEED, metadata=flag(
        "graph-level random seed (default: none)",
        "graph-level random seed (`tf_random_seed`) and input shuffle seed", "none"))
    export: str = field(default="final", metadata=flag(
        "latest | best | final | none (default final)",
        "`latest` (after every evaluation), `best` (by `--best_metric`), `final` (at the "
        "end), `none`", "`final`", empty=("latest, best, final or none", "final")))
    best_metric: str = field(default="loss", metadata=flag(
        "with --export best: the eval metric to keep the best of (default loss)",
        "with `--export best`: the eval metric whose best value is kept", "`loss`",
        empty=("an eval metric such as accuracy", "loss")))
    higher_is_better: bool = field(default=False, metadata=flag(
        "larger --best_metric / --early_stop values are better (implied for accuracy, auc, "
        "precision, recall)",
        "larger `--best_metric` / `--early_stop` values are better (implied for accuracy, "
        "auc, precision, recall)", "off"))
    eval_every_secs: int = field(default=0, metadata=flag(
        "evaluate (and checkpoint) every N seconds instead of by steps", default="0"))
    early_stop: str = field(default="", metadata=flag(
        "stop when this eval metric stops improving (e.g. loss, accuracy)",
        "stop when this eval metric has not improved for `--patience` evaluations", "off",
        "METRIC", empty=("an eval metric such as loss", "no early stop")))
    patience: int = field(default=3, metadata=flag(
        "with --early_stop: evaluations without improvement before stopping (default 3)",
        "evaluations without improvement before an early stop", "3"))
    min_delta: float = field(default=0.0, metadata=flag(
        "with --early_stop: smallest change that counts as improvement",
        "the smallest change that counts as an improvement", "0"))
    warm_start_from: str = field(default="", metadata=flag(
        "initialise from this checkpoint or model_dir (new runs only)",
        "initialise a NEW run from this checkpoint or model_dir's latest", "none",
        empty=("a checkpoint or model_dir", "a cold start")))
    warm_start_vars: str = field(default=".*", metadata=flag(
        "regex of the variables to warm-start (default all)",
        "regex of the variables to warm-start, e.g. `'digits_cnn/conv.*'` to keep a trained "
        "body and a new head", "`.*`",
        empty=("a regex such as 'digits_cnn/conv.*'", "all variables")))
    model_dir: str = field(default="", metadata=flag(
        "where checkpoints, events, config and exports go (default runs/MODEL)",
        "checkpoints, events, `config.yaml`, exports", "`runs/MODEL`",
        empty=("a directory", "the default runs/MODEL")))
    summary_json: str = field(default="", metadata=flag(
        "write final metrics, global step, exports, examples/sec here",
        "write final eval metrics, global step, export paths, examples/sec", "none", "PATH",
        empty=("a file path", "no summary file")))
    weights_check_steps: int = field(default=3, metadata=flag(
        "stop a fresh run in which no trainable variable changed over its first K updates "
        "(default 3; 0 = off, for deliberate freezing)",
        "a fresh run in which no trainable variable changed over its first K updates, the "
        "loss finite and nonzero, stops with one line naming the likely cause (exit 2); 0 = "
        "off, for deliberate freezing (see `docs/model-code.md`)", "3", "K"))


@dataclass(frozen=True)
class DistributeConfig:
    """Which strategy, how many devices, where tower variables live, micro-batches per update,
    the type gradients are all-reduced in."""

    strategy: str = field(default="none", metadata=flag(
        "none | one_device | mirrored | central_storage | tower | multi_worker_mirrored | "
        "parameter_server | horovod (default none); tower: one model replica per device over "
        "one set of variables, any batch size; multi_worker_mirrored and parameter_server need "
        "TF_CONFIG, horovod a Horovod launch (see 'cluster'; without one it runs as 1 rank)",
        "`none`, `one_device`, `mirrored`, `central_storage`, `tower`, "
        "`multi_worker_mirrored`, `parameter_server` (these two need TF_CONFIG), `horovod` "
        "(see \"Horovod\")", "`none`", empty=("a strategy such as mirrored", "none")))
    num_devices: int = field(default=0, metadata=flag(
        "devices to use: 0 = auto (all GPUs, else 1 CPU); on a CPU-only machine N logical CPU "
        "devices",
        "0 = auto (all GPUs, one for `none`/`one_device`; else 1 CPU); on a CPU-only machine "
        "N logical CPU devices (at most max(8, cores))", "0", "N"))
    variable_device: str = field(default="auto", metadata=flag(
        "tower only: where the one set of variables lives, auto | cpu | device0 (default auto: "
        "device0 on GPUs, cpu on CPUs)",
        "`tower` only: where the one set of variables lives, `auto` (`device0` on GPUs, `cpu` "
        "on CPUs), `cpu` or `device0`", "`auto`",
        empty=("auto, cpu or device0", "auto")))
    accumulate_steps: int = field(default=1, metadata=flag(
        "K: apply one update every K batches, equal to one step on a K times larger batch "
        "(none, one_device, mirrored, tower; default 1). The global step counts updates: "
        "--train_steps N reads N x K batches; LR schedules and checkpoints are in updates",
        "apply one update every K batches, equal to one step on a K-times larger batch "
        "(`none`, `one_device`, `mirrored`, `tower`)", "1", "K"))
    scale_lr: bool = field(default=False, metadata=flag(
        "multiply the learning rate by the number of replicas (all workers)",
        "multiply the learning rate by the number of replicas (every worker's)", "off"))
    allow_identical_batches: bool = field(default=False, metadata=flag(
        "multi_worker_mirrored: let every worker read the same examples (without it a run "
        "whose input does not shard by input_context stops in its first steps, exit 2)",
        "`multi_worker_mirrored`: let every worker read the same examples; without it a run "
        "whose workers read the same first batch, or the same labels in the same order "
        "(an input that does not shard by `input_context`), stops in its first steps, exit 2 "
        "(see [docs/cluster.md](docs/cluster.md))", "off"))
    gradient_compression: str = field(default="none", metadata=flag(
        "all-reduce gradients in 16 bits: none, fp16 or bf16 (mirrored, multi_worker_mirrored; "
        "horovod: fp16)",
        "`none`, `fp16` or `bf16`: all-reduce the gradients in 16 bits (half the bytes on the "
        "wire), apply them in float32; `mirrored`, `multi_worker_mirrored`, `horovod` (`fp16` "
        "only); see [docs/compression.md](docs/compression.md)", "`none`",
        empty=("none, fp16 or bf16", "none")))
    ps: int = field(default=0, metadata=flag(
        "in an srun step (Slurm) only: the step's last N tasks are parameter servers "
        "(--strategy parameter_server; default 0)",
        "in an `srun` step only: the step's last N tasks are parameter servers (`cluster` "
        "and `tfjob` take their own `--ps`); see [docs/slurm.md](docs/slurm.md)", "0", "N"))
    evaluator: bool = field(default=False, metadata=flag(
        "in an srun step (Slurm) only: the step's last task is the evaluator",
        "in an `srun` step only: the step's last task is the evaluator (it exports)", "off"))


@dataclass(frozen=True)
class ComputeConfig:
    """How each step computes: XLA compilation, bfloat16 mixed precision."""

    jit: bool = field(default=False, metadata=flag(
        "compile the model's graph with XLA (global_jit_level ON_1; CPU and GPU)",
        "compile the graph with XLA (TF1 `global_jit_level` ON_1; on CPUs too), train, eval "
        "and export (see \"XLA and bfloat16\")", "off"))
    mixed_precision: str = field(default="none", metadata=flag(
        "none | bfloat16 | float16: Keras layers of the model_fn compute in 16 bits, variables "
        "and the loss stay float32; float16 (for GPUs) adds dynamic loss scaling (default none)",
        "`none`, `bfloat16` or `float16` (GPUs; dynamic loss scaling): the model_fn's "
        "`tf.keras` layers compute in 16 bits; variables, loss, metrics and exported "
        "predictions stay float32", "`none`",
        empty=("none, bfloat16 or float16", "none")))


SECTIONS = {"data": DataConfig, "train": TrainConfig, "distribute": DistributeConfig,
            "compute": ComputeConfig}
TOP_LEVEL = ("model", "imports", "hparams") + tuple(SECTIONS)


@dataclass(frozen=True)
class Config:
    """Everything a run needs; `hparams` are the model's, after overrides."""

    model: str = "digits"
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    distribute: DistributeConfig = field(default_factory=DistributeConfig)
    compute: ComputeConfig = field(default_factory=ComputeConfig)
    hparams: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    imports: Tuple[str, ...] = ()

    def to_dict(self) -> Dict[str, Any]:
        return {
            "model": self.model,
            "imports": list(self.imports),
            **{name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS},
            "hparams": dict(self.hparams),
        }


def field_types(cls) -> Dict[str, type]:
    return {f.name: f.type if isinstance(f.type, type) else eval(f.type) for f in fields(cls)}  # noqa: S307


def flag_names() -> Dict[str, str]:
    """Flag name -> section, for every field of every section (names are unique)."""
    return {f.name: section for section, cls in SECTIONS.items() for f in fields(cls)}
