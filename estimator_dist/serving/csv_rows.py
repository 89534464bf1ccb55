"""CSV files read as training reads them: raw string cells, structure checked, exact lines.

pandas.read_csv silently pads a short row (with NaN, or with '' when told to keep
strings), silently turns an extra leading field on every row into an index, and
skips blank lines in its row numbers; so the tabular input (input_fns/tabular.py)
and `predict` both read through the csv module here.
"""
import csv
from typing import List, Optional, Sequence, Tuple

import numpy as np

from estimator_dist.errors import UserError

# Cells that mean "no value": a numeric column refuses them (missing numbers are not
# imputed); text keeps them as they are ("NA" may be a real class).
MISSING = frozenset({"", "na", "n/a", "nan", "null", "none"})


def read_rows(path: str, where: str, columns: Optional[Sequence[str]] = None
              ) -> Tuple[List[str], List[List[str]], np.ndarray]:
    """(header, rows of str cells, the file line each row starts on); UserError otherwise.

    where: how messages name the file, e.g. the path or '--input PATH'.
    columns: the column names of a file without a header line (its first line is data).
    """
    header, rows, lines = (list(columns) if columns else None), [], []
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:
            reader = csv.reader(f)
            start = 1
            for record in reader:
                blank = not record or (len(record) == 1 and not record[0].strip())
                if not blank:
                    if header is None:
                        header = record
                    elif len(record) != len(header):
                        named = "--columns names" if columns else "the header has"
                        raise UserError(
                            f"{where} line {start}: {len(record)} fields but {named} "
                            f"{len(header)}; fix that row (ragged rows are not padded or dropped)")
                    else:
                        rows.append(record)
                        lines.append(start)
                start = reader.line_num + 1
    except csv.Error as e:
        raise UserError(f"{where} line {reader.line_num}: not valid CSV ({e}); fix the quoting on "
                        f"that line") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{where} is not UTF-8 text ({e.reason} at byte {e.start}); save it as "
                        f"UTF-8") from None
    except OSError as e:
        raise UserError(f"{where}: cannot read it ({e.strerror})") from None
    if header is None:
        raise UserError(f"{where} is empty; it needs a header line and data rows")
    for i, name in enumerate(header):
        if columns and not name.strip():
            raise UserError(f"--columns: name {i + 1} is empty; give one name per column, "
                            f"e.g. --columns age,workclass,education")
        if not name.strip():
            raise UserError(f"{where} line 1: header field {i + 1} is empty (an index written by "
                            f"pandas?); name that column or remove it")
        if header.index(name) != i:
            raise UserError(f"{'--columns' if columns else where + ' line 1'}: column '{name}' "
                            f"appears twice; rename one")
    if not rows:
        raise UserError(f"{where} has a header but no data rows")
    return header, rows, np.asarray(lines, np.int64)


def missing(cells) -> np.ndarray:
    """Which of the str cells are MISSING (case and surrounding spaces ignored)."""
    return np.asarray([c.strip().lower() in MISSING for c in cells], bool)
