"""Pixelsmith's Optuna sweeper for Hydra 1.3, on Optuna's ask/tell API (`hydra/sweeper=pixelsmith_optuna`).

A Hydra plugin: Hydra finds it by scanning the `hydra_plugins` namespace package, so this folder has an
`__init__.py` and its parent (`src/hydra_plugins/`) must not. It exists because the stable hydra-optuna-sweeper
(1.2, 1.3) pins optuna<3; retire it for Hydra's own plugin once a stable Hydra 1.4 ships one on current Optuna
(README "Sweeps"). The sweeper itself is `optuna_sweeper.py`.
"""
