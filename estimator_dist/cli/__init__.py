"""Command line: argv -> config -> one call; exit codes."""
from estimator_dist.cli.main import main

__all__ = ["main"]
