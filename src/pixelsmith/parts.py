"""The template's optional parts (the GAN models, style transfer, a fork's own), found at run time, never by name.

A part is a sub-package of `pixelsmith` that holds a module `part.py`. General code asks this module what the parts
present contribute instead of importing them, so deleting a part's folder with its configs and tests (README
"Removing a part") needs no edit anywhere else; tests/test_fork_removal.py proves it. A part's `part.py` may define:

    SCHEMAS                   [(group, name, dataclass)]: typed config schemas stored in Hydra's ConfigStore
                              (`conf/model/<x>.yaml` starts with `defaults: [<name>, _self_]`)
    SHAPING_CONFIG_PREFIXES   config keys that decide the part's network tensors (a resume that does not fit the
                              checkpoint names the ones that differ)
    SHAPING_CONFIG_PATTERNS   regular expressions of such keys that add tensors by their value
    FUNCTION_CONFIG_KEYS      keys whose other value makes the same tensors another network (a resume that
                              changes one is refused, naming it)
    RESOLVERS                 functions that register the OmegaConf resolvers the part's configs use
    CONFIG_RULES              range rules (`pixelsmith.config.rules.Rule`) for the part's config keys, checked at
                              start-up with the general ones
    COMMANDS                  [(name, "module.function")]: commands the general entry points in cli/ run
    CHECKPOINT_READERS        [(suffix, "module.function")]: files of another format the part reads into a checkpoint
                              dict for evaluate.py (`ckpt_path=X.pkl`); train.py refuses them as resume points

Everything else a part brings is reached through the config tree (`_target_` paths) or the model object itself
(e.g. its `breakdown_regions`). `part.py` should import only the part's schemas: it is imported before every
composition.
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from types import ModuleType

PACKAGE = "pixelsmith"
PART_MODULE = "part"


@functools.cache
def part_modules() -> tuple[ModuleType, ...]:
    """The `part` module of every sub-package of pixelsmith that has one, in name order."""
    package = importlib.import_module(PACKAGE)
    names = sorted(
        {
            child.name
            for root in package.__path__
            for child in Path(root).iterdir()
            if (child / f"{PART_MODULE}.py").is_file() and (child / "__init__.py").is_file()
        }
    )
    return tuple(importlib.import_module(f"{PACKAGE}.{name}.{PART_MODULE}") for name in names)


def part_names() -> list[str]:
    """The parts present, e.g. ["gan", "style"] in the full template, ["gan"] in a GAN-only fork."""
    return [module.__name__.split(".")[1] for module in part_modules()]


def contributed(attribute: str) -> list:
    """The concatenation of one list/tuple attribute over every part that defines it."""
    return [item for module in part_modules() for item in getattr(module, attribute, ())]
