"""The argument parser of `estimator-dist` (the train flags come from training/flags.py)."""
import argparse
import difflib
import sys

from estimator_dist import errors
# The train flags come from the config dataclasses' metadata (training/flags.py).
from estimator_dist.training.flags import (  # noqa: F401 - TRAIN_FLAGS: the config-field flags
    TRAIN_FLAGS, add_import_flag, add_train_flags, add_verbose_flag, nonempty_arg, or_leave_out)

READ_MODEL_DIR = nonempty_arg("give the model_dir a train run wrote (e.g. runs/digits)")
CHECKPOINT = or_leave_out("a checkpoint path or model.ckpt-N", "the latest")


def _add_common(p):
    add_import_flag(p)
    add_verbose_flag(p)


DEFAULT_WORKERS = 2


def _add_cluster_shape(p):
    p.add_argument("--workers", type=int, default=None,
                   help=f"training tasks, the chief included (default {DEFAULT_WORKERS})")
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
PASS_THROUGH = ("cluster", "tfjob", "sbatch")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="estimator-dist", description="Estimator-based data-parallel training.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    train = sub.add_parser("train", help="train and evaluate a registered model")
    add_train_flags(train)
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
                    type=or_leave_out("a directory", "MODEL_DIR/export/manual"))
    _add_common(ex)

    pr = sub.add_parser("predict", help="run a SavedModel on a CSV or .npy file or on images, "
                                        "write a CSV")
    pr.add_argument("--saved_model", required=True,
                    type=nonempty_arg("give a SavedModel directory or a model_dir"),
                    help="a SavedModel directory (or a model_dir: its newest export)")
    pr.add_argument("--input", required=True, dest="input_path",
                    type=nonempty_arg("give a .csv or .npy file, or image files"),
                    help="a .csv (columns = features), a .npy (one feature), or a .jpg/.png "
                         "file or a folder of them (a model trained on images)")
    pr.add_argument("--output", help="CSV to write (default: stdout)",
                    type=or_leave_out("a file path", "stdout"))
    pr.add_argument("--batch_size", type=int, default=256)
    pr.add_argument("--id_column", type=or_leave_out("a CSV column name", "none"),
                    help="a CSV column that is no feature, passed through as the first output column")
    pr.add_argument("--signature", type=or_leave_out("a signature name", "the default"),
                    help="the SavedModel signature to run (default: predict_raw when the "
                         "export has it, else serving_default); one over serialized "
                         "tf.Examples is fed the rows as tf.Examples")
    pr.add_argument("--no_header", action="store_true",
                    help="the CSV has no header line: its first line is data (name its columns "
                         "with --columns)")
    pr.add_argument("--columns", type=or_leave_out("comma-separated column names", "the header"),
                    help="NAME,NAME,...: the columns of a CSV without a header line, in order "
                         "(with --no_header)")
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
    cl.add_argument("--discovery", metavar="PATH",
                    help="elastic: a file, or an executable printing, the worker slots available "
                         "now (a line per host: HOST or HOST:SLOTS); the cluster re-forms at the "
                         "next step when they change (docs/elastic.md). Replaces --workers")
    cl.add_argument("--min_workers", type=int, default=None,
                    help="elastic: the fewest workers to train with; below it the launcher "
                         "waits (default 1)")
    cl.add_argument("--max_workers", type=int, default=None,
                    help="elastic: the most workers, whatever the slots (default: as many as "
                         "the slots, up to the local limit)")
    cl.add_argument("--elastic_timeout", type=float, default=600.0,
                    help="elastic: seconds to wait for --min_workers slots before giving up "
                         "(default 600)")

    tj = sub.add_parser("tfjob", help="write a Kubeflow TFJob manifest whose replicas run the "
                                      "train command; other flags go to that command")
    _add_cluster_shape(tj)
    tj.add_argument("--image", required=True, help="container image with estimator-dist installed")
    tj.add_argument("--gpus", type=int, default=0,
                    help="GPUs of each chief/worker pod (resource limit nvidia.com/gpu; default 0)")
    tj.add_argument("--name", default="estimator-dist", help="TFJob name (DNS label)")
    tj.add_argument("--namespace", default="default")
    tj.add_argument("--pvc", help="PersistentVolumeClaim mounted on every replica",
                    type=or_leave_out("a PersistentVolumeClaim name", "no volume"))
    tj.add_argument("--mount_path", default="/mnt/estimator-dist",
                    type=or_leave_out("an absolute path", "/mnt/estimator-dist"),
                    help="where --pvc is mounted (default /mnt/estimator-dist)")
    tj.add_argument("--output", help="file to write (default: stdout)",
                    type=or_leave_out("a file path", "stdout"))

    sb = sub.add_parser("sbatch", help="write a Slurm batch script whose srun step runs the "
                                       "train command on every task, requeued on the retryable "
                                       "exit codes; other flags go to that command")
    sb.add_argument("--workers", type=int, default=None,
                    help=f"training tasks, the chief included (default {DEFAULT_WORKERS})")
    sb.add_argument("--ps", type=int, default=0, help="parameter-server tasks (default 0)")
    sb.add_argument("--evaluator", action="store_true", help="add an evaluator task (it exports)")
    sb.add_argument("--job_name", default="estimator-dist", help="Slurm job name")
    sb.add_argument("--time", type=or_leave_out("a Slurm time limit such as 2:00:00",
                                                "the partition's limit"),
                    help="time limit (sbatch --time); with it Slurm sends SIGUSR1 "
                         "--signal_before seconds before, and the tasks save")
    sb.add_argument("--signal_before", type=int, default=120,
                    help="seconds before --time that the tasks get SIGUSR1 (default 120)")
    sb.add_argument("--max_restarts", type=int, default=3,
                    help="requeues on exit code 143/144 (default 3)")
    sb.add_argument("--partition", type=or_leave_out("a partition name", "the default one"))
    sb.add_argument("--python", type=or_leave_out("a Python with estimator-dist installed",
                                                  "this one"),
                    help="the Python the tasks run (default: this one)")
    sb.add_argument("--output", help="file to write (default: stdout)",
                    type=or_leave_out("a file path", "stdout"))

    rp = sub.add_parser("report", help="a model_dir's event files as a CSV, a PNG plot and a "
                                       "summary; several model_dirs side by side")
    rp.add_argument("--model_dir", required=True, type=READ_MODEL_DIR, action="append",
                    help="a model_dir; repeat it to compare runs in one table and one plot")
    rp.add_argument("--output_dir", help="where report.csv/.png go (default MODEL_DIR/report; "
                                         "with several model_dirs ./report)",
                    type=or_leave_out("a directory", "MODEL_DIR/report"))
    _add_common(rp)

    bn = sub.add_parser("bench", help="examples/sec, start-up time and memory of every strategy, "
                                      "a plain Estimator and Keras fit, side by side in one run")
    bn.add_argument("--output_dir", default="runs/bench",
                    type=or_leave_out("a directory", "runs/bench"),
                    help="where bench.csv, targets.csv, bench.png go (default runs/bench)")
    bn.add_argument("--quick", action="store_true",
                    help="tiny sizes: checks that the command works, not its numbers")
    bn.add_argument("--rounds", type=int, default=None,
                    help="times every case runs, order reversed each round; medians are "
                         "reported (default 1)")
    bn.add_argument("--models", type=or_leave_out("cifar, mlp, imagenet or a list of them",
                                                   "cifar,mlp"),
                    help="comma-separated: cifar, mlp, imagenet (its parts imagenet_input, "
                         "resnet50, imagenet_overhead; opt-in) (default cifar,mlp)")
    bn.add_argument("--cases", type=or_leave_out("comma-separated texts of case names",
                                                  "every case"),
                    help="run only the cases whose name contains one of "
                                                "these comma-separated texts, e.g. 'project none'")
    bn.add_argument("--case_timeout", type=float, default=None,
                    help="seconds one case may take (default 300)")
    add_verbose_flag(bn)  # no --import: bench runs its own cases (bench_cases.py) only

    tr = sub.add_parser("tfrecords", help="an image folder (a subfolder per class) -> "
                                           "ImageNet-layout TFRecord shards and labels.txt")
    tr.add_argument("--images", required=True, type=nonempty_arg("give an image folder"),
                    help="a folder with one subfolder of images per class")
    tr.add_argument("--output", required=True, type=nonempty_arg("give an output directory"),
                    help="directory for train-*, validation-* and labels.txt (new or empty)")
    tr.add_argument("--shards", type=int, default=4, help="training shards (default 4)")
    tr.add_argument("--validation_shards", type=int, default=0,
                    help="validation shards (default: shards / 8, at least 1)")
    tr.add_argument("--validation_fraction", type=float, default=0.1,
                    help="of each class's images, for validation (default 0.1)")
    add_verbose_flag(tr)

    ls = sub.add_parser("list", help="registered models and inputs with their hparams")
    _add_common(ls)
    return parser


def subcommand(parser: Parser, name: str) -> Parser:
    """The parser of subcommand `name`."""
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]  # pylint: disable=protected-access
    return actions[0].choices[name]
