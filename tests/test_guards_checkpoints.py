"""Checkpoint guards, each fault provoked for real on a trained model_dir.

A broken `checkpoint` state file recovers from the model.ckpt-N files present
or refuses; a checkpoint that does not fit the model, or is damaged, is refused
before any step runs and before anything in model_dir changes.
"""
import os
import shutil
import sys

import numpy as np
import pytest
import tensorflow as tf

import guard_models  # noqa: F401 - registers guard_mlp
import support
import tiny_models
from conftest import make_config
from estimator_dist.guards import checkpoints
from estimator_dist.serving import export as export_lib
from estimator_dist.training import plan as plan_lib
from estimator_dist.training import estimator as estimator_lib
from estimator_dist.training import run as runner
from estimator_dist.cli.main import main
from estimator_dist.errors import UserError


def train(model_dir, steps, overrides=(), out=None, **flags):
    flags = {"train_steps": steps, "save_checkpoints_steps": 5, "model_dir": str(model_dir),
             "seed": 1, **flags}
    lines = []
    summary = runner.train(make_config("guard_mlp", overrides, **flags), out=out or lines.append)
    return summary, lines


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """guard_mlp trained to step 10: model.ckpt-0, -5 and -10."""
    model_dir = tmp_path_factory.mktemp("guard_trained")
    train(model_dir, 10)
    return model_dir


@pytest.fixture
def model_dir(trained, tmp_path):
    """A private copy of the trained model_dir."""
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    return copy


def snapshot(path):
    """Every file under path with its size, mtime and bytes: any change shows."""
    found = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                found[os.path.relpath(full, path)] = (os.path.getmtime(full), f.read())
    return found


STATES = {
    "garbage": "model_checkpoint_path: {{{ not a proto\n\x00\x01",
    "empty": "",
    "dangling": 'model_checkpoint_path: "model.ckpt-99"\nall_model_checkpoint_paths: "model.ckpt-99"\n',
    "missing": None,
}


@pytest.mark.parametrize("state", sorted(STATES))
def test_broken_state_file_resumes_from_newest_checkpoint(state, model_dir):
    state_path = model_dir / "checkpoint"
    if STATES[state] is None:
        state_path.unlink()
    else:
        state_path.write_text(STATES[state])
    summary, lines = train(model_dir, 15)
    assert summary["start_step"] == 10 and summary["global_step"] == 15, lines
    assert any("rewrote it to resume from model.ckpt-10" in line for line in lines), lines
    assert any("resuming from the checkpoint at step 10" in line for line in lines), lines


def test_broken_state_file_skips_an_incomplete_newest_checkpoint(model_dir):
    (model_dir / "checkpoint").write_text("garbage")
    (model_dir / "model.ckpt-10.data-00000-of-00001").unlink()
    summary, lines = train(model_dir, 12)
    assert summary["start_step"] == 5 and summary["global_step"] == 12, lines


def test_broken_state_file_without_checkpoints_refuses(tmp_path):
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    (model_dir / "checkpoint").write_text("garbage")
    before = snapshot(model_dir)
    with pytest.raises(UserError, match=r"checkpoint is unreadable or empty and .* holds no "
                                        r"complete model.ckpt-N files"):
        train(model_dir, 5)
    assert snapshot(model_dir) == before


MISMATCHES = [
    # (trained with, resumed with, fragments of the message)
    ((), ("units=16",), ["'hidden/kernel' is [6, 8] in the checkpoint but [6, 16] in the model",
                         "'logits/kernel' is [8, 3] in the checkpoint but [16, 3]"]),
    ((), ("extra_layer=true",), ["the model has 'extra/bias', 'extra/kernel' that the checkpoint lacks"]),
    (("extra_layer=true",), (), ["the checkpoint has 'extra/bias', 'extra/kernel' that the model lacks"]),
]


@pytest.mark.parametrize("first,second,fragments", MISMATCHES, ids=["shape", "added", "removed"])
def test_checkpoint_not_matching_the_model_is_refused_before_any_step(first, second, fragments,
                                                                      tmp_path):
    model_dir = tmp_path / "run"
    train(model_dir, 5, first)
    before = snapshot(model_dir)
    with pytest.raises(UserError) as error:
        train(model_dir, 10, second)
    message = str(error.value)
    assert "\n" not in message and "does not match the model" in message
    assert str(model_dir / "model.ckpt-5") in message
    for fragment in fragments:
        assert fragment in message, message
    assert snapshot(model_dir) == before  # no step, no config.yaml, no events, no checkpoint


def test_optimizer_slots_left_by_another_optimizer_are_no_mismatch(tmp_path):
    model_dir = tmp_path / "run"
    train(model_dir, 5, ("optimizer=momentum",))
    summary, _ = train(model_dir, 7, ("optimizer=sgd",))
    assert summary["start_step"] == 5 and summary["global_step"] == 7


def set_hparam(model_dir, line, changed):
    config = model_dir / "config.yaml"
    text = config.read_text()
    assert f"  {line}\n" in text
    config.write_text(text.replace(f"  {line}\n", f"  {changed}\n"))


EDITED = [
    # (hparam line in config.yaml, edited to, fragments of the message)
    ("units: 8", "units: 16", ["'hidden/kernel' is [6, 8] in the checkpoint but [6, 16] in the model",
                               "'logits/kernel' is [8, 3] in the checkpoint but [16, 3]"]),
    ("extra_layer: false", "extra_layer: true",
     ["the model has 'extra/bias', 'extra/kernel' that the checkpoint lacks"]),
]


@pytest.mark.parametrize("line,changed,fragments", EDITED, ids=["shape", "added"])
def test_evaluate_and_export_refuse_a_model_changed_since_the_checkpoint(line, changed, fragments,
                                                                         model_dir, capsys):
    """TF restores a changed shape silently (export exits 0, broken) or fails with a traceback."""
    set_hparam(model_dir, line, changed)
    before = snapshot(model_dir)
    for command, checkpoint in (("evaluate", "model.ckpt-10"), ("export", "model.ckpt-5")):
        flags = ["--checkpoint", checkpoint] if command == "export" else []
        assert main([command, "--model_dir", str(model_dir)] + flags) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("estimator-dist: error: checkpoint "), err
        assert f"checkpoint {model_dir / checkpoint} does not match the model: " in err
        for fragment in fragments + [f"the hparams in {model_dir / 'config.yaml'} changed",
                                     f"--warm_start_from {model_dir / checkpoint} --warm_start_vars"]:
            assert fragment in err, err
    assert snapshot(model_dir) == before
    assert not (model_dir / "export").exists()


@pytest.mark.parametrize("strategy", ["none", "tower"])
def test_evaluate_and_export_restore_an_unchanged_model_dir(strategy, trained, tmp_path, capsys):
    """No false refusal; the tower run's checkpoint also holds Momentum slots the PREDICT graph lacks."""
    model_dir = tmp_path / "run"
    if strategy == "none":
        shutil.copytree(trained, model_dir)
    else:
        train(model_dir, 2, ("optimizer=momentum",), strategy="tower", num_devices=2,
              accumulate_steps=2)
    assert main(["evaluate", "--model_dir", str(model_dir)]) == 0
    assert "global_step" in capsys.readouterr().out
    assert main(["export", "--model_dir", str(model_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(export_lib.export_paths(str(model_dir))[-1])


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def flip_bytes(path):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle: middle + 8] = bytes(b ^ 0xFF for b in data[middle: middle + 8])
    path.write_bytes(bytes(data))


DAMAGE = [
    ("model.ckpt-10.data-00000-of-00001", truncate),
    ("model.ckpt-10.data-00000-of-00001", flip_bytes),
    ("model.ckpt-10.index", truncate),
]


@pytest.mark.parametrize("name,damage", DAMAGE, ids=["data truncated", "data corrupted", "index truncated"])
def test_damaged_checkpoint_is_refused_naming_the_file(name, damage, model_dir, capsys):
    damage(model_dir / name)
    before = snapshot(model_dir)
    with pytest.raises(UserError) as error:
        train(model_dir, 15)
    message = str(error.value)
    assert "\n" not in message and "is damaged or truncated" in message
    assert str(model_dir / name) in message and "(step 10)" in message
    assert snapshot(model_dir) == before
    # evaluate and export refuse it the same way, exit 2
    for command in ("evaluate", "export"):
        assert main([command, "--model_dir", str(model_dir)]) == 2
        assert str(model_dir / name) in capsys.readouterr().err
    assert snapshot(model_dir) == before


def test_evaluate_and_export_read_through_a_broken_state_file(model_dir, capsys):
    (model_dir / "checkpoint").write_text("garbage")
    assert main(["evaluate", "--model_dir", str(model_dir)]) == 0
    assert "global_step 10" in capsys.readouterr().out
    assert (model_dir / "checkpoint").read_text() == "garbage"  # read-only: not repaired


def test_evaluate_export_predict_refuse_without_checkpoint(model_dir, capsys):
    for path in model_dir.glob("model.ckpt-*"):
        path.unlink()
    (model_dir / "checkpoint").unlink()
    for command in ("evaluate", "export"):
        assert main([command, "--model_dir", str(model_dir)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "has no checkpoint; train first" in err, err
    np.save(model_dir / "x.npy", np.zeros((2, 6), np.float32))
    assert main(["predict", "--saved_model", str(model_dir), "--input", str(model_dir / "x.npy")]) == 2
    assert "no saved_model.pb there" in capsys.readouterr().err
    assert not (model_dir / "export").exists()


def test_interrupted_save_leftovers_are_removed_on_resume(model_dir):
    (model_dir / "model.ckpt-15_temp").mkdir()
    (model_dir / "model.ckpt-15_temp" / "part-00000-of-00001.data-00000-of-00001.tempstate1").write_bytes(b"x")
    summary, lines = train(model_dir, 12)
    assert summary["start_step"] == 10
    assert not (model_dir / "model.ckpt-15_temp").exists()
    assert any("left by an interrupted checkpoint save" in line for line in lines)


@pytest.mark.parametrize("model,strategy,n,accumulate", [
    ("tiny_keras", "mirrored", 2, 2), ("tiny_v1", "tower", 2, 1), ("tiny_keras", "none", 1, 1)])
def test_model_variables_are_what_every_strategy_saves(model, strategy, n, accumulate, tmp_path):
    """The scratch TRAIN graph lists exactly the variables (optimizer slots too) a run saved."""
    tiny_models.train(tmp_path, model, strategy, n, steps=1, overrides=("optimizer=momentum",),
                      accumulate_steps=accumulate, batch_size=6)
    config = make_config(model, ("optimizer=momentum",), train_steps=1, strategy=strategy,
                         num_devices=n, accumulate_steps=accumulate, model_dir=str(tmp_path),
                         batch_size=6)
    p = plan_lib.plan(config)
    variables = checkpoints.model_variables(estimator_lib.build_model_fn(p),
                                            estimator_lib.make_input_fn(p, tf.estimator.ModeKeys.TRAIN),
                                            p.params())
    saved = tf.train.load_checkpoint(str(tmp_path)).get_variable_to_shape_map()
    assert variables == {k: list(v) for k, v in saved.items()}
    assert any(name.endswith("/Momentum") for name in variables)


def test_a_run_resumes_with_or_without_early_stop(tmp_path):
    """TensorFlow's early-stopping hook adds a global variable: a checkpoint written with
    --early_stop was refused without it ('signal_early_stopping/STOP' that the model lacks),
    and one written without it failed to restore with it (NotFoundError traceback)."""
    import tensorflow as tf

    from conftest import quick_train

    every = dict(eval_every=10, save_checkpoints_steps=10, export="none")
    early = dict(every, early_stop="loss", patience=100)
    assert quick_train(tmp_path, steps=20, **early)["global_step"] == 20
    assert quick_train(tmp_path, steps=30, **every)["global_step"] == 30
    assert quick_train(tmp_path, steps=40, **early)["global_step"] == 40
    assert not [n for n, _ in tf.train.list_variables(str(tmp_path)) if "early_stopping" in n]


def test_a_model_dir_of_another_model_is_refused_naming_both_models(model_dir, capsys):
    """Training digits into guard_mlp's model_dir said "use the hparams it was trained with",
    which no hparams fix: the fix is another --model_dir, or the model that wrote it."""
    config = model_dir / "config.yaml"
    config.write_text(config.read_text().replace("imports: []", "imports:\n- guard_models"))
    before = snapshot(model_dir)
    message = (f"estimator-dist: error: --model_dir {model_dir} holds a 'guard_mlp' model "
               f"(checkpoints to step 10; see {config}), not 'digits'; give a new --model_dir to "
               f"train 'digits', or --model guard_mlp --import guard_models to resume it\n")
    for command in (["train"], ["cluster", "--workers", "2"]):  # cluster: before any task starts
        assert main(command + ["--model", "digits", "--model_dir", str(model_dir),
                               "--train_steps", "2"]) == 2
        assert capsys.readouterr().err == message
    assert snapshot(model_dir) == before


def test_checkpoints_of_another_model_without_a_config_are_named_so(model_dir, capsys):
    """No config.yaml to name the model: the variables tell that another model wrote them."""
    (model_dir / "config.yaml").unlink()
    before = snapshot(model_dir)
    assert main(["train", "--model", "digits", "--model_dir", str(model_dir),
                 "--train_steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"estimator-dist: error: checkpoint {model_dir / 'model.ckpt-10'} holds "
                          f"none of the model's variables (it has 'hidden/bias', 'hidden/kernel', "
                          f"'logits/bias', 'logits/kernel'; the model has 'digits_cnn/"), err
    assert err.endswith(f"): {model_dir} holds the checkpoints of another model, or of a model_fn "
                        f"whose variable names have changed; give a new --model_dir, or train "
                        f"it with the model that wrote it\n"), err
    assert "use the hparams" not in err
    assert snapshot(model_dir) == before


def test_a_resume_with_another_strategy_leaves_no_stale_shards(tmp_path):
    """tower over 2 devices saves 2 shards; `none` re-saves the restored step in 1: the 2 old
    shards were left beside the new one, and the checkpoint then looked incomplete."""
    train(tmp_path, 5, strategy="tower", num_devices=2)
    assert sorted(p.name for p in tmp_path.glob("model.ckpt-5.data-*")) == [
        "model.ckpt-5.data-00000-of-00002", "model.ckpt-5.data-00001-of-00002"]
    summary, _ = train(tmp_path, 7)
    assert summary["start_step"] == 5
    for step in (5, 7):
        assert [p.name for p in tmp_path.glob(f"model.ckpt-{step}.data-*")] == [
            f"model.ckpt-{step}.data-00000-of-00001"]
    assert sorted(checkpoints.complete_checkpoints(str(tmp_path))) == [0, 5, 7]
    assert tf.train.load_checkpoint(str(tmp_path / "model.ckpt-5")).get_tensor("global_step") == 5


def test_a_relative_model_dir_resumes_without_a_false_state_file_repair(tmp_path):
    """`--model_dir runs/d` (and `make train` twice): every resume said the state file named a
    checkpoint that does not exist and rewrote it (runs/d joined twice)."""
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(tests), tests])}
    argv = [sys.executable, "-m", "estimator_dist", "train", "--import", "guard_models",
            "--model", "guard_mlp", "--model_dir", os.path.join("runs", "d")]
    outputs = [support.run_argv(argv + ["--train_steps", str(steps)], cwd=tmp_path, env=env,
                                capture_output=True, text=True, timeout=120)
               for steps in (2, 4)]
    assert [r.returncode for r in outputs] == [0, 0], outputs[1].stderr
    resumed = outputs[1].stdout
    assert "resuming from the checkpoint at step 2 in runs/d" in resumed
    assert "rewrote" not in resumed and "done: step 4" in resumed, resumed
    assert open(tmp_path / "runs" / "d" / "checkpoint").readline() == \
        'model_checkpoint_path: "model.ckpt-4"\n'
