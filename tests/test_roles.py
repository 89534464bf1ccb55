"""The Role table: what each kind of process does, as the run, the guard and the launcher
ask it (one place; tests of the runs themselves are in test_cluster, test_signals,
test_horovod). And the StrategySpec table against the strategies the CLI offers."""
import json

import pytest

from estimator_dist.distribute import specs, strategies
from estimator_dist.distribute import tf_config
from estimator_dist.distribute.horovod import Ranks
from estimator_dist.distribute import role as role_lib
from estimator_dist.distribute.role import Role
from estimator_dist.launch import layout


def cluster(task, workers=2, ps=0, evaluator=False):
    spec = {"chief": ["h:1"], "worker": [f"h:{2 + i}" for i in range(workers - 1)],
            "ps": [f"h:{10 + i}" for i in range(ps)]}
    if evaluator:
        spec["evaluator"] = ["h:20"]
    kind, index = task.split(":")
    return tf_config.parse(json.dumps({"cluster": {k: v for k, v in spec.items() if v},
                                       "task": {"type": kind, "index": int(index)}}))


def ranks(rank, size):
    return Ranks(rank=rank, size=size, local_rank=rank, local_size=size, launched=True)


ROLES = {
    "local": Role.of("none"),
    "mwms chief": Role.of("multi_worker_mirrored", cluster("chief:0", evaluator=True)),
    "mwms worker": Role.of("multi_worker_mirrored", cluster("worker:0", evaluator=True)),
    "ps chief, no evaluator": Role.of("parameter_server", cluster("chief:0", ps=1)),
    "ps worker": Role.of("parameter_server", cluster("worker:0", ps=1)),
    "ps task": Role.of("parameter_server", cluster("ps:0", ps=1)),
    "evaluator": Role.of("multi_worker_mirrored", cluster("evaluator:0", evaluator=True)),
    "horovod rank 0": Role.of("horovod", ranks=ranks(0, 2)),
    "horovod rank 1": Role.of("horovod", ranks=ranks(1, 2)),
    "horovod alone": Role.of("horovod", ranks=ranks(0, 1)),
}

# role: (kind, procedure, writes_run_files, exports_final_itself, votes_on_sigterm,
#        trains_in_a_group)
T, F = True, False
EXPECTED = {
    "local": ("local", "run_local", T, F, F, F),
    "mwms chief": ("chief", "run_chief", T, F, T, T),
    "mwms worker": ("worker", "run_worker", F, F, T, T),
    "ps chief, no evaluator": ("chief", "run_chief", T, T, F, T),
    "ps worker": ("worker", "run_worker", F, F, F, T),
    "ps task": ("ps", "run_ps", F, F, F, F),
    "evaluator": ("evaluator", "run_evaluator", F, F, F, F),
    "horovod rank 0": ("chief", "run_horovod_rank", T, F, F, T),
    "horovod rank 1": ("worker", "run_horovod_rank", F, F, F, T),
    "horovod alone": ("local", "run_horovod_rank", T, F, F, F),
}


def procedure_of(role: Role) -> str:
    """The procedure training/roles.py runs for `role`."""
    from estimator_dist.training import roles as procedures

    return procedures.procedure(role).__name__


@pytest.mark.parametrize("name", sorted(ROLES))
def test_role_answers(name):
    r = ROLES[name]
    assert (r.kind, procedure_of(r), r.writes_run_files, r.exports_final_itself,
            r.votes_on_sigterm, r.trains_in_a_group) == EXPECTED[name]


def test_who_trains_in_a_scratch_dir_and_where_it_is():
    assert [n for n, r in ROLES.items() if r.horovod_follower] == ["horovod rank 1"]
    assert ROLES["mwms worker"].where("1 CPU(s)") == "worker:0 of 2 worker(s), 0 ps, 1 CPU(s) each"
    assert ROLES["horovod rank 1"].where("1 CPU(s)") == "rank 1 of 2, 1 CPU(s) each"
    assert ROLES["ps task"].what == "ps task" and ROLES["ps worker"].what == "worker"
    assert ROLES["mwms worker"].task == "worker:0" and ROLES["mwms worker"].address == "h:2"


def test_launcher_task_kinds():
    """The launcher's questions: which tasks train (GPUs), listen, serve until stopped."""
    kinds = {name: role_lib.TASK_TRAITS[layout.kind_of(name)]
             for name in ("chief:0", "worker:1", "ps:0", "evaluator:0")}
    assert [n for n, k in kinds.items() if k.trains] == ["chief:0", "worker:1"]
    assert [n for n, k in kinds.items() if not k.listens] == ["evaluator:0"]
    assert [n for n, k in kinds.items() if k.serves_forever] == ["ps:0"]
    assert [n for n, k in kinds.items() if k.ends_before_chief] == ["worker:1", "evaluator:0"]
    assert role_lib.kind_of_rank(0) == "chief" and role_lib.kind_of_rank(3) == "worker"


def test_every_strategy_has_a_spec_and_a_builder():
    assert specs.names() == sorted(strategies._BUILDERS)  # pylint: disable=protected-access
    assert specs.tf_config_strategies() == ("multi_worker_mirrored", "parameter_server")
    assert [n for n in specs.names() if specs.spec(n).input_gets_global_batch] == ["tower"]
    assert [n for n in specs.names() if specs.restarts_whole_cluster(n)] == \
        ["multi_worker_mirrored"]
    assert specs.is_horovod("horovod") and not specs.is_horovod(None) and \
        not specs.is_horovod("mirored")


def test_the_shadow_dirs_each_task_removes():
    """TensorFlow makes a multi_worker_mirrored worker save its own copy into
    model_dir/tmp_worker_N, which stayed (18 MB after a restart) and showed as a run."""
    names = ["model.ckpt-0.index", "tmp_worker_0", "tmp_worker_1", "tmp_worker_2", "eval"]
    assert ROLES["mwms worker"].shadow_dir == "tmp_worker_0"
    assert ROLES["mwms worker"].shadow_dirs_to_remove(names) == ["tmp_worker_0"]
    assert ROLES["mwms chief"].shadow_dirs_to_remove(names) == ["tmp_worker_1", "tmp_worker_2"]
    for name in ("local", "ps worker", "ps chief, no evaluator", "evaluator", "horovod rank 1"):
        assert ROLES[name].shadow_dir is None and ROLES[name].shadow_dirs_to_remove(names) == []
