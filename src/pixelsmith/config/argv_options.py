"""Hydra-style `key=value` arguments into an options dataclass, for the entry points that are not Hydra apps
(`stylize.py`, `prepare.py`): one argument per field, a leading `--` or `+` tolerated, values converted by the
field's annotation (bool, int, float, `int | str`, optional), and an unknown key named with the closest field."""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from typing import Any


def convert_value(value: str, field: dataclasses.Field, error: type[Exception]) -> Any:
    kind = str(field.type)
    if value.lower() in ("null", "none", "~") and "None" in kind:
        return None
    if kind.startswith("int | str"):  # a number or a word (tile=512 or tile=auto)
        return int(value) if value.lstrip("-").isdigit() else value
    if kind.startswith("bool"):
        if value.lower() in ("true", "1", "yes"):
            return True
        if value.lower() in ("false", "0", "no"):
            return False
        raise error(f"{field.name}={value}: expected true or false.")
    if kind.startswith(("int", "float")):
        try:
            return int(value) if kind.startswith("int") else float(value)
        except ValueError:
            raise error(f"{field.name}={value}: expected a {kind.split()[0]} number.") from None
    return value


def parse_key_values(argv: Sequence[str], options: type, error: type[Exception], program: str) -> Any:
    """`options(**values)` from `argv`; `error` (a message naming the fix) for anything that is not a known key=value."""
    fields = {f.name: f for f in dataclasses.fields(options)}
    values: dict[str, Any] = {}
    for argument in argv:
        key, separator, value = argument.lstrip("-+").partition("=")
        if not separator:
            raise error(f"Arguments are key=value pairs; got '{argument}'. See python {program} --help.")
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f" Did you mean {close[0]}?" if close else ""
            raise error(f"Unknown option '{key}'.{hint} Options: {', '.join(fields)}.")
        values[key] = convert_value(value, fields[key], error)
    return options(**values)
