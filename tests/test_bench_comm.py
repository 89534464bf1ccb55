"""bench_comm.py: the model-free step, the bare TCP ring, and the scaling bounds they give."""
import math
import threading

import numpy as np
import pytest
import tensorflow as tf

from conftest import run_cli
from estimator_dist.bench import main as bench
from estimator_dist.bench import plan as bench_plan
from estimator_dist.bench import results as bench_results
from estimator_dist.bench import comm as bench_comm
from estimator_dist.errors import UserError
from estimator_dist.launch.supervisor import free_ports

MLP_SHAPES = ((3072, 256), (256,), (256, 256), (256,), (256, 10), (10,))


@pytest.mark.parametrize("ranks, floats", [(2, 855_050), (3, 1001), (4, 3)])
def test_ring_all_reduce_sums_every_ranks_gradient(ranks, floats):
    ports = free_ports(ranks)
    gradients = [np.random.RandomState(r).randn(floats).astype(np.float32) for r in range(ranks)]
    expected = np.sum(gradients, axis=0)
    results, errors = [None] * ranks, []

    def rank(r):
        try:
            ring = bench_comm.Ring(r, ports)
            mine = gradients[r].copy()
            chunks = np.array_split(mine, ranks)
            scratch = np.empty(max(len(c) for c in chunks), np.float32)
            for _ in range(2):  # twice: the ring is reused from step to step
                ring.all_reduce(chunks, scratch)
                results[r] = mine.copy()
                mine[:] = gradients[r]
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,), daemon=True) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and all(r is not None for r in results), errors
    for result in results:
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-5)


def test_the_model_free_step_has_the_models_variables_and_optimizer(tmp_path):
    assert bench_comm.trainable_shapes("mlp") == MLP_SHAPES
    assert bench_comm.gradient_floats("mlp") == 855_050
    proc = run_cli("train", "--import", "estimator_dist.bench.cases", "--import",
                   "estimator_dist.bench.comm", "--model", "bench_comm", "--batch_size", "8",
                   "--train_steps", "3", "--export", "none", "--model_dir", str(tmp_path / "m"))
    assert proc.returncode == 0, proc.stderr
    variables = dict(tf.train.list_variables(str(tmp_path / "m")))
    assert variables["global_step"] == []
    assert tuple(tuple(variables[f"v{i}"]) for i in range(6)) == MLP_SHAPES
    assert tuple(tuple(variables[f"v{i}/Momentum"]) for i in range(6)) == MLP_SHAPES  # the MLP's
    moved = tf.train.load_variable(str(tmp_path / "m"), "v0")
    assert np.all(moved < 0) and np.all(np.isfinite(moved))  # 3 updates of the fill gradient


def test_bench_comm_copies_only_a_bench_model():
    assert bench_comm.bench_model("cifar") == "cifar"
    with pytest.raises(UserError, match=r"^--set like=resnet: bench_comm copies one of "
                                        r"bench_mlp, cifar; fix it with --set like=bench_mlp$"):
        bench_comm.bench_model("resnet")


def measurement(name, rate, cpu_ms, round_index=0):
    case = next(c for c in bench_plan.cases_for("mlp") if c.name == name)
    return bench_results.Measurement(case, round_index, ok=True, examples_per_sec=rate, cpu_ms_per_step=cpu_ms)


def test_bounds_are_the_step_over_the_step_plus_what_a_second_worker_adds():
    batch = bench_plan.SETTINGS["mlp"].batch  # per worker
    runs = [measurement(bench_plan.MWMS_1, batch / 0.010, cpu_ms=9.0),  # a 10 ms step
            measurement("comm multi_worker_mirrored 1 worker(s) x 1 core", batch / 0.002, 2.0),
            measurement("comm multi_worker_mirrored 2 worker(s) x 1 core", 2 * batch / 0.007, 8.0),
            measurement("tcp ring 2 worker(s) x 1 core", 2 * batch / 0.0025, 1.0)]
    rows = {t["target"]: t for t in bench_results.target_rows(bench_plan.Options(models=("mlp",), rounds=1), runs)}
    mwms = rows["2-worker scaling bound: MWMS all-reduce alone"]
    assert math.isclose(mwms["ratio"], 10 / (10 + 5)) and mwms["met"] is None
    note = "all-reduce 5.00 ms/step, 3.42 MB of gradients/step"  # the MLP's 855,050 floats
    assert math.isclose(mwms["cpu_ratio"], 9 / (9 + 6)) and mwms["note"] == note
    tcp = rows["2-worker scaling bound: bare TCP ring alone"]
    assert math.isclose(tcp["ratio"], 10 / 12.5) and math.isclose(tcp["cpu_ratio"], 0.9)
    missing = bench_results.target_rows(bench_plan.Options(models=("mlp",), rounds=1), runs[:2])
    assert [t["rounds"] for t in missing if "bound" in t["target"]] == [[]] * len(bench_plan.BOUNDS)
    assert f"({note})" in bench_results.format_targets(list(rows.values()))


def test_a_bench_of_the_tcp_ring_alone_writes_its_tables_and_no_plot(tmp_path):
    """Only cases that train no model: bench.png was a matplotlib traceback (exit 1)."""
    out = tmp_path / "bench"
    proc = run_cli("bench", "--quick", "--models", "mlp", "--cases", "tcp ring",
                   "--output_dir", str(out), timeout=200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "no bench.png: no case that trains a model ran" in proc.stdout
    assert "tcp ring 2 worker(s) x 1 core" in (out / "bench.csv").read_text()
    assert not (out / "bench.png").exists()
