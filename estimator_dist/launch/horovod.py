"""`cluster --launcher horovod`: N Horovod ranks on 127.0.0.1 under the cluster Supervisor.

This does what `horovodrun --gloo` does on one host (horovod.runner.gloo_run):
a gloo rendezvous server (Horovod's own RendezvousHTTPServer, here bound to
127.0.0.1 rather than every interface) and HOROVOD_* variables per rank. The
ranks are then ordinary Supervisor tasks, so output prefixes (`[rank:0]`,
`[launcher]`), exit codes, Ctrl-C/SIGTERM handling and the watchdog are those of
the TF_CONFIG launcher. A rank that dies takes the job with it (its peers would
wait for it in the next all-reduce), so any death restarts every rank from the
last checkpoint, at most --max_restarts times, then the run ends with exit code 3.
"""
import sys
import threading
from typing import List, Set, Tuple

from estimator_dist.distribute import horovod_setup
from estimator_dist.launch import supervisor as launcher
from estimator_dist.errors import UserError
from estimator_dist.distribute import role as role_lib

HOST = "localhost"  # the host name the ranks and the rendezvous agree on
WORKERS_EXIT_TIMEOUT = 60.0


def loopback_interface() -> str:
    """The network interface holding 127.0.0.1, for gloo (lo on Linux, lo0 on macOS)."""
    import psutil

    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address == launcher.LOOPBACK for a in addresses):
            return name
    return "lo"


class Rendezvous:
    """Horovod's gloo rendezvous (a key-value HTTP server) on 127.0.0.1, for one host.

    It remembers which ranks have written their address, which tells the
    Supervisor that a rank is up.
    """

    def __init__(self, size: int):
        from horovod.runner.common.util import hosts
        from horovod.runner.http import http_server

        seen: Set[Tuple[str, str]] = set()
        lock = threading.Lock()

        class Handler(http_server.RendezvousHandler):
            def do_PUT(self):  # noqa: N802 - http.server's naming
                _, scope, key = (self.path.split("/") + ["", ""])[:3]
                with lock:
                    seen.add((scope, key))
                super().do_PUT()

        self.size = size
        self._seen, self._lock = seen, lock
        self._plan = hosts.get_host_assignments(hosts.parse_hosts(f"{HOST}:{size}"), size)
        self._server = http_server.RendezvousHTTPServer((launcher.LOOPBACK, 0), Handler, 0)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.reset()

    def reset(self):
        """Forget the last job's keys: a restarted job meets afresh."""
        with self._lock:
            self._seen.clear()
        self._server.init(self._plan)

    def reached(self, rank: int) -> bool:
        with self._lock:
            return any(scope.startswith("global") and key == str(rank)
                       for scope, key in self._seen)

    def rank_env(self, rank: int, iface: str):
        slot = self._plan[rank]
        return {
            "HOROVOD_HOSTNAME": slot.hostname,
            "HOROVOD_RANK": str(slot.rank),
            "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank),
            "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank),
            "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "HOROVOD_GLOO_RENDEZVOUS_ADDR": launcher.LOOPBACK,
            "HOROVOD_GLOO_RENDEZVOUS_PORT": str(self.port),
            "HOROVOD_CONTROLLER": "gloo",
            "HOROVOD_CPU_OPERATIONS": "gloo",
            "HOROVOD_GLOO_IFACE": iface,
        }

    def stop(self):
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def build_tasks(train_args: List[str], rendezvous: Rendezvous, iface: str,
                python: str = sys.executable) -> List[launcher.Task]:
    """One task per rank: rank 0 is the chief (it writes, evaluates, exports)."""
    argv = [python, "-m", "estimator_dist", "train"] + list(train_args)
    return [launcher.Task(f"rank:{r}", argv, tf_config="", env=rendezvous.rank_env(r, iface),
                          ready=lambda r=r: rendezvous.reached(r),
                          kind=role_lib.kind_of_rank(r))
            for r in range(rendezvous.size)]


def launch(train_args: List[str], workers: int, evaluator: bool, max_restarts: int,
           startup_timeout: float, emit=print) -> int:
    """Run `workers` ranks to completion; returns rank 0's exit code (or 3 / 130)."""
    if evaluator:
        raise UserError("--evaluator: under --launcher horovod rank 0 evaluates and exports; "
                        "drop --evaluator")
    horovod_setup.require_installed()
    rendezvous = Rendezvous(workers)
    iface = loopback_interface()

    def fresh():
        rendezvous.reset()
        return build_tasks(train_args, rendezvous, iface)

    supervisor = launcher.Supervisor(fresh(), whole_restart=True, max_restarts=max_restarts,
                                     startup_timeout=startup_timeout, emit=emit, relaunch=fresh,
                                     workers_exit_timeout=WORKERS_EXIT_TIMEOUT)
    launcher.install_signal_handlers()
    try:
        return supervisor.run()
    finally:
        rendezvous.stop()
