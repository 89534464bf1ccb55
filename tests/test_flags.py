"""The train flags come from the config dataclasses' metadata: README's table, the CLI's
flags and the Config they set all follow it."""
import os

import pytest

from estimator_dist.cli import main as cli
from estimator_dist.errors import UserError
from estimator_dist.training import config as config_lib
from estimator_dist.training import flags

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
HEADING = "### `train` flags"
REGENERATE = (f"README's '{HEADING}' table differs from the config dataclasses' flag metadata "
              f"(estimator_dist/config_schema.py); print the right table with "
              f"'python -m estimator_dist.training.flags --markdown' and paste it over README's")


def readme_rows():
    """The rows of README's train flags table, header included."""
    with open(README, encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert HEADING in lines, f"README has no '{HEADING}' section; {REGENERATE}"
    start = lines.index(HEADING) + 1
    while start < len(lines) and not lines[start].startswith("|"):
        start += 1
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    return lines[start:end]


def flag_of(row: str) -> str:
    return row.split("|")[1].strip().strip("`").split()[0]


def test_readme_table_is_the_generated_one():
    readme, generated = readme_rows(), flags.markdown_rows()
    if readme != generated:
        missing = [flag_of(r) for r in generated[2:] if flag_of(r) not in map(flag_of, readme[2:])]
        extra = [flag_of(r) for r in readme[2:] if flag_of(r) not in map(flag_of, generated[2:])]
        changed = [r for r in generated if r not in readme and flag_of(r) not in missing]
        pytest.fail(f"{REGENERATE}.\nflags missing from README: {missing}\nflags README has "
                    f"that train has not: {extra}\nrows that differ (as generated): {changed}")


def test_the_table_has_every_train_flag_and_only_those():
    train = cli.subcommand(cli.build_parser(), "train")
    options = {o for o in train._option_string_actions if o.startswith("--")} - {"--help"}  # pylint: disable=protected-access
    assert {flag_of(r) for r in flags.markdown_rows()[2:]} == options


def test_markdown_command_prints_the_table(capsys):
    assert flags.main(["--markdown"]) == 0
    assert capsys.readouterr().out == flags.markdown_table()
    assert flags.main([]) == 2


def flag_value(section: str, name: str):
    """A value for --name other than its default, and its text on the command line."""
    default = getattr(config_lib.SECTIONS[section](), name)
    if isinstance(default, bool):
        return True, []
    if isinstance(default, int):
        return default + 7, [str(default + 7)]
    if isinstance(default, float):
        return default + 0.5, [str(default + 0.5)]
    return f"{name}_value", [f"{name}_value"]


FIELDS = [(section, f.name) for section, f in flags.config_fields()]


@pytest.mark.parametrize("section, name", FIELDS)
@pytest.mark.parametrize("parse", ["cli", "flags"])
def test_every_train_flag_reaches_the_config(section, name, parse):
    value, text = flag_value(section, name)
    argv = [f"--{name}"] + text
    if parse == "cli":
        args = cli.build_parser().parse_args(["train"] + argv)
    else:
        args = flags.parse_train_args(argv)
    config = flags.config_from_args(args)
    assert getattr(getattr(config, section), name) == value
    unset = flags.config_from_args(flags.parse_train_args([]))
    for s, other in FIELDS:  # and nothing else
        if (s, other) != (section, name):
            assert getattr(getattr(config, s), other) == getattr(getattr(unset, s), other)


def test_str_flags_refuse_an_empty_value():
    for section, f in flags.config_fields():
        if config_lib.field_types(config_lib.SECTIONS[section])[f.name] is str:
            with pytest.raises(UserError, match=f"argument --{f.name}: '' is empty; give "):
                flags.parse_train_args([f"--{f.name}="])


def test_train_arguments_become_a_config_without_the_cli(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model: digits\ntrain: {train_steps: 9}\n")
    config = flags.config_from_argv(["--config", str(path), "--batch_size", "16", "--set",
                                     "learning_rate=0.5", "--synthetic"])
    assert (config.model, config.train.train_steps, config.train.batch_size) == ("digits", 9, 16)
    assert config.hparams["learning_rate"] == 0.5 and config.data.synthetic
    with pytest.raises(UserError, match=r"unrecognized arguments: --batch_sise 3 \(did you mean "
                                        r"--batch_size for --batch_sise\?\)"):
        flags.parse_train_args(["--batch_sise", "3"])
    with pytest.raises(UserError, match="argument --train_steps: invalid int value: 'x'"):
        flags.parse_train_args(["--train_steps", "x"])
