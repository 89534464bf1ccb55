"""The waits a test may shorten: the same code path with shorter numbers.

Some behaviours are only seen after a wait sized for real clusters: a multi_worker_mirrored
step stalled by a lost peer ends after a minute (guards/peers.py), a preempted cluster
chief exits at the latest 20 s after SIGTERM (guards/signals.py), the launcher kills a
task 25 s after its SIGTERM (launch/supervisor.py). A test that waits them out spends
minutes on one fact. So each such timer reads its number through `seconds(name, default)`,
and the environment variable ESTIMATOR_DIST_TEST_TIMERS, set by the test suite only,
gives other numbers:

    ESTIMATOR_DIST_TEST_TIMERS="peer_stall_min_s=5,stop_grace_s=8"

It is inherited like any environment variable, so a launcher's tasks get it too. Only
the names in TIMERS are accepted, each with a number of seconds > 0; anything else ends
the command with exit code 2 and one line (`check`), so that a typo never passes as a
shorter wait. Users leave it unset: nothing else reads it.
"""
import math
import os
from typing import Dict, Mapping

from estimator_dist.errors import UserError

ENV = "ESTIMATOR_DIST_TEST_TIMERS"
# name -> where its default lives (the constant, in seconds)
TIMERS = {
    "peer_stall_min_s": "guards/peers.py PEER_STALL_MIN_S",
    "peer_deadline_s": "guards/signals.py PEER_DEADLINE_S",
    "stop_grace_s": "launch/supervisor.py STOP_GRACE_SECONDS",
    "peer_lost_settle_s": "launch/supervisor.py PEER_LOST_SETTLE_SECONDS",
    "step_end_grace_s": "guards/step_end.py STEP_END_GRACE_S",
    "session_deadline_s": "guards/peers.py SESSION_DEADLINE_S",
}


def overrides(environ: Mapping[str, str] = os.environ) -> Dict[str, float]:
    """The timers ENV sets: {name: seconds}; UserError for a name or value it may not set."""
    text = environ.get(ENV, "").strip()
    found: Dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        name = name.strip()
        if name not in TIMERS:
            raise UserError(f"{ENV} names {name!r}: not a timer; the timers are "
                            f"{', '.join(sorted(TIMERS))} (name=seconds, comma-separated), or "
                            f"unset it")
        try:
            seconds = float(value)
        except ValueError:
            seconds = float("nan")
        if not (seconds > 0 and math.isfinite(seconds)):
            raise UserError(f"{ENV} {name}={value.strip()!r}: must be a number of seconds > 0 "
                            f"(e.g. {name}=5), or unset it")
        found[name] = seconds
    return found


def seconds(name: str, default: float, environ: Mapping[str, str] = os.environ) -> float:
    """Timer `name`: `default`, unless ENV sets it."""
    if name not in TIMERS:
        raise KeyError(f"{name!r} is not in timers.TIMERS")
    return overrides(environ).get(name, default)


def check(environ: Mapping[str, str] = os.environ):
    """Refuse a bad ENV before a command starts (UserError: exit 2, one line)."""
    overrides(environ)
