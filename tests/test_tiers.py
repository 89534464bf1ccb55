"""The test tiers (`make test-fast` leaves out `process` and `slow`): the rule in conftest.py marks
tests that start processes, and only those."""
import importlib
import subprocess
import sys

import pytest

import conftest
from conftest import spawns_processes


def function(module, name):
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize("module, name", [
    ("test_cli", "test_console_script_exit_code_and_no_traceback"),  # conftest.run_cli
    ("test_cluster", "test_early_stop_in_a_cluster_stops_every_task_and_exports"),  # support.Run
    ("test_workflow", "test_progress_bar_on_a_terminal"),  # conftest.run_on_a_terminal: a pty
    ("test_horovod", "test_sigterm_to_any_rank_stops_every_rank_at_one_step_and_rank_0_saves_it"),  # launch() -> support.Run
    ("test_sync_replicas", "test_it_trains_in_one_local_process_quietly"),  # support.Run
])
def test_a_test_that_starts_a_process_is_a_process_test(module, name):
    assert spawns_processes(function(module, name))


@pytest.mark.parametrize("module, name", [
    ("test_config", "test_precedence_defaults_model_file_flags"),
    ("test_cli", "test_list"),  # cli.main in this process
    ("test_horovod", "test_launcher_shapes_and_flags"),  # horovod_launch.launch is not launch()
    ("test_guards_process", "test_sigterm_outside_a_training_step_stops_at_once"),  # os.kill self
])
def test_a_unit_test_is_not(module, name):
    assert not spawns_processes(function(module, name))


def test_names_count_not_words_in_a_docstring():
    def says_subprocess():
        """Unlike a subprocess run (sys.executable, Popen), this one stays here."""

    assert not spawns_processes(says_subprocess)


@pytest.fixture
def child_exit_code():
    return subprocess.run([sys.executable, "-c", "pass"], timeout=60).returncode


def test_a_fixture_that_starts_a_process_marks_its_test(child_exit_code, request):
    assert child_exit_code == 0
    assert request.node.get_closest_marker("process")


def test_this_test_is_in_the_fast_tier(request):
    assert not request.node.get_closest_marker("process")
    assert not request.node.get_closest_marker("slow")


def test_the_explicit_lists_name_tests_that_exist():
    for entry in sorted(conftest.PROCESS | conftest.SLOW):
        filename, name = entry.split("::")
        assert callable(function(filename[:-len(".py")], name)), entry
