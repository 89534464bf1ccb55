"""Checkpoint guards: never a silent restart from step 0, never a silent bad restore.

TF 2.15 fails silently here (measured): a garbage `checkpoint` state file, or
none at all next to model.ckpt-N files, makes training restart from step 0 (an
empty one raises a bare ValueError); a variable whose shape changed restores
without error; a variable removed from the model is silently dropped. These
checks run before the first training step and before anything is written;
evaluate and export run them (against the PREDICT graph) before restoring.
"""
import inspect
import os
import shutil
import sys
from typing import Callable, Dict, List, Mapping, Optional

import tensorflow as tf

from estimator_dist import config_yaml as config_lib
from estimator_dist import files
from estimator_dist.checkpoint_files import (PREFIX, STATE_FILE, complete_checkpoints,
                                             latest_prefix, named_prefix, temp_dirs)

from estimator_dist.errors import UserError, first_line

# Optimizer slots and bookkeeping left in a checkpoint by another optimizer, and
# variables training hooks add (--early_stop's stop signal): the model graph does
# not hold them and losing them loses nothing trained.
SLOT_SUFFIXES = ("/Momentum", "/Adam", "/Adam_1", "/RMSProp", "/RMSProp_1", "/Adagrad")
SLOT_NAMES = ("beta1_power", "beta2_power", "signal_early_stopping/STOP")
SHOWN = 6  # names listed in one error line before "and N more"
SHAPES_SHOWN = 3  # shape differences spelled out in one error line
# Builds the model's graph and returns its variables, {name: shape}.
Variables = Callable[[], Mapping[str, List[int]]]


def _state_checkpoint(model_dir: str):
    """(what the state file names, or None when it is unusable; that checkpoint if it
    exists, else None)."""
    return named_prefix(model_dir), latest_prefix(model_dir)


def _dangling(path: str) -> str:
    """How the state file's checkpoint `path` is missing: its .index only, or altogether."""
    directory, name = os.path.split(path)
    others = [n for n in (os.listdir(directory or ".") if os.path.isdir(directory or ".") else [])
              if n.startswith(name + ".")]
    if others:
        return (f"naming {name}, which is incomplete ({name}.index is missing, "
                f"{len(others)} other file(s) of it are there)")
    return f"naming {name}, which does not exist"


def find_latest(model_dir: str):
    """(latest checkpoint prefix or None, why the state file could not say so or None).

    Read-only: the state file's checkpoint when it names one that exists, else
    the newest complete model.ckpt-N present.
    """
    state_path = os.path.join(model_dir, STATE_FILE)
    present = complete_checkpoints(model_dir)
    if os.path.exists(state_path):
        named, latest = _state_checkpoint(model_dir)
        if latest:
            return latest, None
        problem = "unreadable or empty" if not named else _dangling(named)
        if not present:
            raise UserError(f"{state_path} is {problem} and {model_dir} holds no complete "
                            f"model.ckpt-N files to recover from; restore the checkpoint files, "
                            f"or delete {state_path} to start from step 0 on purpose")
    elif not present:
        return None, None
    else:
        problem = "missing"
    return present[max(present)], f"the checkpoint state file {state_path} was {problem}"


def write_state(model_dir: str, latest: str, steps: List[int]):
    """Write the `checkpoint` state file (relative paths, as Estimator does), atomically."""
    lines = [f'model_checkpoint_path: "{os.path.basename(latest)}"']
    lines += [f'all_model_checkpoint_paths: "{PREFIX}-{s}"' for s in sorted(steps)]
    files.write_text(os.path.join(model_dir, STATE_FILE), "\n".join(lines) + "\n")


def remove_stale_temp(model_dir: str) -> List[str]:
    """Delete model.ckpt-N_temp dirs left by a save that was killed (kill -9, disk full)."""
    removed = temp_dirs(model_dir)
    for name in removed:
        shutil.rmtree(os.path.join(model_dir, name), ignore_errors=True)
    return removed


def verify_readable(prefix: str) -> Dict[str, List[int]]:
    """Read every tensor (checksums included) of a checkpoint; UserError naming the damaged file.

    Returns {variable name: shape}.
    """
    step = prefix.rsplit("-", 1)[-1]
    hint = (f"move {prefix}.* away to resume from an older checkpoint (training never "
            f"silently starts over)")
    try:
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        shapes = reader.get_variable_to_shape_map()
    except Exception as e:  # noqa: BLE001 - DataLossError, NotFoundError, ...
        raise UserError(f"checkpoint {prefix}.index (step {step}) is damaged or truncated "
                        f"({first_line(e, 200)}); {hint}") from None
    for name in sorted(shapes):
        try:
            reader.get_tensor(name)
        except Exception as e:  # noqa: BLE001
            data = sorted(n for n in os.listdir(os.path.dirname(prefix) or ".")
                          if n.startswith(os.path.basename(prefix) + ".data-"))
            files = ", ".join(os.path.join(os.path.dirname(prefix), n) for n in data)
            raise UserError(f"checkpoint {files or prefix} (step {step}) is damaged or truncated: "
                            f"reading '{name}' failed ({first_line(e, 200)}); {hint}") from None
    return {k: list(v) for k, v in shapes.items()}


def _is_slot(name: str) -> bool:
    return name in SLOT_NAMES or name.endswith(SLOT_SUFFIXES)


def _names(names: List[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def compare(model: Mapping[str, List[int]], checkpoint: Mapping[str, List[int]],
            extras: bool = True) -> List[str]:
    """Differences between the model's variables and a checkpoint's, one phrase each.

    The first SHAPES_SHOWN shape differences, in the order the model's graph
    creates them, are spelled out. extras: variables only the checkpoint has
    are a difference (training; a PREDICT graph lacks the training-only ones,
    so evaluate/export pass False).
    """
    changed = [n for n in model if n in checkpoint and list(model[n]) != list(checkpoint[n])]
    problems = [f"'{n}' is {list(checkpoint[n])} in the checkpoint but {list(model[n])} in the model"
                for n in changed[:SHAPES_SHOWN]]
    if len(changed) > SHAPES_SHOWN:
        problems.append(f"{len(changed) - SHAPES_SHOWN} more variables differ in shape")
    missing = sorted(set(model) - set(checkpoint))
    extra = sorted(n for n in set(checkpoint) - set(model) if not _is_slot(n)) if extras else []
    if missing:
        problems.append(f"the model has {_names(missing)} that the checkpoint lacks")
    if extra:
        problems.append(f"the checkpoint has {_names(extra)} that the model lacks")
    return problems


def check_matches(model: Mapping[str, List[int]], checkpoint: Mapping[str, List[int]],
                  prefix: str, training: bool = True, model_dir: str = ""):
    """UserError, before anything runs or is written, when the checkpoint does not fit the model.

    training: before a training step (every difference counts). False: before
    evaluate/export restore it into a PREDICT graph, where checkpoint-only
    variables (optimizer slots, accumulators) are expected; the message then
    names the likely cause, a model_fn or hparams changed since it was written.
    model_dir: whose config.yaml holds the hparams (default: the checkpoint's dir).
    """
    problems = compare(model, checkpoint, extras=training)
    if not problems:
        return
    model_dir = model_dir or os.path.dirname(prefix)
    config = os.path.join(model_dir, config_lib.CONFIG_FILE)
    if training and _another_models(model, checkpoint):
        saved, flags = saved_model(model_dir)
        wrote = f"a '{saved}' model (see {config})" if saved else "another model"
        raise UserError(f"checkpoint {prefix} holds none of the model's variables (it has "
                        f"{_names(sorted(_trained(checkpoint)))}; the model has "
                        f"{_names(sorted(_trained(model)))}): {model_dir} holds the checkpoints "
                        f"of {wrote}, or of a model_fn whose variable names have changed; give a "
                        f"new --model_dir, or train it with the model that wrote it"
                        + (f" ({flags})" if saved else ""))
    if training:
        fix = (f"use the hparams it was trained with (see {config}), or train into a new "
               f"--model_dir (--warm_start_from {prefix} --warm_start_vars REGEX takes over the "
               f"variables that still fit)")
    else:
        fix = (f"the model_fn or the hparams in {config} changed since it was written: restore "
               f"the model code and hparams it was trained with, or train into a new --model_dir "
               f"with --warm_start_from {prefix} --warm_start_vars REGEX")
    raise UserError(f"checkpoint {prefix} does not match the model: {'; '.join(problems)}; {fix}")


def _trained(variables: Mapping[str, List[int]]) -> List[str]:
    """The names of a model's own variables: no global step, no optimizer slots."""
    return [n for n in variables if n != "global_step" and not _is_slot(n)]


def _another_models(model: Mapping[str, List[int]], checkpoint: Mapping[str, List[int]]) -> bool:
    """True when the checkpoint holds none of the model's own variables (both have some)."""
    own = _trained(model)
    return bool(own) and bool(_trained(checkpoint)) and not set(own) & set(checkpoint)


def saved_model(model_dir: str):
    """(--model, the flags that train it) named by model_dir's config.yaml; (None, "") if it
    names none or cannot be read."""
    try:
        data = config_lib.load_saved(model_dir)
    except (OSError, UserError):
        return None, ""
    name = data.get("model")
    if not isinstance(name, str) or not name:
        return None, ""
    imports = data.get("imports") if isinstance(data.get("imports"), list) else []
    return name, " ".join([f"--model {name}"] + [f"--import {m}" for m in imports])


def check_same_model(model_dir: str, model: str):
    """Before training: refuse a model_dir that holds checkpoints of another --model.

    Its config.yaml names the model that wrote them. Resuming them into `model`
    would fail on every variable, and the fix is another --model_dir (or the
    other --model), not other hparams. Reads only; a model_dir without complete
    checkpoints or without a readable config.yaml is left to check_resume.
    """
    present = complete_checkpoints(model_dir)
    saved, flags = saved_model(model_dir) if present else (None, "")
    if saved is None or saved == model:
        return
    raise UserError(f"--model_dir {model_dir} holds a '{saved}' model (checkpoints to step "
                    f"{max(present)}; see {os.path.join(model_dir, config_lib.CONFIG_FILE)}), not "
                    f"'{model}'; give a new --model_dir to train '{model}', or {flags} to "
                    f"resume it")


def check_same_lr_scale(model_dir: str, scale_lr: bool, replicas: int):
    """Before a resume: --scale_lr ties the learning rate to the replica count, so a resume
    on another count (another --workers) would change the run's schedule: refused.

    The replicas of the run that wrote the checkpoints are in its config.yaml.
    """
    if not scale_lr or not complete_checkpoints(model_dir):
        return
    try:
        saved = config_lib.load_saved(model_dir).get("replicas")
    except (OSError, UserError):
        return
    if isinstance(saved, int) and saved != replicas:
        raise UserError(f"--scale_lr: the checkpoints in {model_dir} were trained with the "
                        f"learning rate x {saved} (replicas), this run has {replicas}; resume "
                        f"with {saved} replicas, or start a new --model_dir (docs/elastic.md)")


def model_variables(model_fn, input_fn, params, run_config=None,
                    mode: str = tf.estimator.ModeKeys.TRAIN) -> Dict[str, List[int]]:
    """{name: shape} of the variables a `mode` graph of model_fn holds, built in a scratch graph.

    No session runs: only the graph is built, as Estimator builds it (global
    step first, then input_fn, then model_fn with the arguments it takes).
    input_fn: an Estimator input_fn, or (PREDICT) a serving_input_receiver_fn.
    A TRAIN graph holds what training saves; a PREDICT graph what export and
    evaluate restore.
    """
    return in_scratch_graph(model_fn, input_fn, params, mode, run_config, lambda spec: {
        v.op.name: v.shape.as_list() for v in tf.compat.v1.global_variables()})


def in_scratch_graph(model_fn, input_fn, params, mode, run_config, read):
    """`read(spec)` of model_fn's EstimatorSpec, built in a scratch graph as Estimator builds it."""
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        features, labels = _features_labels(input_fn())
        takes = set(inspect.signature(model_fn).parameters)
        given = {"features": features, "labels": labels, "mode": mode,
                 "params": params, "config": run_config or tf.estimator.RunConfig()}
        return read(model_fn(**{k: v for k, v in given.items() if k in takes}))


def _features_labels(result):
    """(features, labels) from what an input_fn or a serving_input_receiver_fn returns."""
    if isinstance(result, tf.estimator.export.ServingInputReceiver):
        return result.features, None
    if isinstance(result, tf.data.Dataset):
        result = tf.compat.v1.data.make_initializable_iterator(result).get_next()
    return result if isinstance(result, tuple) and len(result) == 2 else (result, None)


def check_resume(model_dir: str, variables: Variables,
                 say=print, repair: bool = True) -> Optional[str]:
    """Before training: the checkpoint it will resume from, checked; None for a fresh start.

    A garbage, empty, dangling or missing state file next to complete
    model.ckpt-N files is rewritten (when `repair`, i.e. on the chief) to name
    the newest of them; with none to name it refuses. The checkpoint must read
    back whole and match `variables()` (the model's {name: shape}). Any refusal
    happens before the state file or anything else is written.
    """
    latest, problem = find_latest(model_dir)
    if latest is None:
        return None
    checkpoint = verify_readable(latest)
    check_matches(variables(), checkpoint, latest)
    if problem and repair:
        write_state(model_dir, latest, sorted(complete_checkpoints(model_dir)))
        say(f"{problem}; rewrote it to resume from {os.path.basename(latest)}, the newest complete "
            f"checkpoint present")
    if repair:
        for name in remove_stale_temp(model_dir):
            say(f"removed {os.path.join(model_dir, name)}, left by an interrupted checkpoint save")
    return latest


def check_restore(prefix: str, model_dir: str, variables: Optional[Variables] = None) -> str:
    """For evaluate/export: `prefix` read back whole and, given `variables`, fitting the model.

    variables: returns the {name: shape} of the PREDICT graph the checkpoint is
    restored into. TF 2.15 restores a changed shape without error (export then
    writes a SavedModel whose graph disagrees with its variables) or fails deep
    inside the run; this refuses first, before anything is written.
    """
    checkpoint = verify_readable(prefix)
    if variables is not None:
        check_matches(variables(), checkpoint, prefix, training=False, model_dir=model_dir)
    return prefix


def latest_readable(model_dir: str, variables: Optional[Variables] = None,
                    say=None) -> Optional[str]:
    """For evaluate/export: the latest checkpoint, checked (check_restore); None if there is none.

    Read-only: an unusable state file is worked around (the newest complete
    model.ckpt-N is used), never rewritten, and said (`say`, default stderr: evaluate
    prints its metrics on stdout): with a deleted .index it used an older checkpoint
    without a word.
    """
    latest, problem = find_latest(model_dir)
    if latest is None:
        return None
    checked = check_restore(latest, model_dir, variables)
    if problem:
        (say or _note)(f"{problem}; using {os.path.basename(latest)}, the newest complete "
                       f"checkpoint present")
    return checked


def _note(text: str):
    print(f"estimator-dist: {text}", file=sys.stderr)
