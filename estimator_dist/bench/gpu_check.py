"""`make gpu-check`: train a few steps per strategy on this machine's GPUs and print, per
strategy, the devices used, one step's time and the peak GPU memory.

    python -m estimator_dist.bench.gpu_check [--steps 20] [--strategies none,mirrored]
                                                  [--model digits] [--allow_cpu]

No GPU has ever run this project: this is the first thing to run on a GPU box (docs/gpu.md).
Each strategy trains in a process of its own (a process claims its GPUs once, before
TensorFlow's runtime starts: devices.claim_gpus), on `--num_devices 0` (auto: one GPU for
none and one_device, every GPU otherwise). `horovod` runs as one rank (no launcher);
several ranks: `make cluster LAUNCHER=horovod WORKERS=N GPU=1`.

"one step" is the median of the steps after the first two (graph build, autotuning).
Peak GPU memory is `tf.config.experimental.get_memory_info('GPU:i')['peak']`, the largest
over the GPUs the strategy used.

Exit codes: 0 every strategy trained; 1 one or more failed (the table says which);
3 no GPU visible to TensorFlow and no --allow_cpu (nothing was run); 2 bad arguments.
--allow_cpu runs the same check on the CPU (two logical CPUs for the multi-device
strategies), so the script itself is tested on machines without GPUs.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

from estimator_dist.distribute import specs

STRATEGIES = ("none", "one_device", "mirrored", "central_storage", "tower", "horovod")
SINGLE = ("none", "one_device", "horovod")
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_NO_GPU = 0, 1, 2, 3
RESULT = "GPU_CHECK_RESULT "
CPU_DEVICES = 2  # logical CPUs for the multi-device strategies under --allow_cpu
NO_GPU = ("gpu-check: no GPU is visible to TensorFlow ({why}); nothing was checked. On a GPU "
          "box install tensorflow[and-cuda]==2.15.1 (make venv GPU=1) and check nvidia-smi and "
          "CUDA_VISIBLE_DEVICES; --allow_cpu runs the check on the CPU instead")
HEADER = ("strategy", "devices", "step_ms", "peak_gpu_mb", "result")


def horovod_installed() -> bool:
    return importlib.util.find_spec("horovod") is not None


def default_strategies() -> List[str]:
    return [s for s in STRATEGIES if not specs.is_horovod(s) or horovod_installed()]


def parse(argv):
    parser = argparse.ArgumentParser(prog="gpu-check", description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default=",".join(default_strategies()),
                        help="comma-separated, from " + ", ".join(STRATEGIES) +
                             " (default: all; horovod when installed)")
    parser.add_argument("--steps", type=int, default=20, help="steps per strategy (>= 4)")
    parser.add_argument("--model", default="digits", help="a built-in model (default digits)")
    parser.add_argument("--batch_size", type=int, default=64, help="global batch")
    parser.add_argument("--allow_cpu", action="store_true",
                        help="without GPUs, run the check on the CPU instead of exiting 3")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model_dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = [s for s in args.strategies.split(",") if s]
    unknown = [s for s in names if s not in STRATEGIES]
    if unknown or not names:
        parser.error(f"--strategies {args.strategies}: choose from {', '.join(STRATEGIES)}")
    if any(specs.is_horovod(s) for s in names) and not horovod_installed():
        parser.error("--strategies horovod: horovod is not installed (make horovod GPU=1)")
    if args.steps < 4:
        parser.error(f"--steps {args.steps}: give at least 4")
    args.strategy_list = names
    return args


def gpu_names() -> List[str]:
    import tensorflow as tf

    return [d.name for d in tf.config.list_physical_devices("GPU")]


# --- one strategy, in a child process ------------------------------------------------------

def run_child(args) -> int:
    """Train `args.child` for args.steps steps and print one RESULT line (JSON)."""
    import tensorflow as tf

    from estimator_dist.distribute import devices as devices_lib
    from estimator_dist.training import config as config_lib
    from estimator_dist.training import run as runner
    from estimator_dist.training import user_code
    from estimator_dist.training.registry import MODELS

    user_code.load_builtins()
    entry = MODELS.get(args.model)
    gpus = tf.config.list_physical_devices("GPU")
    num_devices = 0 if gpus else (1 if args.child in SINGLE else CPU_DEVICES)
    flags = {"strategy": args.child, "num_devices": num_devices, "train_steps": args.steps,
             "batch_size": args.batch_size, "model_dir": args.model_dir, "export": "none",
             "eval_steps": 1, "synthetic": True}
    config = config_lib.build_config(args.model, {}, flags, entry.run_defaults, entry.hparams, ())
    clock = StepClock()
    summary = runner.train(config, out=lambda *_: None, extra_hooks=[clock])
    devices = devices_lib.resolve(num_devices, gpus=len(gpus), single_device=args.child in SINGLE)
    result = {"strategy": args.child, "devices": list(devices.names),
              "step_ms": clock.step_ms(), "peak_gpu_mb": peak_gpu_mb(devices.names),
              "global_step": summary.get("global_step")}
    print(RESULT + json.dumps(result), flush=True)
    return EXIT_OK


class StepClock:
    """A SessionRunHook timing each training step (session run)."""

    def __new__(cls):
        import tensorflow as tf

        class _Clock(tf.compat.v1.train.SessionRunHook):
            def __init__(self):
                self.seconds = []
                self._start = None

            def before_run(self, run_context):
                self._start = time.perf_counter()

            def after_run(self, run_context, run_values):
                self.seconds.append(time.perf_counter() - self._start)

            def step_ms(self) -> Optional[float]:
                settled = self.seconds[2:] or self.seconds
                return round(statistics.median(settled) * 1000, 2) if settled else None

        return _Clock()


def peak_gpu_mb(devices) -> Optional[float]:
    """Largest peak memory over the GPUs used (MiB); None on CPUs."""
    import tensorflow as tf

    gpus = [d for d in devices if d.startswith("/gpu:")]
    if not gpus:
        return None
    peaks = [tf.config.experimental.get_memory_info(f"GPU:{d.split(':')[1]}")["peak"]
             for d in gpus]
    return round(max(peaks) / 2 ** 20, 1)


# --- the table, in the parent ----------------------------------------------------------------

def run_one(strategy: str, args, workdir: str) -> Dict:
    cmd = [sys.executable, "-m", "estimator_dist.bench.gpu_check", "--child", strategy,
           "--steps", str(args.steps), "--model", args.model, "--batch_size",
           str(args.batch_size), "--model_dir", os.path.join(workdir, strategy)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT):
            return {**json.loads(line[len(RESULT):]), "result": "ok"}
    tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
    return {"strategy": strategy, "devices": [], "step_ms": None, "peak_gpu_mb": None,
            "result": f"FAILED (exit {proc.returncode}): {tail[:200]}"}


def row(result: Dict) -> List[str]:
    def num(value):
        return "-" if value is None else f"{value:g}"

    return [result["strategy"], ",".join(result["devices"]) or "-", num(result["step_ms"]),
            num(result["peak_gpu_mb"]), result["result"]]


def table(results: List[Dict]) -> str:
    rows = [list(HEADER)] + [row(r) for r in results]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]
                     for r in rows)


def main(argv=None) -> int:
    args = parse(argv)
    from estimator_dist import quiet

    quiet.configure(False)  # before TensorFlow is imported: no banners
    if args.child:
        return run_child(args)
    gpus = gpu_names()
    if not gpus and not args.allow_cpu:
        why = ("CUDA_VISIBLE_DEVICES is empty" if os.environ.get("CUDA_VISIBLE_DEVICES") == ""
               else "no CUDA GPU found, or this TensorFlow is the CPU build")
        print(NO_GPU.format(why=why), file=sys.stderr)
        return EXIT_NO_GPU
    where = (f"{len(gpus)} GPU(s): {', '.join(gpus)}" if gpus
             else f"no GPU: the CPU (--allow_cpu; {CPU_DEVICES} logical CPUs for several devices)")
    print(f"gpu-check: {args.model}, {args.steps} steps, global batch {args.batch_size}, "
          f"on {where}", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as workdir:
        for strategy in args.strategy_list:
            results.append(run_one(strategy, args, workdir))
            print(f"  {strategy}: {results[-1]['result']}", flush=True)
    print(table(results))
    return EXIT_OK if all(r["result"] == "ok" for r in results) else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
