"""The case processes of `estimator-dist bench`: started in waves, then run in interleaved bursts.

The cases of a group (bench.py: the cases its targets compare) are alive together.
A case whose start-up time a target compares is launched while the others wait idle,
so its start-up is measured alone; the others start as many at once as there are cores
(plan.start_waves). Each runs its warm-up and stops at a gate (bench_cases.Clock).
Then the group runs in bursts: one case at a time runs `burst_steps` steps while the
others wait, the order reversed every burst. A ratio of two cases is taken burst by burst, from
steps a second or two apart instead of minutes apart, so a shared machine's
changing load falls on both sides of it alike.

Messages go over two pipes per process: "run K" and "quit" to the case, one JSON
line back per event ("ready" after the warm-up, "burst" after each burst). A case
whose parent dies reads end-of-file at its gate and leaves.
"""
import json
import os
import select
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional

from estimator_dist import process_temp
from estimator_dist.bench import step_split
from estimator_dist.bench.plan import PROCESS_STRATEGIES, start_waves

STOP_TIMEOUT_S = 20.0
# The drivers whose steps are Estimator session runs, traced for the per-step split of
# their process-strategy cases, 1 worker included (step_split.py).
TRACED_DRIVERS = ("project", "plain", "comm")
ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
ONEDNN_DEFAULT = "1"  # what cli.main sets unless the environment says otherwise


class Channel:
    """Line-delimited JSON between the bench and one case process, over two pipes."""

    def __init__(self):
        self._cmd_read, self._cmd_write = os.pipe()  # bench -> case
        self._report_read, self._report_write = os.pipe()  # case -> bench
        self._buffer = b""

    def child_fds(self):
        """(fd the case reads commands from, fd it writes reports to)."""
        return self._cmd_read, self._report_write

    def launched(self):
        """Close the case's ends here, so that its exit shows as end-of-file."""
        os.close(self._cmd_read)
        os.close(self._report_write)

    def send(self, command: str):
        try:
            os.write(self._cmd_write, (command + "\n").encode())
        except (BrokenPipeError, OSError):
            pass  # the case has gone; its missing report says so

    def receive(self, deadline: float) -> Optional[Dict]:
        """The next message; None once the case has closed its end (exited).

        Raises:
          TimeoutError: nothing came before `deadline` (monotonic seconds).
        """
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            ready, _, _ = select.select([self._report_read], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._report_read, 1 << 16)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def close(self):
        for fd in (self._cmd_write, self._report_read):
            try:
                os.close(fd)
            except OSError:
                pass


class CaseRun:
    """The processes of one case in one round, and what they reported."""

    def __init__(self, case, round_index: int, log_path: str, global_batch: int,
                 started_alone: bool = True):
        self.case = case
        self.started_alone = started_alone  # no other case started beside it
        self.round = round_index
        self.log_path = log_path
        self.global_batch = global_batch
        self.procs: List[subprocess.Popen] = []
        self.channels: List[Channel] = []
        self.release = lambda: None  # frees what the processes needed (a Horovod rendezvous)
        self.started = time.monotonic()
        self.ended = self.started
        self.error = ""
        self.ready: Dict = {}
        self.bursts: List[Dict] = []  # the chief's burst reports
        self.shares: Dict = {}  # the chief's traced shares of input and communication
        self.split_error = ""  # why the traced steps failed (the processes were stopped)
        self.peak_rss_mb = float("nan")

    @property
    def ok(self) -> bool:
        return not self.error

    def note_rss(self, message: Dict):
        rss = message.get("rss_mb", float("nan"))
        if rss == rss and not rss <= self.peak_rss_mb:
            self.peak_rss_mb = rss

    def fail(self, error: str):
        if self.ok:
            self.error = error
        self.kill()

    def kill(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()  # by PID, the process we started
        for proc in self.procs:
            proc.wait()
            process_temp.remove_if_killed(proc)  # a killed case left its temporary directory
        self._finish()

    def _finish(self):
        for channel in self.channels:
            channel.close()
        self.channels = []
        self.release()
        self.release = lambda: None
        self.ended = time.monotonic()

    def stop(self):
        """Send quit; processes that do not leave within STOP_TIMEOUT_S are killed.

        Exit codes after the last burst do not count: every measurement is in
        (a Horovod rank fails at exit once rank 0 has left, for one).
        """
        for channel in reversed(self.channels):
            channel.send("quit")
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def figures(self) -> Dict:
        """Rates and costs from the chief's bursts (the first step of each burst left out)."""
        steps = [s for b in self.bursts for s in b["step_seconds"]]
        rates = [self.global_batch / max(statistics.median(b["step_seconds"]), 1e-9)
                 for b in self.bursts if b["step_seconds"]]
        cpu = sum(b["cpu_seconds"] for b in self.bursts)
        ran = sum(b["steps"] for b in self.bursts)
        return {
            # Steady state: the median step, which a burst of another process's load
            # moves far less than the mean.
            "examples_per_sec": self.global_batch / max(statistics.median(steps), 1e-9),
            # Every measured step counted, periodic work (summaries, logging) included.
            "window_examples_per_sec": len(steps) * self.global_batch / max(sum(steps), 1e-9),
            "burst_examples_per_sec": rates,
            # Process CPU time (all threads) per step: the work done, which other
            # processes' load moves little, unlike wall time.
            "cpu_ms_per_step": 1000.0 * cpu / max(ran, 1),
            "burst_cpu_ms_per_step": [1000.0 * b["cpu_seconds"] / max(b["steps"], 1)
                                      for b in self.bursts],
            "first_step_seconds": self.ready["first_step_seconds"],
            "onednn": self.ready.get("onednn"),
            "step_split": step_split.split(
                steps, [r for b in self.bursts for r in b.get("run_seconds", ())], self.shares),
        }


class Runner:
    """Launches the case processes of a group and runs them in interleaved bursts."""

    def __init__(self, options, settings, work_dir: str, cifar_dir: str, spec_for, envs_for):
        self.options = options
        self.settings = settings
        self.work_dir = work_dir
        self.cifar_dir = cifar_dir
        self.spec_for = spec_for  # (case, model_dir, worker) -> the case's JSON spec
        self.envs_for = envs_for  # case -> (each process's extra environment, release)
        self.count = 0

    def run_group(self, cases, round_index: int, cores: int = 1) -> List[CaseRun]:
        """Start the cases in waves of up to `cores` processes (plan.start_waves; 1: each
        alone, the others idle at their gates); then the bursts."""
        waves = start_waves(cases, cores)
        runs = []
        for wave in waves:
            started = [self._launch_case(case, round_index, len(wave) == 1) for case in wave]
            for run in started:
                self._await_warmup(run)
            runs += started
        runs.sort(key=lambda run: cases.index(run.case))  # the group's order, for the bursts
        for b in range(self.settings[cases[0].model].bursts):  # a group is one model's
            order = runs if b % 2 == 0 else list(reversed(runs))
            for run in order:
                if run.ok:
                    self._burst(run)
        for run in runs:  # after the measured bursts: tracing slows the steps
            if run.ok and run.case.strategy in PROCESS_STRATEGIES and \
                    run.case.driver in TRACED_DRIVERS:  # 1 worker too: what scaling adds
                self._trace(run)
        for run in runs:
            if run.ok:
                run.stop()
        return runs

    def _launch_case(self, case, round_index: int, alone: bool) -> CaseRun:
        self.count += 1
        tag = f"{self.count:03d}-{case.model}-{case.name.replace(' ', '_').replace('=', '')}"
        tag = "".join(ch for ch in tag if ch.isalnum() or ch in "-_.")
        s = self.settings[case.model]
        run = CaseRun(case, round_index, os.path.join(self.options.output_dir, "logs", f"{tag}.log"),
                      s.batch * case.workers, started_alone=alone)
        envs, run.release = self.envs_for(case)
        model_dir = os.path.join(self.work_dir, "model_dirs", tag)
        with open(run.log_path, "w", encoding="utf-8") as log:
            for worker in range(case.workers):
                spec = self.spec_for(case, model_dir, worker)
                self._launch(run, spec, f"{tag}.w{worker}", envs[worker], log)
        return run

    def _await_warmup(self, run: CaseRun):
        deadline = run.started + self.options.case_timeout
        for worker in range(run.case.workers):
            message = self._receive(run, worker, deadline, "its warm-up")
            if message is None:
                return
            run.note_rss(message)
            if worker == 0:
                run.ready = message

    def _trace(self, run: CaseRun):
        """The traced steps of the per-step split. If they fail, the case's processes are
        stopped but what its bursts measured stands: only the split is missing."""
        self._burst(run, trace=True)
        run.split_error, run.error = run.error, ""

    def _burst(self, run: CaseRun, trace: bool = False):
        """A measured burst, or with `trace` the traced steps of the per-step split."""
        steps = step_split.TRACED_STEPS if trace else self.settings[run.case.model].burst_steps
        for channel in run.channels:
            channel.send(f"{'trace' if trace else 'run'} {steps}")
        deadline = time.monotonic() + self.options.case_timeout
        what = "the traced steps" if trace else f"burst {len(run.bursts) + 1}"
        for worker in range(run.case.workers):
            message = self._receive(run, worker, deadline, what)
            if message is None:
                return
            run.note_rss(message)
            if worker == 0 and trace:
                run.shares = message.get("shares") or {}
            elif worker == 0:
                run.bursts.append(message)

    @staticmethod
    def _receive(run: CaseRun, worker: int, deadline: float, what: str) -> Optional[Dict]:
        try:
            message = run.channels[worker].receive(deadline)
        except TimeoutError:
            run.fail(f"timed out in {what}")
            return None
        if message is None:
            try:
                code = run.procs[worker].wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                code = "none yet"
            run.fail(f"process {worker} closed its pipe (exit code {code}) before the end of {what}")
            return None
        return message

    def _launch(self, run: CaseRun, spec: Dict, name: str, extra_env: Dict, log):
        channel = Channel()
        path = os.path.join(self.work_dir, "specs", f"{name}.json")
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("TF_CONFIG", None)
        if spec["tf_defaults"]:
            env.pop(ONEDNN, None)
        else:
            env.setdefault(ONEDNN, ONEDNN_DEFAULT)  # as `estimator-dist train` runs
        env.update(extra_env)
        argv = [sys.executable, "-c", "from estimator_dist.bench.main import child_main; child_main()",
                path]
        spec = dict(spec, t0=time.monotonic(), control_fds=list(channel.child_fds()))
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        run.procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          pass_fds=channel.child_fds()))
        channel.launched()
        run.channels.append(channel)
