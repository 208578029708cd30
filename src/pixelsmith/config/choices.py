"""Choice fields of the typed schemas: a fixed set of string values, refused at composition when out of it.

A schema field declares its allowed values with an Enum (the `*/config.py` schema modules):

    on_corrupt: str = choice(OnCorrupt, "skip")

and `typed(Schema)`, which `register_configs` stores in Hydra's ConfigStore, turns that field's node into a
`ChoiceNode`: `data.on_corrupt=explode` on the command line, or in a YAML option, then stops Hydra's composition with
OmegaConf's message naming the key and the values (`Invalid value 'explode': choose one of skip, error` /
`full_key: data.on_corrupt`), before anything runs.

Why not an Enum-typed field (OmegaConf's `EnumNode`): it looks values up by the member's *name* (so `16-mixed`,
`reduce-overhead` could not be values) and puts Enum objects into every `OmegaConf.to_container`, hence into the run
config stored in checkpoints, which must load with `torch.load(weights_only=True)`. A `ChoiceNode` holds a plain
string, so the code, the YAML dumps and the checkpoints see exactly what they saw before; the Python dataclasses keep
plain string defaults.
"""

from __future__ import annotations

import dataclasses
from enum import Enum
from typing import Any

from omegaconf import DictConfig, OmegaConf, StringNode, ValidationError

CHOICES = "choices"  # the dataclass field metadata key holding the Enum of allowed values


def choice(enum: type[Enum], default: str | None) -> Any:
    """A dataclass field whose value must be one of `enum`'s values (None too when the field is Optional)."""
    return dataclasses.field(default=default, metadata={CHOICES: enum})


def values(enum: type[Enum]) -> tuple[str, ...]:
    return tuple(str(member.value) for member in enum)


class ChoiceNode(StringNode):
    """A string node that accepts only `choices` (interpolations are checked when resolved)."""

    def __init__(
        self,
        choices: tuple[str, ...],
        value: Any = None,
        key: Any = None,
        parent: Any = None,
        is_optional: bool = True,
        flags: dict[str, bool] | None = None,
    ):
        self._choices = tuple(choices)  # set before the base class validates the initial value
        super().__init__(value=value, key=key, parent=parent, is_optional=is_optional, flags=flags)

    def _validate_and_convert_impl(self, value: Any) -> str:
        text = super()._validate_and_convert_impl(value)
        if text not in self._choices:
            raise ValidationError(f"Invalid value '$VALUE': choose one of {', '.join(self._choices)}")
        return text

    def __deepcopy__(self, memo: dict[int, Any]) -> ChoiceNode:  # StringNode's would drop the choices
        res = ChoiceNode(self._choices)
        self._deepcopy_impl(res, memo)
        return res


def typed(schema: type) -> DictConfig:
    """`OmegaConf.structured(schema)` with every `choice(...)` field, nested dataclasses included, as a ChoiceNode."""
    cfg = OmegaConf.structured(schema)
    _swap_choice_nodes(cfg, schema)
    return cfg


def _swap_choice_nodes(cfg: DictConfig, schema: type) -> None:
    for f in dataclasses.fields(schema):
        node = cfg._get_node(f.name)
        enum = f.metadata.get(CHOICES)
        if enum is not None:
            swapped = ChoiceNode(
                values(enum), node._value(), key=f.name, parent=cfg, is_optional=node._is_optional()
            )
            cfg.__dict__["_content"][f.name] = swapped
        elif isinstance(node, DictConfig) and not node._is_none() and not node._is_missing():
            nested = OmegaConf.get_type(node)
            if nested is not None and dataclasses.is_dataclass(nested):
                _swap_choice_nodes(node, nested)
