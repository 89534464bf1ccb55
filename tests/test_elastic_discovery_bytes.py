"""`cluster --discovery`: output that is not UTF-8 text is bad discovery output like any other.

A discovery file or executable giving such bytes ended the launcher with a UnicodeDecodeError
traceback (exit 1) at its start, and mid-run while its tasks trained."""
import stat

import pytest

from estimator_dist.cli.main import main
from estimator_dist.launch import elastic

NOT_UTF8 = b"localhost:2\n\xff\xfehost\n"


def test_a_discovery_file_that_is_not_utf8_is_refused_in_one_line(tmp_path, monkeypatch,
                                                                  capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "slots").write_bytes(NOT_UTF8)
    code = main(["cluster", "--discovery", "slots", "--model", "digits", "--batch_size", "24",
                 "--export", "none", "--model_dir", "run"])
    out, err = capsys.readouterr()
    assert (code, out) == (2, "")
    assert err == ("estimator-dist: error: --discovery slots holds bytes that are not UTF-8 text "
                   "(byte 12: b'\\xff'); list the worker slots available now, a line per host "
                   "(HOST or HOST:SLOTS)\n")
    assert not (tmp_path / "run").exists()


def executable(path, body: bytes):
    path.write_bytes(b"#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_an_executable_printing_bytes_that_are_not_utf8_mid_run_keeps_the_slots(
        tmp_path, monkeypatch):
    script = tmp_path / "discover.sh"
    executable(script, b"echo localhost:3\n")
    said = []
    monkeypatch.setattr(elastic, "DISCOVERY_EVERY_S", 0.0)
    e = elastic.Elastic(str(script), [1, 2, 3], str(tmp_path), 1.0, None, emit=said.append)
    assert e.target == 3
    executable(script, b"printf 'localhost:1\\n\\377\\n'\n")
    for _ in range(3):
        e._read()  # pylint: disable=protected-access
    assert e.target == 3
    assert said == [f"[launcher] discovery: {script} printed bytes that are not UTF-8 text "
                    f"(byte 12: b'\\xff'); keeping 3 slots"]
    executable(script, b"echo localhost:2\n")
    e._read()  # pylint: disable=protected-access
    e._read()  # pylint: disable=protected-access
    assert e.target == 2


@pytest.mark.parametrize("how", ["file", "executable"])
def test_read_slots_names_the_byte(tmp_path, how):
    path = tmp_path / "slots"
    if how == "file":
        path.write_bytes(NOT_UTF8)
    else:
        executable(path, b"printf 'localhost:2\\n\\377\\376host\\n'\n")
    with pytest.raises(elastic.BadDiscovery, match=r"bytes that are not UTF-8 text \(byte 12: "
                                                   r"b'\\xff'\)$"):
        elastic.read_slots(str(path))
