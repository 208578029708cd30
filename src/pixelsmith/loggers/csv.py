"""A CSV logger that keeps what an earlier run in the same dir wrote (`logger=csv`).

Lightning's CSVLogger deletes `metrics.csv` when its directory is not empty, warning "Previous log files in this
directory will be deleted" on every run (Hydra has already written `.hydra/` and `train.log` there). A run resumed in
its own dir (`train.auto_resume`, a requeued or preempted job) would lose the history before the resume. This one
appends to the existing file (its columns are read back, and a new column rewrites the file with the union, as
Lightning does within a run), and says nothing on a fresh run.
"""

from __future__ import annotations

import csv
import logging
import os

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
