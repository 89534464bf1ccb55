"""`report --model_dir A --model_dir B ...`: several runs side by side in one table and one plot.

The table has a row per global step and a column per (metric, run), `loss (A)`, `loss (B)`,
so each row holds every run's values at that step (blank where a run logged none). Runs
are named by their folder, or by as much of their path as tells them apart.
"""
import os
from typing import Callable, List, Tuple

import pandas as pd

from estimator_dist.errors import UserError
from estimator_dist.serving import report


def run_names(model_dirs: List[str]) -> List[str]:
    """A short name per run: its folder's name, or more of its path where two share one."""
    parts = [os.path.normpath(os.path.abspath(d)).split(os.sep) for d in model_dirs]
    depths = [1] * len(parts)
    while True:
        names = [os.sep.join(p[-k:]) for p, k in zip(parts, depths)]
        clashing = [i for i, n in enumerate(names)
                    if names.count(n) > 1 and depths[i] < len(parts[i])]
        if not clashing:
            return names
        for i in clashing:
            depths[i] += 1


def _column(metric: str, run: str) -> str:
    return f"{metric} ({run})"


def write(model_dirs: List[str], output_dir: str = "") -> Tuple[str, str, str]:
    """report.csv and report.png of several runs (default in ./report); their paths and the
    summary text."""
    table, metric_of, text = compare(model_dirs)
    return report.write_frame(table, output_dir or "report", text, metric_of)


def compare(model_dirs: List[str]) -> Tuple[pd.DataFrame, Callable[[str], str], str]:
    """(the joined table, column -> its metric, the summary text) of several model_dirs."""
    seen = {}
    for model_dir in model_dirs:
        key = os.path.realpath(model_dir)
        if key in seen:
            raise UserError(f"--model_dir {model_dir}: given twice (as {seen[key]}); give each "
                            f"run once")
        seen[key] = model_dir
    names = run_names(model_dirs)
    frames = {name: report.load(model_dir) for name, model_dir in zip(names, model_dirs)}
    metrics = list(dict.fromkeys(m for frame in frames.values() for m in frame.columns))
    columns, metric_of = {}, {}
    for metric in metrics:  # a metric's runs side by side
        for name, frame in frames.items():
            if metric in frame:
                columns[_column(metric, name)] = frame[metric]
                metric_of[_column(metric, name)] = metric
    table = pd.DataFrame(columns).sort_index()
    table.index.name = "step"
    return table, metric_of.__getitem__, summary(frames, model_dirs)


def summary(frames, model_dirs: List[str]) -> str:
    """Each run's path, then a table of runs as columns: last step, final eval metrics (with
    their step), best eval loss, train loss first and last."""
    rows = {}
    for name, frame in frames.items():
        column = {"last step": str(int(frame.index.max()))}
        evals = [c for c in frame.columns if c.startswith(report.EVAL_PREFIX)]
        done = frame[evals].dropna(how="all") if evals else frame.iloc[0:0]
        if len(done):
            step = int(done.index[-1])
            for metric, value in done.iloc[-1].dropna().items():
                column[f"final {metric[len(report.EVAL_PREFIX):]}"] = f"{value:.4f} @{step}"
        if f"{report.EVAL_PREFIX}loss" in frame:
            best = frame[f"{report.EVAL_PREFIX}loss"].dropna()
            if len(best):
                column["best eval loss"] = f"{best.min():.4f} @{int(best.idxmin())}"
        if "loss" in frame:
            train = frame["loss"].dropna()
            column["train loss first"] = f"{train.iloc[0]:.4f} @{int(train.index[0])}"
            column["train loss last"] = f"{train.iloc[-1]:.4f} @{int(train.index[-1])}"
        rows[name] = column
    table = pd.DataFrame(rows).fillna("-")
    lines = [f"{len(frames)} runs: " + ", ".join(f"{name} = {path}" for name, path in
                                                 zip(frames, model_dirs)),
             table.to_string()]
    for name, frame in frames.items():
        lines += [f"note: {name}: scalars may be missing: {problem}"
                  for problem in frame.attrs.get("unreadable", ())]
    return "\n".join(lines)
