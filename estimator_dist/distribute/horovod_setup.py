"""What a Horovod launch needs to know before any rank starts; imports no TensorFlow.

The ranks check the whole install themselves (horovod.require: its TensorFlow ops, gloo)
and exit 2 with one line; the launcher only checks that Horovod is there at all.
"""
import importlib.util

from estimator_dist.errors import UserError

INSTALL = ("install it with `make horovod` or `HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 "
           "HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 "
           "HOROVOD_CPU_OPERATIONS=gloo pip install --no-build-isolation horovod==0.28.1` "
           "(TensorFlow first), or choose another --strategy")
RANK_VARIABLES = ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE")
RENDEZVOUS = "HOROVOD_GLOO_RENDEZVOUS_ADDR"


def not_installed() -> UserError:
    return UserError(f"--strategy horovod: Horovod is not installed; {INSTALL}")


def require_installed():
    """A one-line UserError when Horovod is not installed (without importing it: importing
    horovod.tensorflow loads TensorFlow)."""
    try:
        found = importlib.util.find_spec("horovod") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise not_installed()
