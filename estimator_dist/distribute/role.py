"""What a process is: one Role per process, built once from the plan.

Its kind, strategy, TF_CONFIG cluster or Horovod ranks, and the facts that follow (does
it own model_dir, is it in a group whose steps wait for peers, which shadow dirs are its);
what each kind does, start to exit code, SIGTERM and SIGINT included, is its procedure in
training/roles.py (tensorflow/estimator's training.py: `'run_' + task_type`). No other
module reads task types or Horovod ranks. The kinds:

  local      one process: trains, evaluates, exports, owns model_dir (also the one task of
             a TF_CONFIG cluster running a one-machine strategy: Vertex AI's one replica)
  chief      a TF_CONFIG cluster's chief, or Horovod's rank 0 (it owns model_dir)
  worker     a cluster's other training task, or a Horovod rank > 0 (a scratch dir)
  ps         a parameter server (Estimator runs its server until the run ends)
  evaluator  a cluster's evaluator: evaluates each new checkpoint, exports

A kind is one of these names: Role.kind, and the launcher's Task.kind (TF_CONFIG's task
type; a Horovod rank's from kind_of_rank). Imports no TensorFlow: what the launcher needs to
know about each kind comes from here too (TASK_TRAITS).
"""
import re
from dataclasses import dataclass
from typing import Any, List, Optional

from estimator_dist.distribute.specs import StrategySpec, spec
from estimator_dist.distribute.tf_config import ClusterSpec

LOCAL, CHIEF, WORKER, PS, EVALUATOR = "local", "chief", "worker", "ps", "evaluator"


@dataclass(frozen=True)
class TaskTraits:
    """What the local launcher (and the GPU split) needs to know about a kind of task."""

    chief: bool = False  # its exit ends the run; its restart rebuilds the cluster
    trains: bool = False  # takes training steps (and gets the training GPUs)
    listens: bool = True  # has a port in TF_CONFIG's cluster (the evaluator has none)
    serves_forever: bool = False  # a ps: never exits by itself; stopped after the others
    evaluates: bool = False  # the chief's end waits for its final evaluation and export


TASK_TRAITS = {
    CHIEF: TaskTraits(chief=True, trains=True),
    WORKER: TaskTraits(trains=True),
    PS: TaskTraits(serves_forever=True),
    EVALUATOR: TaskTraits(listens=False, evaluates=True),
}


def kind_of_rank(rank: int) -> str:
    """The kind of the launcher's task for Horovod rank `rank`: rank 0 is the chief."""
    return CHIEF if rank == 0 else WORKER


@dataclass(frozen=True)
class Role:
    """This process's part in the run."""

    kind: str
    strategy: StrategySpec
    cluster: Optional[ClusterSpec] = None  # a TF_CONFIG cluster task
    ranks: Optional[Any] = None  # Horovod: horovod.Ranks

    @classmethod
    def of(cls, strategy: str, cluster: Optional[ClusterSpec] = None, ranks=None) -> "Role":
        """The role of a process running `strategy` with this TF_CONFIG or these ranks."""
        if cluster and cluster.is_chief and cluster.trains_alone and \
                not spec(strategy).needs_tf_config and not cluster.has_evaluator:
            return cls.local(strategy)  # a one-machine job's TF_CONFIG: nothing else runs
        if cluster:
            kind = cluster.task_type
        elif ranks is not None and ranks.size > 1:
            kind = CHIEF if ranks.is_root else WORKER
        else:
            kind = LOCAL
        return cls(kind, spec(strategy), cluster, ranks)

    @classmethod
    def local(cls, strategy: str = "none") -> "Role":
        return cls(LOCAL, spec(strategy))

    # -- what it is --------------------------------------------------------------------
    @property
    def in_cluster(self) -> bool:
        """A task of a TF_CONFIG cluster."""
        return self.cluster is not None

    @property
    def horovod(self) -> bool:
        return self.ranks is not None

    @property
    def trains_alone(self) -> bool:
        """A cluster's only training task on a one-machine strategy, beside an evaluator
        task: TensorFlow sees no cluster (its one-machine strategies took TF_CONFIG for a
        multi-worker cluster and failed); it trains, the evaluator evaluates and exports."""
        return (self.kind == CHIEF and self.in_cluster and self.cluster.trains_alone
                and not self.strategy.needs_tf_config)

    @property
    def tensorflow_cluster(self) -> Optional[ClusterSpec]:
        """The TF_CONFIG cluster TensorFlow is handed; None: it runs this process alone."""
        return None if self.trains_alone else self.cluster

    @property
    def horovod_follower(self) -> bool:
        """A Horovod rank > 0: trains in a scratch dir, gets every variable from rank 0."""
        return self.horovod and not self.ranks.is_root

    @property
    def trains_in_a_group(self) -> bool:
        """A chief or worker: its steps wait for peers (a deadline bounds its SIGTERM)."""
        return self.kind in (CHIEF, WORKER) and not self.trains_alone

    @property
    def index(self) -> int:
        if self.cluster:
            return self.cluster.task_index
        return self.ranks.rank if self.ranks is not None else 0

    @property
    def num_workers(self) -> int:
        """Training processes: the cluster's workers, or the Horovod ranks."""
        if self.cluster:
            return self.cluster.num_workers
        return self.ranks.size if self.ranks is not None else 1

    # -- what it writes and says -------------------------------------------------------
    @property
    def writes_run_files(self) -> bool:
        """config.yaml, the checkpoints, the model_dir lock: the run's owner."""
        return self.kind in (LOCAL, CHIEF)

    @property
    def exports_final_itself(self) -> bool:
        """A cluster's chief with no evaluator task exports the final checkpoint once, when
        training ends (no evaluator runs the exporters; Estimator's `master` ran its final
        exporter at two steps of an asynchronous run)."""
        return self.kind == CHIEF and self.in_cluster and not self.cluster.has_evaluator

    @property
    def exports_after_early_stop(self) -> bool:
        """Outside a cluster (local, Horovod rank 0) an early stop's export is its own; a
        cluster's evaluator exports on the chief's end marker."""
        return not self.in_cluster

    # -- what it builds and runs -------------------------------------------------------
    @property
    def computes(self) -> bool:
        """Runs model ops. A ps only holds variables: with a GPU visible, TF placed them on
        its GPU:0 (a copy over PCIe for every read); it keeps no GPU."""
        return self.kind != PS

    @property
    def checks_memory(self) -> bool:
        """Refuses variables that cannot fit here: in a cluster they may live on ps tasks."""
        return self.kind == LOCAL

    @property
    def warm_starts(self) -> bool:
        """A Horovod rank > 0 gets every variable from rank 0: no warm start of its own."""
        return not self.horovod_follower

    @property
    def runs_early_stop_hook(self) -> bool:
        return self.kind != EVALUATOR

    @property
    def decides_early_stop(self) -> bool:
        """Under Horovod rank 0 alone evaluates: its decision is voted to every rank."""
        return not self.horovod or self.ranks.is_root

    # -- how it stops --------------------------------------------------------------------
    @property
    def votes_on_sigterm(self) -> bool:
        """Every worker takes part in a save (multi_worker_mirrored): they vote to stop at
        one step, save together and exit 143 (preemption_vote.py)."""
        return self.strategy.every_worker_saves and self.trains_in_a_group

    @property
    def compares_first_batches(self) -> bool:
        """Its workers all-reduce every step (multi_worker_mirrored): an input that does not
        shard feeds them the same batches; they compare their first batches and labels
        (guards/identical_batches.py)."""
        return self.strategy.every_worker_saves and self.trains_in_a_group and \
            self.num_workers > 1

    @property
    def names_checkpoint_on_vote(self) -> bool:
        return self.kind == CHIEF

    @property
    def writes_checkpoints(self) -> bool:
        return self.kind in (LOCAL, CHIEF)

    @property
    def shadow_dir(self) -> Optional[str]:
        """Where TensorFlow makes this task save its own copy of every checkpoint and summary,
        under model_dir: a multi_worker_mirrored worker other than the chief runs the
        collective save ops too (MonitoredTrainingSession's 'tmp_worker_N'); None elsewhere."""
        if self.kind == WORKER and self.cluster and self.strategy.every_worker_saves:
            return f"tmp_{self.cluster.task_type}_{self.cluster.task_index}"
        return None

    def shadow_dirs_to_remove(self, names: List[str]) -> List[str]:
        """Of model_dir's entries `names`, the shadow dirs this task removes (at its start and
        its end): a worker its own; the chief those of workers its cluster no longer has (a
        larger cluster's). They are no run of their own, and TensorBoard showed them as one."""
        if self.shadow_dir:
            return [self.shadow_dir] if self.shadow_dir in names else []
        if self.kind != CHIEF or not self.cluster or not self.strategy.every_worker_saves:
            return []
        ours = {f"tmp_worker_{i}" for i in range(self.cluster.num_workers - 1)}
        return [n for n in names if re.fullmatch(r"tmp_worker_\d+", n) and n not in ours]

    @property
    def writes_exports(self) -> bool:
        return self.kind in (LOCAL, EVALUATOR)

    @property
    def what(self) -> str:
        """How its one-line stop message names it."""
        return {PS: "ps task", EVALUATOR: "evaluator"}.get(self.kind, "worker")

    # -- how it describes itself -------------------------------------------------------
    def where(self, devices: str) -> str:
        """'chief:0 of 2 worker(s), 1 ps, 1 CPU(s) each', for the run's first line."""
        if self.horovod:
            alone = "" if self.ranks.launched else " (not started by a Horovod launcher: one process)"
            return f"rank {self.ranks.rank} of {self.ranks.size}{alone}, {devices} each"
        if self.cluster:
            return (f"{self.kind}:{self.cluster.task_index} of {self.cluster.num_workers} "
                    f"worker(s), {self.cluster.num_ps} ps, {devices} each")
        return devices

    @property
    def task(self) -> str:
        """'worker:1' for a cluster task (TF_CONFIG's name), else the kind."""
        return f"{self.kind}:{self.cluster.task_index}" if self.cluster else self.kind

    @property
    def address(self) -> Optional[str]:
        """Its own address in TF_CONFIG's cluster."""
        if not self.cluster:
            return None
        return self.cluster.cluster[self.cluster.task_type][self.cluster.task_index]
