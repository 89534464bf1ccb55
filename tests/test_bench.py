"""`estimator-dist bench`: scheduling and ratios (fast), and `bench --quick` end to end."""
import csv
import json
import math

import pytest

from estimator_dist.bench import main as bench
from estimator_dist.bench import plan as bench_plan
from estimator_dist.bench import step_split
from estimator_dist.bench import results as bench_results
from estimator_dist.errors import UserError
from support import cli_in_process, run_cli


def measurement(model, name, round_index, rate, first=10.0):
    case = next(c for c in bench_plan.cases_for(model) if c.name == name)
    return bench_results.Measurement(case, round_index, ok=True, examples_per_sec=rate,
                             first_step_seconds=first, peak_rss_mb=500.0, cpu_ms_per_step=1.0)


def test_rounds_alternate_order_and_every_target_compares_cases_of_one_group(monkeypatch):
    monkeypatch.setattr(bench_plan, "horovod_installed", lambda: True)
    rounds = bench_plan.schedule(bench_plan.Options(rounds=3))
    flat = [[case for group in groups for case in group] for groups in rounds]
    assert flat[1] == list(reversed(flat[0])) and rounds[2] == rounds[0]
    assert sorted(flat[0], key=str) == sorted(bench_plan.selected_cases(bench_plan.Options()), key=str)
    for groups in rounds:
        assert all(len({c.group for c in group}) == 1 for group in groups)
    names = {model: {c.name: c for c in bench_plan.cases_for(model)}
             for model in bench_plan.KNOWN_MODELS}  # --models imagenet's parts too
    for _, numerator, denominator, _, goal in bench_plan.TARGETS:
        pairs = [(cases[numerator], cases[denominator]) for cases in names.values()
                 if numerator in cases and denominator in cases]
        assert pairs
        if goal is not None:  # every target with a goal is measured interleaved
            assert all(a.group == b.group for a, b in pairs)
    for _, two, one in bench_plan.BOUNDS:  # measured interleaved with the step they bound
        for cases in (names[model] for model in bench_plan.MODELS):
            assert {cases[n].group for n in (bench_plan.MWMS_1, two, one) if n} == \
                {cases[bench_plan.MWMS_1].group}
    for model, wanted in bench_plan.QUICK_CASES.items():
        assert set(wanted) <= set(names[model])
    assert "project none N=1 bfloat16" in set(names["mlp"]) - set(names["cifar"])  # v1 layers
    horovod = [c for c in names["mlp"].values() if c.strategy == "horovod"]
    assert len({c.group for c in horovod}) == 2  # each alone: idle ranks keep polling


def test_only_the_start_up_targets_cases_start_alone_the_rest_by_cores(monkeypatch):
    monkeypatch.setattr(bench_plan, "horovod_installed", lambda: True)
    groups = {}
    for case in bench_plan.cases_for("cifar"):
        groups.setdefault(case.group, []).append(case)
    alone = [c.name for c in bench_plan.cases_for("cifar") if bench_plan.starts_alone(c)]
    assert alone == ["plain none N=1", "project none N=1"]  # "time to first step" compares them
    for group in groups.values():
        waves = bench_plan.start_waves(group, cores=2)
        started = [case for wave in waves for case in wave]
        assert sorted(started, key=group.index) == group and len(set(started)) == len(group)
        for wave in waves:
            assert sum(case.workers for case in wave) <= 2 or len(wave) == 1
            apart = [c for c in wave if c.strategy in bench_plan.PROCESS_STRATEGIES or
                     bench_plan.starts_alone(c)]
            assert not apart or len(wave) == 1  # pinned to cores 0, 1, or measured alone
    single = bench_plan.start_waves(groups["cifar:N=1 single"], cores=2)
    assert [len(wave) for wave in single] == [2, 1, 1, 2, 1], single
    strategies = bench_plan.start_waves(groups["cifar:N=2 strategies"], cores=2)
    assert [len(wave) for wave in strategies] == [2, 2, 1]
    assert len(bench_plan.start_waves(groups["cifar:N=2 strategies"], cores=1)) == 5


def test_a_start_up_measured_beside_another_case_is_marked_in_the_table():
    runs = [measurement("mlp", "project none N=1", 0, 100.0),
            measurement("mlp", "project mirrored N=2", 0, 90.0, first=20.0)]
    runs[1].started_alone = False
    rows = bench_results.make_rows(bench_plan.Options(models=("mlp",)), runs)
    table = bench_results.format_table([r for r in rows if r.runs],
                                       bench_plan.SETTINGS).splitlines()
    assert table[2].split()[-4] == "10.0" and table[3].split()[-4] == "20.0*", table
    assert table[-1] == bench_results.BESIDE_NOTE


def test_quick_runs_a_subset_and_cases_filters():
    quick = bench_plan.selected_cases(bench_plan.Options(quick=True))
    assert 0 < len(quick) < len(bench_plan.selected_cases(bench_plan.Options()))
    only = bench_plan.selected_cases(bench_plan.Options(models=("mlp",), only=("keras",)))
    assert {c.driver for c in only} == {"keras"} and {c.model for c in only} == {"mlp"}


def test_ratios_are_taken_within_each_round_then_the_median():
    runs = [measurement("mlp", "project none N=1", 0, 100.0, first=11.0),
            measurement("mlp", "plain none N=1", 0, 100.0, first=10.0),
            measurement("mlp", "project none N=1", 1, 50.0, first=10.0),
            measurement("mlp", "plain none N=1", 1, 49.0, first=10.0),
            measurement("mlp", "project multi_worker_mirrored 2 worker(s) x 1 core", 0, 180.0),
            measurement("mlp", "project multi_worker_mirrored 1 worker(s) x 1 core", 0, 100.0)]
    targets = {t["target"]: t for t in
               bench_results.target_rows(bench_plan.Options(models=("mlp",), rounds=2), runs)}
    plain = targets["project none / plain Estimator, N=1"]
    assert plain["rounds"] == [1.0, round(50 / 49, 4)] and plain["met"]
    assert math.isclose(plain["ratio"], (1.0 + 50 / 49) / 2)
    first = targets["time to first step: project / plain Estimator"]
    assert math.isclose(first["ratio"], (1.1 + 1.0) / 2) and first["met"]
    scaling = targets["2-worker scaling efficiency (MWMS, 1 core each)"]
    assert math.isclose(scaling["ratio"], 0.9) and scaling["met"]
    assert targets["project none / Keras fit, N=1"]["met"] is None  # keras did not run


def test_interleaved_cases_are_compared_burst_by_burst():
    # The machine slows down 2x in bursts 3-4: the median of the whole runs would give
    # 120 / 100, the burst-by-burst ratio stays 0.9.
    a = measurement("mlp", "project none N=1", 0, 120.0)
    b = measurement("mlp", "plain none N=1", 0, 100.0)
    a.burst_examples_per_sec = [90.0, 90.0, 45.0, 45.0, 90.0]
    b.burst_examples_per_sec = [100.0, 100.0, 50.0, 50.0, 100.0]
    t = next(t for t in bench_results.target_rows(bench_plan.Options(models=("mlp",)), [a, b])
             if t["target"] == "project none / plain Estimator, N=1")
    assert math.isclose(t["ratio"], 0.9) and not t["met"]


@pytest.mark.parametrize("options, message", [
    (bench_plan.Options(rounds=0), "--rounds 0: must be 1-100"),
    (bench_plan.Options(rounds=10 ** 10), "--rounds 10000000000: must be 1-100"),  # hung in schedule()
    (bench_plan.Options(models=("resnet",)), "--models resnet: choose from cifar, mlp"),
    (bench_plan.Options(only=("nothing like it",)), "matches no case"),
])
def test_bad_options_are_user_errors(options, message):
    with pytest.raises(UserError, match=message):
        bench_plan.check_options(options)
        bench_plan.schedule(options)


@pytest.mark.parametrize("flags, message", [
    (["--rounds", "0"], "estimator-dist: error: --rounds 0: must be 1-100"),
    (["--case_timeout", "0"], "estimator-dist: error: --case_timeout 0.0: must be a number of "
                              "seconds > 0"),
    # Tracebacks from select() once a case process had started.
    (["--case_timeout", "nan"], "estimator-dist: error: --case_timeout nan: must be a number"),
    (["--case_timeout", "inf"], "estimator-dist: error: --case_timeout inf: must be a number"),
    (["--models", "mlp", "--cases", "projet none"], "estimator-dist: error: --cases projet none: "
                                                    "matches no case; case names: "),
    # An empty filter ran every case (a --quick run took minutes instead of failing).
    (["--quick", "--cases", ","], "estimator-dist: error: --cases ',': an empty item; give "
                                  "comma-separated names"),
    (["--models", "cifar,,mlp"], "estimator-dist: error: --models 'cifar,,mlp': an empty item"),
])
def test_bad_flag_is_one_line_exit_2_nothing_written(flags, message, tmp_path, capsys,
                                                     monkeypatch):
    """In this process (a case process started fails the test); one as a user runs it below."""
    code, _, err = cli_in_process(["bench", *flags, "--output_dir", tmp_path / "out"], capsys,
                                  monkeypatch)
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith(message), err
    assert not (tmp_path / "out").exists()


def test_a_bad_flag_as_a_user_runs_it(tmp_path):
    proc = run_cli("bench", "--case_timeout", "nan", "--output_dir", tmp_path / "out")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == "estimator-dist: error: --case_timeout nan: must be a number of " \
                          "seconds > 0\n", proc.stderr
    assert not (tmp_path / "out").exists()


def test_an_output_dir_holding_other_files_is_refused(tmp_path):
    """Each run replaces work/ and logs/: a user's files in them were deleted."""
    out = tmp_path / "out"
    (out / "logs").mkdir(parents=True)
    (out / "logs" / "case.log").write_text("an earlier bench's log")
    (out / "bench.csv").write_text("")
    bench_plan.check_output_dir(str(out))
    (out / "logs" / "important.txt").write_text("mine")
    with pytest.raises(UserError, match=f"^--output_dir {out}: holds logs/important.txt, which "
                                        f"a bench run did not write; give an empty directory"):
        bench_plan.check_output_dir(str(out))
    (out / "logs" / "important.txt").unlink()
    (out / "work" / "notes").mkdir(parents=True)
    with pytest.raises(UserError, match="holds work/notes, which"):
        bench_plan.check_output_dir(str(out))
    (out / "work" / "notes").rmdir()
    (out / "thesis.tex").write_text("")
    with pytest.raises(UserError, match="holds thesis.tex, which"):
        bench_plan.check_output_dir(str(out))
    with pytest.raises(UserError, match="is a file; give a directory"):
        bench_plan.check_output_dir(str(out / "thesis.tex"))


@pytest.mark.timeout(400)
def test_quick_bench_writes_table_csv_and_png(tmp_path):
    out = tmp_path / "bench"
    proc = run_cli("bench", "--quick", "--output_dir", out, timeout=380)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    expected = {(c.model, c.name) for c in bench_plan.selected_cases(bench_plan.Options(quick=True))}
    for model, name in expected:
        assert name in proc.stdout
    assert "examples/sec" in proc.stdout and "target" in proc.stdout

    with open(out / "bench.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["model"], r["case"]) for r in rows} == expected
    for r in rows:
        assert float(r["examples_per_sec"]) > 0 and float(r["first_step_seconds"]) > 0
        assert float(r["peak_rss_mb"]) > 50 and r["failed_runs"] == "0"
    project = next(r for r in rows if r["case"] == "project mirrored N=2")
    assert int(project["global_batch"]) == bench_plan.QUICK_SETTINGS["mlp"].batch
    two = next(r for r in rows if r["case"].startswith("project multi_worker_mirrored 2"))
    assert int(two["global_batch"]) == 2 * bench_plan.QUICK_SETTINGS["mlp"].batch  # per-worker batch kept

    with open(out / "targets.csv", newline="") as f:
        targets = list(csv.DictReader(f))
    scaling = next(t for t in targets if t["model"] == "mlp" and t["target"].startswith("2-worker"))
    assert float(scaling["ratio"]) > 0
    ran = {label for label, two, _ in bench_plan.BOUNDS if ("mlp", two) in expected}
    bounds = [t for t in targets if t["model"] == "mlp" and t["target"] in ran]
    assert len(bounds) == len(ran) >= 2  # MWMS's all-reduce, the TCP ring
    for t in bounds:  # the all-reduce costs something, so each bound lies in (0, 1]
        assert 0 < float(t["ratio"]) <= 1.05 and t["note"].startswith("all-reduce "), t

    with open(out / "bench.json") as f:
        runs = json.load(f)["runs"]
    assert all(run["ok"] for run in runs)
    alone = {run["case"]: run["started_alone"] for run in runs}
    assert alone["mlp:project none N=1"] and not alone["mlp:project mirrored N=2"], alone
    assert all(len(run["burst_examples_per_sec"]) == bench_plan.QUICK_SETTINGS["mlp"].bursts
               for run in runs if run["case"].startswith("mlp:"))
    # The per-step split of each process-strategy case that trains through Estimator: parts
    # that add up to its step, the all-reduce found in TensorFlow's trace of the step.
    split = {run["case"]: run["step_split"] for run in runs}
    traced = [k for k in split if ("multi_worker_mirrored" in k or "horovod" in k)]
    assert len(traced) == 5, split  # project and comm MWMS with 1 and 2 workers, Horovod
    for key in traced:
        parts = split[key]
        assert all(parts[p] >= 0 for p in step_split.PARTS), key
        assert parts["all-reduce"] > 0 or " 1 worker" in key, key
        assert math.isclose(sum(parts[p] for p in step_split.PARTS), parts["step"]), key
    assert not [k for k in split if split[k] and k not in traced], split
    assert "per-step split of the worker cases" in proc.stdout

    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    from matplotlib import image

    height, width = image.imread(str(out / "bench.png")).shape[:2]
    assert width > 800 and height > 400
    assert not (out / "work").exists()  # model dirs and data are cleaned up


class GateClosed(Exception):
    pass


class FakeGate:
    """Gives the commands, then raises GateClosed instead of letting the clock leave."""

    def __init__(self, commands):
        self.commands = list(commands)
        self.reports = []

    def report(self, message):
        self.reports.append(message)

    def command(self):
        if not self.commands:
            raise GateClosed
        return self.commands.pop(0)


def test_clock_reports_ready_after_warmup_then_bursts_without_their_first_step(monkeypatch):
    from estimator_dist.bench import cases as bench_cases

    now = [0.0]
    monkeypatch.setattr(bench_cases.time, "monotonic", lambda: now[0])
    gate = FakeGate(["run 4", "run 4"])
    clock = bench_cases.Clock({"warmup": 2, "t0": 0.5}, gate)
    for t in (2.0, 3.0, 10.0, 11.0, 12.0, 23.0, 50.0, 51.0, 52.0):  # 2 + 4 + 3 steps
        now[0] = t
        clock.step_done()
    now[0] = 53.0
    with pytest.raises(GateClosed):  # the second burst ends: the clock asks what next
        clock.step_done()
    ready, first, second = gate.reports
    assert ready["event"] == "ready" and ready["first_step_seconds"] == 1.5
    # A burst's first step (after the wait at the gate) is not measured; another tenant's
    # 11-second stall is kept (the median ignores it, the window mean does not).
    assert first["step_seconds"] == [1.0, 1.0, 11.0] and first["steps"] == 4
    assert second["step_seconds"] == [1.0, 1.0, 1.0]
    assert not gate.commands


def test_case_run_figures_are_the_median_step_and_the_window_mean():
    from estimator_dist.bench import case_runner as bench_runner

    case = bench_plan.cases_for("mlp")[0]
    run = bench_runner.CaseRun(case, 0, "log", global_batch=100)
    run.ready = {"first_step_seconds": 2.0, "onednn": True}
    run.bursts = [{"steps": 3, "step_seconds": [1.0, 1.0], "cpu_seconds": 6.0},
                  {"steps": 3, "step_seconds": [11.0, 1.0], "cpu_seconds": 3.0}]
    figures = run.figures()
    assert math.isclose(figures["examples_per_sec"], 100.0)
    assert math.isclose(figures["window_examples_per_sec"], 4 * 100 / 14.0)
    assert figures["burst_examples_per_sec"] == [100.0, 100.0 / 6.0]
    assert math.isclose(figures["cpu_ms_per_step"], 1500.0)
    assert figures["first_step_seconds"] == 2.0


def test_a_case_that_dies_fails_alone_and_its_group_goes_on(tmp_path):
    from estimator_dist.bench import case_runner as bench_runner

    options = bench_plan.Options(output_dir=str(tmp_path), quick=True, case_timeout=120)
    (tmp_path / "logs").mkdir()
    (tmp_path / "specs").mkdir()
    settings = bench_plan.QUICK_SETTINGS
    good, bad = [c for c in bench_plan.cases_for("mlp") if c.name in ("keras none N=1",
                                                                 "project none N=1 jit")]

    def spec_for(case, model_dir, worker):
        spec = bench.case_spec(options, settings, "", case, model_dir, worker)
        return dict(spec, model="no_such_model") if case is bad else spec

    runner = bench_runner.Runner(options, settings, str(tmp_path), "", spec_for,
                                 bench.process_envs)
    runs = runner.run_group([bad, good], 0, cores=2)  # started together
    failed, fine = runs
    assert not failed.started_alone and not fine.started_alone
    assert not failed.ok and "before the end of its warm-up" in failed.error
    assert "no_such_model" in open(failed.log_path).read()
    assert fine.ok and len(fine.bursts) == settings["mlp"].bursts
    assert all(p.poll() is not None for run in runs for p in run.procs)
