"""Ports for local tasks (launch/ports.py): held from the moment they are chosen until released,
so that nothing else on the machine (another cluster, an outgoing connection) takes one
before its task listens; the task itself binds it as TensorFlow's gRPC server does."""
import errno
import socket
import sys

import pytest

from estimator_dist.launch import ports as ports_lib
from estimator_dist.launch import supervisor as launcher


def bind(port, reuse):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("", port))
    return s


def test_a_held_port_is_refused_to_anyone_else_until_released():
    (port,) = launcher.free_ports(1)
    try:
        with pytest.raises(OSError) as refused:
            bind(port, reuse=False)
        assert refused.value.errno == errno.EADDRINUSE
        # A bind to port 0 (another launcher's free_ports, with or without SO_REUSEADDR) is
        # never handed the held port.
        others = [bind(0, reuse=i % 2 == 0) for i in range(200)]
        assert port not in {s.getsockname()[1] for s in others}
        for s in others:
            s.close()
    finally:
        launcher.release_ports([port])
    assert not ports_lib.held(port)
    bind(port, reuse=False).close()  # free again


def test_the_task_binds_and_listens_on_its_held_port():
    """As gRPC binds (SO_REUSEADDR on the wildcard address): the hand-over has no window."""
    ports = launcher.free_ports(2)
    try:
        assert len(set(ports)) == 2 and all(ports_lib.held(p) for p in ports)
        server = bind(ports[0], reuse=True)
        server.listen(1)
        with socket.create_connection((launcher.LOOPBACK, ports[0]), timeout=5):
            assert launcher.listening(ports[0])
        server.close()
    finally:
        launcher.release_ports(ports)


def test_the_supervisor_releases_its_tasks_ports_when_the_run_ends():
    (port,) = launcher.free_ports(1)
    quick = [sys.executable, "-c", "pass"]
    task = launcher.Task("chief:0", quick, "{}", port)
    supervisor = launcher.Supervisor([task], whole_restart=False, max_restarts=0,
                                     startup_timeout=60, emit=lambda line: None)
    assert supervisor.run() == 0
    assert not ports_lib.held(port)
