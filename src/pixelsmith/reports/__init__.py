"""What a run or a sweep leaves for people to read: `report.html` (`html`), the sweep's summary table
(`sweep_summary`) and its Optuna part (`optuna`)."""
