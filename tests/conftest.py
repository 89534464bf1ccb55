"""Shared test setup: quiet TensorFlow, register built-ins, small training helpers, test tiers."""
import ast
import functools
import inspect
import os
import sys
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest  # noqa: E402

from estimator_dist import quiet  # noqa: E402

quiet.configure(verbose=False)

from estimator_dist.training import config as config_lib  # noqa: E402
from estimator_dist.training import user_code
from estimator_dist.training import run as runner  # noqa: E402
from estimator_dist.training.registry import MODELS  # noqa: E402

user_code.load_builtins()

# Long-standing names of this module, now in support.py (import them from there in new tests).
from support import REPO, run_cli, run_on_a_terminal, supervise  # noqa: E402,F401
import support  # noqa: E402
import warm  # noqa: E402
# CPU seconds per test when ESTIMATOR_DIST_TEST_CPU=FILE (cpu_report.py).
from cpu_report import pytest_runtest_protocol, pytest_terminal_summary  # noqa: E402,F401


def make_config(model="digits", overrides=(), **flags):
    """A Config as the CLI would build it from flags (None = not given)."""
    entry = MODELS.get(model)
    return config_lib.build_config(model, {}, flags, entry.run_defaults, entry.hparams,
                                   tuple(overrides))


def quick_train(model_dir, steps=40, strategy="none", num_devices=1, **flags):
    """Train digits briefly and quietly; returns the run summary."""
    flags = {"train_steps": steps, "strategy": strategy, "num_devices": num_devices,
             "model_dir": str(model_dir), "batch_size": 32, "export": "final", "seed": 1,
             "save_checkpoints_steps": steps, **flags}
    return runner.train(make_config(**flags), out=lambda *_: None)


@pytest.fixture(autouse=True)
def _stop_left_running():
    """No test leaves a `Run` running, not even one that failed or timed out."""
    yield
    support.stop_left_running()


@pytest.fixture
def warm_tasks(monkeypatch):
    """A launcher.Supervisor the test runs in its own process starts its tasks warm, as a
    warm `cluster` does (tests/warm.py; SIGTERM to them when this worker ends)."""
    from estimator_dist.launch import supervisor

    monkeypatch.setattr(supervisor, "subprocess", warm.WarmSubprocess())


@pytest.fixture(scope="session")
def trained_digits(tmp_path_factory):
    """One short single-device digits run shared by export/predict tests."""
    model_dir = tmp_path_factory.mktemp("digits_none")
    summary = quick_train(model_dir, steps=60)
    return model_dir, summary


# --- Tiers ----------------------------------------------------------------------------------------
# `make test` runs every test; `make test-fast` runs `-m "not process and not slow"`: the unit tier.
# The rule, applied at collection: a test is marked `process` when its code names a way to start a
# process (SPAWNS: subprocess, Popen, sys.executable, pty, launcher.Supervisor, ...), looking at the
# names used by the test function, by the fixtures it requests and, followed transitively, by the
# functions and classes defined under tests/ that these name (run_cli, test_cluster.Run, a module
# helper). Names, not text: a docstring that says "subprocess" does not count. PROCESS lists by
# "file::name" tests the rule misses (none today). SLOW lists the in-process tests that train: those
# whose cases took 1 s or more each in `pytest -m "not process" --durations=0` on the 2-core dev
# machine under load (other test runs), so the fast tier stays under 2 minutes there. Re-measure and
# add a test here when `make test-fast` grows past that.
SPAWNS = frozenset({"subprocess", "Popen", "executable", "pty", "fork", "multiprocessing",
                    "Supervisor", "run_group"})
PROCESS = frozenset()
SLOW = frozenset({
    "test_accumulate.py::test_batch_norm_statistics_move_on_every_micro_batch",
    "test_accumulate.py::test_mirrored_accumulation_keeps_mirrored_checkpoint_names",
    "test_accumulate.py::test_one_update_over_uneven_micro_batches_equals_one_big_batch",
    "test_accumulate.py::test_progress_prints_once_per_update",
    "test_accumulate.py::test_updates_equal_steps_on_a_k_times_larger_batch",
    "test_cifar.py::test_conv_layers_grow_with_depth",
    "test_cifar.py::test_small_synthetic_training_run_learns",
    "test_cifar.py::test_training_from_the_binary_files_is_quiet_by_default",
    "test_cifar.py::test_unaugmented_training_batches_are_the_standardized_training_images",
    "test_cli.py::test_an_input_that_runs_out_before_train_steps_is_said",
    "test_cli.py::test_evaluate_that_fails_when_it_runs_is_one_line",
    "test_collections.py::test_batch_norm_update_ops_are_each_replicas_own",
    "test_collections.py::test_control_the_unisolated_graph_trains_wrong",
    "test_collections.py::test_single_device_loss_code_trains_as_on_one_device",
    "test_compression.py::test_an_overflowing_float16_sum_is_named_with_its_fix",
    "test_compression.py::test_mirrored_trains_like_float32_within_the_16_bit_precision",
    "test_digits.py::test_keras_batch_norm_statistics_really_update",
    "test_digits.py::test_make_train_default_reaches_97_percent",
    "test_end_to_end.py::test_checkpoint_interchange",
    "test_evaluator_export.py::test_a_checkpoint_after_max_steps_is_the_one_final_export",
    "test_evaluator_export.py::test_a_chief_gone_before_its_end_marker_still_gets_the_final_export",
    "test_evaluator_export.py::test_the_loops_evaluation_of_the_last_checkpoint_is_not_repeated",
    "test_end_to_end.py::test_export_matches_estimator_predict",
    "test_end_to_end.py::test_train_files_loss_resume",
    "test_guards_checkpoints.py::test_a_resume_with_another_strategy_leaves_no_stale_shards",
    "test_guards_checkpoints.py::test_a_run_resumes_with_or_without_early_stop",
    "test_guards_checkpoints.py::test_broken_state_file_resumes_from_newest_checkpoint",
    "test_guards_checkpoints.py::test_broken_state_file_skips_an_incomplete_newest_checkpoint",
    "test_guards_checkpoints.py::test_checkpoint_not_matching_the_model_is_refused_before_any_step",
    "test_guards_checkpoints.py::test_checkpoints_of_another_model_without_a_config_are_named_so",
    "test_guards_checkpoints.py::test_evaluate_and_export_restore_an_unchanged_model_dir",
    "test_guards_checkpoints.py::test_interrupted_save_leftovers_are_removed_on_resume",
    "test_guards_checkpoints.py::test_model_variables_are_what_every_strategy_saves",
    "test_guards_checkpoints.py::test_optimizer_slots_left_by_another_optimizer_are_no_mismatch",
    "test_guards_inputs.py::test_a_training_batch_of_all_the_data_is_accepted",
    "test_guards_inputs.py::test_export_into_a_non_empty_directory_is_refused",
    "test_guards_inputs.py::test_nothing_unpickled_and_environment_never_logged",
    "test_guards_inputs.py::test_predict_csv_with_text_in_a_numeric_feature",
    "test_guards_numerics.py::test_cli_exit_code_and_resume_from_the_last_good_checkpoint",
    "test_guards_numerics.py::test_non_finite_step_stops_before_a_poisoned_checkpoint",
    "test_horovod.py::test_one_rank_outside_a_launcher_equals_none",
    "test_horovod.py::test_rerunning_a_finished_run_evaluates",
    "test_imagenet.py::test_resnet50_trains_and_exports",
    "test_model_code.py::test_every_estimator_signature_trains_under_each_strategy",
    "test_model_code.py::test_weights_that_never_move_name_the_likely_cause",
    "test_precision.py::test_bfloat16_digits_trains_in_bfloat16_with_float32_variables",
    "test_precision.py::test_bfloat16_export_computes_in_bfloat16_and_predicts_float32",
    "test_precision.py::test_cifar_model_fn_refused_in_train_mode",
    "test_precision.py::test_float16_trains_on_this_cpu_with_a_dynamic_loss_scale",
    "test_precision.py::test_float32_and_bfloat16_build_no_loss_scale",
    "test_precision.py::test_mirrored_bfloat16_leaves_no_policy_behind",
    "test_precision.py::test_none_has_no_bfloat16_op",
    "test_report_compare.py::test_two_runs_side_by_side_in_one_table_and_one_plot",
    "test_run_leftovers.py::test_a_garbage_config_yaml_is_replaced_and_said",
    "test_saver_hook.py::test_graph_pbtxt_is_the_graph_of_the_checkpoints",
    "test_saver_hook.py::test_one_session_run_per_step_and_checkpoints_every_n",
    "test_serving.py::test_report_plots_a_positive_loss_on_a_log_scale",
    "test_sparse_gradients.py::test_a_gather_with_its_own_momentum_train_op_under_mirrored_equals_one_device",
    "test_tabular.py::test_breast_cancer_accuracy",
    "test_tabular.py::test_regression_trains_and_serves_raw_values",
    "test_tfrecord_input.py::test_resnet_on_own_records_trains_and_serves_the_spec",
    "test_towers.py::test_batch_norm_keeps_tower0_statistics",
    "test_towers.py::test_checkpoints_interchange_tower_mirrored_none",
    "test_towers.py::test_eval_and_predict_under_towers_match_single_device_in_input_order",
    "test_towers.py::test_optimizer_slots_keep_single_device_names_when_minimize_runs_in_a_variable_scope",
    "test_towers.py::test_per_tower_losses_in_tensorboard_and_reported_mean",
    "test_towers.py::test_tower_step_equals_single_device",
    "test_towers.py::test_unweighted_average_would_fail_the_exactness_test",
    "test_vocabulary.py::test_a_vocabulary_file_column_and_a_list_column_are_both_known",
    "test_workflow.py::test_best_export_by_accuracy_survives_a_restart",
    "test_workflow.py::test_early_stop_on_plateau_stops_before_target_and_evaluates_at_end",
    "test_workflow.py::test_eval_every_secs",
    "test_workflow.py::test_plain_progress_lines_when_not_a_terminal",
    "test_workflow.py::test_report_csv_last_step_equals_checkpoint_and_png",
    "test_workflow.py::test_report_names_an_unreadable_event_file_instead_of_train_first",
    "test_workflow.py::test_two_seeded_runs_match",
    "test_workflow.py::test_warm_start_changes_starting_loss_and_respects_regex",
})
TESTS = os.path.dirname(os.path.abspath(__file__))


def _defined_in_tests(obj) -> bool:
    try:
        path = inspect.getsourcefile(obj)
    except TypeError:  # a built-in
        return False
    return bool(path) and os.path.dirname(os.path.abspath(path)) == TESTS


@functools.lru_cache(maxsize=None)
def _uses(obj):
    """(names, attributes): the bare names and the `x.attr` pairs in obj's source."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(obj)))
    except (OSError, SyntaxError):  # no source, or a lambda's line that is not a statement
        return set(), set()
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    attributes = {(n.value.id, n.attr) for n in ast.walk(tree)
                  if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    return names, attributes


def spawns_processes(*objects) -> bool:
    """True when these functions or classes, or the tests/ functions and classes they name (and
    so on), use one of SPAWNS."""
    seen, todo = set(), list(objects)
    while todo:
        obj = inspect.unwrap(todo.pop())
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        names, attributes = _uses(obj)
        if (names | {attr for _, attr in attributes}) & SPAWNS:
            return True
        scope = vars(sys.modules[obj.__module__])
        found = [scope.get(name) for name in names]
        found += [getattr(scope.get(base), attr, None) for base, attr in attributes
                  if inspect.ismodule(scope.get(base)) and _defined_in_tests(scope.get(base))]
        todo.extend(f for f in found if (inspect.isfunction(f) or inspect.isclass(f))
                    and _defined_in_tests(f))
    return False


def _test_id(item) -> str:
    return f"{os.path.basename(str(item.path))}::{item.originalname}"


def is_process_test(item) -> bool:
    fixtures = [defs[-1].func for defs in item._fixtureinfo.name2fixturedefs.values()
                if _defined_in_tests(defs[-1].func)]
    return _test_id(item) in PROCESS or spawns_processes(item.function, *fixtures)


def shares_a_module_fixture(item) -> bool:
    return any(defs[-1].scope == "module" for defs in item._fixtureinfo.name2fixturedefs.values())


def pytest_itemcollected(item):
    """Before any pytest_collection_modifyitems: pytest-xdist's names a test by its group."""
    if shares_a_module_fixture(item):  # its file's tests on one worker: one fixture build
        item.add_marker(pytest.mark.xdist_group(os.path.basename(str(item.path))))


def pytest_collection_modifyitems(config, items):
    for item in items:
        if is_process_test(item):
            item.add_marker(pytest.mark.process)
        if _test_id(item) in SLOW:
            item.add_marker(pytest.mark.slow)
    longest_first(items)


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session):
    """A pytest-xdist worker under `--dist loadgroup` gives a grouped test the id `ID@group`,
    by which the tests of a group go to one worker. pytest 9.2 ignores that (a test's id is
    no longer the attribute xdist sets), and a group marked after xdist's hook ran is missed:
    the groups ran on both workers, two Slurm jobs at once (one waited minutes for the node's
    CPUs) and module fixtures built on each. Refuse such a run before any test (setup.py
    pins pytest < 9; the groups are marked in pytest_itemcollected)."""
    if not getattr(session.config.option, "loadgroup", False):
        return
    lost = [item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid]
    if lost:  # the worker's own error is an INTERNALERROR in the controller: say it first
        message = (f"the xdist_group of {lost[0]} (and {len(lost) - 1} more) is not in its id: "
                   f"`--dist loadgroup` would split the groups (pytest {pytest.__version__}: "
                   f"9.2 drops them, install pytest < 9 with make venv; a group marked after "
                   f"pytest_itemcollected comes too late)")
        sys.stderr.write(message + "\n")
        raise pytest.UsageError(message)


def longest_first(items):
    """Order the tests process tier first, then slow, then the unit tests (a group, above,
    goes as a unit where its longest tier does), each in file order. pytest-xdist hands the
    next test to the first worker that is free: the seconds-long process tests are all under
    way before the unit tests (minutes of sub-second tests) fill the end, so the workers end
    within a test of each other (a process test handed out last kept one worker busy alone)."""
    def unit(item):
        group = item.get_closest_marker("xdist_group")
        return group.args[0] if group else item.nodeid

    def tier(item):
        return 0 if item.get_closest_marker("process") else 1 if item.get_closest_marker("slow") else 2

    first, best = {}, {}
    for i, item in enumerate(items):
        first.setdefault(unit(item), i)
        best[unit(item)] = min(best.get(unit(item), 2), tier(item))
    order = {id(item): i for i, item in enumerate(items)}
    items.sort(key=lambda item: (best[unit(item)], first[unit(item)], order[id(item)]))
