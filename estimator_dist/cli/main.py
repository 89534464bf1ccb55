"""`estimator-dist` command line: parse arguments, call one function, map errors to exit codes."""
import gc
import os
import sys

from estimator_dist import errors
from estimator_dist import files
from estimator_dist import process_temp
from estimator_dist import timers
from estimator_dist.guards import signals  # no TensorFlow: set before it is imported
from estimator_dist.cli.parser import (  # noqa: F401 - the parser's names, for callers of main
    PASS_THROUGH, TRAIN_FLAGS, Parser, build_parser, subcommand)


def main(argv=None) -> int:
    code = command(argv)
    if argv is None:
        # A process of its own ends here. TensorFlow leaves millions of objects for the
        # collector's last pass at exit, about 1 CPU-second per process (0.9-1.6 s measured
        # on digits; every task of a cluster pays it): frozen, that pass skips them. Exit
        # handlers, thread joins and reference-count finalizers still run.
        gc.freeze()
    return code


def command(argv) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if argv is None:  # a process of its own, not a test's call
        process_temp.claim()  # before TensorFlow's autograph writes its first file
        if args.command == "train":
            signals.exit_on_sigterm_by_default()
    if args.command in PASS_THROUGH:
        args.train_args = rest
        args.verbose = "--verbose" in rest
    elif rest:
        subcommand(parser, args.command).unrecognized(rest)
    # oneDNN kernels: ResNet-20 trains ~1.8x faster on CPUs where TensorFlow leaves them off
    # (measured, docs/speed.md). Must be set before TensorFlow is imported; =0 opts out.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "1")
    from estimator_dist import quiet

    quiet.configure(args.verbose)
    from estimator_dist.cli import commands

    try:
        timers.check()
        return commands.run(args.command, args) or errors.EXIT_OK
    except (OSError, IndexError, RuntimeError) as e:
        error = unguarded_os_error(e)
        if error is None:
            raise
        return errors.reported(error)
    except errors.ReportedError as e:
        return errors.reported(e)
    except KeyboardInterrupt:
        return errors.interrupted()


def unguarded_os_error(e: BaseException):
    """A ReportedError for an OS error no check caught earlier, or None (a real bug: traceback).

    A full disk (IndexError: TensorFlow's OUT_OF_RANGE, e.g. a TensorBoard events file too
    large; RuntimeError: an events writer thread's error) is a StorageError; a path that is a file where a directory is needed, a directory
    where a file is, or under a missing directory is a UserError naming it.
    """
    if files.reason_in(e):
        return files.storage_error(e, "writing a file", "the command stopped there")
    if isinstance(e, OSError) and e.filename:
        return errors.UserError(f"{e.filename}: {e.strerror or e}; check the paths given "
                                f"(--model_dir, --output, --output_dir, --summary_json, ...)")
    return None


if __name__ == "__main__":
    sys.exit(main())
