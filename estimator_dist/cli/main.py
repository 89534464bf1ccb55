"""`estimator-dist` command line: parse arguments, call one function, map errors to exit codes."""
import argparse
import difflib
import os
import signal
import sys

from estimator_dist import errors
from estimator_dist import files


def nonempty_arg(fix: str):
    """argparse type of a flag for which an empty value would silently mean "not given": an
    explicit empty value ('--flag ""', '--flag=') is refused with `fix`, not taken for the
    default (train's runs/MODEL, the input's data, stdout, ...) or the current directory.

    Only the command line is checked: a config file (and the config.yaml a run saves) keeps
    '' for a setting it leaves unset.
    """
    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"'' is empty; {fix}")
        return text

    return parse


def _or_leave_out(what: str, default: str):
    return nonempty_arg(f"give {what}, or leave the flag out for {default}")


TRAIN_MODEL_DIR = _or_leave_out("a directory", "the default runs/MODEL")
READ_MODEL_DIR = nonempty_arg("give the model_dir a train run wrote (e.g. runs/digits)")
CHECKPOINT = _or_leave_out("a checkpoint path or model.ckpt-N", "the latest")

TRAIN_FLAGS = {
    # flag: (type, help); a str flag's type refuses '' (nonempty_arg), which meant "not given"
    "input": (_or_leave_out("a registered input (see 'estimator-dist list')", "the model's own"),
              "registered input (default: the model's own)"),
    "data_dir": (_or_leave_out("a directory", "the input's default"),
                 "directory with the input's data files"),
    "data_path": (_or_leave_out("a data file", "the input's default data"),
                  "a data file, e.g. the CSV for --model tabular"),
    "label_column": (_or_leave_out("a column of --data_path", "the input's default"),
                     "the label column of --data_path"),
    "synthetic": (bool, "use generated in-memory data of the right shapes"),
    "reader_nice": (int, "0-19: nice value of the input's reader threads, which run under "
                         "SCHED_BATCH (Linux), so that on a CPU the reader uses cores the "
                         "training step leaves idle; 0 = the step's priority (default 19). Only "
                         "an input with reader threads reads it (built-in: cifar); others "
                         "refuse it"),
    "strategy": (_or_leave_out("a strategy such as mirrored", "none"),
                 "none | one_device | mirrored | central_storage | tower | "
                 "multi_worker_mirrored | parameter_server | horovod (default none); tower: "
                 "one model replica per device over one set of variables, any batch size; "
                 "multi_worker_mirrored and parameter_server need TF_CONFIG, horovod a "
                 "Horovod launch (see 'cluster'; without one it runs as 1 rank)"),
    "num_devices": (int, "devices to use: 0 = auto (all GPUs, else 1 CPU); on a CPU-only "
                         "machine N logical CPU devices"),
    "variable_device": (_or_leave_out("auto, cpu or device0", "auto"),
                        "tower only: where the one set of variables lives, auto | cpu | device0 "
                        "(default auto: device0 on GPUs, cpu on CPUs)"),
    "accumulate_steps": (int, "K: apply one update every K batches, equal to one step on a K "
                              "times larger batch (none, one_device, mirrored, tower; default 1). "
                              "The global step counts updates: --train_steps N reads N x K "
                              "batches; LR schedules and checkpoints are in updates"),
    "scale_lr": (bool, "multiply the learning rate by the number of replicas (all workers)"),
    "jit": (bool, "compile the model's graph with XLA (global_jit_level ON_1; CPU and GPU)"),
    "gradient_compression": (_or_leave_out("none, fp16 or bf16", "none"),
                             "all-reduce gradients in 16 bits: none, fp16 or bf16 (mirrored, "
                             "multi_worker_mirrored; horovod: fp16)"),
    "mixed_precision": (_or_leave_out("none, bfloat16 or float16", "none"),
                        "none | bfloat16 | float16: Keras layers of the model_fn compute in "
                        "16 bits, variables and the loss stay float32; float16 (for GPUs) adds "
                        "dynamic loss scaling (default none)"),
    "batch_size": (int, "GLOBAL batch per step (per micro-batch with --accumulate_steps); each "
                        "of R replicas gets batch_size / R; tower splits any size over its towers"),
    "train_steps": (int, "global step to train to (optimizer updates)"),
    "eval_steps": (int, "batches per evaluation (0 = the whole eval set)"),
    "eval_every": (int, "steps between evaluations (sets the checkpoint interval)"),
    "save_checkpoints_steps": (int, "steps between checkpoints (default 500 or the model's)"),
    "keep_checkpoint_max": (int, "checkpoints (and latest/best exports) to keep"),
    "seed": (int, "graph-level random seed (default: none)"),
    "export": (_or_leave_out("latest, best, final or none", "final"),
               "latest | best | final | none (default final)"),
    "best_metric": (_or_leave_out("an eval metric such as accuracy", "loss"),
                    "with --export best: the eval metric to keep the best of (default loss)"),
    "higher_is_better": (bool, "larger --best_metric / --early_stop values are better (implied "
                               "for accuracy, auc, precision, recall)"),
    "eval_every_secs": (int, "evaluate (and checkpoint) every N seconds instead of by steps"),
    "early_stop": (_or_leave_out("an eval metric such as loss", "no early stop"),
                   "stop when this eval metric stops improving (e.g. loss, accuracy)"),
    "patience": (int, "with --early_stop: evaluations without improvement before stopping "
                      "(default 3)"),
    "min_delta": (float, "with --early_stop: smallest change that counts as improvement"),
    "warm_start_from": (_or_leave_out("a checkpoint or model_dir", "a cold start"),
                        "initialise from this checkpoint or model_dir (new runs only)"),
    "warm_start_vars": (_or_leave_out("a regex such as 'digits_cnn/conv.*'", "all variables"),
                        "regex of the variables to warm-start (default all)"),
    "model_dir": (TRAIN_MODEL_DIR, "where checkpoints, events, config and exports go (default "
                                   "runs/MODEL)"),
    "summary_json": (_or_leave_out("a file path", "no summary file"),
                     "write final metrics, global step, exports, examples/sec here"),
    "weights_check_steps": (int, "stop a fresh run in which no trainable variable changed "
                                 "over its first K updates (default 3; 0 = off, for "
                                 "deliberate freezing)"),
}


def _add_common(p):
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                   type=nonempty_arg("give a module name such as my_project.models"),
                   help="import a module that registers more models/inputs (repeatable)")
    _add_verbose(p)


def _add_verbose(p):
    p.add_argument("--verbose", action="store_true", help="show TensorFlow's own logging")


def _add_train_flags(p):
    p.add_argument("--model", default=None, help="registered model (default digits)",
                   type=_or_leave_out("a registered model (see 'estimator-dist list')", "digits"))
    p.add_argument("--config", default=None, metavar="YAML", help="a run config file",
                   type=_or_leave_out("a YAML file", "none"))
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a model hparam (repeatable); unknown keys fail")
    for name, (kind, text) in TRAIN_FLAGS.items():
        if kind is bool:
            p.add_argument(f"--{name}", action="store_const", const=True, default=None, help=text)
        else:
            p.add_argument(f"--{name}", type=kind, default=None, help=text)


def _add_cluster_shape(p):
    p.add_argument("--workers", type=int, default=2, help="training tasks, the chief included (default 2)")
    p.add_argument("--ps", type=int, default=0, help="parameter-server tasks (default 0)")
    p.add_argument("--evaluator", action="store_true", help="add an evaluator task (it exports)")
    p.add_argument("--evaluator_gpus", type=int, default=0,
                   help="GPUs of the evaluator task (default 0: it evaluates on its CPU)")


class Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with the fix) instead of the usage text."""

    def error(self, message):
        print(f"{self.prog}: error: {message}; see '{self.prog} --help'", file=sys.stderr)
        sys.exit(errors.EXIT_USER)

    def unrecognized(self, rest):
        """Exit with one line naming the unknown arguments and the closest known flags."""
        known = [o for o in self._option_string_actions if o.startswith("--")]
        hints = []
        for arg in rest:
            name = arg.split("=", 1)[0]
            close = difflib.get_close_matches(name, known, n=1)
            if close:
                hints.append(f"{close[0]} for {name}")
        self.error(f"unrecognized arguments: {' '.join(rest)}"
                   + (f" (did you mean {', '.join(hints)}?)" if hints else ""))


# Subcommands that pass the flags they do not know on to `train`.
PASS_THROUGH = ("cluster", "tfjob")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="estimator-dist", description="Estimator-based data-parallel training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    train = sub.add_parser("train", help="train and evaluate a registered model")
    _add_train_flags(train)
    _add_common(train)

    ev = sub.add_parser("evaluate", help="evaluate a model_dir's checkpoint on its eval data")
    ev.add_argument("--model_dir", required=True, type=READ_MODEL_DIR)
    ev.add_argument("--checkpoint", type=CHECKPOINT, help="a checkpoint path or model.ckpt-N (default latest)")
    ev.add_argument("--eval_steps", type=int, default=None, help="batches (default: as trained)")
    _add_common(ev)

    ex = sub.add_parser("export", help="export a SavedModel from a model_dir's checkpoint, on CPU")
    ex.add_argument("--model_dir", required=True, type=READ_MODEL_DIR)
    ex.add_argument("--checkpoint", type=CHECKPOINT, help="a checkpoint path or model.ckpt-N (default latest)")
    ex.add_argument("--export_dir", help="base directory (default MODEL_DIR/export/manual)",
                    type=_or_leave_out("a directory", "MODEL_DIR/export/manual"))
    _add_common(ex)

    pr = sub.add_parser("predict", help="run a SavedModel on a CSV or .npy file, write a CSV")
    pr.add_argument("--saved_model", required=True,
                    type=nonempty_arg("give a SavedModel directory or a model_dir"),
                    help="a SavedModel directory (or a model_dir: its newest export)")
    pr.add_argument("--input", required=True, dest="input_path",
                    type=nonempty_arg("give a .csv or .npy file"),
                    help="a .csv (columns = features) or .npy (one feature)")
    pr.add_argument("--output", help="CSV to write (default: stdout)",
                    type=_or_leave_out("a file path", "stdout"))
    pr.add_argument("--batch_size", type=int, default=256)
    pr.add_argument("--id_column", type=_or_leave_out("a CSV column name", "none"),
                    help="a CSV column that is no feature, passed through as the first output column")
    _add_common(pr)

    cl = sub.add_parser("cluster", help="run a TF_CONFIG cluster or Horovod ranks as local "
                                        "processes on 127.0.0.1; other flags go to every "
                                        "task's train command")
    _add_cluster_shape(cl)
    cl.add_argument("--launcher", choices=["tf_config", "horovod"], default=None,
                    help="tf_config: TF_CONFIG tasks (default); horovod: --workers Horovod ranks "
                         "over gloo, --strategy horovod (implied by --strategy horovod)")
    cl.add_argument("--max_restarts", type=int, default=3,
                    help="restarts of dead tasks allowed in all (default 3)")
    cl.add_argument("--startup_timeout", type=float, default=120.0,
                    help="seconds a task may take to start listening (a Horovod rank: to "
                         "reach the rendezvous) (default 120)")

    tj = sub.add_parser("tfjob", help="write a Kubeflow TFJob manifest whose replicas run the "
                                      "train command; other flags go to that command")
    _add_cluster_shape(tj)
    tj.add_argument("--image", required=True, help="container image with estimator-dist installed")
    tj.add_argument("--gpus", type=int, default=0,
                    help="GPUs of each chief/worker pod (resource limit nvidia.com/gpu; default 0)")
    tj.add_argument("--name", default="estimator-dist", help="TFJob name (DNS label)")
    tj.add_argument("--namespace", default="default")
    tj.add_argument("--pvc", help="PersistentVolumeClaim mounted on every replica",
                    type=_or_leave_out("a PersistentVolumeClaim name", "no volume"))
    tj.add_argument("--mount_path", default="/mnt/estimator-dist",
                    type=_or_leave_out("an absolute path", "/mnt/estimator-dist"),
                    help="where --pvc is mounted (default /mnt/estimator-dist)")
    tj.add_argument("--output", help="file to write (default: stdout)",
                    type=_or_leave_out("a file path", "stdout"))

    rp = sub.add_parser("report", help="a model_dir's event files as a CSV, a PNG plot and a summary")
    rp.add_argument("--model_dir", required=True, type=READ_MODEL_DIR)
    rp.add_argument("--output_dir", help="where report.csv/.png go (default MODEL_DIR/report)",
                    type=_or_leave_out("a directory", "MODEL_DIR/report"))
    _add_common(rp)

    bn = sub.add_parser("bench", help="examples/sec, start-up time and memory of every strategy, "
                                      "a plain Estimator and Keras fit, side by side in one run")
    bn.add_argument("--output_dir", default="runs/bench",
                    type=_or_leave_out("a directory", "runs/bench"),
                    help="where bench.csv, targets.csv, bench.png go (default runs/bench)")
    bn.add_argument("--quick", action="store_true",
                    help="tiny sizes: checks that the command works, not its numbers")
    bn.add_argument("--rounds", type=int, default=None,
                    help="times every case runs, order reversed each round; medians are "
                         "reported (default 1)")
    bn.add_argument("--models", type=_or_leave_out("cifar, mlp or cifar,mlp", "both"),
                    help="comma-separated: cifar, mlp (default both)")
    bn.add_argument("--cases", type=_or_leave_out("comma-separated texts of case names",
                                                  "every case"),
                    help="run only the cases whose name contains one of "
                                                "these comma-separated texts, e.g. 'project none'")
    bn.add_argument("--case_timeout", type=float, default=None,
                    help="seconds one case may take (default 300)")
    _add_verbose(bn)  # no --import: bench runs its own cases (bench_cases.py) only

    ls = sub.add_parser("list", help="registered models and inputs with their hparams")
    _add_common(ls)
    return parser


def subcommand(parser: Parser, name: str) -> Parser:
    """The parser of subcommand `name`."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # pylint: disable=protected-access
    return actions[0].choices[name]


def exit_on_early_sigterm():
    """`train` until its own SIGTERM handling starts (importing TensorFlow alone takes
    seconds): one line and exit 143, as later; it died by the raw signal (-15)."""
    def handler(signum, frame):
        os.write(2, f"estimator-dist: preempted: {errors.OUTSIDE_THE_RUN}\n".encode())
        os._exit(errors.EXIT_PREEMPTED)  # noqa: SLF001 - nothing written yet

    signal.signal(signal.SIGTERM, handler)


def main(argv=None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "train" and argv is None:  # a process of its own, not a test's call
        exit_on_early_sigterm()
    if args.command in PASS_THROUGH:
        args.train_args = rest
        args.verbose = "--verbose" in rest
    elif rest:
        subcommand(parser, args.command).unrecognized(rest)
    # oneDNN kernels: ResNet-20 trains ~1.8x faster on CPUs where TensorFlow leaves them off
    # (measured, README "Performance"). Must be set before TensorFlow is imported; =0 opts out.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    from estimator_dist import quiet

    quiet.configure(args.verbose)
    from estimator_dist.cli import commands

    try:
        return commands.run(args.command, args) or errors.EXIT_OK
    except (OSError, IndexError) as e:
        error = unguarded_os_error(e)
        if error is None:
            raise
        print(f"estimator-dist: {error.label}: {error}", file=sys.stderr)
        return error.exit_code
    except errors.ReportedError as e:
        print(f"estimator-dist: {e.label}: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        print("estimator-dist: interrupted", file=sys.stderr)
        return errors.EXIT_INTERRUPTED


def unguarded_os_error(e: BaseException):
    """A ReportedError for an OS error no check caught earlier, or None (a real bug: traceback).

    A full disk (IndexError: TensorFlow's OUT_OF_RANGE, e.g. a TensorBoard events file too
    large) is a StorageError; a path that is a file where a directory is needed, a directory
    where a file is, or under a missing directory is a UserError naming it.
    """
    if files.reason_in(e):
        return files.storage_error(e, "writing a file", "the command stopped there")
    if isinstance(e, OSError) and e.filename:
        return errors.UserError(f"{e.filename}: {e.strerror or e}; check the paths given "
                                f"(--model_dir, --output, --output_dir, --summary_json, ...)")
    return None


if __name__ == "__main__":
    sys.exit(main())
