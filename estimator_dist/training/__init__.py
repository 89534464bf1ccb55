"""A training run: plan, roles, user-code checks, model_fn/input_fn wrapping, preflight checks,
the run and its summary; config, registry, hooks, checkpoints, the evaluator task."""
