"""A process's own temporary directory (estimator_dist/process_temp.py), removed however the
process ends: os._exit skips the atexit handlers that remove autograph's files."""
import os
import subprocess
import sys
import textwrap

from estimator_dist import process_temp
from support import REPO, environment


def python(code, tmp_path, name="tmp"):
    """`code` (dedented) as the script tmp_path/NAME.py, run by a new Python whose TMPDIR is
    the new directory tmp_path/NAME: (that directory, exit code, stdout, stderr). A file, not
    -c: autograph converts only functions whose source it can read."""
    tmp, script = tmp_path / name, tmp_path / f"{name}.py"
    tmp.mkdir()
    script.write_text(textwrap.dedent(code))
    done = subprocess.run([sys.executable, str(script)], cwd=REPO,
                          env=environment(REPO, TMPDIR=str(tmp)), capture_output=True,
                          text=True, timeout=120)
    return tmp, done.returncode, done.stdout, done.stderr


CLAIM = """
    import os, sys, tempfile
    from estimator_dist import process_temp
    own = process_temp.claim()
    print(own)
    with tempfile.NamedTemporaryFile(suffix=".py", delete=False) as f:  # as autograph does
        print(f.name)
"""


def test_a_claimed_directory_holds_the_temp_files_and_is_removed_at_exit(tmp_path):
    tmp, code, out, err = python(CLAIM, tmp_path)
    assert code == 0, err
    own, made = out.split()
    assert os.path.dirname(own) == str(tmp)
    assert os.path.basename(own).startswith("estimator-dist-") and made.startswith(own + "/")
    assert os.listdir(tmp) == []


def test_hard_exit_removes_what_os_exit_leaves(tmp_path):
    tmp, code, _, err = python(CLAIM + "    process_temp.hard_exit(7)\n", tmp_path, "hard")
    assert code == 7, err
    assert os.listdir(tmp) == []
    _, code, out, err = python(CLAIM + "    os._exit(7)\n", tmp_path, "raw")
    assert code == 7, err
    assert os.path.exists(out.split()[1])  # what the exit handlers would have removed


def test_a_forked_child_leaves_its_parents_directory(tmp_path):
    tmp, code, out, err = python(CLAIM + """
    pid = os.fork()
    if pid == 0:
        process_temp.remove()
        sys.exit(0)  # the atexit handler runs in the child too
    os.waitpid(pid, 0)
    print(os.path.isdir(own))
    """, tmp_path)
    assert code == 0, err
    assert out.split()[-1] == "True"
    assert os.listdir(tmp) == []  # the parent's exit removed it


def test_no_usable_temporary_directory_changes_nothing(monkeypatch):
    """Python found none (every candidate unwritable): the process runs on as before."""
    def none_usable(*_args, **_kwargs):
        raise FileNotFoundError("No usable temporary directory found")

    monkeypatch.setattr(process_temp.tempfile, "mkdtemp", none_usable)
    monkeypatch.setattr(process_temp.tempfile, "tempdir", None)
    monkeypatch.setattr(process_temp, "_CLAIMED", None)  # whatever this process claimed
    assert process_temp.claim() is None
    assert process_temp.tempfile.tempdir is None and process_temp._CLAIMED is None


def test_autographs_files_are_removed_by_the_exits_of_a_stopped_task(tmp_path):
    """A real tf.data map converted by autograph (its file written), then the exits the
    guards take: exit_now (a SIGTERM'd task: one line, 143) and a task ended with its run."""
    for name, exit_call in [("preempted", "signals.exit_now(errors.Preempted('SIGTERM'))"),
                            ("ended", "step_end._exit(0, 'done')")]:
        tmp, code, _, err = python(f"""
        from estimator_dist import errors, process_temp
        from estimator_dist.guards import signals, step_end
        process_temp.claim()
        import os, tempfile
        import tensorflow as tf

        def double(x):
            return x * 2 if x > 0 else x  # a Python condition on a tensor: autograph's work

        tf.data.Dataset.range(3).map(double)
        assert any(n.startswith("__autograph_generated_file")
                   for n in os.listdir(tempfile.gettempdir())), "autograph wrote no file"
        {exit_call}
        """, tmp_path, name)
        assert code == (143 if name == "preempted" else 0), err
        assert err.strip().startswith("estimator-dist: "), err
        assert os.listdir(tmp) == [], (name, os.listdir(tmp))


def test_the_directories_of_a_killed_process_are_removed_by_its_pid_only(tmp_path, monkeypatch):
    """The launcher's clean-up after a task it reaped was killed by a signal."""
    for name in ("estimator-dist-12-abcdefgh", "estimator-dist-123-abcdefgh", "other-12-x"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__autograph_generated_file1.py").write_text("")
    monkeypatch.setattr(process_temp.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(process_temp, "_CLAIMED", None)
    process_temp.remove_left_by(12)
    assert sorted(os.listdir(tmp_path)) == ["estimator-dist-123-abcdefgh", "other-12-x"]


def test_a_child_killed_by_a_signal_has_its_directory_removed_once_reaped(tmp_path, monkeypatch):
    """What the launcher and the bench do for a task or case they killed (SIGKILL)."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent("""
        import sys
        from estimator_dist import process_temp
        print(process_temp.claim(), flush=True)
        sys.stdin.read()
        """)], cwd=REPO, env=environment(REPO, TMPDIR=str(tmp_path)), stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    own = child.stdout.readline().strip()
    assert os.path.isdir(own)
    child.kill()
    child.wait()
    monkeypatch.setattr(process_temp.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(process_temp, "_CLAIMED", None)
    process_temp.remove_if_killed(child)
    assert os.listdir(tmp_path) == [] and child.temp_removed


def test_hard_exit_removes_the_directory_while_another_thread_writes_in_it(tmp_path):
    """A task stopped from its signal thread (exit_now) while its main thread's autograph
    wrote files: rmtree listed the directory before two files came, so it stayed."""
    tmp, code, _, err = python(CLAIM + """
    import threading
    writing = threading.Event()
    def write():
        while True:
            try:
                tempfile.NamedTemporaryFile(suffix=".py", delete=False).close()
                writing.set()
            except OSError:  # the directory is gone
                pass
    for _ in range(50):
        with tempfile.NamedTemporaryFile(suffix=".py", delete=False):
            pass
    threading.Thread(target=write, daemon=True).start()
    writing.wait()
    process_temp.hard_exit(7)
    """, tmp_path)
    assert code == 7, err
    assert os.listdir(tmp) == []
