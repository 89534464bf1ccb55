"""What the bench reports: measurements -> rows, targets and bounds met or missed, the tables,
bench.csv, targets.csv and bench.png."""
import csv
import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from estimator_dist import files
from estimator_dist.bench.plan import BOUNDS, Case, GRADIENT_BYTES, MWMS_1, Options, PIPELINE_DRIVERS, QUICK_SETTINGS, SETTINGS, TARGETS, cases_for, selected_cases



@dataclass
class Measurement:
    """One run of one case."""

    case: Case
    round: int
    ok: bool
    examples_per_sec: float = float("nan")  # from the median step
    burst_examples_per_sec: List[float] = field(default_factory=list)  # each burst's median step
    window_examples_per_sec: float = float("nan")  # over the whole measured window
    first_step_seconds: float = float("nan")
    started_alone: bool = True  # its start-up measured with no other case starting beside it
    peak_rss_mb: float = float("nan")
    cpu_ms_per_step: float = float("nan")
    burst_cpu_ms_per_step: List[float] = field(default_factory=list)  # each burst's
    onednn: Optional[bool] = None
    step_split: Dict[str, float] = field(default_factory=dict)  # step_split.split, ms
    split_error: str = ""  # why a worker case has no per-step split
    wall_seconds: float = 0.0
    error: str = ""
    log: str = ""


def measurement(run: "bench_runner.CaseRun") -> Measurement:
    """A case run's figures (the chief's; peak RSS over all its processes)."""
    wall = run.ended - run.started
    if not run.ok:
        return Measurement(run.case, run.round, ok=False, wall_seconds=wall, log=run.log_path,
                           error=run.error, started_alone=run.started_alone)
    return Measurement(run.case, run.round, ok=True, wall_seconds=wall, log=run.log_path,
                       started_alone=run.started_alone, peak_rss_mb=run.peak_rss_mb,
                       split_error=run.split_error, **run.figures())


def _median(values):
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


@dataclass
class Row:
    """A case's figures over the rounds."""

    case: Case
    batch: int
    runs: List[Measurement]

    @property
    def ok_runs(self):
        return [m for m in self.runs if m.ok]

    def _median_of(self, name: str) -> float:
        return _median([getattr(m, name) for m in self.ok_runs])

    examples_per_sec = property(lambda self: self._median_of("examples_per_sec"))
    window_examples_per_sec = property(lambda self: self._median_of("window_examples_per_sec"))
    first_step_seconds = property(lambda self: self._median_of("first_step_seconds"))
    started_alone = property(lambda self: all(m.started_alone for m in self.ok_runs))
    cpu_ms_per_step = property(lambda self: self._median_of("cpu_ms_per_step"))

    @property
    def onednn(self) -> str:
        seen = {m.onednn for m in self.ok_runs}
        return "on" if seen == {True} else "off" if seen == {False} else "?"

    @property
    def peak_rss_mb(self):
        values = [m.peak_rss_mb for m in self.ok_runs]
        return max(values) if values else float("nan")


def make_rows(options: Options, measurements: List[Measurement]) -> List[Row]:
    settings = QUICK_SETTINGS if options.quick else SETTINGS
    rows = []
    for case in selected_cases(options):
        runs = [m for m in measurements if m.case == case]
        rows.append(Row(case, settings[case.model].batch * case.workers, runs))
    return rows


def target_rows(options: Options, measurements: List[Measurement]) -> List[Dict]:
    """Each target per model: the median over rounds of the ratio measured within a round.

    Within a round, two cases of one group are compared burst by burst (the median
    of the ratios of adjacent bursts); cases of different groups by their figures.
    `cpu_ratio` is the same comparison in examples per CPU-second of the (chief)
    process: the work each way costs, which other tenants' load moves far less than
    wall time (it is not what a user waits for, so the targets are judged on wall time).
    """
    out = []
    for model in options.models:
        names = {c.name for c in cases_for(model)}
        for label, num, den, kind, goal in TARGETS:
            if num not in names or den not in names:  # e.g. bfloat16: the MLP only
                continue
            ratios, cpu, wall = [], [], []
            for r in range(options.rounds):
                a = _find(measurements, model, num, r)
                b = _find(measurements, model, den, r)
                if a is None or b is None:
                    continue
                if kind == "max":
                    ratios.append(a.first_step_seconds / b.first_step_seconds)
                    continue
                # Per-worker (scaling) or global batches are equal within every pair.
                cpu.append(_cpu_ratio(a, b))
                wall.append(_rate_ratio(a, b))
                ratios.append(cpu[-1] if kind == "cpu" else
                              wall[-1] / (2.0 if kind == "scaling" else 1.0))
            value = _median(ratios)
            met = None if goal is None or value != value else \
                (value <= goal if kind == "max" else value >= goal)
            row = {"model": model, "target": label, "ratio": value,
                   "goal": "-" if goal is None else f"{'<=' if kind == 'max' else '>='} {goal:g}",
                   "met": met, "rounds": [round(x, 4) for x in ratios], "cpu_ratio": _median(cpu)}
            # No wall-time note for a pipeline ("cpu"): it fills its prefetch buffers while it
            # waits at the gate, so its burst's wall time says how long it waited.
            out.append(row)
        out += bound_rows(options, measurements, model)
    return out


def bound_rows(options: Options, measurements: List[Measurement], model: str) -> List[Dict]:
    """BOUNDS for one model: within each round, MWMS_1's step / (step + the 2-worker case's
    step - its 1-worker case's), in wall time (`ratio`) and in CPU time (`cpu_ratio`)."""
    settings = QUICK_SETTINGS if options.quick else SETTINGS
    out = []
    for label, two, one in BOUNDS:
        ratios, cpu, costs = [], [], []
        for r in range(options.rounds):
            base, a = _find(measurements, model, MWMS_1, r), _find(measurements, model, two, r)
            b = _find(measurements, model, one, r) if one else None
            if base is None or a is None or (one and b is None):
                continue
            step = _step_seconds(base, settings)
            cost = _step_seconds(a, settings) - (_step_seconds(b, settings) if b else 0.0)
            ratios.append(step / (step + cost))
            costs.append(cost * 1000.0)
            cpu_cost = a.cpu_ms_per_step - (b.cpu_ms_per_step if b else 0.0)
            cpu.append(base.cpu_ms_per_step / (base.cpu_ms_per_step + cpu_cost))
        note = f"all-reduce {_median(costs):.2f} ms/step" if costs else ""
        if costs:
            note += f", {_gradient_megabytes(model, two):.2f} MB of gradients/step"
        out.append({"model": model, "target": label, "ratio": _median(ratios), "goal": "-",
                    "met": None, "rounds": [round(x, 4) for x in ratios], "cpu_ratio": _median(cpu),
                    "note": note})
    return out


def _gradient_megabytes(model: str, case_name: str) -> float:
    """What one worker puts into the step's gradient all-reduce: every trainable value, in
    float32 or the --gradient_compression type the case name ends with."""
    from estimator_dist.bench import comm as bench_comm

    compressed = case_name.rsplit(" ", 1)[-1]
    floats = bench_comm.gradient_floats(SETTINGS[model].registered)
    return floats * GRADIENT_BYTES.get(compressed, 4) / 1e6


def _step_seconds(m: Measurement, settings) -> float:
    """The median step of a case run, from its global examples/sec."""
    return settings[m.case.model].batch * m.case.workers / m.examples_per_sec


def _rate_ratio(a: Measurement, b: Measurement) -> float:
    """a's rate / b's: burst by burst when they ran interleaved, else from their medians."""
    pairs = list(zip(a.burst_examples_per_sec, b.burst_examples_per_sec))
    if a.case.group == b.case.group and pairs:
        return _median([x / y for x, y in pairs])
    return a.examples_per_sec / b.examples_per_sec


def _cpu_ratio(a: Measurement, b: Measurement) -> float:
    """b's CPU per step / a's (a's examples per CPU-second / b's): burst by burst when they
    ran interleaved, else from their whole runs."""
    pairs = list(zip(a.burst_cpu_ms_per_step, b.burst_cpu_ms_per_step))
    if a.case.group == b.case.group and pairs:
        return _median([y / x for x, y in pairs])
    return b.cpu_ms_per_step / a.cpu_ms_per_step


def _find(measurements, model, name, round_index) -> Optional[Measurement]:
    for m in measurements:
        if m.case.model == model and m.case.name == name and m.round == round_index and m.ok:
            return m
    return None


def format_table(rows: List[Row], settings) -> str:
    head = f"{'model':<20} {'case':<52} {'batch':>5} {'examples/sec':>12} {'rounds':<15} " \
           f"{'window ex/s':>11} {'1st step s':>10} {'peak RSS MB':>11} {'CPU ms/step':>11} {'oneDNN':>6}"
    lines = [head, "-" * len(head)]
    for row in rows:
        per_round = ", ".join(f"{m.examples_per_sec:.0f}" if m.ok else "failed" for m in row.runs)
        lines.append(f"{settings[row.case.model].title:<20} {row.case.name:<52} {row.batch:>5} "
                     f"{row.examples_per_sec:>12,.1f} {per_round:<15} "
                     f"{row.window_examples_per_sec:>11,.0f} "
                     f"{_first_step(row):>10} {row.peak_rss_mb:>11.0f} "
                     f"{row.cpu_ms_per_step:>11.1f} {row.onednn:>6}")
    if not all(row.started_alone for row in rows):
        lines.append(BESIDE_NOTE)
    return "\n".join(lines)


BESIDE_NOTE = ("* 1st step with another case of its group starting beside it (alone only "
               "where a target compares start-up times)")


def _first_step(row: Row) -> str:
    return f"{row.first_step_seconds:.1f}" + ("" if row.started_alone else "*")


def format_targets(targets: List[Dict]) -> str:
    """The targets whose cases ran (a --cases or --quick run leaves some out)."""
    measured = [t for t in targets if t["rounds"]]
    if not measured:
        return "targets: none of their case pairs ran"
    width = max(6, *(len(t["model"]) for t in measured))
    head = f"{'model':<{width}} {'target':<50} {'ratio':>7} {'goal':>7}  result   " \
           f"{'CPU ratio':>9}  per round"
    lines = [head, "-" * len(head)]
    for t in measured:
        verdict = "-" if t["goal"] == "-" else "n/a" if t["met"] is None else \
            ("met" if t["met"] else "MISSED")
        cpu = "" if t["cpu_ratio"] != t["cpu_ratio"] else f"{t['cpu_ratio']:.3f}"
        note = f"  ({t['note']})" if t.get("note") else ""
        lines.append(f"{t['model']:<{width}} {t['target']:<50} {t['ratio']:>7.3f} {t['goal']:>7}  "
                     f"{verdict:<8} {cpu:>9}  {', '.join(f'{x:.3f}' for x in t['rounds'])}{note}")
    return "\n".join(lines)


def write_csv(path: str, rows: List[Row], settings):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["model", "case", "driver", "strategy", "num_devices", "workers", "input",
                    "global_batch", "warmup_steps", "measured_steps", "examples_per_sec",
                    "examples_per_sec_per_round", "window_examples_per_sec", "first_step_seconds", "peak_rss_mb",
                    "cpu_ms_per_step", "onednn", "failed_runs", "started_alone"])
        for row in rows:
            s = settings[row.case.model]
            w.writerow([row.case.model, row.case.name, row.case.driver, row.case.strategy,
                        row.case.num_devices, row.case.workers,
                        _input_name(row.case), row.batch, s.warmup,
                        s.steps, f"{row.examples_per_sec:.2f}",
                        ";".join(f"{m.examples_per_sec:.2f}" for m in row.ok_runs),
                        f"{row.window_examples_per_sec:.2f}",
                        f"{row.first_step_seconds:.2f}", f"{row.peak_rss_mb:.1f}",
                        f"{row.cpu_ms_per_step:.2f}", row.onednn,
                        len(row.runs) - len(row.ok_runs), int(row.started_alone)])


def _input_name(case: Case) -> str:
    if not case.real_input and case.driver not in PIPELINE_DRIVERS:
        return "memory"
    return "imagenet_records" if case.image_size else "cifar_binary"


def write_targets_csv(path: str, targets: List[Dict]):
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["model", "target", "ratio", "goal", "met", "ratio_per_round", "cpu_ratio",
                    "note"])
        for t in targets:
            w.writerow([t["model"], t["target"], f"{t['ratio']:.4f}", t["goal"],
                        "" if t["met"] is None else t["met"],
                        ";".join(str(x) for x in t["rounds"]), f"{t['cpu_ratio']:.4f}",
                        t.get("note", "")])


COLOURS = {"project": "#1f77b4", "plain": "#7f7f7f", "keras": "#d62728",
           "input": "#1f77b4", "r1input": "#7f7f7f", "pixels": "#bcbd22", "bare": "#7f7f7f"}


ALL_REDUCE_DRIVERS = ("comm", "tcp")  # bench_comm.py: in the tables, not in the plot


def write_plot(path: str, rows: List[Row], settings, subtitle: str) -> bool:
    """bench.png of the training cases; False (and no file) when none ran."""
    # The all-reduce cases train no model: their rates would dwarf every bar of the plot.
    rows = [r for r in rows if r.case.driver not in ALL_REDUCE_DRIVERS]
    if not rows:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.case.model for r in rows))
    fig, axes = plt.subplots(len(models), 2, figsize=(14, 4.2 * len(models)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1.4]})
    for i, model in enumerate(models):
        mine = [r for r in rows if r.case.model == model]
        names = [r.case.name for r in mine]
        y = np.arange(len(mine))
        colours = [COLOURS[r.case.driver] for r in mine]
        ax = axes[i][0]
        ax.barh(y, [r.examples_per_sec for r in mine], color=colours)
        for k, r in enumerate(mine):
            ax.plot([m.examples_per_sec for m in r.ok_runs], [k] * len(r.ok_runs), "k.", ms=4)
        ax.set_yticks(y)
        ax.set_yticklabels(names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("global examples/sec (median of rounds; dots: each round)")
        ax.set_title(f"{settings[model].title}, batch {settings[model].batch} per worker")
        ax2 = axes[i][1]
        ax2.barh(y, [r.first_step_seconds for r in mine], color=colours)
        ax2.set_yticks(y)
        ax2.set_yticklabels([])
        ax2.invert_yaxis()
        ax2.set_xlabel("seconds from process start to first step")
    fig.suptitle(f"estimator-dist bench: {subtitle}", fontsize=10)
    fig.tight_layout()
    try:
        files.write_file(path, lambda tmp: fig.savefig(tmp, dpi=100), temp_suffix=".tmp.png")
    finally:
        plt.close(fig)
    return True
