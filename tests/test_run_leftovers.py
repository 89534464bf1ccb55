"""What a run finds and leaves in its model_dir: a config.yaml that is no run's config is
replaced and said; a checkpoint whose .index was deleted is skipped by evaluate and export,
and said. (TensorFlow's tmp_worker_N copies of a multi_worker_mirrored worker: test_roles.py,
and the cluster runs of test_cluster.py and test_signals.py.)"""
import shutil

from conftest import make_config
from estimator_dist.cli.main import main
from estimator_dist.training import run as runner


def test_a_garbage_config_yaml_is_replaced_and_said(tmp_path):
    """train replaced it without a word."""
    (tmp_path / "config.yaml").write_text("model: [digits\n\t: {\n")
    lines = []
    runner.train(make_config("digits", (), model_dir=str(tmp_path), train_steps=1, batch_size=8,
                             eval_steps=1, export="none"), out=lines.append)
    notes = [line for line in lines if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith(
        f"note: config file '{tmp_path}/config.yaml' line 2: not valid YAML ("), notes
    assert notes[0].endswith("); replaced it with this run's config")
    assert "model: digits" in (tmp_path / "config.yaml").read_text()
    lines.clear()
    runner.train(make_config("digits", (), model_dir=str(tmp_path), train_steps=2, batch_size=8,
                             eval_steps=1, export="none"), out=lines.append)
    assert not [line for line in lines if line.startswith("note: ")]  # a run's own: no note


def test_evaluate_says_which_checkpoint_it_uses_when_the_latest_has_no_index(trained_digits,
                                                                            tmp_path, capsys):
    """With model.ckpt-60.index deleted it evaluated model.ckpt-0 without a word."""
    model_dir, _ = trained_digits
    copy = tmp_path / "run"
    shutil.copytree(model_dir, copy)
    (copy / "model.ckpt-60.index").unlink()
    assert main(["evaluate", "--model_dir", str(copy)]) == 0
    out, err = capsys.readouterr()
    assert err == (f"estimator-dist: the checkpoint state file {copy}/checkpoint was naming "
                   f"model.ckpt-60, which is incomplete (model.ckpt-60.index is missing, 2 other "
                   f"file(s) of it are there); using model.ckpt-0, the newest complete checkpoint "
                   f"present\n")
    assert "global_step 0" in out
