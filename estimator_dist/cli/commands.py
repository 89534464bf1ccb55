"""What each CLI subcommand does, given its parsed arguments."""
import os
import sys

from estimator_dist import errors
from estimator_dist.distribute import specs
from estimator_dist.guards import checkpoints
from estimator_dist.training import config as config_lib
from estimator_dist.serving import export as export_lib
from estimator_dist import files
from estimator_dist import paths
from estimator_dist.guards import signals
from estimator_dist.guards import stop_messages
from estimator_dist.training import user_code
from estimator_dist.training import plan as plan_lib
from estimator_dist.training import run as runner
from estimator_dist.training.flags import config_from_args
from estimator_dist.guards import storage
from estimator_dist.errors import UserError
from estimator_dist.cli.parser import DEFAULT_WORKERS
from estimator_dist.training.registry import INPUTS, MODELS


def saved_config(model_dir: str, **flags):
    """The config a run saved in model_dir, re-resolved for one CPU with `flags` applied."""
    user_code.load_builtins()
    data = config_lib.load_saved(model_dir)
    resolved = data.pop("resolved", {})
    user_code.import_user_modules(data.get("imports") or ())
    entry = MODELS.get(data.get("model", ""))
    # --summary_json is training's: its path need not be writable now.
    data.get("train", {}).pop("summary_json", None)
    # One process: no Slurm step's ps or evaluator task (train's --ps, --evaluator).
    flags = {"strategy": "none", "num_devices": 1, "model_dir": model_dir, "ps": 0,
             "evaluator": False, **flags}
    config = config_lib.build_config(data["model"], data, flags, {}, entry.hparams, (),
                                     tuple(data.get("imports") or ()))
    return config_lib.without_ignored(config), resolved


def train(args):
    # Until the run's guard takes over (and after it), SIGTERM exits 143 at once with one
    # line, in every role: it was a raw -15, or ignored while peers were connecting.
    with signals.exit_on_sigterm(stop_messages.outside_the_run):
        config = config_from_args(args)
        spec = check_slurm_step(config)
        checkpoints.check_same_model(plan_lib.default_model_dir(config), config.model)
        if spec is None:
            runner.train(config)
        else:
            train_in_slurm_step(config, spec)


def train_in_slurm_step(config, spec):
    """A task of an srun step ends by itself (guards/step_end.py): every task but the ps marks
    its end in model_dir; every task but the chief watches the chief's."""
    from estimator_dist.guards import step_end

    model_dir = plan_lib.default_model_dir(config)
    task = spec.task_name
    if spec.is_chief:
        step_end.clear_stale(model_dir)
    else:
        step_end.start(model_dir, task, spec.worker_names)

    def mark_exit_now(error):  # a task that exits at once (signals.exit_now) ends too
        if spec.marks_its_end:
            step_end.mark(model_dir, task, error.exit_code)

    code = errors.EXIT_INTERNAL
    try:
        with signals.on_exit_now(mark_exit_now):
            runner.train(config)
        code = errors.EXIT_OK
    except errors.ReportedError as e:
        code = e.exit_code
        raise
    except KeyboardInterrupt:
        code = errors.EXIT_INTERRUPTED
        raise
    finally:
        if spec.marks_its_end:
            step_end.mark(model_dir, task, code)


def check_slurm_step(config):
    """The cluster of an srun step (None outside one, or with TF_CONFIG set).

    A task of an srun step (Slurm) checks what `cluster` checks before it launches: every
    task of the step runs the same checks on the same flags, so all refuse together, with
    the same line and exit code (the chief alone refusing left its peers waiting for it)."""
    from estimator_dist.distribute import slurm
    from estimator_dist.distribute import tf_config
    from estimator_dist.launch import cluster as launcher

    d = config.distribute
    slurm.check_one_process_step(d.strategy)
    spec = tf_config.from_env(d.strategy, ps=d.ps, evaluator=d.evaluator)
    if spec is None or not slurm.in_step() or os.environ.get(tf_config.TF_CONFIG, "").strip():
        return None
    launcher.check_shape(spec.num_workers, spec.num_ps, d.strategy)
    check_evaluations(config, spec.has_evaluator)
    plan_lib.check_cluster_run(config, spec.num_workers, local=True)
    return spec


def evaluate(args):
    config, _ = saved_config(args.model_dir, eval_steps=args.eval_steps)
    metrics = runner.evaluate(config, args.checkpoint)
    print("  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in sorted(metrics.items())))


def export(args):
    config, resolved = saved_config(args.model_dir)
    if "input_meta" not in resolved:
        raise UserError(f"{args.model_dir}/{config_lib.CONFIG_FILE} has no resolved input "
                        f"metadata; retrain with this version")
    base = args.export_dir or os.path.join(args.model_dir, export_lib.EXPORT_SUBDIR, "manual")
    print(runner.export(config, resolved["input_meta"], base, args.checkpoint))


def predict(args):
    from estimator_dist.serving import predict as predict_lib

    if args.output:
        predict_lib.check_output_path(args.output, args.input_path)

    frame = predict_lib.predict_file(args.saved_model, args.input_path, args.batch_size,
                                     args.id_column or "", predict_lib.csv_columns(args),
                                     say=lambda line: print(line, file=sys.stderr),
                                     signature_name=args.signature or "")
    if args.output:
        files.write_file(args.output, lambda tmp: frame.to_csv(tmp, index=False))
        print(f"wrote {len(frame)} predictions to {args.output}")
    else:
        frame.to_csv(sys.stdout, index=False)


def list_registered(args):
    user_code.load_builtins()
    user_code.import_user_modules(args.imports)
    print("models:")
    for name in MODELS.names():
        entry = MODELS.get(name)
        hparams = ", ".join(f"{k}={v}" for k, v in entry.hparams.items())
        print(f"  {name:<12} (input {entry.default_input}) {entry.doc}")
        print(f"  {'':<12} hparams: {hparams}")
    print("inputs:")
    for name in INPUTS.names():
        print(f"  {name:<12} {INPUTS.get(name).doc}")


def checked_train_args(args, default_strategy=None) -> list:
    """The pass-through train flags, with --strategy made explicit (default_strategy, else
    the cluster's), validated for a cluster of --workers before any launch."""
    if args.workers is None:
        args.workers = DEFAULT_WORKERS
    train_args, config = train_flags(args, default_strategy)
    check_cluster(args, config, args.workers)
    return train_args, config


def train_flags(args, default_strategy=None):
    """(the train flags with --strategy made explicit, their Config); bad ones exit 2."""
    from estimator_dist.launch import cluster as launcher
    from estimator_dist.cli.parser import build_parser

    train_args = launcher.train_args_for(args.command, getattr(args, "launcher", None),
                                         args.train_args)
    strategy = default_strategy or launcher.cluster_strategy(None, args.ps)
    if not any(a == "--strategy" or a.startswith("--strategy=") for a in train_args):
        train_args += ["--strategy", strategy]
    parser = build_parser()
    train_ns, unknown = parser.parse_known_args(["train"] + train_args)  # bad values: exit 2
    if unknown:
        pass_through_parser(parser, args.command).unrecognized(unknown)  # exit 2
    # A TFJob's paths are its pods' (their own train expands ~ and $VARS); a local cluster's
    # tasks get them expanded here, said once.
    local = args.command == "cluster"
    config = config_from_args(train_ns, expand_paths=local)
    if local:
        checkpoints.check_same_model(plan_lib.default_model_dir(config), config.model)
        train_args = with_expanded_paths(train_args, train_ns, config)
    return train_args, config


def with_expanded_paths(train_args, train_ns, config) -> list:
    """The tasks' train flags with --config and every path setting as `config` resolved them
    (flags override the config file's values), so that no task expands or says it again."""
    from estimator_dist.training.flags import PATH_FIELDS

    changed = {"config": paths.expand("--config", train_ns.config)} if train_ns.config else {}
    for section, name in PATH_FIELDS:
        value = getattr(getattr(config, section), name)
        if value:
            changed[name] = value
    kept = []
    skip = False
    for arg in train_args:
        if skip:
            skip = False
            continue
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else None
        if name in changed:
            skip = "=" not in arg
            continue
        kept.append(arg)
    return kept + [a for name, value in changed.items() for a in (f"--{name}", value)]


def check_cluster(args, config, workers: int):
    """What every task of a cluster of `workers` would refuse at its start."""
    from estimator_dist.launch import cluster as launcher

    launcher.check_shape(workers, args.ps, config.distribute.strategy)
    check_evaluations(config, args.evaluator)
    plan_lib.check_cluster_run(config, workers, local=args.command == "cluster")


def pass_through_parser(parser, command: str):
    """A parser that knows `command`'s own flags and the train flags it passes on, so that an
    unknown one gets the closest of both ("did you mean --model for --modle?")."""
    from estimator_dist.cli.parser import Parser, subcommand

    return Parser(prog=f"{parser.prog} {command}", add_help=False, conflict_handler="resolve",
                  parents=[subcommand(parser, "train"), subcommand(parser, command)])


def check_evaluations(config, evaluator: bool):
    """In a TF_CONFIG cluster only the evaluator task evaluates while training runs: without
    one, --early_stop and --export best would have no evaluations to go on."""
    if evaluator or specs.is_horovod(config.distribute.strategy):
        return
    t = config.train
    needs = f"--early_stop {t.early_stop}" if t.early_stop else \
        "--export best" if t.export == "best" else None
    if needs:
        raise UserError(f"{needs}: in a cluster only the evaluator task evaluates during "
                        f"training, and there is none; add --evaluator")


ELASTIC_FLAGS = ("min_workers", "max_workers")


def cluster(args):
    from estimator_dist.launch import cluster as launcher

    if args.discovery is not None:
        return elastic_cluster(args)
    for name in ELASTIC_FLAGS:
        if getattr(args, name) is not None:
            raise UserError(f"--{name} without --discovery: an elastic cluster follows the "
                            f"worker slots a discovery file lists; add --discovery PATH, or "
                            f"use --workers N")
    train_args, _ = checked_train_args(args)
    return launcher.launch(train_args, args.workers, args.ps, args.evaluator, args.max_restarts,
                           args.startup_timeout, evaluator_gpus=args.evaluator_gpus)


def elastic_cluster(args):
    """`cluster --discovery`: the sizes in --min_workers..--max_workers that keep the global
    batch, checked as a cluster is, then launch/elastic.py."""
    from estimator_dist.launch import cluster as launcher
    from estimator_dist.launch import elastic

    if args.workers is not None:
        raise UserError(f"--workers {args.workers} with --discovery: the discovery's slots set "
                        f"the worker count; drop --workers (bound it with --min_workers and "
                        f"--max_workers)")
    low = 1 if args.min_workers is None else args.min_workers
    limit = launcher.workers_limit(args.ps, args.evaluator)
    elastic.check_range(low, args.max_workers, limit, args.elastic_timeout)
    train_args, config = train_flags(args)
    sizes = plan_lib.cluster_sizes(config, low, limit if args.max_workers is None
                                   else args.max_workers)
    check_cluster(args, config, sizes[-1])
    return launcher.launch_elastic(train_args, sizes, args.discovery,
                                   plan_lib.default_model_dir(config), args.ps, args.evaluator,
                                   args.max_restarts, args.startup_timeout, args.elastic_timeout,
                                   evaluator_gpus=args.evaluator_gpus)


def tfjob(args):
    from estimator_dist.launch import tfjob as tfjob_lib

    if args.workers is None:
        args.workers = DEFAULT_WORKERS
    if args.output:
        files.check_output_file("--output", args.output, "tfjob.yaml")
    # A bad --pvc was reported as the --model_dir that is not on it.
    tfjob_lib.check_job_flags(args.name, args.image, args.namespace, args.pvc, args.mount_path)
    # A pod computes on the GPUs it asks for: said to its train command, so the batch split
    # is checked here with the replicas the pods will have.
    args.train_args = tfjob_lib.with_num_devices(args.train_args, args.gpus)
    train_args, config = checked_train_args(
        args, tfjob_lib.default_strategy(args.workers, args.ps, args.evaluator))
    replicas = sum(tfjob_lib.replica_counts(args.workers, args.ps, args.evaluator).values())
    tfjob_lib.check_shared_model_dir(config.train.model_dir, args.pvc, args.mount_path, replicas)
    tfjob_lib.check_gpus(args.gpus, args.evaluator_gpus, config.distribute.num_devices)
    job = tfjob_lib.manifest(args.name, args.image, train_args, args.workers, args.ps,
                             args.evaluator, args.namespace, args.pvc, args.mount_path,
                             args.gpus, args.evaluator_gpus)
    text = tfjob_lib.to_yaml(job)
    if args.output:
        files.write_text(args.output, text)
        print(f"wrote TFJob '{args.name}' to {args.output}")
    else:
        sys.stdout.write(text)


def sbatch(args):
    """A Slurm batch script for the train flags (launch/sbatch.py), checked as `tfjob` checks
    its job: what every task would refuse at its start is refused here."""
    from estimator_dist.launch import sbatch as sbatch_lib
    from estimator_dist.launch import tfjob as tfjob_lib

    if args.workers is None:
        args.workers = DEFAULT_WORKERS
    if args.output:
        files.check_output_file("--output", args.output, "job.sbatch")
    sbatch_lib.check_job_flags(args.job_name, args.time or "", args.signal_before,
                               args.max_restarts, args.partition or "")
    train_args, _ = checked_train_args(
        args, tfjob_lib.default_strategy(args.workers, args.ps, args.evaluator))
    text = sbatch_lib.script(train_args, args.workers, args.ps, args.evaluator, args.job_name,
                             args.time or "", args.signal_before, args.max_restarts,
                             args.partition or "", args.python or sys.executable)
    if args.output:
        files.write_text(args.output, text)
        print(f"wrote the batch script of job '{args.job_name}' to {args.output}; submit it "
              f"with: sbatch {args.output}")
    else:
        sys.stdout.write(text)


def report(args):
    from estimator_dist.serving import report as report_lib
    from estimator_dist.serving import report_compare

    if len(args.model_dir) > 1:  # runs side by side
        csv_path, png_path, text = report_compare.write(args.model_dir, args.output_dir)
    else:
        csv_path, png_path, text = report_lib.write(args.model_dir[0], args.output_dir)
    print(text)
    print(f"wrote {csv_path} and {png_path}")


def bench(args):
    from estimator_dist.bench import main as bench_lib
    from estimator_dist.bench import plan as bench_plan

    return bench_lib.run(bench_plan.options_from_args(args))


def tfrecords(args):
    from estimator_dist.records import image_folder

    written = image_folder.write_records(args.images, args.output, args.shards,
                                         args.validation_shards, args.validation_fraction)
    counts = written.counts
    print(f"wrote {counts['train']} training and {counts['validation']} validation images of "
          f"{len(written.classes)} classes (labels 1-{len(written.classes)}) to {args.output}: "
          f"{len(written.shards['train'])} train-* and {len(written.shards['validation'])} "
          f"validation-* shards, {os.path.basename(written.labels_file)}")


COMMANDS = {"bench": bench, "tfrecords": tfrecords, "report": report, "train": train, "evaluate": evaluate, "export": export, "predict": predict,
            "list": list_registered, "cluster": cluster, "tfjob": tfjob, "sbatch": sbatch}


# Commands whose --import is imported here, before they run: evaluate and export also
# import what the model_dir's config.yaml names; predict and report may need custom ops.
IMPORT_FIRST = ("evaluate", "export", "predict", "report")


# Commands that write files and have no SIGTERM handling of their own (train has its
# guards; cluster and bench stop their processes): SIGTERM raises Preempted in the main
# thread, so the removal of a half-written export or output file runs instead of a
# sudden death that leaves it behind.
STOPPED_BY_SIGTERM = ("evaluate", "export", "predict", "report", "tfjob", "tfrecords", "sbatch")


# Each command's path flags (dest, flag): ~ and $VARS expanded and said, URLs refused
# (paths.py). train's come from its config (training/flags.py), cluster's and tfjob's train
# flags are handled in train_flags.
PATH_FLAGS = {
    "evaluate": (("model_dir", "--model_dir"), ("checkpoint", "--checkpoint")),
    "export": (("model_dir", "--model_dir"), ("checkpoint", "--checkpoint"),
               ("export_dir", "--export_dir")),
    "predict": (("saved_model", "--saved_model"), ("input_path", "--input"),
                ("output", "--output")),
    "report": (("model_dir", "--model_dir"), ("output_dir", "--output_dir")),  # model_dir: a list
    "tfrecords": (("images", "--images"), ("output", "--output")),
    "bench": (("output_dir", "--output_dir"),),
    "cluster": (("discovery", "--discovery"),),
    "tfjob": (("output", "--output"),),
    "sbatch": (("output", "--output"),),
}


def run(name: str, args):
    storage.forbid_world_writable()
    paths.expand_args(args, PATH_FLAGS.get(name, ()))
    if name in IMPORT_FIRST:
        user_code.import_user_modules(getattr(args, "imports", ()))
    if name not in STOPPED_BY_SIGTERM:
        return COMMANDS[name](args)
    with signals.raise_on_sigterm(lambda: stop_messages.command_stopped(name)):
        return COMMANDS[name](args)
