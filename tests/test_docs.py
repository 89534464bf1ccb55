"""README.md and docs/ describe what is, not how it came to be (history goes to CHANGELOG.md),
and the version is the same in setup.py, the package and CHANGELOG.md."""
import glob
import os
import re

import pytest

import estimator_dist
from support import REPO

# What only history needs: this project's issue numbers ("issue 30", "issues 24 and 26";
# upstream references such as "TF #60810" or "horovod#346" name a bug, and stay), commit
# hashes, benchmark run letters ("run V", "runs P-U", "runs C/D"), dates and sessions.
HISTORY = {
    "an issue number": re.compile(r"\bissues? #?\d+", re.I),
    "a commit hash": re.compile(r"\bcommit [0-9a-f]{7,40}\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)"
                                r"[0-9a-f]{7,40}\b"),
    "a run letter": re.compile(r"\b[Rr]uns? [A-Z](?:[-/][A-Z])?\b(?![\w-])"),
    "a date": re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b"),
    "a work session": re.compile(r"\((?:first|second|third|fourth|fifth) session\)", re.I),
    "what was tried": re.compile(r"\b(?:tried, and reverted|we tried|the issue asked|"
                                 r"the product card)\b", re.I),
}
# Outputs quoted from a real run carry the timestamps TensorFlow names exports by.
EXPORT_TIMESTAMP = re.compile(r"export/[\w/]*\d{10}")


def documents():
    return [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "*.md")))


def history_in(text: str):
    """'line: what' for each piece of history in a document's text."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        line = EXPORT_TIMESTAMP.sub("export/", line)
        found += [f"{number}: {what} ({m.group(0)!r})" for what, pattern in HISTORY.items()
                  for m in pattern.finditer(line)]
    return found


@pytest.mark.parametrize("path", documents(), ids=os.path.basename)
def test_docs_describe_what_is(path):
    assert history_in(open(path, encoding="utf-8").read()) == []


def test_history_finder_finds_it():
    """The check can fail: each kind of history is found, and current facts are not."""
    text = ("Not done yet (issue 30).\nOn the code of commit dc42186, run V met 16.\n"
            "Runs P-U, 2026-11-25 (fourth session); tried, and reverted.\n"
            "fixed in 0f1fdd2\nTF #60810, horovod#346, runs 3 rounds, ResNet-20, "
            "exported: runs/digits/export/final/1795398470, sha 8403ea18, its first session\n")
    assert history_in(text) == [
        "1: an issue number ('issue 30')", "2: a commit hash ('commit dc42186')",
        "2: a run letter ('run V')", "3: a run letter ('Runs P-U')",
        "3: a date ('2026-11-25')", "3: a work session ('(fourth session)')",
        "3: what was tried ('tried, and reverted')", "4: a commit hash ('0f1fdd2')",
        "5: a commit hash ('8403ea18')"]


def _setup_version():
    text = open(os.path.join(REPO, "setup.py"), encoding="utf-8").read()
    return re.search(r'\bversion="([^"]+)"', text).group(1)


def _changelog_versions():
    text = open(os.path.join(REPO, "CHANGELOG.md"), encoding="utf-8").read()
    return re.findall(r"^## \[([^\]]+)\]", text, re.M)


def test_one_version_everywhere():
    """setup.py, estimator_dist.__version__ and CHANGELOG.md's newest release agree; the
    CHANGELOG opens with Unreleased and lists semantic versions, newest first."""
    versions = _changelog_versions()
    assert versions[0] == "Unreleased"
    released = versions[1:]
    assert all(re.fullmatch(r"\d+\.\d+\.\d+", v) for v in released), released
    as_tuples = [tuple(map(int, v.split("."))) for v in released]
    assert as_tuples == sorted(as_tuples, reverse=True) and len(set(as_tuples)) == len(released)
    assert _setup_version() == estimator_dist.__version__ == released[0]
