"""A CSV logger that keeps what an earlier run in the same dir wrote (`logger=csv`).

Lightning's CSVLogger deletes `metrics.csv` when its directory is not empty, warning "Previous log files in this
directory will be deleted" on every run (Hydra has already written `.hydra/` and `train.log` there). A run resumed in
its own dir (`train.auto_resume`, a requeued or preempted job) would lose the history before the resume. This one
appends to the existing file (its columns are read back, and a new column rewrites the file with the union, as
Lightning does within a run), and says nothing on a fresh run. Before the run starts, `align_metrics_with_resume`
makes the file end at the resumed checkpoint's iteration (rows a crashed run logged after its last checkpoint would
repeat), and a fresh start in the dir (`train.overwrite=true`) moves the earlier file aside instead of mixing.
"""

from __future__ import annotations

import csv
import logging
import os
import time
from pathlib import Path

from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

log = logging.getLogger(__name__)


class _AppendingWriter(ExperimentWriter):
    def _check_log_dir_exists(self) -> None:
        if not os.path.isfile(self.metrics_file_path):
            return
        with open(self.metrics_file_path, newline="") as handle:
            header = next(csv.reader(handle), [])
        self.metrics_keys = list(header)
        log.info("Appending to the metrics of the earlier run in %s.", self.metrics_file_path)


class AppendingCSVLogger(CSVLogger):
    @property
    def experiment(self) -> ExperimentWriter:
        if self._experiment is None:
            self._fs.makedirs(self.root_dir, exist_ok=True)
            self._experiment = _AppendingWriter(log_dir=self.log_dir)
        return self._experiment


def align_metrics_with_resume(path: Path, resume_iteration: int | None) -> None:
    """Resuming (`resume_iteration` given): drop the rows logged after that iteration. A fresh start: move an
    earlier run's file to `metrics.replaced-<time>.csv`. Both are whole-file replacements, never a half-written file."""
    if not path.is_file():
        return
    if resume_iteration is None:
        aside = path.with_name(f"metrics.replaced-{time.strftime('%Y%m%d-%H%M%S')}.csv")
        os.replace(path, aside)
        log.warning("The run dir held metrics of an earlier run: moved to %s.", aside)
        return
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        header, rows = reader.fieldnames or [], list(reader)
    kept = [
        r for r in rows if not r.get("train/iteration") or float(r["train/iteration"]) <= resume_iteration
    ]
    if len(kept) == len(rows):
        return
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=header)
        writer.writeheader()
        writer.writerows(kept)
    os.replace(partial, path)
    log.info(
        "Dropped %d metrics rows logged after iteration %d, the resumed one.",
        len(rows) - len(kept),
        resume_iteration,
    )
