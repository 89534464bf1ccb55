"""Command line: argv -> config -> one call; exit codes (the entry point is cli.main.main)."""
