"""Range rules of config values: a key, what it must be, and a valid example. The general rules and each part's own
(`CONFIG_RULES` in its part.py) are checked together at start-up by `pixelsmith.config.validate`; the `Range`s here
are shared by a plain key and every value a schedule gives it (`model.schedules.<name>`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Rule:
    key: str  # dotted path; the rule is skipped when the config has no such key (another model, another data)
    ok: Callable[[Any], bool]
    requirement: str  # "must be ..." text
    example: str  # a valid value for the message


def number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def positive_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def non_negative(v: Any) -> bool:
    return number(v) and v >= 0


def positive(v: Any) -> bool:
    return number(v) and v > 0


def optional(check: Callable[[Any], bool]) -> Callable[[Any], bool]:
    return lambda v: v is None or check(v)


@dataclass(frozen=True)
class Range:
    """What one kind of hyper-parameter may be, wherever its value comes from: the plain key
    (`model.g_optimizer.lr`) and every value a schedule gives it over a run (`model.schedules.lr`) obey the same
    rule, so a value refused on the command line cannot come back through a schedule."""

    ok: Callable[[Any], bool]
    requirement: str
    example: str

    def rule(self, key: str, example: str | None = None) -> Rule:
        return Rule(key, self.ok, self.requirement, example or self.example)


LEARNING_RATE = Range(
    positive, "must be > 0 (at 0 nothing learns; a negative learning rate climbs the loss)", "2.0e-4"
)
ADAM_BETA = Range(
    lambda v: number(v) and 0.0 <= v < 1.0,
    "must be in [0, 1) (Adam's moment decay; 1 or more makes its bias correction divide by zero: NaN)",
    "0.99",
)
PENALTY_WEIGHT = Range(
    non_negative, "must be >= 0 (0 disables it; a negative weight rewards the penalty)", "10.0"
)
PROBABILITY = Range(lambda v: number(v) and 0.0 <= v <= 1.0, "must be a probability in [0, 1]", "0.3")
# The EMA's half-life: > 0 as a plain key (EMA refuses 0), but a schedule may start at 0 (R3GAN's presets ramp it up
# from a plain copy of G), so its scheduled values only have to be >= 0.
EMA_HALF_LIFE = Range(positive, "must be > 0", "10.0")
EMA_HALF_LIFE_RAMP = Range(
    non_negative, "must be >= 0 (0: the average is a copy of G, as R3GAN's ramp starts)", "500.0"
)

# model.schedules.<name> -> the range its values obey: the same Range objects as the plain keys they move.
# `<optimizer>_lr` / `_beta1` / `_beta2` (one optimizer's) take the range of their suffix.
GENERAL_SCHEDULED_RANGES: dict[str, Range] = {
    "lr": LEARNING_RATE,
    "beta1": ADAM_BETA,
    "beta2": ADAM_BETA,
    "augment_p": PROBABILITY,
    "ema_half_life_kimg": EMA_HALF_LIFE_RAMP,
}


def betas(v: Any) -> bool:
    return isinstance(v, list | tuple) and len(v) == 2 and all(ADAM_BETA.ok(b) for b in v)


def optimizer_rules(prefix: str) -> list[Rule]:
    return [
        LEARNING_RATE.rule(f"{prefix}.lr"),
        Rule(
            f"{prefix}.betas",
            optional(betas),
            "must be two numbers in [0, 1), Adam's (beta1, beta2), or null for an optimizer without betas",
            "[0.5,0.999]",
        ),
        Rule(f"{prefix}.eps", optional(positive), "must be > 0 (or null: the optimizer's default)", "1.0e-8"),
        Rule(f"{prefix}.weight_decay", non_negative, "must be >= 0", "0.0"),
    ]
