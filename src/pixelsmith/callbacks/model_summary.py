"""The start-up model summary (Lightning's RichModelSummary table) without its FLOPs column.

Lightning 2.6 counts FLOPs by running the module's `example_input_array` through `forward`; a Pixelsmith module
trains in `training_step` (G and D, forward and backward) and has neither, so the column and "Total FLOPs" read 0
for every network. A true count is a whole iteration's (G and D, forward and backward), which `profiler=breakdown`
counts on a real iteration and writes to perf/throughput.json with MFU (perf/throughput.py); counting one at every
start-up would cost an extra traced iteration, so the summary leaves the column out instead of showing a wrong 0.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import RichModelSummary
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count

DROPPED = "FLOPs"


class ParameterSummary(RichModelSummary):
    """RichModelSummary's table and totals, FLOPs left out (see the module docstring)."""

    @staticmethod
    def summarize(
        summary_data: list[tuple[str, list[str]]],
        total_parameters: int,
        trainable_parameters: int,
        model_size: float,
        total_training_modes: dict[str, int],
        total_flops: int,
        **summarize_kwargs: Any,
    ) -> None:
        from rich import get_console
        from rich.table import Table

        columns = [(name, values) for name, values in summary_data if name != DROPPED]
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _values in columns:
            if name == " ":
                table.add_column(" ", style="dim")
            elif name in ("Name", "Type", "Mode"):
                table.add_column(name, justify="left", no_wrap=name == "Name")
            else:
                table.add_column(name, justify="right")
        for row in zip(*(values for _name, values in columns), strict=True):
            table.add_row(*row)
        console = get_console()
        console.print(table)
        frozen = total_parameters - trainable_parameters
        grid = Table.grid(expand=True)
        grid.add_column()
        for line in (
            f"[bold]Trainable params[/]: {get_human_readable_count(int(trainable_parameters))}",
            f"[bold]Non-trainable params[/]: {get_human_readable_count(int(frozen))}",
            f"[bold]Total params[/]: {get_human_readable_count(int(total_parameters))}",
            f"[bold]Total estimated model params size (MB)[/]: {get_formatted_model_size(model_size)}",
            f"[bold]Modules in train mode[/]: {total_training_modes['train']}",
            f"[bold]Modules in eval mode[/]: {total_training_modes['eval']}",
        ):
            grid.add_row(line)
        console.print(grid)
