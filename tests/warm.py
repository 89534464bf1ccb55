"""The CLI's processes started warm: forks of a process that already imported TensorFlow.

A test's `python -m estimator_dist ...` spends about 3 CPU-seconds importing TensorFlow
before it parses a flag (2.5-3 s measured per process on the 2-core machine; some 200 test
processes: a quarter of the suite's CPU). Each pytest worker starts one server (this file
run as a script) that does what every CLI process does before it parses its arguments (the
quiet configuration, TensorFlow's import, no session, no thread of ours) and then waits. For
each run a test asks for, it forks: the child takes the test's argv, environment, working
directory and standard streams, resets what a fresh interpreter has, and runs the
`estimator_dist` module as `python -m` does, to the interpreter's own exit. So the run is a
process of its own (real signals, exit code, pid, output), the same code from
`estimator_dist/__main__.py` on; only the import is shared. A warm launcher (`cluster`, the
elastic and Horovod launchers) and a warm `bench` start their tasks and cases from the same
server (WarmSubprocess): some 150 more processes of the suite; the server does what the
launcher's preexec_fn does (SIGTERM to its tasks when it ends). A test of the task start
itself starts the launcher cold, and so its tasks.

Cold (a new interpreter, as before) when the run differs before that point: `--verbose`
(TensorFlow's C++ log level is read at its import), an environment whose import-time
variables (IMPORT_TIME) differ from the server's, or ESTIMATOR_DIST_TEST_WARM=0 for the whole
suite. The children of a worker's server share one hash seed (PYTHONHASHSEED), drawn at the
server's start: a test that compares runs for an order string hashing could change starts
them cold (`cold=True`).
"""
import fcntl
import gc
import io
import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ENV = "ESTIMATOR_DIST_TEST_WARM"
# Read while TensorFlow is imported (or by the interpreter at its start): a run whose values
# differ starts cold. The CLI sets TF_ENABLE_ONEDNN_OPTS to 1 when unset (cli/main.py).
IMPORT_TIME = ("TF_ENABLE_ONEDNN_OPTS", "TF_CPP_MIN_VLOG_LEVEL", "TF_CPP_VMODULE",
               "TF2_BEHAVIOR", "TF_USE_LEGACY_KERAS", "KERAS_BACKEND", "LD_PRELOAD",
               "LD_LIBRARY_PATH", "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONIOENCODING",
               "PYTHONUTF8", "LANG", "LC_ALL", "LC_CTYPE", "PYTHONSAFEPATH", "PYTHONHOME")
DEFAULTS = {"TF_ENABLE_ONEDNN_OPTS": "1"}


def import_time_values(env) -> dict:
    return {k: env.get(k, DEFAULTS.get(k)) for k in IMPORT_TIME}


# --- the server (a pytest worker's child) ---------------------------------------------------

def serve(path: str):
    """Prepare as a CLI process does, then fork a child per request; only children return
    (the request), the server itself exits when its pytest worker does."""
    values = import_time_values(os.environ)  # before the import (TensorFlow sets some)
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")  # as cli/main.py, before the import
    from estimator_dist import quiet

    quiet.configure(verbose=False)
    gc.freeze()  # the import's objects: no collection in a child walks (and copies) them
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # wakes select through the fd above
    added = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    base_path = [p for p in sys.path[1:] if p not in added]  # [0]: this file's directory
    print(json.dumps({"values": values}), flush=True)
    children = {}  # pid -> the connection of the process that asked for it
    parents = {}  # a launcher's pidfd -> (its pid, its tasks' pids): die_with
    cpu = [0.0, os.path.join(os.path.dirname(path), CPU_FILE)]
    while True:
        ready, _, _ = select.select([sys.stdin, listener, wake_r, *parents], [], [])
        if sys.stdin in ready and not os.read(0, 512):  # the pytest worker is gone
            return None, None
        if wake_r in ready:
            os.read(wake_r, 512)
            _report_ended(children, cpu)
        for pidfd in [fd for fd in parents if fd in ready]:  # a launcher ended
            _signal_alive(parents.pop(pidfd)[1], children)
            os.close(pidfd)
        if listener in ready:
            conn, _ = listener.accept()
            request, fds = _receive(conn)
            request.update(base_path=base_path, server={"path": path, "values": values})
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for sock in [listener, conn, *children.values()]:
                    sock.close()
                for fd in [wake_r, wake_w, *parents]:
                    os.close(fd)
                if request.get("session"):
                    os.setsid()
                return request, fds
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            if request.get("die_with"):
                _die_with(request["die_with"], pid, parents, children)


def _receive(conn):
    data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 16)
    while not data.endswith(b"\n"):
        more = conn.recv(1 << 20)
        if not more:
            break
        data += more
    return json.loads(data), fds


def _die_with(parent, pid, parents, children):
    """What the launcher's preexec_fn (supervisor.die_with_parent: PR_SET_PDEATHSIG) does for
    a task it forks: SIGTERM to the task when `parent` ends, or now if it already has."""
    for launcher, pids in parents.values():
        if launcher == parent:
            pids.append(pid)
            return
    try:
        parents[os.pidfd_open(parent)] = (parent, [pid])
    except ProcessLookupError:
        _signal_alive([pid], children)


def _signal_alive(pids, children):
    for pid in pids:
        if pid in children:  # not yet reaped: its pid is still its own
            os.kill(pid, signal.SIGTERM)


def _report_ended(children, cpu):
    while children:
        try:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is None:
            continue
        cpu[0] += usage.ru_utime + usage.ru_stime
        with open(cpu[1] + ".new", "w") as f:  # before the status: a waiter reads it after
            f.write(f"{cpu[0]:.3f}")
        os.replace(cpu[1] + ".new", cpu[1])
        try:
            conn.sendall(json.dumps({"status": status}).encode() + b"\n")
        except OSError:  # the test is gone
            pass
        conn.close()


def become(request, fds):
    """In the forked child: the process `python -m estimator_dist ARGS` would be by now."""
    env = request["env"]
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(env)
    tempfile.tempdir = None  # found again from this environment's TMPDIR at first use
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
        os.close(fd)
    # pass_fds: at the numbers the parent gave (in the spec it wrote), out of each other's way
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in fds[3:]]
    for fd in fds[3:]:
        os.close(fd)
    for fd, target in zip(moved, request["pass_fds"]):
        os.dup2(fd, target)
        os.close(fd)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = sys.__stdin__ = _text(0, "r", encoding, errors, False)
    sys.stdout = sys.__stdout__ = _text(1, "w", encoding, errors, unbuffered)
    sys.stderr = sys.__stderr__ = _text(2, "w", encoding, "backslashreplace", True)
    sys.dont_write_bytecode = bool(env.get("PYTHONDONTWRITEBYTECODE"))
    # sys.path as `python -m` builds it: the working directory, PYTHONPATH, then the rest.
    added = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [os.getcwd(), *added, *request["base_path"]]
    # runpy sets argv[0] to the module's file
    sys.argv = ["-c" if request.get("code") else "-m", *request["args"]]
    if "numpy" in sys.modules:  # a new interpreter draws its global RandomState afresh
        sys.modules["numpy"].random.seed()
    _server.update(request["server"])  # this process's own warm starts: the same server
    from estimator_dist.bench import case_runner
    from estimator_dist.launch import supervisor

    supervisor.subprocess = case_runner.subprocess = WarmSubprocess()


class WarmSubprocess:
    """`subprocess` as the project's two starters of processes see it in a warm process
    (launch/supervisor.py: a launcher's tasks, `python -m estimator_dist train ...`;
    bench/case_runner.py: the bench's cases, `python -c CODE SPEC`): their Popen starts
    warm too, as the CLI's processes do and under the same rules (can_start); the rest as
    always. Its arguments are theirs: env, stdin (DEVNULL), stdout (PIPE: bytes; a file),
    stderr (STDOUT), pass_fds, start_new_session, and preexec_fn, which is the launcher's
    die_with_parent (done by the server: SIGTERM to the task when its launcher ends)."""
    KWARGS = frozenset({"env", "stdin", "stdout", "stderr", "start_new_session", "pass_fds",
                        "preexec_fn"})

    def __getattr__(self, name):
        return getattr(subprocess, name)

    def Popen(self, argv, **kwargs):  # noqa: N802 - subprocess.Popen's name
        argv, env = [str(a) for a in argv], kwargs.get("env")
        module = argv[:3] == [sys.executable, "-m", "estimator_dist"]
        code = argv[2] if argv[:2] == [sys.executable, "-c"] and len(argv) > 2 else None
        args = argv[3:]
        if (not (module or code) or set(kwargs) - self.KWARGS
                or not can_start(args, os.environ if env is None else env)):
            return subprocess.Popen(argv, **kwargs)
        return Process(args, os.getcwd(), env, kwargs.get("stdout"), kwargs.get("stderr"),
                       text=False, session=bool(kwargs.get("start_new_session")),
                       die_with=os.getpid() if kwargs.get("preexec_fn") else None,
                       stdin=kwargs.get("stdin"), pass_fds=kwargs.get("pass_fds", ()),
                       code=code)


def _text(fd, mode, encoding, errors, write_through):
    raw = io.open(fd, mode + "b", buffering=0, closefd=False)
    if mode == "r":
        return io.TextIOWrapper(io.BufferedReader(raw), encoding=encoding, errors=errors)
    buffered = raw if write_through else io.BufferedWriter(raw)
    return io.TextIOWrapper(buffered, encoding=encoding, errors=errors,
                            line_buffering=os.isatty(fd) or fd == 2, write_through=write_through)


# --- the test's side --------------------------------------------------------------------------

_server = {}
_lock = threading.Lock()
CPU_FILE = "cpu"  # beside the socket: the CPU seconds of the server's children that ended


def ended_cpu() -> float:
    """The CPU seconds of this worker's warm processes that ended so far (cpu_report.py adds
    them: they are the server's children, not this process's), 0 before the first."""
    try:
        with open(os.path.join(os.path.dirname(_server["path"]), CPU_FILE)) as f:
            return float(f.read())
    except (KeyError, OSError, ValueError):
        return 0.0


def enabled() -> bool:
    return os.environ.get(ENV, "1") != "0"


def _start_server():
    """The worker's server, started at its first warm run: its socket's path and import-time
    values. It ends when this process does (its stdin, our pipe, reaches EOF)."""
    with _lock:
        if "path" not in _server:
            path = os.path.join(tempfile.mkdtemp(prefix="estimator-dist-warm-"), "socket")
            proc = subprocess.Popen([sys.executable, __file__, path], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the warm CLI server exited with code {proc.wait()}")
            _server.update(path=path, proc=proc, values=json.loads(line)["values"])
        return _server


def can_start(args, env) -> bool:
    """Whether `python -m estimator_dist ARGS` in `env` can start warm (module docstring)."""
    if not enabled() or "--verbose" in args:
        return False
    return import_time_values(env) == _start_server()["values"]


class Process:
    """A warm child, used as a subprocess.Popen of `cli_argv(*args)`: pid, stdout/stderr
    (PIPE: files, text unless text=False), poll(), wait(timeout), send_signal(),
    terminate(), kill(), returncode (negative: the signal that ended it). `session`: its
    own session (start_new_session); `die_with`: SIGTERM to it when process `die_with`
    ends (a launcher's task: supervisor.die_with_parent)."""

    def __init__(self, args, cwd, env, stdout=None, stderr=None, text=True, session=False,
                 die_with=None, stdin=None, pass_fds=(), code=None):
        server = _start_server()
        self.args = [sys.executable, *(["-c", code] if code else ["-m", "estimator_dist"]),
                     *args]
        self.returncode = None
        theirs = []  # the fds the child gets that are ours to close once it has them
        self.stdout = self.stderr = None
        in_fd = 0 if stdin is None else self._pipe("stdin", stdin, theirs, text, os.O_RDONLY)
        out_fd = self._pipe("stdout", stdout, theirs, text)
        err_fd = (out_fd if stderr == subprocess.STDOUT
                  else self._pipe("stderr", stderr, theirs, text))
        self._conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._conn.connect(server["path"])
        self._received = b""
        request = {"args": list(args), "code": code, "cwd": os.path.abspath(cwd),
                   "env": dict(os.environ if env is None else env), "session": session,
                   "die_with": die_with, "pass_fds": list(pass_fds)}
        socket.send_fds(self._conn, [json.dumps(request).encode() + b"\n"],
                        [in_fd, out_fd, err_fd, *pass_fds])
        for fd in theirs:
            os.close(fd)
        self.pid = self._reply(None)["pid"]

    def _reply(self, timeout):
        """The server's next line (None: not within `timeout`). What arrived is kept across
        an exception (the launcher's signal handler raises anywhere)."""
        while b"\n" not in self._received:
            if not select.select([self._conn], [], [], timeout)[0]:
                return None
            more = self._conn.recv(4096)
            if not more:
                raise RuntimeError(f"the warm CLI server dropped process {self.args}")
            self._received += more
        line, self._received = self._received.split(b"\n", 1)
        return json.loads(line)

    def _pipe(self, name, target, theirs, text, mode=os.O_WRONLY):
        """The fd the child writes `name` to (reads: stdin): a pipe's (PIPE, for stdout and
        stderr: self.NAME reads it), /dev/null's, the given file's or fd, or ours."""
        if target == subprocess.PIPE:
            r, w = os.pipe()
            setattr(self, name, os.fdopen(r, "r" if text else "rb"))
            theirs.append(w)
            return w
        if target is None:
            return 1 if name == "stdout" else 2
        if target == subprocess.DEVNULL:
            fd = os.open(os.devnull, mode)
            theirs.append(fd)
            return fd
        return target if isinstance(target, int) else target.fileno()

    def _ended(self, reply):
        if reply is not None:
            status = reply["status"]
            self.returncode = (-os.WTERMSIG(status) if os.WIFSIGNALED(status)
                               else os.WEXITSTATUS(status))
            self._conn.close()

    def poll(self):
        if self.returncode is None:
            self._ended(self._reply(0))
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self._ended(self._reply(timeout))
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout=None):
        """(the rest of stdout, of stderr) once both reach EOF and the process ended, as
        Popen.communicate: a process it left holding a pipe keeps it from EOF."""
        streams = [s for s in (self.stdout, self.stderr) if s is not None]
        texts = {}
        readers = [threading.Thread(target=lambda s=s: texts.__setitem__(s, s.read()),
                                    daemon=True) for s in streams]
        for reader in readers:
            reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for stream in streams:
            stream.close()
        return (texts.get(self.stdout) if self.stdout else None,
                texts.get(self.stderr) if self.stderr else None)

    def send_signal(self, signum):
        """As Popen.send_signal. The warm server, not this process, reaps the child, so it
        can be gone before poll() has read that it ended: no such process then means that."""
        if self.poll() is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self):
        self.send_signal(signal.SIGTERM)

    def kill(self):
        self.send_signal(signal.SIGKILL)


def run(args, cwd, env, timeout):
    """subprocess.run(cli_argv(*args), capture_output=True, text=True, timeout=...) warm."""
    proc = Process(args, cwd, env, subprocess.PIPE, subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


if __name__ == "__main__":
    _request, _fds = serve(sys.argv[1])  # returns in each forked child, and at the end
    if _request is None:
        sys.exit(0)
    become(_request, _fds)
    _code = _request.get("code")
    del _request, _fds
    if _code:  # python -c CODE: run in a __main__ namespace of its own
        exec(compile(_code, "<string>", "exec"), {"__name__": "__main__"})
    else:
        import runpy

        runpy.run_module("estimator_dist", run_name="__main__", alter_sys=True)
