"""`report --model_dir A --model_dir B`: several runs in one table and one plot, the runs as
columns and lines, their metrics at matching steps. It kept only the last --model_dir."""
import os
import shutil

import pandas as pd
import pytest

from conftest import make_config
from estimator_dist.cli.main import main
from estimator_dist.errors import UserError
from estimator_dist.serving import report, report_compare
from estimator_dist.training import run as runner


@pytest.fixture(scope="module")
def two_runs(trained_digits, tmp_path_factory):
    """runs/lr05 (the shared digits run, learning rate 0.05) and runs/lr01 (0.01), same steps."""
    root = tmp_path_factory.mktemp("compare")
    model_dir, _ = trained_digits
    shutil.copytree(model_dir, root / "runs" / "lr05")
    config = make_config("digits", ("learning_rate=0.01",), train_steps=60, strategy="none",
                         num_devices=1, model_dir=str(root / "runs" / "lr01"), batch_size=32,
                         export="none", seed=1, save_checkpoints_steps=60)
    runner.train(config, out=lambda *_: None)
    return root


def test_two_runs_side_by_side_in_one_table_and_one_plot(two_runs, monkeypatch, capsys):
    monkeypatch.chdir(two_runs)
    code = main(["report", "--model_dir", "runs/lr05", "--model_dir", "runs/lr01"])
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), err
    table = pd.read_csv(two_runs / "report" / "report.csv", index_col="step")
    for metric in ("loss", "eval_accuracy", "eval_loss"):
        assert [c for c in table.columns if c.startswith(f"{metric} (")] == \
            [f"{metric} (lr05)", f"{metric} (lr01)"]
    alone = {name: report.load(str(two_runs / "runs" / name)) for name in ("lr05", "lr01")}
    for name, frame in alone.items():  # each run's values at its own steps, in its column
        pd.testing.assert_series_equal(table[f"loss ({name})"].dropna(),
                                       frame["loss"].dropna(), check_names=False)
    both = table[["loss (lr05)", "loss (lr01)"]].dropna()
    assert len(both) >= 5  # the same steps: the rows hold both runs
    assert table.loc[60, "eval_accuracy (lr05)"] == pytest.approx(
        alone["lr05"].loc[60, "eval_accuracy"])
    lines = out.splitlines()
    assert lines[0] == "2 runs: lr05 = runs/lr05, lr01 = runs/lr01"
    assert lines[1].split() == ["lr05", "lr01"]
    assert any(line.startswith("final accuracy ") and line.count("@60") == 2 for line in lines)
    assert lines[-1] == "wrote report/report.csv and report/report.png"
    figure = report.figure(table, report_compare.compare(
        [str(two_runs / "runs" / "lr05"), str(two_runs / "runs" / "lr01")])[1])
    labels = [line.get_label() for ax in figure.axes for line in ax.get_lines()]
    assert "loss (lr05)" in labels and "loss (lr01)" in labels
    assert os.path.getsize(two_runs / "report" / "report.png") > 10_000


def test_runs_are_named_by_as_much_of_their_path_as_tells_them_apart():
    assert report_compare.run_names(["a/x/run", "b/x/run", "c"]) == ["a/x/run", "b/x/run", "c"]
    assert report_compare.run_names(["runs/a", "runs/b"]) == ["a", "b"]


def test_a_run_given_twice_is_refused(two_runs, monkeypatch):
    monkeypatch.chdir(two_runs)
    with pytest.raises(UserError, match=r"^--model_dir runs/lr05/: given twice \(as runs/lr05\); "
                                        r"give each run once$"):
        report_compare.compare(["runs/lr05", "runs/lr05/"])
