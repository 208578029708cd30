"""Hydra's own refusals of a command line, as the one paragraph every other refusal is (exit status 2).

Hydra composes the config before any Pixelsmith code runs, and reports what it refuses (an option a config group
does not have, a value of the wrong type, a key no schema has, an override it cannot parse) in several lines of its
own with exit status 1. `composition_error_message` turns each into one paragraph naming the key, what it takes (the
group's options, the field's type, the schema's keys) and a valid example; `report_composition_errors` runs a
`@hydra.main` function so that such an error is printed that way.

How: Hydra runs each phase of a command (composing the config, running the job or the sweep) inside
`hydra._internal.utils.run_and_report`, which prints an exception and exits with status 1. While the entry point
runs, that function is wrapped: an error raised outside the job itself (no `run_job` frame in its traceback:
composing the run's config, a sweep job's config, starting a sweeper) is printed as the paragraph and exits with
status 2; anything else goes to Hydra's handler as before (a job's own errors are the job's: `pixelsmith.run.entry`).
`HYDRA_FULL_ERROR=1` keeps Hydra's full traceback, as Hydra documents. A private function of Hydra, so the wrapping
is skipped where a Hydra release lacks it (pyproject.toml bounds Hydra below 1.4): then Hydra's own lines show, with
exit status 1; tests/test_bad_input.py runs the entry points to catch that.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
import traceback
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from hydra.core.config_store import ConfigStore
from hydra.errors import (
    HydraException,
    InstantiationException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import MISSING, OmegaConf
from omegaconf.errors import ConfigAttributeError, ConfigKeyError, OmegaConfBaseException, ValidationError

from pixelsmith.errors import PixelsmithError

PREFIX = "[pixelsmith] "  # before Hydra's logging is set up, stderr is the only channel
_HELP = "`--help` lists the config groups and their options, `--cfg job` prints the composed config."


def composition_error_message(err: BaseException) -> str | None:
    """One paragraph for an error Hydra raised composing a config (None for any other exception)."""
    if isinstance(err, PixelsmithError):  # a sweeper's or a callback's own refusal, before any job ran
        return str(err)
    if isinstance(err, InstantiationException) or not isinstance(
        err, HydraException | OmegaConfBaseException
    ):
        return None
    if isinstance(err, MissingConfigException):
        return _missing_option(err)
    if isinstance(err, OverrideParseException):
        why = "; ".join(line for line in _lines(err) if not line.startswith(("See ", "Error parsing")))
        return (
            f"The override {err.override!r} cannot be parsed ({why}). Write key=value, quoting a value with spaces, "
            "brackets or commas as a whole argument ('key=[1,2]'); Hydra's override grammar: "
            "https://hydra.cc/docs/advanced/override_grammar/basic/."
        )
    cause = err.__cause__ if isinstance(err.__cause__, OmegaConfBaseException) else err
    if isinstance(cause, ConfigAttributeError | ConfigKeyError) and getattr(cause, "full_key", None):
        return _unknown_key(cause)
    if isinstance(cause, ValidationError) and getattr(cause, "full_key", None):
        return _wrong_value(err, cause)
    said = " ".join(_lines(err) + ([] if cause is err else _lines(cause)))
    return f"The command line does not compose into a config: {said} {_HELP}"


def _lines(err: BaseException) -> list[str]:
    """The message's lines up to Hydra's config search path, which names Hydra's internals, not the fix."""
    lines = []
    for line in str(err).splitlines():
        if line.startswith("Config search path"):
            break
        if line.strip() and not line.strip().startswith(("full_key:", "object_type=", "reference_type=")):
            lines.append(line.strip())
    return lines


def _missing_option(err: MissingConfigException) -> str:
    missing = str(err.missing_cfg_file or "")
    group, _, option = missing.rpartition("/")
    # Names starting with "_" are the schemas and the detected hardware profile: not options a user picks.
    options = [o for o in err.options or [] if not o.startswith("_")]
    if not group or not options:
        return f"The command line names a config that does not exist: {' '.join(_lines(err))} {_HELP}"
    close = difflib.get_close_matches(option, options, n=1)
    hint = f" Did you mean {group}={close[0]}?" if close else ""
    return (
        f"{group}={option} is not an option of the config group {group}: choose one of {', '.join(options)} (the "
        f"files in conf/{group}/).{hint}"
    )


def _schema_fields(cause: OmegaConfBaseException) -> dict[str, dataclasses.Field]:
    schema = getattr(cause, "object_type", None)
    if schema is None or not dataclasses.is_dataclass(schema):
        return {}
    return {f.name: f for f in dataclasses.fields(schema)}


def _unknown_key(cause: OmegaConfBaseException) -> str:
    full_key = str(cause.full_key)
    parent, _, name = full_key.rpartition(".")
    schema = getattr(cause, "object_type", None)
    keys = [k for k in _schema_fields(cause) if not k.startswith("_")]
    where = (
        f"{schema.__name__} ({parent or 'the root config'})" if schema is not None else parent or "the config"
    )
    if not keys:
        return f"{full_key} is not a key of {where}, so nothing would read it. {_HELP}"
    owners = _options_with_key(full_key)
    if owners:
        hint = (
            f" It is a key of {' and '.join(owners)}: name that option on the command line before its keys "
            f"({owners[0]} {full_key}=...)."
        )
    else:
        close = difflib.get_close_matches(name, keys, n=1)
        hint = f" Did you mean {parent + '.' if parent else ''}{close[0]}?" if close else ""
    return f"{full_key} is not a key of {where}, so nothing would read it; its keys: {', '.join(keys)}.{hint}"


def _options_with_key(full_key: str) -> list[str]:
    """The options of the key's config group whose schema has the key (`model.generator.channel_base`:
    model=stylegan2), from the schemas in Hydra's ConfigStore (`_<option>_schema`, config/schema.py)."""
    group, _, rest = full_key.partition(".")
    store = ConfigStore.instance()
    owners = []
    try:
        names = store.list(group)
    except OSError:  # not a config group
        return []
    for name in names:
        option = re.fullmatch(r"_(.+)_schema\.yaml", name)
        if option is None:
            continue
        node = store.load(f"{group}/{name}").node
        try:
            present = OmegaConf.select(node, rest, default=MISSING, throw_on_missing=False) is not MISSING
        except OmegaConfBaseException:
            present = False
        if present:
            owners.append(f"{group}={option.group(1)}")
    return owners


def _wrong_value(err: BaseException, cause: ValidationError) -> str:
    full_key = str(cause.full_key)
    given = re.search(r"override (\S+)", str(err))
    override = given.group(1) if given else full_key
    name = full_key.rpartition(".")[2]
    reason = (_lines(cause) or [type(cause).__name__])[0].rstrip(".")
    takes = ""
    field = _schema_fields(cause).get(name)
    if field is not None:
        kind = _describe_type(_field_type(cause, field))
        example = _default_of(field)
        takes = f" {full_key} takes {kind}" + (f", e.g. {full_key}={example}" if example is not None else "")
    return f"{override} is not a valid value: {reason}.{takes}. {_HELP}"


def _field_type(cause: ValidationError, field: dataclasses.Field) -> Any:
    try:
        return typing.get_type_hints(cause.object_type).get(field.name, field.type)
    except Exception:  # a string annotation that does not resolve here: say it as written
        return field.type


def _describe_type(kind: Any) -> str:
    args = [a for a in typing.get_args(kind) if a is not type(None)]
    optional = type(None) in typing.get_args(kind)
    origin = typing.get_origin(kind)
    if origin is list or kind is list:
        text = "a list, e.g. [a,b]"
    elif optional and len(args) == 1:
        text = _describe_type(args[0])
    else:
        text = {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(
            kind, str(kind)
        )
    return f"{text}, or null" if optional and not text.endswith("null") else text


def _default_of(field: dataclasses.Field) -> str | None:
    if field.default is not dataclasses.MISSING and field.default is not MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return None
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ",".join(map(str, value)) + "]"
    return str(value) if isinstance(value, int | float | str) else None


def _raised_in_a_job(err: BaseException) -> bool:
    return any(frame.f_code.co_name == "run_job" for frame, _ in traceback.walk_tb(err.__traceback__))


@contextmanager
def composition_errors_as_paragraphs() -> Iterator[None]:
    """Within the block, a Hydra app's composition errors are one paragraph on stderr and exit status 2."""
    try:
        from hydra._internal import utils as hydra_utils
    except ImportError:
        yield
        return
    original = getattr(hydra_utils, "run_and_report", None)
    if original is None:
        yield
        return

    def run_and_report(func: Callable[[], Any]) -> Any:
        def phase() -> Any:
            try:
                return func()
            except Exception as err:
                if os.environ.get("HYDRA_FULL_ERROR") == "1" or _raised_in_a_job(err):
                    raise
                message = composition_error_message(err)
                if message is None:
                    raise
                print(PREFIX + " ".join(message.split()), file=sys.stderr)
                raise SystemExit(2) from None

        return original(phase)

    hydra_utils.run_and_report = run_and_report
    try:
        yield
    finally:
        hydra_utils.run_and_report = original


def report_composition_errors(main: Callable[[], Any]) -> Any:
    """Call an entry point's `@hydra.main` function with composition errors as paragraphs (module docstring)."""
    with composition_errors_as_paragraphs():
        return main()
