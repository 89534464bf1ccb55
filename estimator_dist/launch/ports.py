"""Loopback ports for the tasks of a local cluster, held by the launcher until it releases them.

The usual way to find a free port, bind port 0 and close the socket, leaves a window
between the close and the task's own bind in which the kernel may hand the same port
to another process: a second launcher's bind to port 0, or any outgoing connection (its
source port). Two clusters side by side (two test workers, two users on one machine)
then start a task on a port that is taken.

So a port here stays bound by this process from the moment it is chosen until
`release_ports`: the socket is bound with SO_REUSEADDR and never listens. TensorFlow's
gRPC server binds with SO_REUSEADDR too (and turns SO_REUSEPORT off: a port held with
SO_REUSEPORT alone made it fail, "Address already in use"; measured), so the task binds
and listens on the held port; any other bind of it (one without SO_REUSEADDR, a bind to
port 0) is refused, and the kernel gives it to no outgoing connection. Whoever binds a
port from here binds it with SO_REUSEADDR (gRPC, bench/comm.py's ring,
tf_config.check_own_port).
"""
import socket
import threading
from typing import Dict, Iterable, List

LOOPBACK = "127.0.0.1"

_held: Dict[int, socket.socket] = {}
_lock = threading.Lock()


def free_ports(n: int) -> List[int]:
    """n distinct loopback ports for tasks to listen on, held by this process (a bound
    socket that never listens) until release_ports() or its exit."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the task binds it
            s.bind((LOOPBACK, 0))
    except OSError:
        for s in sockets:
            s.close()
        raise
    with _lock:
        _held.update({s.getsockname()[1]: s for s in sockets})
    return [s.getsockname()[1] for s in sockets]


def release_ports(ports: Iterable[int]):
    """Stop holding these ports (those not held here are ignored): once their tasks are gone."""
    with _lock:
        sockets = [_held.pop(port, None) for port in ports]
    for s in sockets:
        if s is not None:
            s.close()


def held(port: int) -> bool:
    """Whether this process holds `port` (free_ports, not yet released)."""
    with _lock:
        return port in _held
