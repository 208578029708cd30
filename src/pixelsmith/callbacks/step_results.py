"""StepResultsRelease: an iteration that logs nothing converts no logged value, so it never makes the host wait.

Lightning's logger connector reads the step results at every batch end (`_LoggerConnector.on_batch_end`): each
progress-bar value still held from the last `self.log` call (the core's `img/s`) goes through `.item()` on every
iteration, not only on the iteration that logged it. On a GPU the value is a device tensor, so that is a
host-device synchronisation per iteration, for a number that changes only at logging iterations
(`train.host_sync_check` with `train.host_sync_scope=loop` finds it: `lightning/fabric/utilities/apply_func.py`,
`to_item`).

At the start of every iteration this callback drops the cached step value of each result logged on steps only
(`on_step=True, on_epoch=False`: everything the training core logs) once the previous iteration has handed it to
the loggers and the bar. What was logged stays in `trainer.logged_metrics`, `progress_bar_metrics` and
`callback_metrics`; the next `self.log` of a key fills its cache again. Values logged for epoch aggregation are left
alone.
"""

from __future__ import annotations

import lightning as L
from torch import Tensor


class StepResultsRelease(L.Callback):
    """Drop the step-only values Lightning holds between logging iterations (see the module docstring)."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # `trainer._results` and `_forward_cache` are Lightning 2.6's (private) step results: the only handle on the
        # connector's per-batch conversion. Setting the cache to None is what a never-logged key looks like to it.
        results = getattr(trainer, "_results", None)
        if results is None:
            return
        for result in results.values():
            meta = getattr(result, "meta", None)
            if meta is None or not meta.on_step or meta.on_epoch:
                continue
            if isinstance(getattr(result, "_forward_cache", None), Tensor):
                result._forward_cache = None
