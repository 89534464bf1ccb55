"""`estimator-dist bench`: scheduling and ratios (fast), and `bench --quick` end to end."""
import csv
import json
import math
import os
import subprocess
import sys

import pytest

from estimator_dist import bench
from estimator_dist.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def measurement(model, name, round_index, rate, first=10.0):
    case = next(c for c in bench.cases_for(model) if c.name == name)
    return bench.Measurement(case, round_index, ok=True, examples_per_sec=rate,
                             first_step_seconds=first, peak_rss_mb=500.0, cpu_ms_per_step=1.0)


def test_rounds_alternate_order_and_every_target_names_real_cases(monkeypatch):
    monkeypatch.setattr(bench, "horovod_installed", lambda: True)
    rounds = bench.schedule(bench.Options(rounds=3))
    assert rounds[1] == list(reversed(rounds[0])) and rounds[2] == rounds[0]
    names = {model: {c.name for c in bench.cases_for(model)} for model in bench.MODELS}
    for _, numerator, denominator, _, _ in bench.TARGETS:
        assert any({numerator, denominator} <= cases for cases in names.values())
    for model, wanted in bench.QUICK_CASES.items():
        assert set(wanted) <= names[model]
    assert "project none N=1 bfloat16" in names["mlp"] - names["cifar"]  # cifar: v1 layers


def test_quick_runs_a_subset_and_cases_filters():
    quick = bench.schedule(bench.Options(quick=True))[0]
    assert 0 < len(quick) < len(bench.schedule(bench.Options())[0])
    only = bench.schedule(bench.Options(models=("mlp",), only=("keras",)))[0]
    assert {c.driver for c in only} == {"keras"} and {c.model for c in only} == {"mlp"}


def test_ratios_are_taken_within_each_round_then_the_median():
    runs = [measurement("mlp", "project none N=1", 0, 100.0, first=11.0),
            measurement("mlp", "plain none N=1", 0, 100.0, first=10.0),
            measurement("mlp", "project none N=1", 1, 50.0, first=10.0),
            measurement("mlp", "plain none N=1", 1, 49.0, first=10.0),
            measurement("mlp", "project multi_worker_mirrored 2 worker(s) x 1 core", 0, 180.0),
            measurement("mlp", "project multi_worker_mirrored 1 worker(s) x 1 core", 0, 100.0)]
    targets = {t["target"]: t for t in
               bench.target_rows(bench.Options(models=("mlp",), rounds=2), runs)}
    plain = targets["project none / plain Estimator, N=1"]
    assert plain["rounds"] == [1.0, round(50 / 49, 4)] and plain["met"]
    assert math.isclose(plain["ratio"], (1.0 + 50 / 49) / 2)
    first = targets["time to first step: project / plain Estimator"]
    assert math.isclose(first["ratio"], (1.1 + 1.0) / 2) and first["met"]
    scaling = targets["2-worker scaling efficiency (MWMS, 1 core each)"]
    assert math.isclose(scaling["ratio"], 0.9) and scaling["met"]
    assert targets["project none / Keras fit, N=1"]["met"] is None  # keras did not run


@pytest.mark.parametrize("options, message", [
    (bench.Options(rounds=0), "--rounds 0: must be >= 1"),
    (bench.Options(models=("resnet",)), "--models resnet: choose from cifar, mlp"),
    (bench.Options(only=("nothing like it",)), "matches no case"),
])
def test_bad_options_are_user_errors(options, message):
    with pytest.raises(UserError, match=message):
        bench.check_options(options)
        bench.schedule(options)


def test_bad_flag_is_one_line_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "estimator_dist", "bench", "--rounds", "0",
                           "--output_dir", str(tmp_path / "out")],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == ["estimator-dist: error: --rounds 0: must be >= 1"]
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(400)
def test_quick_bench_writes_table_csv_and_png(tmp_path):
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, "-m", "estimator_dist", "bench", "--quick",
                           "--output_dir", str(out)],
                          capture_output=True, text=True, cwd=REPO, timeout=380)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    expected = {(c.model, c.name) for c in bench.schedule(bench.Options(quick=True))[0]}
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
    assert int(project["global_batch"]) == bench.QUICK_SETTINGS["mlp"].batch
    two = next(r for r in rows if r["case"].startswith("project multi_worker_mirrored 2"))
    assert int(two["global_batch"]) == 2 * bench.QUICK_SETTINGS["mlp"].batch  # per-worker batch kept

    with open(out / "targets.csv", newline="") as f:
        targets = list(csv.DictReader(f))
    scaling = next(t for t in targets if t["model"] == "mlp" and t["target"].startswith("2-worker"))
    assert float(scaling["ratio"]) > 0

    with open(out / "bench.json") as f:
        assert all(run["ok"] for run in json.load(f)["runs"])

    png = (out / "bench.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    from matplotlib import image

    height, width = image.imread(str(out / "bench.png")).shape[:2]
    assert width > 800 and height > 400
    assert not (out / "work").exists()  # model dirs and data are cleaned up


def test_steady_state_rate_is_the_median_step_and_the_window_mean_is_kept():
    from estimator_dist import bench_cases

    clock = bench_cases.Clock({"warmup": 2, "steps": 5, "global_batch": 100, "t0": 0.0,
                               "result": ""})
    # Warm-up ends at t=3; five measured steps of 1 s, one of them 11 s (another tenant's burst).
    clock.times = [2.0, 3.0, 4.0, 5.0, 16.0, 17.0, 18.0]
    clock.cpu = [0.0] * len(clock.times)
    result = clock.result()
    assert result["step_seconds"] == [1.0, 1.0, 11.0, 1.0, 1.0]
    assert math.isclose(result["examples_per_sec"], 100.0)
    assert math.isclose(result["window_examples_per_sec"], 5 * 100 / 15.0)
    assert math.isclose(result["first_step_seconds"], 2.0)
