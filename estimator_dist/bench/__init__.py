"""The interleaved benchmark: cases, case processes, the all-reduce cost."""
