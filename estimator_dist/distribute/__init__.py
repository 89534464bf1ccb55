"""Strategy specs (one table entry per --strategy), devices, TF_CONFIG, Horovod ranks."""
