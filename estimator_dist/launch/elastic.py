"""`cluster --discovery PATH`: a local cluster that re-forms when its worker slots change.

PATH lists the worker slots available now, in Horovod's host-discovery format: a
line per host, `HOST` (one slot) or `HOST:SLOTS`; blank lines and `#` comments are
skipped. An executable PATH is run (at most DISCOVERY_TIMEOUT_S) and its output read,
as `horovodrun --host-discovery-script` does; any other file is read. The local
launcher runs every slot on this machine: the hosts are counted, not connected to.

The cluster runs `size` workers: the most the slots allow, at most --max_workers,
among the sizes that keep the global batch (`sizes`). When that changes, or a
training task exits with the restarts used up (its slot is dropped for the rest of
the run), every task gets SIGTERM: multi_worker_mirrored workers vote and stop
together at the next step, the chief saves that step's checkpoint, and the cluster
starts again at the new size from it (training/position.py keeps the data stream
exact). Below --min_workers it waits, up to --elastic_timeout seconds.

Every re-form is one line once the new cluster has taken its first step (the chief's
step file, step_file.py): old size, new size, the checkpoint's step, the steps lost,
and the seconds from the change to that first step (stop and checkpoint, start).
Imports no TensorFlow.
"""
import os
import re
import shutil
import subprocess
import tempfile
import time
from typing import Callable, List, Optional

from estimator_dist import checkpoint_files
from estimator_dist.errors import UserError
from estimator_dist.launch import step_file
from estimator_dist.launch.supervisor import (EXIT_CLUSTER_FAILED, Reform, Supervisor,
                                              install_signal_handlers)

DISCOVERY_TIMEOUT_S = 10.0
DISCOVERY_EVERY_S = 0.5  # between reads; a change counts when two reads in a row agree
WAIT_EVERY_S = 1.0
_LINE = re.compile(r"^([^\s:]+)(?::(\d+))?$")


class BadDiscovery(Exception):
    """The discovery file or script gave no slot count."""


def read_slots(path: str) -> int:
    """The worker slots `path` lists now (see the module's docstring)."""
    if os.path.isfile(path) and os.access(path, os.X_OK):
        try:
            proc = subprocess.run([os.path.abspath(path)], capture_output=True,
                                  timeout=DISCOVERY_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BadDiscovery(f"{path} ran longer than {DISCOVERY_TIMEOUT_S:.0f} s") from None
        except OSError as e:
            raise BadDiscovery(f"{path} could not run: {e.strerror}") from None
        if proc.returncode != 0:
            raise BadDiscovery(f"{path} exited with code {proc.returncode}")
        text = _text(path, proc.stdout, "printed")
    else:
        try:
            with open(path, "rb") as f:
                text = _text(path, f.read(), "holds")
        except OSError as e:
            raise BadDiscovery(f"{path}: {e.strerror}") from None
    slots = 0
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if not m:
            raise BadDiscovery(f"{path} line {number} {line!r} is not HOST or HOST:SLOTS "
                               f"(e.g. localhost:2)")
        slots += int(m.group(2)) if m.group(2) is not None else 1
    return slots


def _text(path: str, data: bytes, how: str) -> str:
    """The discovery output as text; bytes that are not UTF-8 are bad output like any other
    (a UnicodeDecodeError ended the launcher, its tasks' saved step aside)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadDiscovery(f"{path} {how} bytes that are not UTF-8 text (byte {e.start}: "
                           f"{data[e.start:e.start + 1]!r})") from None


def size_for(slots: int, sizes: List[int]) -> int:
    """The largest size the slots hold (0: fewer slots than the smallest size)."""
    return max([s for s in sizes if s <= slots], default=0)


def plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


class Elastic:
    """Runs clusters of changing size until one ends (see the module's docstring).

    make_supervisor(size, chief_env, watch) -> the Supervisor of a cluster of `size`
    workers, whose chief gets chief_env and which calls watch at every poll.
    """

    def __init__(self, discovery: str, sizes: List[int], model_dir: str, wait_timeout: float,
                 make_supervisor: Callable[..., Supervisor], emit=print):
        self.discovery = discovery
        self.sizes = sizes
        self.model_dir = model_dir
        self.wait_timeout = wait_timeout
        self.make_supervisor = make_supervisor
        self.emit = emit
        self.dropped = 0
        self.slots = self._slots_at_start()
        self._seen = self.slots  # the last read, for the two-reads rule
        self._next_read = 0.0
        self._bad_said = False
        self.first_start = float("nan")  # seconds from the launch to the first step

    def say(self, text: str):
        self.emit(f"[launcher] {text}")

    def _slots_at_start(self) -> int:
        try:
            return read_slots(self.discovery)
        except BadDiscovery as e:
            raise UserError(f"--discovery {e}; list the worker slots available now, a "
                            f"line per host (HOST or HOST:SLOTS)") from None

    def _read(self):
        """Read the discovery again (every DISCOVERY_EVERY_S); a count is taken when two reads
        in a row agree (a file rewritten in place may be read half-written)."""
        now = time.monotonic()
        if now < self._next_read:
            return
        self._next_read = now + DISCOVERY_EVERY_S
        try:
            slots = read_slots(self.discovery)
            self._bad_said = False
        except BadDiscovery as e:
            if not self._bad_said:
                self.say(f"discovery: {e}; keeping {plural(self.slots, 'slot')}")
                self._bad_said = True
            return
        if slots == self._seen:
            self.slots = slots
        self._seen = slots

    @property
    def target(self) -> int:
        return size_for(self.slots - self.dropped, self.sizes)

    def run(self) -> int:
        work_dir = tempfile.mkdtemp(prefix="estimator-dist-elastic-")
        try:
            return self._run(os.path.join(work_dir, "steps.json"))
        finally:
            shutil.rmtree(work_dir, ignore_errors=True)

    def _run(self, steps_path: str) -> int:
        install_signal_handlers()
        started = time.time()
        reform = None  # the last re-form, reported at the new cluster's first step
        try:
            while True:
                size = self._wait_for_slots()
                if size == 0:
                    return EXIT_CLUSTER_FAILED
                if os.path.exists(steps_path):
                    os.remove(steps_path)
                start = dict(size=size, at=time.time(), reform=reform, reported=False)

                def watch():
                    self._report_first_step(steps_path, start, started)
                    self._read()
                    if self.target != start["size"]:
                        raise Reform(self._change())

                supervisor = self.make_supervisor(size, {step_file.ENV: steps_path}, watch)
                try:
                    return supervisor.run()
                except Reform as e:
                    reform = self._stopped(e, size, steps_path)
        except KeyboardInterrupt as e:  # supervisor.Interrupted while waiting
            return 128 + getattr(e, "signum", 2)

    def _change(self) -> str:
        return (f"discovery lists {plural(self.slots, 'slot')}"
                + (f" ({self.dropped} dropped)" if self.dropped else ""))

    def _stopped(self, e: Reform, size: int, steps_path: str) -> dict:
        """The cluster stopped for a re-form: what it lost."""
        self.dropped += e.dropped
        steps = step_file.read(steps_path)
        saved = checkpoint_files.named_step(self.model_dir)
        last = steps.get("last_step")
        return dict(old=size, reason=e.reason, at=e.at, stopped=time.time(), step=saved,
                    lost=None if last is None or saved is None else last - saved)

    def _report_first_step(self, steps_path: str, start: dict, started: float):
        if start["reported"]:
            return
        steps = step_file.read(steps_path)
        if "first_at" not in steps:
            return
        start["reported"] = True
        reform = start["reform"]
        if reform is None:
            self.first_start = steps["first_at"] - started
            self.say(f"{plural(start['size'], 'worker')} took their first step "
                     f"{self.first_start:.1f} s after the start")
            return
        lost = ("? steps lost (the chief stopped without a final checkpoint)"
                if reform["lost"] is None else f"{plural(reform['lost'], 'step')} lost")
        total = steps["first_at"] - reform["at"]
        self.say(f"re-formed {reform['old']} -> {plural(start['size'], 'worker')} at step "
                 f"{reform['step'] or 0} ({reform['reason']}): {lost}, {total:.1f} s from the "
                 f"change to the next step (stop and checkpoint "
                 f"{reform['stopped'] - reform['at']:.1f} s, start {steps['first_at'] - start['at']:.1f}"
                 f" s; the first start took {self.first_start:.1f} s)")

    def _wait_for_slots(self) -> int:
        """The size to start at; waits while the slots are fewer than the smallest size (0:
        --elastic_timeout passed)."""
        if self.target:
            return self.target
        self.say(f"waiting for workers: {self._change()}, the smallest cluster is "
                 f"{plural(self.sizes[0], 'worker')}; giving up in {self.wait_timeout:.0f} s "
                 f"(--elastic_timeout)")
        deadline = time.monotonic() + self.wait_timeout
        while time.monotonic() < deadline:
            time.sleep(WAIT_EVERY_S)
            self._read()
            if self.target:
                return self.target
        self.say(f"error: still {self._change()} after {self.wait_timeout:.0f} s, fewer than "
                 f"--min_workers {self.sizes[0]}; add slots to {self.discovery} and rerun "
                 f"to resume")
        return 0


def check_range(min_workers: int, max_workers: Optional[int], limit: int, wait_timeout: float):
    if min_workers < 1:
        raise UserError(f"--min_workers {min_workers}: must be >= 1 (it counts the chief)")
    if max_workers is not None and max_workers < min_workers:
        raise UserError(f"--max_workers {max_workers} is below --min_workers {min_workers}; "
                        f"use --max_workers >= {min_workers}")
    if max_workers is not None and max_workers > limit:
        raise UserError(f"--max_workers {max_workers}: at most {limit} workers run on this "
                        f"machine with the other tasks (use a TFJob for more)")
    if min_workers > limit:
        raise UserError(f"--min_workers {min_workers}: at most {limit} workers run on this "
                        f"machine with the other tasks")
    if not 0 < wait_timeout < float("inf"):
        raise UserError(f"--elastic_timeout {wait_timeout}: must be a number of seconds > 0")

