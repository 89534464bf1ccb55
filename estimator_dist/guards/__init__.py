"""What keeps a run safe: the training guard, preemption, lost peers, storage and memory checks,
the model_dir lock."""
