"""Typed (structured) config schemas registered with Hydra's ConfigStore."""
