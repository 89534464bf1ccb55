"""`cluster`: a local cluster of training processes, from the train flags to the supervisor.

TF_CONFIG tasks (chief, workers, ps, evaluator) by default; `--strategy horovod` runs
Horovod ranks (launch/horovod.py). Both run on one Supervisor (supervisor.py). What a
strategy needs (its processes, what a death restarts) comes from its StrategySpec.
Imports no TensorFlow.
"""
import sys
from typing import Dict, List, Optional

from estimator_dist.distribute import specs
from estimator_dist.errors import UserError
from estimator_dist.launch import task_gpus
from estimator_dist.launch.layout import MAX_LOCAL_TASKS, make_tf_configs, task_names
from estimator_dist.launch.supervisor import (Supervisor, Task, free_ports,
                                              install_signal_handlers, release_tasks_ports)

# --launcher: TF_CONFIG tasks, or Horovod ranks (specs.HOROVOD)
TF_CONFIG_LAUNCHER = "tf_config"


def cluster_strategy(strategy: Optional[str], ps: int) -> str:
    """The strategy the tasks run: given, or parameter_server with ps tasks, else MWMS."""
    if strategy:
        return strategy
    return specs.CLUSTER_DEFAULT[bool(ps)]


def check_shape(workers: int, ps: int, strategy: str):
    if workers < 1:
        raise UserError(f"--workers {workers}: must be >= 1 (it counts the chief)")
    if ps < 0:
        raise UserError(f"--ps {ps}: must be >= 0")
    if specs.is_horovod(strategy):
        if ps:
            raise UserError(f"--ps {ps}: Horovod has no parameter servers (every rank all-reduces "
                            f"its gradients); drop --ps")
        return
    from estimator_dist.distribute import tf_config as cluster

    names = task_names(workers, ps, False)
    # The chief's TF_CONFIG only: every task's grows with the square of the task count
    # (--workers 100000 ran for minutes here). Stand-in ports, valid whatever the count.
    ports = [1 + i % 65535 for i in range(len(names))]
    spec = cluster.parse(make_tf_configs(names, ports, only="chief:0")["chief:0"])
    cluster.check_strategy(spec, strategy, flags=True)


def build_tasks(train_args: List[str], workers: int, ps: int, evaluator: bool,
                python: str = sys.executable, gpus: Optional[List[str]] = None,
                evaluator_gpus: int = 0, chief_env: Optional[Dict[str, str]] = None) -> List[Task]:
    """The tasks, each with its TF_CONFIG, port (held until released: ports.py) and GPUs
    (task_gpus.py; `gpus`: the ids to hand out, default the machine's); the chief also gets
    chief_env."""
    names = task_names(workers, ps, evaluator)
    shares = task_gpus.assign(names, task_gpus.visible_gpus() if gpus is None else gpus,
                              _int_flag_in(train_args, "--num_devices"), evaluator_gpus)
    ports = free_ports(len(names))
    configs = make_tf_configs(names, ports)
    argv = [python, "-m", "estimator_dist", "train"] + list(train_args)
    tasks = [Task(name, argv, configs[name], port,
                  env={"CUDA_VISIBLE_DEVICES": shares[name]} if shares else {})
             for name, port in zip(names, ports)]
    for task in tasks:
        if task.traits.chief:
            task.env.update(chief_env or {})
    return tasks


def _int_flag_in(train_args: List[str], flag: str) -> int:
    """An integer train flag's value (the last given), 0 when absent or not a number (the
    train command refuses that itself)."""
    found = "0"
    for i, arg in enumerate(train_args):
        if arg == flag and i + 1 < len(train_args):
            found = train_args[i + 1]
        elif arg.startswith(flag + "="):
            found = arg.split("=", 1)[1]
    try:
        return int(found)
    except ValueError:
        return 0


def launch(train_args: List[str], workers: int, ps: int, evaluator: bool, max_restarts: int,
           startup_timeout: float, emit=print, evaluator_gpus: int = 0) -> int:
    """Run the cluster to completion; returns the chief's exit code (or 3 / 130).

    `--strategy horovod` in train_args runs Horovod ranks instead (horovod_launch.py).
    """
    strategy = _strategy_in(train_args)
    check_shape(workers, ps, strategy)
    check_launchable(strategy, ps)
    check_restarts(max_restarts, startup_timeout)
    tasks = workers + ps + int(evaluator)
    if tasks > MAX_LOCAL_TASKS:
        raise UserError(f"--workers {workers} --ps {ps}: {tasks} tasks, each a TensorFlow process "
                        f"on this machine; at most {MAX_LOCAL_TASKS} (use a TFJob for more)")
    if specs.is_horovod(strategy):
        from estimator_dist.launch import horovod as horovod_launch

        if evaluator_gpus:
            raise UserError(f"--evaluator_gpus {evaluator_gpus}: Horovod has no evaluator task "
                            f"(rank 0 evaluates on its own GPU); drop it")

        return horovod_launch.launch(train_args, workers, evaluator, max_restarts,
                                     startup_timeout, emit)

    def fresh():
        return build_tasks(train_args, workers, ps, evaluator, evaluator_gpus=evaluator_gpus)

    release_tasks_ports(fresh())  # refuses a GPU split that cannot work before any task starts

    supervisor = Supervisor(fresh(), whole_restart=specs.restarts_whole_cluster(strategy),
                            max_restarts=max_restarts, startup_timeout=startup_timeout,
                            emit=emit, relaunch=fresh)
    install_signal_handlers()
    return supervisor.run()


def check_launchable(strategy: str, ps: int):
    """A one-machine strategy alone in its cluster runs as one process, with no server: the
    launcher would wait for its port (`--workers 1 --strategy mirrored` ended in exit 3)."""
    if specs.spans_tf_config(strategy) or specs.is_horovod(strategy) or \
            (strategy == "none" and ps):
        return
    raise UserError(f"--strategy {strategy} runs in one process, and `cluster` starts TF_CONFIG "
                    f"tasks; run 'estimator-dist train --strategy {strategy}', or use "
                    f"{', '.join(specs.tf_config_strategies())} (or none with --ps for async "
                    f"between-graph training)")


def check_restarts(max_restarts: int, startup_timeout: float):
    if max_restarts < 0:
        raise UserError(f"--max_restarts {max_restarts}: must be >= 0")
    if not 0 < startup_timeout < float("inf"):  # NaN fails too
        raise UserError(f"--startup_timeout {startup_timeout}: must be a number of seconds > 0")


def workers_limit(ps: int, evaluator: bool) -> int:
    """The most workers a local cluster runs beside its other tasks."""
    return MAX_LOCAL_TASKS - ps - int(evaluator)


def launch_elastic(train_args: List[str], sizes: List[int], discovery: str, model_dir: str,
                   ps: int, evaluator: bool, max_restarts: int, startup_timeout: float,
                   wait_timeout: float, emit=print, evaluator_gpus: int = 0) -> int:
    """Run an elastic cluster (elastic.py) of `sizes` workers (those that keep the global
    batch, checked by the caller) to completion; returns as launch() does."""
    from estimator_dist.launch import elastic

    strategy = _strategy_in(train_args)
    if not specs.spans_tf_config(strategy) or specs.is_horovod(strategy):
        raise UserError(f"--discovery with --strategy {strategy}: an elastic cluster runs "
                        f"TF_CONFIG workers ({', '.join(specs.tf_config_strategies())}); drop "
                        f"--discovery")
    check_restarts(max_restarts, startup_timeout)
    check_shape(sizes[0], ps, strategy)

    def make_supervisor(size, chief_env, watch):
        def fresh():
            return build_tasks(train_args, size, ps, evaluator, evaluator_gpus=evaluator_gpus,
                               chief_env=chief_env)

        return Supervisor(fresh(), whole_restart=specs.restarts_whole_cluster(strategy),
                          max_restarts=max_restarts, startup_timeout=startup_timeout,
                          emit=emit, relaunch=fresh, watch=watch, drop_exhausted=True)

    release_tasks_ports(build_tasks(train_args, sizes[-1], ps, evaluator,
                                    evaluator_gpus=evaluator_gpus))
    return elastic.Elastic(discovery, sizes, model_dir, wait_timeout, make_supervisor,
                           emit).run()


def train_args_for(command: str, launcher: Optional[str], train_args: List[str]) -> List[str]:
    """The train flags of `cluster`/`tfjob`: --launcher horovod means --strategy horovod.

    The launcher follows the strategy: `--strategy horovod` alone runs Horovod
    ranks too; a launcher that contradicts the strategy is an error. A `--` before
    them (`cluster --workers 2 -- --model digits`) only separates them.
    """
    train_args = list(train_args)
    if "--" in train_args:
        train_args.remove("--")
    strategy = _strategy_in(train_args, required=False)
    if command == "tfjob" and specs.is_horovod(strategy):
        raise UserError("tfjob --strategy horovod: a TFJob runs TF_CONFIG tasks; run Horovod "
                        "ranks with 'estimator-dist cluster --launcher horovod' (on Kubernetes, "
                        "Kubeflow's MPIJob runs horovodrun)")
    if launcher == specs.HOROVOD and strategy is not None and not specs.is_horovod(strategy):
        raise UserError(f"--launcher horovod runs --strategy horovod, got --strategy {strategy}; "
                        f"drop --strategy or use --launcher tf_config")
    if launcher == TF_CONFIG_LAUNCHER and specs.is_horovod(strategy):
        raise UserError("--launcher tf_config --strategy horovod: Horovod ranks are started by "
                        "--launcher horovod; drop --launcher tf_config")
    if launcher == specs.HOROVOD and strategy is None:
        return train_args + ["--strategy", specs.HOROVOD]
    return train_args


def _strategy_in(train_args: List[str], required: bool = True) -> Optional[str]:
    """The train flags' --strategy; the last one given, as the train command reads it."""
    found = None
    for i, arg in enumerate(train_args):
        if arg == "--strategy" and i + 1 < len(train_args):
            found = train_args[i + 1]
        elif arg.startswith("--strategy="):
            found = arg.split("=", 1)[1]
    if found is not None or not required:
        return found
    raise UserError("the cluster launcher needs --strategy in the train flags")
