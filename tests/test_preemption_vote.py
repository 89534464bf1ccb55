"""The vote's arithmetic; the votes themselves run in test_cluster.py (real processes)."""
from estimator_dist.launch import supervisor as launcher
from estimator_dist.guards import signals
from estimator_dist.guards import preemption_vote
from estimator_dist.guards.preemption_vote import MAX_VOTE_STEPS, VOTE_EVERY_S, steps_to_next_vote


def test_votes_come_about_every_vote_every_s_at_the_mean_step_time():
    # 2 replicas summed 2.0 s over 10 steps: 0.1 s a step.
    assert steps_to_next_vote(2.0, 2, 10) == round(VOTE_EVERY_S / 0.1)
    assert steps_to_next_vote(2.0 * 30, 2, 10) == 1  # 3 s steps: vote after every step
    assert steps_to_next_vote(1e-9, 2, 10) == MAX_VOTE_STEPS
    assert steps_to_next_vote(0.0, 2, 10) == MAX_VOTE_STEPS
    assert steps_to_next_vote(1.0, 0, 0) >= 1  # no division by zero


def test_the_launcher_waits_longer_than_a_task_takes_to_save_and_exit_on_sigterm():
    assert launcher.STOP_GRACE_SECONDS > signals.PEER_DEADLINE_S
    assert signals.PEER_DEADLINE_S > preemption_vote.VOTE_EVERY_S


class RawSession:
    """What ExitAfterTheVoteHook wraps: the raw session's close."""

    def __init__(self, calls):
        self.calls = calls

    def close(self):
        self.calls.append("tensorflow's close")


def closed_after(stopped_at, monkeypatch, tmp_path, failing=False):
    """Close a session ExitAfterTheVoteHook saw created; what ran, in order."""
    calls = []
    monkeypatch.setattr(signals, "exit_now",
                        lambda error: calls.append(f"exit {error.exit_code}: {error}"))
    vote = preemption_vote.VoteHook(workers=2)
    vote.stopped_at, vote.signalled, vote.signalled_workers = stopped_at, True, 1
    (tmp_path / "model.ckpt-12.index").write_text("")
    (tmp_path / "checkpoint").write_text('model_checkpoint_path: "model.ckpt-12"\n')
    session = RawSession(calls)
    preemption_vote.ExitAfterTheVoteHook(vote, True, str(tmp_path)).after_create_session(
        session, None)
    if not failing:
        session.close()
        return calls
    try:
        raise OSError("a save that failed on the way out")
    except OSError:
        session.close()  # MonitoredSession's close in a finally: the guard says the failure
    return calls


def test_a_vote_stop_exits_before_tensorflows_session_close(monkeypatch, tmp_path):
    """TensorFlow's close of a GrpcSession waited 8.7 to over 20 s for tf.data's
    autotuning thread, past the peer deadline: the task exits before it."""
    calls = closed_after(12, monkeypatch, tmp_path)
    assert calls[0].startswith("exit 143: SIGTERM at step 12: every worker stopped there "
                               "(1 got SIGTERM); saved ") and calls[0].count("model.ckpt-12")
    assert calls[1:] == ["tensorflow's close"]  # only here, where exit_now does not exit


def test_other_ends_close_the_session_as_tensorflow_does(monkeypatch, tmp_path):
    assert closed_after(None, monkeypatch, tmp_path) == ["tensorflow's close"]
    assert closed_after(12, monkeypatch, tmp_path, failing=True) == ["tensorflow's close"]
