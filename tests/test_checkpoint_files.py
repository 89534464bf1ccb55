"""checkpoint_files: each question about a model_dir's checkpoint files, on files laid out by hand
as Estimator leaves them (and as a killed save or a damaged disk leaves them)."""
import os

import pytest

from estimator_dist import checkpoint_files as cf

STATE = 'model_checkpoint_path: "model.ckpt-{0}"\nall_model_checkpoint_paths: "model.ckpt-{0}"\n'


def checkpoint(model_dir, step, shards=1, written=None):
    """model.ckpt-<step>'s index and `written` of its `shards` data shards (all by default)."""
    (model_dir / f"model.ckpt-{step}.index").write_bytes(b"i")
    for i in range(shards if written is None else written):
        (model_dir / f"model.ckpt-{step}.data-{i:05d}-of-{shards:05d}").write_bytes(b"d")


def answers(model_dir):
    d = str(model_dir)
    return (cf.named_step(d), cf.latest_step(d), cf.index_steps(d),
            sorted(cf.complete_checkpoints(d)), cf.temp_dirs(d))


def test_no_dir_and_empty_dir(tmp_path):
    assert answers(tmp_path / "none") == (None, None, [], [], [])
    assert answers(tmp_path) == (None, None, [], [], [])
    assert cf.named_prefix(str(tmp_path)) is None and cf.latest_prefix(str(tmp_path)) is None


def test_the_state_file_names_the_latest(tmp_path):
    """The state file decides, not the newest index on disk (keep_checkpoint_max, a state file
    pointed back on purpose); the prefix is joined with model_dir."""
    checkpoint(tmp_path, 30)
    checkpoint(tmp_path, 60)
    (tmp_path / "checkpoint").write_text(STATE.format(30))
    assert answers(tmp_path) == (30, 30, [30, 60], [30, 60], [])
    assert cf.latest_prefix(str(tmp_path)) == os.path.join(str(tmp_path), "model.ckpt-30")


def test_a_state_file_naming_a_missing_checkpoint(tmp_path):
    """named_step reads the file alone (the launcher's question); latest_step wants its index."""
    checkpoint(tmp_path, 30)
    (tmp_path / "checkpoint").write_text(STATE.format(60))
    assert answers(tmp_path) == (60, None, [30], [30], [])


def test_an_absolute_path_in_the_state_file(tmp_path):
    elsewhere = tmp_path / "old"
    elsewhere.mkdir()
    checkpoint(elsewhere, 7)
    (tmp_path / "checkpoint").write_text(f'model_checkpoint_path: "{elsewhere}/model.ckpt-7"\n')
    assert cf.latest_prefix(str(tmp_path)) == f"{elsewhere}/model.ckpt-7"
    assert answers(tmp_path) == (7, 7, [], [], [])


def test_index_files_only(tmp_path):
    """No state file: no latest step (Estimator would start at step 0; guards/checkpoints
    repairs that), though index files are there. Names that only look alike do not count."""
    checkpoint(tmp_path, 0)
    checkpoint(tmp_path, 5)
    for name in ("model.ckpt-9.index.tempstate123", "xmodel.ckpt-8.index", "model.ckpt-x.index",
                 "model.ckpt-4.meta"):
        (tmp_path / name).write_bytes(b"")
    assert answers(tmp_path) == (None, None, [0, 5], [0, 5], [])


def test_a_temp_dir_is_no_checkpoint(tmp_path):
    """A save under way (or killed) writes into model.ckpt-N_temp/: not a checkpoint yet."""
    checkpoint(tmp_path, 10)
    (tmp_path / "checkpoint").write_text(STATE.format(10))
    temp = tmp_path / "model.ckpt-20_temp"
    temp.mkdir()
    (temp / "part-00000-of-00001.index").write_bytes(b"i")
    (temp / "part-00000-of-00001.data-00000-of-00001").write_bytes(b"d")
    (tmp_path / "model.ckpt-30_temp").write_bytes(b"")  # a file of that name: no save's dir
    assert answers(tmp_path) == (10, 10, [10], [10], ["model.ckpt-20_temp"])


def test_a_sharded_checkpoint(tmp_path):
    """Complete when its index and every shard of one count are there; an index beside a
    missing shard, or beside shards of two counts, is not."""
    checkpoint(tmp_path, 10, shards=3)
    checkpoint(tmp_path, 20, shards=3, written=2)
    checkpoint(tmp_path, 30, shards=2)
    (tmp_path / "model.ckpt-30.data-00000-of-00001").write_bytes(b"d")
    (tmp_path / "checkpoint").write_text(STATE.format(20))
    assert answers(tmp_path) == (20, 20, [10, 20, 30], [10], [])
    assert cf.complete_checkpoints(str(tmp_path)) == {10: str(tmp_path / "model.ckpt-10")}


# (state file text, what it names): TensorFlow's CheckpointState text format.
STATE_FILES = [
    ("", None),
    ("\n\n", None),
    ("garbage", None),
    ("\x00\x01\xff binary", None),
    ('model_checkpoint_path: "model.ckpt-60"\n', 60),
    ('model_checkpoint_path:"model.ckpt-60"', 60),
    ("model_checkpoint_path: 'model.ckpt-60'", 60),
    ('# a comment\nmodel_checkpoint_path: "model.ckpt-60"  # another\n', 60),
    ('model_checkpoint_path: "model.ckpt-" "60"', 60),
    ('model_checkpoint_path: "model.ckpt-60" all_model_checkpoint_paths: "model.ckpt-30"', 60),
    ('model_checkpoint_path: "model.ckpt-60";\nlast_preserved_timestamp: 1.7e9,\n', 60),
    ('model_checkpoint_path: "model.ckpt-60"\nall_model_checkpoint_timestamps: 1700000000.5\n',
     60),
    ('model_checkpoint_path: "model.ckpt-60"\nmodel_checkpoint_path: "model.ckpt-30"\n', 30),
    ('all_model_checkpoint_paths: "model.ckpt-30"\n', None),  # no model_checkpoint_path
    ('model_checkpoint_path: ""', None),
    ('model_checkpoint_path: "model.ckpt"', None),  # no step in its name
    # Garbage around a good line: TensorFlow ignores the whole file.
    ('model_checkpoint_path: "model.ckpt-60"\nbogus: "x"\n', None),
    ('model_checkpoint_path: "model.ckpt-60"\nall_model_checkpoint_paths: "model.ck', None),
    ('model_checkpoint_path: "model.ckpt-6', None),
    ('model_checkpoint_path "model.ckpt-60"', None),
    ("model_checkpoint_path: model.ckpt-60", None),
    ("model_checkpoint_path: 60", None),
    ('model_checkpoint_path: "model.ckpt-60"\nlast_preserved_timestamp: "x"', None),
    ('model_checkpoint_path: "model.ckpt-60" ,, ', None),
]


@pytest.mark.parametrize("text, step", STATE_FILES)
def test_the_state_file_is_read_as_tensorflow_reads_it(tmp_path, text, step):
    """Pinned against tf.train.get_checkpoint_state itself (an empty file or one without
    model_checkpoint_path raises a bare ValueError there; it names nothing here)."""
    import tensorflow as tf

    (tmp_path / "checkpoint").write_bytes(text.encode("latin-1"))
    assert cf.named_step(str(tmp_path)) == step
    try:
        state = tf.train.get_checkpoint_state(str(tmp_path))
        theirs = state.model_checkpoint_path if state else None
    except ValueError:
        theirs = None
    assert cf.named_prefix(str(tmp_path)) == theirs
