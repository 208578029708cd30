"""What the benchmark tools' command lines share: a refused argument is one paragraph on stderr and exit status 2,
said at start-up, before any run, like the entry points' refusals (`pixelsmith.errors`).

Each tool keeps its own checks beside its argument parsing; from here it takes:
- `Parser`: argparse's parser, whose refusals are a `CommandLineError` instead of the usage text and `SystemExit`;
- `refusals_exit_2`: its `main(argv)` prints a `PixelsmithError` as one paragraph and returns 2, no traceback;
- argparse `type=` functions for counts, seconds, powers of two and true/false;
- the names the config tree offers (`conf_names`: hardware profiles, GAN models), `check_hardware_here` (a profile
  whose device this machine lacks) and `check_output_folder` (writable, and not one of the command's inputs).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pixelsmith.errors import PixelsmithError, check_writable_folder


class CommandLineError(PixelsmithError):
    """A benchmark argument refused at start-up: nothing was run."""


class Parser(argparse.ArgumentParser):
    """argparse's parser with its refusal (an unknown option, a bad value, a missing one) raised as one paragraph."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandLineError(f"{message}. Nothing was run; `{self.prog} --help` lists the options.")


def refusals_exit_2(main: Callable[..., Any]) -> Callable[..., Any]:
    """`main(argv)` with a PixelsmithError (a refused argument, a bad input found at start-up) printed on stderr as
    one paragraph, and 2 returned, instead of a traceback."""

    @functools.wraps(main)
    def refusing(argv: list[str] | None = None) -> Any:
        try:
            return main(argv)
        except PixelsmithError as err:
            print("error: " + " ".join(str(err).split()), file=sys.stderr, flush=True)
            return 2

    return refusing


# ---- argparse type= functions -------------------------------------------------------------------------------------
def _number(text: str, kind: type) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def at_least(minimum: int) -> Callable[[str], int]:
    """A whole number >= `minimum` (a count: repeats, steps, a batch size, threads)."""

    def count(text: str) -> int:
        value = _number(text, int)
        if value < minimum:
            raise argparse.ArgumentTypeError(
                f"{value} is below {minimum}: give a whole number of at least {minimum}"
            )
        return value

    return count


count = at_least(1)


def amount(unit: str, minimum: float = 0.0) -> Callable[[str], float]:
    """A finite number of `unit` (seconds, minutes, ...) of at least `minimum`, and above 0 in any case."""

    def parse(text: str) -> float:
        value = _number(text, float)
        if value < minimum or value <= 0:
            floor = f"at least {minimum:g}" if minimum > 0 else "more than 0"
            raise argparse.ArgumentTypeError(f"{text} {unit} is too little: give {floor} {unit}")
        return value

    return parse


seconds = amount("seconds")


def power_of_two(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An image side the networks build: a power of two from `minimum` to `maximum` (None: no upper bound)."""

    def side(text: str) -> int:
        value = _number(text, int)
        top = maximum if maximum is not None else max(minimum, 1 << max(value, 1).bit_length())
        if minimum <= value <= top and not value & (value - 1):
            return value
        upper = min(top, max(minimum, 1 << max(value, 1).bit_length()))
        lower = max(minimum, min(upper // 2, top))
        example = f"{lower} or {upper}" if lower != upper else str(upper)
        span = f"from {minimum} to {maximum}" if maximum is not None else f"of at least {minimum}"
        raise argparse.ArgumentTypeError(
            f"{value} is not a power of two {span} (an image side the networks build here): e.g. {example}"
        )

    return side


def true_or_false(text: str) -> bool:
    if text.lower() in ("true", "1", "yes", "on"):
        return True
    if text.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is neither true nor false (true, false, 1, 0, yes, no)")


def nvlabs_checkout(text: str) -> str:
    """A checkout of NVlabs/stylegan2-ada-pytorch (its training/networks.py is what the reference columns build)."""
    if not (Path(text).expanduser() / "training" / "networks.py").is_file():
        found = "does not exist" if not Path(text).expanduser().exists() else "has no training/networks.py"
        raise argparse.ArgumentTypeError(
            f"{text} {found}: give a checkout of https://github.com/NVlabs/stylegan2-ada-pytorch"
        )
    return text


# ---- names from the config tree ------------------------------------------------------------------------------------
def conf_names(group: str) -> tuple[str, ...]:
    """The options of a config group (`conf/<group>/*.yaml`, schemas and `_`-files left out): a fork's own profile
    or model is a valid name as soon as its file is there."""
    from pixelsmith.config.paths import CONF_DIR

    return tuple(
        sorted(p.stem for p in (Path(CONF_DIR) / group).glob("*.yaml") if not p.stem.startswith("_"))
    )


def gan_models() -> tuple[str, ...]:
    """The models of `conf/model/` that hold a generator and a discriminator: what the GAN benchmarks time."""
    from omegaconf import OmegaConf

    from pixelsmith.config.paths import CONF_DIR

    names = []
    for name in conf_names("model"):
        node = OmegaConf.load(Path(CONF_DIR) / "model" / f"{name}.yaml")
        if "generator" in node and "discriminator" in node:
            names.append(name)
    return tuple(names)


def one_of(names: Iterable[str], what: str) -> Callable[[str], str]:
    """A name from `names` (computed once, when the parser is built), refused with every valid one listed."""
    valid = tuple(names)

    def name(text: str) -> str:
        if text not in valid:
            raise argparse.ArgumentTypeError(f"{text!r} is no {what}; choose one of {', '.join(valid)}")
        return text

    return name


def composition_error(err: BaseException) -> str:
    """Hydra's refusal of an override with its cause (OmegaConf's first line: the value and the type it wanted)."""
    cause = err.__cause__
    detail = str(cause).strip().splitlines()[0] if cause is not None and str(cause).strip() else ""
    return f"{err} ({detail})" if detail and detail not in str(err) else str(err)


# ---- the machine and the outputs ----------------------------------------------------------------------------------
def device_here() -> tuple[str, str]:
    """(the profile `hardware=auto` picks on this machine, the device in words)."""
    import torch

    from pixelsmith.hardware.settings import detect_profile

    profile = detect_profile()
    if torch.cuda.is_available():
        return profile, torch.cuda.get_device_name(0)
    if profile == "mps":
        return profile, "an Apple GPU (MPS)"
    from pixelsmith.perf.flops import cpu_model_name

    return profile, f"no GPU, the CPU {cpu_model_name()}"


def check_hardware_here(
    profile: str, flag: str = "--hardware", precisions: Iterable[str] = ("auto",)
) -> None:
    """Refuse, before any run, a hardware profile (with each of `precisions`) this machine cannot run: a CUDA or
    Apple GPU profile without that device, a precision the device lacks. The paragraph names the device found and
    what runs here."""
    import tempfile

    import torch
    from hydra.errors import HydraException

    from benchmarks.harness import compose
    from pixelsmith.hardware.settings import HardwareError, mps_available, resolve_hardware_settings

    with tempfile.TemporaryDirectory() as scratch:
        try:
            cfg = compose([f"hardware={profile}"], Path(scratch))
        except HydraException as err:
            raise CommandLineError(f"{flag} {profile} does not compose: {composition_error(err)}") from err
    accelerator = str(cfg.hardware.accelerator)
    present = {"cuda": torch.cuda.is_available, "mps": mps_available}.get(accelerator, lambda: True)()
    if not present:
        here, device = device_here()
        needs = "a CUDA GPU" if accelerator == "cuda" else "an Apple GPU (MPS)"
        raise CommandLineError(
            f"{flag} {profile} runs on {needs}, but this machine has {device}: every run would fail. Nothing was "
            f"run. Fix: {flag} auto (it picks the {here} profile here) or {flag} {here}."
        )
    for precision in precisions:
        try:
            resolve_hardware_settings(
                cfg.hardware, precision, cfg.strategy.name, cfg.strategy.process_group_backend
            )
        except HardwareError as err:
            shown = "" if precision == "auto" else f" with precision {precision}"
            raise CommandLineError(
                f"{flag} {profile}{shown} cannot run on this machine ({device_here()[1]}): {err} Nothing was run."
            ) from err


def check_output_folder(
    folder: str | Path, flag: str, inputs: Iterable[tuple[str, str | Path | None]] = ()
) -> Path:
    """The absolute output folder `flag` names, refused in one paragraph when this process could not write there
    (read-only, /proc, a file in the way) or when it is, or lies inside, one of the command's `inputs`
    ((flag, path) pairs; None: not given): an output never replaces what the command reads."""
    path = Path(folder).expanduser().resolve()
    for input_flag, given in inputs:
        if given is None:
            continue
        source = Path(given).expanduser().resolve()
        if path.is_relative_to(source):
            raise CommandLineError(
                f"{flag} {folder} is {'' if path == source else 'inside '}{input_flag} {given}: what this command "
                f"writes would land among what it reads. Nothing was run. Fix: give {flag} a folder outside {given}."
            )
    check_writable_folder(path, flag, f"give {flag} a folder you can write in.", given=folder)
    return path
