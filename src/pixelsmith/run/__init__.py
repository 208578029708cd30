"""The run: build its parts from the config (`build`), fit them (`fit`, with the Trainer from `trainer`), evaluate a
checkpoint (`evaluate`), and what surrounds every entry point: one-paragraph errors (`entry`), the run dir's
ownership (`run_dir`), resuming (`resume`) and where this process sits in a multi-process launch (`launch`)."""
