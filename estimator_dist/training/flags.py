"""The `train` flags, generated from the config dataclasses' field metadata
(config_schema.flag), and train-style arguments -> Config for any caller (the CLI, the bench).

    python -m estimator_dist.training.flags --markdown

prints README's `train` flags table (tests/test_flags.py checks README against it).
Imports no TensorFlow: the CLI parses its arguments before TensorFlow is loaded.
"""
import argparse
import dataclasses
import difflib
import sys
from dataclasses import fields
from typing import List, Sequence, Tuple

from estimator_dist import paths
from estimator_dist.errors import UserError
from estimator_dist.training import config as config_lib
from estimator_dist.config_schema import SECTIONS, FlagDoc, flag_doc


def nonempty_arg(fix: str):
    """argparse type of a flag for which an empty value would silently mean "not given": an
    explicit empty value ('--flag ""', '--flag=') is refused with `fix`, not taken for the
    default (train's runs/MODEL, the input's data, stdout, ...) or the current directory.

    Only the command line is checked: a config file (and the config.yaml a run saves) keeps
    '' for a setting it leaves unset.
    """
    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"'' is empty; {fix}")
        return text

    return parse


def or_leave_out(what: str, default: str):
    return nonempty_arg(f"give {what}, or leave the flag out for {default}")


# The flags of `train` that are no config field (--import and --verbose: every command's).
MODEL = FlagDoc("registered model (default digits)", "registered model", "`digits`",
                empty=("a registered model (see 'estimator-dist list')", "digits"))
CONFIG = FlagDoc("a run config file", "a run config file (see below)", "none", "YAML",
                 empty=("a YAML file", "none"))
SET = FlagDoc("override a model hparam (repeatable); unknown keys fail",
              "override a model hparam (repeatable); unknown keys and wrong types fail",
              metavar="KEY=VALUE")
IMPORT = FlagDoc("import a module that registers more models/inputs (repeatable)",
                 "import a module that registers more models/inputs (repeatable)",
                 metavar="MODULE")
VERBOSE = FlagDoc("show TensorFlow's own logging", "show TensorFlow's own logging", "off")

# Sections in the order their flags are listed (--help and README).
FLAG_SECTIONS = ("data", "distribute", "compute", "train")


def config_fields() -> List[Tuple[str, object]]:
    """(section, dataclass field) of every train flag that sets a config field, in order."""
    return [(section, f) for section in FLAG_SECTIONS for f in fields(SECTIONS[section])]


# Every config-field flag's name (= its field's name); each is None when not given.
TRAIN_FLAGS = tuple(f.name for _, f in config_fields())


def _argument(section: str, f) -> dict:
    """add_argument keywords of a config field's flag."""
    doc = flag_doc(f)
    kind = config_lib.field_types(SECTIONS[section])[f.name]
    if kind is bool:
        return {"action": "store_const", "const": True, "default": None, "help": doc.help}
    if kind is str:
        if doc.empty is None:
            raise TypeError(f"str field {f.name} needs flag(empty=(what, default))")
        return {"type": or_leave_out(*doc.empty), "default": None, "help": doc.help}
    return {"type": kind, "default": None, "help": doc.help}


def add_train_flags(parser: argparse.ArgumentParser):
    """--model, --config, --set and one flag per config field (not --import, --verbose)."""
    parser.add_argument("--model", default=None, help=MODEL.help, type=or_leave_out(*MODEL.empty))
    parser.add_argument("--config", default=None, metavar=CONFIG.metavar, help=CONFIG.help,
                        type=or_leave_out(*CONFIG.empty))
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar=SET.metavar, help=SET.help)
    for section, f in config_fields():
        parser.add_argument(f"--{f.name}", **_argument(section, f))


def add_import_flag(parser: argparse.ArgumentParser):
    parser.add_argument("--import", dest="imports", action="append", default=[],
                        metavar=IMPORT.metavar, help=IMPORT.help,
                        type=nonempty_arg("give a module name such as my_project.models"))


def add_verbose_flag(parser: argparse.ArgumentParser):
    parser.add_argument("--verbose", action="store_true", help=VERBOSE.help)


class _Parser(argparse.ArgumentParser):
    """A usage error is a UserError (exit 2 where it is reported), not a SystemExit."""

    def error(self, message):
        raise UserError(f"train flags: {message}")


def train_parser() -> argparse.ArgumentParser:
    """A parser of train-style arguments ('--model digits --train_steps 5 ...')."""
    parser = _Parser(prog="train", add_help=False)
    add_train_flags(parser)
    add_import_flag(parser)
    add_verbose_flag(parser)
    return parser


def parse_train_args(argv: Sequence[str]) -> argparse.Namespace:
    """Train-style arguments -> namespace; a bad value or an unknown flag is a UserError."""
    parser = train_parser()
    args, rest = parser.parse_known_args(list(argv))
    if rest:
        known = [o for o in parser._option_string_actions if o.startswith("--")]  # pylint: disable=protected-access
        hints = [f"{close[0]} for {arg}" for arg in rest
                 for close in [difflib.get_close_matches(arg.split("=", 1)[0], known, n=1)]
                 if close]
        raise UserError(f"train flags: unrecognized arguments: {' '.join(rest)}"
                        + (f" (did you mean {', '.join(hints)}?)" if hints else ""))
    return args


# The config fields that are paths (~ and $VARS expanded, URLs refused: paths.py).
PATH_FIELDS = (("data", "data_dir"), ("data", "data_path"), ("train", "model_dir"),
               ("train", "summary_json"), ("train", "warm_start_from"))


def config_from_args(args: argparse.Namespace, expand_paths: bool = True) -> config_lib.Config:
    """Config file + flags + --set, strictly, after registering built-ins and --import modules.

    expand_paths: ~ and $VARS in --config and the path settings are expanded (and said);
    False for paths that are another machine's (a TFJob's pods): kept as given. Storage URLs
    are refused either way.
    """
    from estimator_dist.training import user_code  # TensorFlow: only once a run is built
    from estimator_dist.training.registry import MODELS

    user_code.load_builtins()
    config_path = paths.expanded("--config", args.config) if expand_paths else args.config
    file_data = config_lib.load_yaml(config_path) if config_path else {}
    config_lib.check_top_level(file_data)
    imports = tuple(file_data.get("imports") or ()) + tuple(args.imports)
    user_code.import_user_modules(imports)
    model = args.model or file_data.get("model") or "digits"
    entry = MODELS.get(model)
    flags = {name: getattr(args, name) for name in TRAIN_FLAGS}
    config = config_lib.build_config(model, file_data, flags, entry.run_defaults, entry.hparams,
                                     tuple(args.overrides), imports)
    return with_paths_expanded(config, flags, config_path, expand_paths)


def with_paths_expanded(config: config_lib.Config, flags, config_path: str,
                        expand_paths: bool = True) -> config_lib.Config:
    """config with its PATH_FIELDS expanded (a value from the config file said as such)."""
    for section, name in PATH_FIELDS:
        part = getattr(config, section)
        value = getattr(part, name)
        if not expand_paths:
            paths.check_not_url(f"--{name}", value)
            continue
        where = "" if flags.get(name) is not None else f"config file {config_path}: "
        new = paths.expanded(f"--{name}", value, where)
        if new != value:
            config = dataclasses.replace(config, **{section: dataclasses.replace(part, **{name: new})})
    return config


def config_from_argv(argv: Sequence[str]) -> config_lib.Config:
    """`estimator-dist train ARGV`'s Config, built without the CLI."""
    return config_from_args(parse_train_args(argv))


def _row(name: str, doc: FlagDoc) -> str:
    flag = f"--{name} {doc.metavar}" if doc.metavar else f"--{name}"
    cells = (f"`{flag}`", doc.doc, doc.default)
    return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"


def markdown_rows() -> List[str]:
    """README's `train` flags table, one row per flag, header included."""
    rows = ["| flag | meaning | default |", "|---|---|---|",
            _row("model", MODEL), _row("config", CONFIG), _row("set", SET),
            _row("import", IMPORT)]
    rows += [_row(f.name, flag_doc(f)) for _, f in config_fields()]
    return rows + [_row("verbose", VERBOSE)]


def markdown_table() -> str:
    return "\n".join(markdown_rows()) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv != ["--markdown"]:
        print("usage: python -m estimator_dist.training.flags --markdown  (README's `train` "
              "flags table)", file=sys.stderr)
        return 2
    sys.stdout.write(markdown_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
