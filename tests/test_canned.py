"""Canned Estimators, feature columns and TF1 model code (canned_models.py) through the CLI:
their exports and `predict`, the EVAL graph built before training, a rerun's final export,
predict's CSV hygiene."""
import json
import os

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from canned_models import census_rows
from support import TESTS, environment, final_export, run_cli

ENV = environment(TESTS)
CENSUS = ["--import", "canned_models", "--batch_size", "16", "--seed", "1",
          "--eval_steps", "2"]


def census_csv(tmp_path, n=96, seed=0, name="adult.data", sep=","):
    path = tmp_path / name
    path.write_text(census_rows(n, seed, sep))
    return path


def train_census(tmp_path, model, *extra, steps=6, data=None):
    model_dir = tmp_path / model
    data = data or census_csv(tmp_path)
    done = run_cli("train", *CENSUS, "--model", model, "--data_path", data, "--model_dir",
                   model_dir, "--train_steps", steps, *extra, env=ENV, timeout=240)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-1500:]
    return model_dir, done


# -- a rerun at --train_steps exports its final step --------------------------------------

def test_a_rerun_at_train_steps_exports_the_final_step_it_left_unexported(tmp_path):
    """`--export none`, then the same run with `--export final`: it evaluated, exited 0 and
    exported nothing."""
    model_dir = tmp_path / "run"
    flags = ["--import", "guard_models", "--model", "guard_mlp", "--model_dir", model_dir,
             "--train_steps", "4"]
    first = run_cli("train", *flags, "--export", "none", env=ENV, timeout=120)
    assert first.returncode == 0 and not final_export(model_dir), first.stderr
    again = run_cli("train", *flags, "--export", "final", env=ENV, timeout=120)
    assert again.returncode == 0, again.stderr
    exports = final_export(model_dir)
    assert len(exports) == 1 and "exported:" in again.stdout, again.stdout
    exported = os.path.dirname(exports[0])
    assert int(tf.train.load_variable(os.path.join(exported, "variables", "variables"),
                                      "global_step")) == 4
    third = run_cli("train", *flags, "--export", "final", env=ENV, timeout=120)
    assert third.returncode == 0 and len(final_export(model_dir)) == 1, third.stderr


# -- the EVAL graph is built before the first step ----------------------------------------

def test_the_official_mnist_eval_bug_is_found_before_training_with_the_fix(tmp_path):
    """The r1 MNIST model_fn's EVAL branch calls tf.losses.sparse_softmax_cross_entropy,
    which Keras 2.15's tf.losses lacks: it trained every step, then failed evaluating."""
    model_dir = tmp_path / "mnist"
    done = run_cli("train", "--import", "canned_models", "--model", "mnist_r1", "--set",
                   "eval_bug=true", "--batch_size", "8", "--train_steps", "5", "--eval_steps",
                   "1", "--model_dir", model_dir, env=ENV, timeout=180)
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "could not build its eval graph" in lines[0], lines[0]
    assert "tf.compat.v1.losses.sparse_softmax_cross_entropy" in lines[0], lines[0]
    assert not os.path.exists(model_dir)  # refused before anything was written: no step


def test_the_official_mnist_model_without_the_bug_trains_and_evaluates(tmp_path):
    done = run_cli("train", "--import", "canned_models", "--model", "mnist_r1", "--batch_size",
                   "8", "--train_steps", "5", "--eval_steps", "1", "--export", "none",
                   "--model_dir", tmp_path / "mnist", env=ENV, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "accuracy" in done.stdout

