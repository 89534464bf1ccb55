"""Memory: variables that can never fit are refused while the TRAIN graph is built; a tensor
TensorFlow could not allocate becomes one line naming it (guards.TrainingGuard)."""
import contextlib
import os
import re
import resource
from typing import Optional, Tuple

import tensorflow as tf

from estimator_dist.errors import OutOfMemory, UserError, message, op_error_line


# A constant TensorFlow could not materialize: Grappler folds a large tf.ones/tf.zeros
# initializer into a Const node holding one value, and the kernel that expands it reports
# a failed allocation as InvalidArgumentError (measured: digits, --set filters=100000000).
UNPARSED_CONSTANT = "Cannot parse tensor from proto"
SHOWN_VARIABLES = 3  # largest variables named when they do not fit


def is_out_of_memory(error: BaseException) -> bool:
    """A TensorFlow allocation failure: ResourceExhaustedError ("OOM when allocating tensor"),
    or a folded constant whose tensor could not be allocated."""
    return isinstance(error, tf.errors.ResourceExhaustedError) or (
        isinstance(error, tf.errors.InvalidArgumentError) and
        UNPARSED_CONSTANT in message(error))


def _failed_allocation(error: tf.errors.OpError) -> str:
    """What could not be allocated, in one line: TensorFlow's OOM line, or for a folded
    constant its node and shape (the message spreads them over many lines)."""
    text = message(error)
    if UNPARSED_CONSTANT not in text:
        return f"{op_error_line(error)} ({type(error).__name__})"
    shape = re.search(r"tensor_shape \{(.*?)\n\}", text.split(UNPARSED_CONSTANT, 1)[1], re.S)
    dims = re.findall(r"size: (\d+)", shape.group(1)) if shape else []
    node = re.search(r"\{\{node ([^}]+)\}\}", text)
    named = f"'{node.group(1)}' " if node else ""
    return (f"the constant {named}of shape [{', '.join(dims)}] could not be allocated "
            f"({type(error).__name__}: {UNPARSED_CONSTANT})")


def out_of_memory(error: tf.errors.OpError, step: Optional[int],
                  latest: Optional[str]) -> OutOfMemory:
    """One line for a tensor TensorFlow could not allocate: where (the variables' initialization
    or restore, when no step has run, else the step), the tensor, and what makes it smaller.

    step: the global step the session started from (GuardHook.step), None before it exists.
    """
    where = ("before the first step (initializing the variables)" if step is None
             else f"at step {step + 1}")
    return OutOfMemory(
        f"out of memory {where}: {_failed_allocation(error)}; lower --batch_size or the "
        f"model's size hparams (--set ...; 'estimator-dist list' shows them); "
        f"{f'the latest checkpoint is {latest}' if latest else 'no checkpoint was written'}"
        f"; --verbose shows TensorFlow's traceback")


def memory_limit() -> Optional[Tuple[int, str]]:
    """(bytes, what sets them): the most memory this process can ever hold, or None if unknown.

    RAM plus swap (/proc/meminfo; else the physical pages), or the address-space limit
    (ulimit -v) when that is lower. A total, not what is free now: what exceeds it can
    never fit, whatever other processes give back.
    """
    limits = []
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        limits.append((soft, "the address-space limit (ulimit -v)"))
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            kib = dict(line.split(":", 1) for line in f)
        total = sum(int(kib[key].split()[0]) * 1024 for key in ("MemTotal", "SwapTotal"))
        limits.append((total, "this machine's memory (RAM and swap)"))
    except (OSError, KeyError, ValueError):
        try:
            limits.append((os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
                           "this machine's memory"))
        except (ValueError, OSError, AttributeError):
            pass
    return min(limits) if limits else None


def _size(n: float) -> str:
    """Bytes in binary units: 1.5 TiB."""
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if n < 1024 or unit == "EiB":
            break
        n /= 1024
    return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"


def _bytes(variable) -> int:
    count = variable.shape.num_elements()
    return 0 if count is None else count * variable.dtype.base_dtype.size


def _name(variable) -> str:
    return variable.name.rsplit(":", 1)[0]


def check_variables_fit(variables, limit: Optional[Tuple[int, str]] = None,
                        so_far: bool = False):
    """UserError when the variables (the model's, the optimizer's, local ones; one copy)
    alone need more bytes than `limit` (default memory_limit()).

    so_far: `variables` are those created so far; the graph will hold more ("at least").

    TensorFlow would try: it filled 10 GB of RAM in 30 s before failing with a misleading
    error for digits --set filters=100000000 (variables of 1.5 TiB), and crashed with
    a segmentation fault under ulimit -v (a std::bad_alloc in a session run; measured).
    """
    limit = limit or memory_limit()
    if limit is None:
        return
    sizes = [(_bytes(v), _name(v), v.shape.as_list()) for v in variables
             if v.shape.num_elements() is not None]
    total = sum(size for size, _, _ in sizes)
    if total <= limit[0]:
        return
    largest = ", ".join(f"'{name}' {shape} {_size(size)}" for size, name, shape in
                        sorted(sizes, key=lambda s: -s[0])[:SHOWN_VARIABLES])
    need = f"{'at least ' if so_far else ''}{_size(total)}"
    raise UserError(f"out of memory: the model's variables need {need} (the largest: {largest}), "
                    f"more than {limit[1]}, {_size(limit[0])}; lower the model's size hparams "
                    f"(--set ...; 'estimator-dist list' shows them)")


@contextlib.contextmanager
def variables_checked(limit: Optional[Tuple[int, str]] = None):
    """Around a TRAIN graph's model_fn: check_variables_fit as each variable is created, and
    on the whole graph's variables (optimizer slots included) when it returns.

    Before anything is sized by them: under mirrored strategies the optimizer packs every
    gradient for its all-reduce with int32 sizes, and digits --set filters=100000000 failed
    there with a ValueError traceback ("Split size ... must be >= 0"; measured) before any
    session. Counted once per variable (a replica or tower reusing one adds nothing).
    """
    limit = limit or memory_limit()
    created, seen, total = [], set(), [0]

    def creator(next_creator, **kwargs):
        variable = next_creator(**kwargs)
        if id(variable) not in seen:
            seen.add(id(variable))
            created.append(variable)
            total[0] += _bytes(variable)
            if limit is not None and total[0] > limit[0]:
                check_variables_fit(created, limit, so_far=True)
        return variable

    with tf.compat.v1.variable_creator_scope(creator):
        yield
    if limit is not None:
        check_variables_fit(tf.compat.v1.global_variables() + tf.compat.v1.local_variables(),
                            limit)


def example_bytes(element_spec) -> Optional[int]:
    """Bytes of one example of a batched dataset's element (at least: an unknown dimension
    counts 1, a string 0), or None if no component is a tensor batched along its first axis."""
    total, batched = 0, False
    for spec in tf.nest.flatten(element_spec):
        if not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None or spec.shape.rank < 1:
            continue
        batched = True
        count = 1
        for dim in spec.shape.as_list()[1:]:
            count *= dim or 1
        total += count * spec.dtype.size
    return total if batched else None


def _batch_dims(element_spec):
    return {spec.shape.as_list()[0] for spec in tf.nest.flatten(element_spec)
            if isinstance(spec, tf.TensorSpec) and spec.shape.rank}


def batch_flag(params):
    """(--batch_size as the user gave it, with the per-replica batch when they differ;
    replicas per input_fn call) from params["batch_size"] and params["global_batch_size"]."""
    batch = int(params["batch_size"])
    global_batch = int(params.get("global_batch_size") or batch)
    replicas = max(1, global_batch // batch)
    given = str(global_batch) if replicas == 1 else f"{global_batch} ({batch} per replica)"
    return given, replicas


def check_batch_fits(data, params, input_name: str, limit: Optional[Tuple[int, str]] = None):
    """UserError when one training batch of the dataset `data`, params["batch_size"]
    examples, needs more bytes than `limit` (default memory_limit()): it can never be built.

    For any input, a user's included, whose size is unknown: tf.data fills a repeated
    dataset's batch from as many epochs as it takes, and --batch_size 100000000 of
    64-float examples (26 GB) grew for minutes without a first step (measured). Skipped
    for what is not a tf.data.Dataset, and for a dataset batched by another size than
    params["batch_size"] (its first dimension fixed to that other size).
    params["batch_size"] is one input_fn call's batch (per replica),
    params["global_batch_size"] the --batch_size it came from.
    """
    batch = int(params.get("batch_size") or 0)
    if not isinstance(data, tf.data.Dataset) or batch <= 0:
        return
    dims = _batch_dims(data.element_spec)
    if dims and None not in dims and batch not in dims:
        return
    per_example = example_bytes(data.element_spec)
    limit = limit or memory_limit()
    if not per_example or limit is None or per_example * batch <= limit[0]:
        return
    given, replicas = batch_flag(params)
    raise UserError(f"--batch_size {given}: one training batch of input '{input_name}' needs "
                    f"{_size(per_example * batch)} ({per_example:,} bytes an example), more "
                    f"than {limit[1]}, {_size(limit[0])}; use at most "
                    f"{limit[0] // per_example * replicas:,}")
