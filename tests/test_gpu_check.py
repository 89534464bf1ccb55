"""`make gpu-check` (estimator_dist/bench/gpu_check.py): exits 3 on a machine without GPUs,
runs for real on the CPU with --allow_cpu, prints one table row per strategy."""
import subprocess
import sys

import pytest

from support import REPO, environment
from estimator_dist.bench import gpu_check


def run(*argv, timeout=420):
    """`python -m estimator_dist.bench.gpu_check ARGV`, as `make gpu-check` runs it."""
    return subprocess.run([sys.executable, "-m", "estimator_dist.bench.gpu_check", *argv],
                          capture_output=True, text=True, cwd=REPO, env=environment(REPO),
                          timeout=timeout)


def test_no_gpu_is_said_in_one_line_and_exit_3():
    assert gpu_check.gpu_names() == []  # this machine: no GPU
    proc = run()
    assert proc.returncode == gpu_check.EXIT_NO_GPU == 3, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no GPU is visible to TensorFlow")
    assert "--allow_cpu" in lines[0] and proc.stdout == ""


def test_allow_cpu_trains_each_strategy_and_prints_the_table():
    proc = run("--allow_cpu", "--strategies", "none,tower", "--steps", "5")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("strategy"))
    assert lines[header].split() == list(gpu_check.HEADER)
    rows = [line.split() for line in lines[header + 1:]]
    assert [r[0] for r in rows] == ["none", "tower"]
    assert rows[0][1] == "/cpu:0" and rows[1][1] == "/cpu:0,/cpu:1"
    for r in rows:
        assert float(r[2]) > 0 and r[3] == "-" and r[4] == "ok"  # step ms; no GPU memory


def test_a_failed_strategy_is_a_row_and_exit_1(monkeypatch, capsys):
    """The parent with a simulated GPU list: rows as the children report them."""
    monkeypatch.setattr(gpu_check, "gpu_names", lambda: ["/physical_device:GPU:0",
                                                         "/physical_device:GPU:1"])
    reports = {
        "none": {"strategy": "none", "devices": ["/gpu:0"], "step_ms": 3.5,
                 "peak_gpu_mb": 120.25, "result": "ok"},
        "mirrored": {"strategy": "mirrored", "devices": [], "step_ms": None,
                     "peak_gpu_mb": None, "result": "FAILED (exit 1): boom"},
    }
    monkeypatch.setattr(gpu_check, "run_one", lambda s, args, workdir: reports[s])
    assert gpu_check.main(["--strategies", "none,mirrored"]) == gpu_check.EXIT_FAILED
    out = capsys.readouterr().out
    assert "on 2 GPU(s)" in out
    assert [line.split()[:4] for line in out.splitlines() if line.startswith(("none", "mirr"))] \
        == [["none", "/gpu:0", "3.5", "120.25"], ["mirrored", "-", "-", "-"]]
    assert "FAILED (exit 1): boom" in out


@pytest.mark.parametrize("argv,message", [
    (["--strategies", "nccl"], "--strategies nccl: choose from"),
    (["--steps", "2"], "--steps 2: give at least 4"),
])
def test_bad_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        gpu_check.main(argv)
    assert info.value.code == 2 and message in capsys.readouterr().err


def test_make_gpu_check_runs_the_script():
    result = subprocess.run(["make", "--no-print-directory", "-n", "-B", "gpu-check", "STEPS=10",
                             "ARGS=--allow_cpu"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        ".venv/bin/python -m estimator_dist.bench.gpu_check --steps 10 --allow_cpu")
