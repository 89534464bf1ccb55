"""`estimator-dist bench`: every way to train the same model, measured side by side in one run.

Each case (bench_cases.py) runs in its own process: a fresh TensorFlow runtime,
its own peak RSS, and its start-up time measured from the moment this process
launched it. The cases a target compares form a group whose processes are alive
together and take turns in short bursts of steps (bench_runner.py), so that the
load of a shared machine falls on both sides of a ratio alike; a ratio is the
median of the ratios taken burst by burst. `--rounds R` repeats every group,
the order reversed every other round; a case's figure is then the median over
rounds, a ratio the median of the per-round ratios.

Throughput is GLOBAL examples/sec (every replica and worker) in steady state:
global batch / the median step time after a discarded warm-up (the mean over
the same steps is shown beside it, as "window"), on the same in-memory data,
batch and step count for every case. multi_worker_mirrored and horovod (when
Horovod is installed) run one process per worker or rank, each pinned to one
core, with the per-worker batch fixed (weak scaling, as tf_cnn_benchmarks and
Horovod report scaling).
"""
import json
import os
import shutil
import sys
import time
from typing import Dict, List

import numpy as np

from estimator_dist import files
from estimator_dist.bench import case_runner as bench_runner
from estimator_dist.bench import step_split
from estimator_dist.distribute import specs
from estimator_dist.bench.plan import COMPUTE_FLAGS, Case, IMAGENET_PARTS, Options, PIPELINE_DRIVERS, PROCESS_STRATEGIES, QUICK_SETTINGS, SETTINGS, check_options, schedule
from estimator_dist.bench.results import format_table, format_targets, make_rows, measurement, target_rows, write_csv, write_plot, write_targets_csv


# The real-input case reads this many CIFAR-10 records written in the binary format.
REAL_RECORDS_PER_FILE = 2000


# The ImageNet bench's JPEGs (imagenet_data.py), written once per run.
IMAGENET_IMAGES = 96
QUICK_IMAGENET_IMAGES = 24


def child_main():
    """Entry point of a case process: pin cores, quiet TensorFlow, run the case."""
    from estimator_dist import process_temp

    process_temp.claim()
    spec_path = sys.argv[1]
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    if spec.get("cores"):
        os.sched_setaffinity(0, spec["cores"])
    from estimator_dist import quiet

    quiet.configure(verbose=False)
    from estimator_dist.bench import case_process

    sys.exit(case_process.main([spec_path]))


def write_cifar_files(directory: str, records: int = REAL_RECORDS_PER_FILE, seed: int = 0) -> str:
    """The six CIFAR-10 binary files (label byte + CHW pixels per record), random content."""
    from input_fns import cifar

    os.makedirs(directory, exist_ok=True)
    rng = np.random.RandomState(seed)
    for i, name in enumerate(cifar.ALL_FILES):
        n = records if name != cifar.TEST_FILE else max(1, records // 5)
        data = rng.randint(0, 256, size=(n, cifar.RECORD_BYTES)).astype(np.uint8)
        data[:, 0] = (np.arange(n) + i) % cifar.NUM_CLASSES
        # Not data.tofile: its error on a full disk carries no errno ("N requested and 0
        # written"), so it could not be told from a bug.
        files.write_text(os.path.join(directory, name), data.tobytes())
    return directory


def case_spec(options: Options, settings, cifar_dir: str, case: Case, model_dir: str,
              worker: int, imagenet_dir: str = "") -> Dict:
    """What one process of a case runs (case_process.main reads it)."""
    if case.model in IMAGENET_PARTS:
        return imagenet_spec(options, settings, imagenet_dir, case, model_dir)
    s = settings[case.model]
    return {
        "driver": case.driver,
        "model": {"project": s.registered, "comm": "bench_comm"}.get(case.driver, case.model),
        "input": "cifar" if case.real_input else "bench_memory",
        "data_dir": cifar_dir if case.real_input else "",
        "strategy": case.strategy,
        "num_devices": case.num_devices,
        "global_batch": s.batch * case.workers,
        "warmup": s.warmup,
        "train_steps": s.train_steps,
        "model_dir": model_dir,
        "worker": worker,
        "cores": [worker % (os.cpu_count() or 1)] if case.strategy in PROCESS_STRATEGIES else [],
        "extra_args": _train_flags(options, case, s.registered),
        "tf_defaults": case.tf_defaults,
    }


def imagenet_spec(options: Options, settings, imagenet_dir: str, case: Case,
                  model_dir: str) -> Dict:
    """A case of `--models imagenet` (imagenet_cases.py): one process, the records in
    imagenet_dir, the project case's model at the case's image size."""
    s = settings[case.model]
    project = case.driver == "project"
    extra = list(options.extra_args) + (["--set", f"image_size={case.image_size}"]
                                        if project and case.model == "resnet50" else [])
    return {
        "driver": case.driver, "imagenet": True,
        "model": s.registered if project else case.model,
        "input": "imagenet" if case.real_input else "bench_images",
        "data_dir": imagenet_dir if case.real_input or case.driver in PIPELINE_DRIVERS else "",
        "strategy": case.strategy, "num_devices": case.num_devices,
        "global_batch": s.batch, "warmup": s.warmup, "train_steps": s.train_steps,
        "image_size": case.image_size, "model_dir": model_dir, "worker": 0, "cores": [],
        "extra_args": extra if project else [], "tf_defaults": False,
        "cpu_from_report": case.driver in PIPELINE_DRIVERS,
    }


def _train_flags(options: Options, case: Case, registered: str) -> List[str]:
    """More `train` flags of a case that runs the project's command line."""
    if case.driver == "project":
        return list(options.extra_args) + list(COMPUTE_FLAGS[case.compute])
    if case.driver == "comm":  # the model's step without the model (bench_comm.py)
        return ["--import", "estimator_dist.bench.comm", "--set", f"like={registered}"] + \
            list(COMPUTE_FLAGS[case.compute])
    return []


def process_envs(case: Case):
    """(each process's extra environment, a function that releases what it needs)."""
    if specs.is_horovod(case.strategy):
        from estimator_dist.launch import horovod as horovod_launch

        rendezvous = horovod_launch.Rendezvous(case.workers)
        iface = horovod_launch.loopback_interface()
        return [rendezvous.rank_env(r, iface) for r in range(case.workers)], rendezvous.stop
    from estimator_dist.launch import layout
    from estimator_dist.launch import supervisor as launcher

    if not specs.spans_tf_config(case.strategy) and case.strategy != "ring":
        return [{}], lambda: None
    ports = launcher.free_ports(case.workers)  # held until released (launch/ports.py)

    def release():
        launcher.release_ports(ports)

    if case.strategy == "ring":
        return [{"BENCH_RING_PORTS": ",".join(map(str, ports))}] * case.workers, release
    names = layout.task_names(case.workers, 0, False)
    configs = layout.make_tf_configs(names, ports)
    return [{"TF_CONFIG": configs[name]} for name in names], release


def machine_line() -> str:
    import platform

    load = os.getloadavg()
    return (f"{os.cpu_count()} CPU(s), {platform.processor() or platform.machine()}, "
            f"load average {load[0]:.2f}")


def write_data(options: Options, work: str):
    """(cifar_dir, imagenet_dir or ''): the cases' data, written afresh under `work`."""
    shutil.rmtree(work, ignore_errors=True)
    for sub in ("model_dirs", "specs"):
        os.makedirs(os.path.join(work, sub), exist_ok=True)
    logs = os.path.join(os.path.dirname(work), "logs")
    shutil.rmtree(logs, ignore_errors=True)
    os.makedirs(logs, exist_ok=True)
    records = 64 if options.quick else REAL_RECORDS_PER_FILE
    cifar_dir = write_cifar_files(os.path.join(work, "cifar10"), records)
    imagenet_dir = ""
    if any(m in IMAGENET_PARTS for m in options.models):
        from estimator_dist.bench import imagenet_data

        imagenet_dir = imagenet_data.write_records(
            os.path.join(work, "imagenet"),
            QUICK_IMAGENET_IMAGES if options.quick else IMAGENET_IMAGES)
    return cifar_dir, imagenet_dir


def run(options: Options) -> int:
    """Run every case, print the tables, write bench.csv, targets.csv, bench.json, bench.png."""
    check_options(options)
    rounds = schedule(options)  # an unknown --cases is refused before anything is written
    say = options.emit
    started = time.monotonic()
    out = options.output_dir
    work = os.path.join(out, "work")
    settings = QUICK_SETTINGS if options.quick else SETTINGS
    created = files.missing_dirs(out)
    try:  # a full disk: one line naming the file (files.write_file), no data left behind
        cifar_dir, imagenet_dir = write_data(options, work)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        files.remove_empty_dirs([os.path.join(out, "logs")] + created)
        raise
    total = sum(len(g) for r in rounds for g in r)
    say(f"bench: {total} case runs ({len(rounds)} round(s) of {total // len(rounds)}, in "
        f"{len(rounds[0])} interleaved group(s)) on "
        f"{machine_line()}; logs in {os.path.join(out, 'logs')}")
    runner = bench_runner.Runner(
        options, settings, os.path.abspath(work), cifar_dir,
        spec_for=lambda case, model_dir, worker: case_spec(options, settings, cifar_dir, case,
                                                           model_dir, worker, imagenet_dir),
        envs_for=process_envs)
    measurements = []
    cores = os.cpu_count() or 1
    for r, groups in enumerate(rounds):
        for group in groups:
            say(f"{group[0].group}: {len(group)} case(s), started up to {cores} processes at "
                f"once (one at a time where a target compares start-ups), then "
                f"{settings[group[0].model].bursts} interleaved bursts")
            for run_ in runner.run_group(group, r, cores):
                m = measurement(run_)
                measurements.append(m)
                figure = (f"{m.examples_per_sec:,.1f} examples/sec, first step "
                          f"{m.first_step_seconds:.1f} s{'' if m.started_alone else ' *'}"
                          if m.ok else
                          f"FAILED ({m.error}; see {m.log})")
                say(f"[{len(measurements)}/{total}] {settings[m.case.model].title} | "
                    f"{m.case.name}: {figure} ({m.wall_seconds:.0f} s)")
    rows = make_rows(options, measurements)
    targets = target_rows(options, measurements)
    elapsed = time.monotonic() - started
    subtitle = (f"{'quick, ' if options.quick else ''}{options.rounds} round(s), "
                f"{machine_line()} at the end, {elapsed / 60:.1f} min")
    say("")
    say(format_table(rows, settings))
    several_rounds = options.rounds > 1
    split = step_split.format_split([
        (settings[m.case.model].title,
         m.case.name + (f" (round {m.round + 1})" if several_rounds else ""), m.step_split)
        for m in measurements if m.ok])
    if split:
        say("")
        say(split)
    for m in measurements:
        if m.split_error:
            say(f"{m.case.key}: no per-step split: its traced steps failed ({m.split_error})")
    say("")
    say(format_targets(targets))
    files.write_file(os.path.join(out, "bench.csv"), lambda tmp: write_csv(tmp, rows, settings))
    files.write_file(os.path.join(out, "targets.csv"),
                     lambda tmp: write_targets_csv(tmp, targets))
    files.write_text(os.path.join(out, "bench.json"), json.dumps({"options": {"quick": options.quick, "rounds": options.rounds,
                               "models": list(options.models),
                               "extra_args": list(options.extra_args)},
                   "settings": {m: vars(settings[m]) for m in options.models},
                   "machine": subtitle,
                   "runs": [{"case": m.case.key, "round": m.round, "ok": m.ok,
                             "examples_per_sec": m.examples_per_sec,
                             "burst_examples_per_sec": m.burst_examples_per_sec,
                             "window_examples_per_sec": m.window_examples_per_sec,
                             "first_step_seconds": m.first_step_seconds,
                             "started_alone": m.started_alone,
                             "peak_rss_mb": m.peak_rss_mb, "cpu_ms_per_step": m.cpu_ms_per_step,
                             "burst_cpu_ms_per_step": m.burst_cpu_ms_per_step,
                             "onednn": m.onednn, "step_split": m.step_split,
                             "wall_seconds": m.wall_seconds,
                             "error": m.error} for m in measurements],
                   "targets": targets}, indent=2))
    png = os.path.join(out, "bench.png")
    if os.path.exists(png):  # an earlier run's plot would pass for this one's
        os.remove(png)
    plotted = write_plot(png, rows, settings, subtitle)
    shutil.rmtree(work, ignore_errors=True)
    say("")
    say(f"wrote {out}/bench.csv, targets.csv, bench.json"
        f"{', bench.png' if plotted else ' (no bench.png: no case that trains a model ran)'} "
        f"({elapsed / 60:.1f} min)")
    failed = [m for m in measurements if not m.ok]
    if failed:
        say(f"bench: {len(failed)} case run(s) failed; see their logs under {out}/logs")
        return 1
    return 0
