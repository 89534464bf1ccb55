"""CLI: parsing, `list`, and bad input -> one line, exit 2, nothing written."""
import pytest

from conftest import run_cli
from estimator_dist import cli


def run_main(argv, capsys):
    code = cli.main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_every_train_flag_parses():
    args = cli.build_parser().parse_args(
        ["train", "--model", "digits", "--strategy", "mirrored", "--num_devices", "2",
         "--batch_size", "64", "--train_steps", "10", "--eval_steps", "2", "--eval_every", "5",
         "--model_dir", "d", "--data_dir", "x", "--synthetic", "--seed", "3",
         "--save_checkpoints_steps", "5", "--keep_checkpoint_max", "2", "--export", "best",
         "--summary_json", "s.json", "--set", "learning_rate=0.1", "--import", "m",
         "--config", "c.yaml", "--input", "digits", "--data_path", "p", "--label_column", "y",
         "--variable_device", "device0", "--accumulate_steps", "4"])
    assert (args.num_devices, args.synthetic, args.overrides, args.imports) == (2, True, ["learning_rate=0.1"], ["m"])
    assert (args.variable_device, args.accumulate_steps) == ("device0", 4)
    unset = cli.build_parser().parse_args(["train"])
    assert unset.batch_size is None and unset.synthetic is None  # flags only override when given


def test_list(capsys):
    code, out, _ = run_main(["list"], capsys)
    assert code == 0 and "digits" in out and "learning_rate=0.05" in out


BAD = [
    (["--model", "digitz"], "unknown model 'digitz'; registered: "),
    (["--input", "nope"], "unknown input 'nope'"),
    (["--strategy", "horovodd"], "--strategy horovodd: unknown; choose one of"),
    (["--strategy", "mirrored", "--num_devices", "99"], "--num_devices 99: this machine has no GPU"),
    (["--strategy", "mirrored", "--num_devices", "2", "--batch_size", "33"], "--batch_size 33 is not divisible"),
    (["--set", "learning_rat=0.1"], "the key 'learning_rat' does not exist in the hparams of model 'digits'"),
    (["--set", "filters=many"], "--set filters=many: 'filters' takes a int"),
    (["--import", "no_such_module_xyz"], "--import no_such_module_xyz: cannot import it"),
    (["--export", "sometimes"], "--export sometimes: must be one of"),
    (["--strategy", "tower", "--variable_device", "gpu0"], "--variable_device gpu0: must be cpu or device0"),
    (["--accumulate_steps", "0"], "--accumulate_steps 0: must be >= 1 (1 = apply every batch)"),
    (["--strategy", "central_storage", "--num_devices", "2", "--accumulate_steps", "2"],
     "--accumulate_steps 2 does not work with --strategy central_storage; use one of"),
]


@pytest.mark.parametrize("argv,message", BAD)
def test_bad_input_one_line_exit_2_nothing_written(argv, message, tmp_path, capsys):
    model_dir = tmp_path / "run"
    code, out, err = run_main(["train", "--model_dir", str(model_dir), "--train_steps", "5"] + argv, capsys)
    assert code == 2
    assert err.startswith("estimator-dist: error: " + message), err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not model_dir.exists()


def test_unknown_config_key_in_file(tmp_path, capsys):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("model: digits\ntrain:\n  batch_sise: 8\n")
    code, _, err = run_main(["train", "--config", str(cfg), "--model_dir", str(tmp_path / "r")], capsys)
    assert code == 2 and "the key 'batch_sise' does not exist in config file section 'train'" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("command", ["evaluate", "export"])
def test_no_checkpoint_refused(command, tmp_path, capsys):
    code, _, err = run_main([command, "--model_dir", str(tmp_path)], capsys)
    assert code == 2 and "has no config.yaml" in err


def test_console_script_exit_code_and_no_traceback(tmp_path):
    """The real entry point, as a user runs it."""
    proc = run_cli("train", "--model", "cifra", "--model_dir", str(tmp_path / "r"), timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()]
    assert "unknown model 'cifra'" in proc.stderr and proc.stdout == ""
