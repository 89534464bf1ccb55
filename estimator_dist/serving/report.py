"""`estimator-dist report`: a model_dir's event files as a table, a CSV and a PNG of the curves."""
import glob
import os
import re
from typing import Dict, List, Tuple

import pandas as pd
import tensorflow as tf

from estimator_dist import files
from estimator_dist.errors import UserError, first_line

EVAL_PREFIX = "eval_"


def _scalars(pattern: str, prefix: str, unreadable: List[str]) -> Dict[Tuple[int, str], float]:
    """{(step, tag): value} of every scalar in the files matching `pattern`.

    TensorFlow reads a file cut off mid-write up to the cut (a DataLossError
    there), and one cut inside its first record as an empty file (no error):
    the records before the cut are kept, and every file that ends in a damaged
    record or holds none is appended to `unreadable` ("PATH ...").
    """
    values = {}
    for path in sorted(glob.glob(pattern)):
        records = 0
        try:
            for event in tf.compat.v1.train.summary_iterator(path):
                records += 1
                for value in event.summary.value:
                    if value.HasField("simple_value"):
                        values[(int(event.step), prefix + value.tag)] = value.simple_value
        except tf.errors.OpError as e:  # DataLossError (truncated, corrupt), PermissionDenied, ...
            at = re.search(r"record at (\d+)", first_line(e))
            where = f"at byte {at.group(1)} of {os.path.getsize(path)}" if at else \
                f"({first_line(e, 120)})"
            unreadable.append(f"{path} is cut off or corrupt {where}, after {records} complete "
                              f"record(s)")
            continue
        if not records:
            unreadable.append(f"{path} holds no complete record ({os.path.getsize(path)} bytes)")
    return values


def load(model_dir: str) -> pd.DataFrame:
    """One row per step: training scalars (loss, tower losses, rates) and eval_* metrics.

    frame.attrs["unreadable"]: the event files read only in part (see _scalars).
    """
    if not os.path.isdir(model_dir):
        raise UserError(f"--model_dir {model_dir}: no such directory")
    unreadable: List[str] = []
    values = _scalars(os.path.join(model_dir, "events.out.tfevents.*"), "", unreadable)
    values.update(_scalars(os.path.join(model_dir, "eval", "events.out.tfevents.*"), EVAL_PREFIX,
                           unreadable))
    if not values and unreadable:
        more = f" (and {len(unreadable) - 1} more file(s))" if len(unreadable) > 1 else ""
        raise UserError(f"{model_dir} has event files, but no scalar in them can be read: "
                        f"{unreadable[0]}{more}; they were cut off or damaged (a full disk, an "
                        f"interrupted copy): copy them again from the run's original model_dir "
                        f"if there is one, else their scalars are lost (training on from the "
                        f"latest checkpoint writes new ones)")
    if not values:
        raise UserError(f"{model_dir} has no TensorBoard event files with scalars; train first")
    series = pd.Series(values)
    frame = series.unstack().sort_index()
    frame.index.name = "step"
    frame = frame.drop(columns=[c for c in frame.columns if c == f"{EVAL_PREFIX}global_step"])
    frame.attrs["unreadable"] = unreadable
    return frame


def plot(frame: pd.DataFrame, path: str, metric_of=lambda column: column):
    fig = figure(frame, metric_of)  # sets the Agg backend before pyplot is imported
    import matplotlib.pyplot as plt

    try:
        files.write_file(path, lambda tmp: fig.savefig(tmp, dpi=100), temp_suffix=".tmp.png")
    finally:
        plt.close(fig)


def figure(frame: pd.DataFrame, metric_of=lambda column: column):
    """The report's figure: losses (log scale when all positive), eval metrics, throughput.

    metric_of(column): the metric a column holds (a comparison's columns are 'loss (run)'),
    which decides its panel; the column is its line's label.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def panel(column):
        metric = metric_of(column)
        if metric.endswith("loss") or metric.startswith("tower_loss"):
            return "loss"
        if metric.startswith(EVAL_PREFIX):
            return "eval metrics"
        return "throughput" if "per_sec" in metric or metric.endswith("/sec") else None

    panels = [(title, [c for c in frame.columns if panel(c) == title])
              for title in ("loss", "eval metrics", "throughput")]
    panels = [(title, cols) for title, cols in panels if cols]
    fig, axes = plt.subplots(len(panels), 1, figsize=(8, 3 * len(panels)), squeeze=False)
    for ax, (title, cols) in zip(axes[:, 0], panels):
        for col in cols:
            data = frame[col].dropna()
            ax.plot(data.index, data.values, marker="." if len(data) < 30 else None, label=col)
        if title == "loss" and (frame[cols].stack() > 0).all():
            ax.set_yscale("log")  # the first steps' loss flattened the rest of the curve
        ax.set_title(title)
        ax.set_xlabel("global step")
        ax.legend(fontsize="small")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def summary(frame: pd.DataFrame) -> str:
    lines = [f"{len(frame)} steps with scalars, last step {int(frame.index.max())}"]
    evals = [c for c in frame.columns if c.startswith(EVAL_PREFIX)]
    if evals:
        last = frame[evals].dropna(how="all").iloc[-1]
        lines.append("final eval: " + "  ".join(f"{c[len(EVAL_PREFIX):]} {v:.4f}"
                                                 for c, v in last.dropna().items()))
        if f"{EVAL_PREFIX}loss" in frame:
            best = frame[f"{EVAL_PREFIX}loss"].dropna()
            lines.append(f"best eval loss {best.min():.4f} at step {int(best.idxmin())}")
    if "loss" in frame:
        train = frame["loss"].dropna()
        lines.append(f"train loss {train.iloc[0]:.4f} at step {int(train.index[0])} -> "
                     f"{train.iloc[-1]:.4f} at step {int(train.index[-1])}")
    for problem in frame.attrs.get("unreadable", ()):
        lines.append(f"note: scalars may be missing: {problem}")
    return "\n".join(lines)


def write(model_dir: str, output_dir: str = "") -> Tuple[str, str, str]:
    """Write report.csv and report.png; returns their paths and the summary text."""
    frame = load(model_dir)
    return write_frame(frame, output_dir or os.path.join(model_dir, "report"), summary(frame))


def write_frame(frame: pd.DataFrame, output_dir: str, text: str,
                metric_of=lambda column: column) -> Tuple[str, str, str]:
    """report.csv and report.png of `frame` in output_dir (created, and removed again when the
    write fails); returns their paths and `text`."""
    created = files.missing_dirs(output_dir)
    os.makedirs(output_dir, exist_ok=True)
    csv_path = os.path.join(output_dir, "report.csv")
    png_path = os.path.join(output_dir, "report.png")
    try:
        files.write_file(csv_path, frame.to_csv)
        plot(frame, png_path, metric_of)
    except BaseException:
        files.remove_empty_dirs(created)  # a report.csv written before a failed plot stays
        raise
    return csv_path, png_path, text
