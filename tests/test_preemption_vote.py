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
