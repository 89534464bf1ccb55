"""What the gradient all-reduce costs a multi-worker step: two bench cases that measure it.

`comm` (the model `bench_comm`): the project's own training step for a bench model
(`--set like=bench_mlp` or `cifar`) without the model: the same trainable variables,
optimizer, guard and update, under a loss that costs next to nothing. Under
multi_worker_mirrored, its step with 2 workers less its step with 1 worker is what
TensorFlow's collective all-reduce (gRPC) adds to every step.

`tcp` (`run_ring`): a ring all-reduce of the same float32 gradient bytes over loopback
TCP with nothing else (sockets and NumPy's add, no serialization, no framework): the
floor that any TCP transport pays on this machine. Both go through the bench's Clock,
so they run interleaved with the real model's cases.

With one core per worker nothing overlaps the all-reduce, so a 2-worker step costs at
least the 1-worker step plus the all-reduce, which bounds the scaling efficiency at
step / (step + all-reduce) (bench.BOUNDS).
"""
import functools
import os
import queue
import socket
import threading
import time

import numpy as np
import tensorflow as tf

from estimator_dist.bench import cases as bench_cases
from estimator_dist.errors import UserError
from estimator_dist.launch.supervisor import LOOPBACK
from estimator_dist.training.registry import register_model
from estimator_dist.graph.train_op import minimize

# The registered names of the bench's models -> bench_cases' keys.
LIKE = {"bench_mlp": "mlp", "cifar": "cifar"}
OPTIMIZER_HPARAMS = ("optimizer", "learning_rate", "momentum", "lr_schedule")
CONNECT_TIMEOUT_S = 120.0
ModeKeys = tf.estimator.ModeKeys


@functools.lru_cache(maxsize=None)
def trainable_shapes(model: str):
    """Shapes of a bench model's trainable variables: the gradients all-reduced every step."""
    graph = tf.Graph()
    with graph.as_default():
        features = {"image": tf.compat.v1.placeholder(tf.float32, (None,) + bench_cases.IMAGE_SHAPE)}
        labels = tf.compat.v1.placeholder(tf.int64, (None,))
        params = {**bench_cases.hparams_for(model), "batch_size": 1, "train_steps": 1,
                  "num_classes": bench_cases.NUM_CLASSES}
        bench_cases.model_fn_for(model)(features, labels, ModeKeys.TRAIN, params)
        return tuple(tuple(v.shape.as_list()) for v in tf.compat.v1.trainable_variables())


def gradient_floats(model: str) -> int:
    return int(sum(np.prod(shape, dtype=np.int64) for shape in trainable_shapes(model)))


def bench_model(like: str) -> str:
    if like not in LIKE:
        raise UserError(f"--set like={like}: bench_comm copies one of {', '.join(sorted(LIKE))}; "
                        f"fix it with --set like=bench_mlp")
    return LIKE[like]


@register_model("bench_comm", hparams={"like": "bench_mlp"}, default_input="bench_memory",
                run_defaults={"batch_size": 256, "train_steps": 2000})
def comm_model_fn(features, labels, mode, params):
    """`like`'s step without its model: its trainable variables, optimizer and update, and a
    loss that reads the batch but costs next to nothing (each gradient is a fill)."""
    model = bench_model(params["like"])
    images = features["image"] if isinstance(features, dict) else features
    variables = [tf.compat.v1.get_variable(f"v{i}", shape, initializer=tf.compat.v1.zeros_initializer())
                 for i, shape in enumerate(trainable_shapes(model))]
    loss = 1e-6 * tf.add_n([tf.reduce_sum(v) for v in variables]) + \
        0.0 * tf.reduce_mean(tf.cast(images, tf.float32))
    if mode == ModeKeys.PREDICT:
        predictions = {"mean": tf.reduce_mean(tf.cast(images, tf.float32), axis=[1, 2, 3])}
        return tf.estimator.EstimatorSpec(
            mode, predictions=predictions,
            export_outputs={"serving_default": tf.estimator.export.PredictOutput(predictions)})
    if mode == ModeKeys.EVAL:
        return tf.estimator.EstimatorSpec(mode, loss=loss)
    hparams = bench_cases.hparams_for(model)
    optimizer = {k: hparams[k] for k in OPTIMIZER_HPARAMS if k in hparams}
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=minimize(loss, {**params, **optimizer}))


class Ring:
    """Rank r of a TCP ring on the loopback: listens on ports[r], sends to rank r + 1."""

    def __init__(self, rank: int, ports):
        self.rank, self.size = rank, len(ports)
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((LOOPBACK, ports[rank]))
        listener.listen(1)
        self.right = self._connect(ports[(rank + 1) % self.size])
        self.left, _ = listener.accept()
        listener.close()
        for s in (self.left, self.right):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._outbox = queue.Queue()
        self._sent = queue.Queue()
        threading.Thread(target=self._send_loop, daemon=True).start()

    @staticmethod
    def _connect(port: int) -> socket.socket:
        deadline = time.monotonic() + CONNECT_TIMEOUT_S
        while True:
            try:
                return socket.create_connection((LOOPBACK, port))
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def _send_loop(self):
        while True:
            try:
                self.right.sendall(self._outbox.get())
            except OSError as e:  # handed to exchange(), which would otherwise wait forever
                self._sent.put(e)
                return
            self._sent.put(None)

    def exchange(self, send: np.ndarray, receive: np.ndarray):
        """Send `send` to the right while filling `receive` from the left."""
        self._outbox.put(memoryview(send).cast("B"))
        view, got = memoryview(receive).cast("B"), 0
        while got < len(view):
            n = self.left.recv_into(view[got:])
            if not n:
                raise ConnectionError("the ring's left neighbour closed its socket")
            got += n
        error = self._sent.get()
        if error is not None:
            raise ConnectionError(f"the ring's right neighbour is gone: {error}")

    def all_reduce(self, chunks, scratch):
        """Sum `chunks` (this rank's gradient, cut in `size` pieces) over the ring, in place:
        size - 1 reduce-scatter steps, then size - 1 all-gather steps."""
        n, r = self.size, self.rank
        for s in range(n - 1):
            i = (r - s - 1) % n
            got = scratch[:len(chunks[i])]
            self.exchange(chunks[(r - s) % n], got)
            np.add(chunks[i], got, out=chunks[i])
        for s in range(n - 1):
            self.exchange(chunks[(r + 1 - s) % n], chunks[(r - s) % n])


def run_ring(spec, clock) -> int:
    """The bare TCP ring all-reduce of the model's gradient floats, once per step."""
    ports = [int(p) for p in os.environ["BENCH_RING_PORTS"].split(",")]
    ring = Ring(int(spec["worker"]), ports)
    gradient = np.zeros(gradient_floats(spec["model"]), np.float32)  # zeros: sums stay finite
    chunks = np.array_split(gradient, ring.size)
    scratch = np.empty(max(len(c) for c in chunks), np.float32)
    for _ in range(int(spec["train_steps"])):
        ring.all_reduce(chunks, scratch)
        clock.step_done()
    return 0
