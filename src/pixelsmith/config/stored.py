"""A run config read back from a checkpoint (`pixelsmith_config`), checked as data before anything is built from it.

A checkpoint is a file a user may have downloaded or been sent. `torch.load(weights_only=True)` makes its contents
plain data, but a config node is still an instruction once it reaches `hydra.utils.instantiate`: `_target_` names any
callable (`torch.load` with `weights_only: false`, `builtins.open`), at any depth. So a stored config names, at most,
which of the project's own classes a run was trained with, and each is taken only where the config tree puts it:

- **The classes.** `_target_` must be a value the config tree in `conf/` (or a registered schema's default) gives
  at the same place: `model.generator` may name a generator some `conf/` file names at `model.generator`, and
  nothing else. A fork's own network, added as the README says (a YAML under `conf/model/` naming it), is therefore
  allowed with no other change; a class named only on a training run's command line is not, and the paragraph says
  to add the YAML. `_partial_` is allowed where the tree has it; every other `_`-key (`_args_`, `_recursive_`,
  `_convert_`) is refused.
- **The values.** Only plain data (dicts with string keys, lists, strings, numbers, booleans, None), within depth,
  node and length limits; no OmegaConf interpolation (`${...}`), since a stored config is written resolved and a
  resolver is code. The node of a class is merged into the typed schema of the option that names it (unknown key,
  wrong type: refused), or, for an untyped node, its keys are checked against the class's arguments. Ranges are
  the config rules' job, run by the caller on the config it builds (`config/validate.py`).

The check never imports or calls a name it reads from the file: the allow-list is built from the config tree, and a
stored `_target_` is compared with it as a string. What is refused is said in one paragraph naming the key, the
value and the fix (`StoredConfigError`, exit status 2 at the entry points).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import fields, is_dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from pixelsmith.config.choices import typed
from pixelsmith.config.paths import CONF_DIR
from pixelsmith.errors import PixelsmithError
from pixelsmith.parts import contributed

# Bounds on what a stored config may hold: far above any real run config (a few hundred nodes, depth under 8), far
# below what would cost the reader memory or time.
MAX_DEPTH = 32
MAX_NODES = 20_000
MAX_STRING = 4_096
MAX_INT = 2**40
# Keys whose children are named freely by a config (regularizers: r1, path_length, gp, a fork's own): one place.
FREE_NAMED = ("regularizers",)
UNDERSCORE_KEYS = ("_target_", "_partial_")
# A model's optimizer nodes: building from a checkpoint never trains, so they are dropped unread.
OPTIMIZER_KEYS = ("g_optimizer", "d_optimizer", "optimizer")


class StoredConfigError(PixelsmithError):
    """A checkpoint's stored run config names a class the config tree does not, or holds values that are not plain
    data of the schema's types."""


def _refuse(source: str, where: str, why: str, fix: str = "") -> StoredConfigError:
    return StoredConfigError(
        f"{source}: its stored run config (pixelsmith_config) is refused at {where}: {why}. Nothing was built from it "
        "(a checkpoint names at most which of this project's own classes it was trained with; its values are read "
        "as data, never called). "
        + (
            fix
            or "Use a checkpoint written by this project's train.py, or convert.py's output for NVlabs pickles."
        )
    )


def plain_tree(value: Any, source: str, where: str = "pixelsmith_config") -> Any:
    """A deep copy of `value` if it is plain data within the limits; refused otherwise. Iterative, so depth is a
    count, not Python's recursion limit."""
    count = 0
    stack: list[tuple[Any, str, int]] = [(value, where, 0)]
    while stack:
        node, path, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise _refuse(source, where, f"more than {MAX_NODES} values (a run config has a few hundred)")
        if depth > MAX_DEPTH:
            raise _refuse(source, path, f"nested deeper than {MAX_DEPTH} levels")
        if isinstance(node, dict):
            for key, child in node.items():
                if not isinstance(key, str) or len(key) > 200:
                    raise _refuse(source, path, f"a key that is not a short string ({type(key).__name__})")
                stack.append((child, f"{path}.{key}", depth + 1))
        elif isinstance(node, list | tuple):
            stack.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(node))
        elif isinstance(node, str):
            if len(node) > MAX_STRING:
                raise _refuse(source, path, f"a string of {len(node)} characters")
            if "${" in node:
                raise _refuse(
                    source, path, f"an interpolation {node[:80]!r} (stored configs are written resolved)"
                )
            if node == "???":
                raise _refuse(
                    source, path, "OmegaConf's missing-value marker '???' (a stored config is complete)"
                )
        elif isinstance(node, bool) or node is None:
            pass
        elif isinstance(node, int):
            if abs(node) > MAX_INT:
                raise _refuse(source, path, f"the integer {node} (beyond {MAX_INT})")
        elif isinstance(node, float):
            pass
        else:
            raise _refuse(source, path, f"a {type(node).__name__}, which is not plain config data")
    return _copy(value)


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_copy(v) for v in value]
    return value


def _generalised(path: tuple[str, ...]) -> tuple[str, ...]:
    """A path with the freely named children (`regularizers.r1`) as `*`."""
    return tuple("*" if i and path[i - 1] in FREE_NAMED else part for i, part in enumerate(path))


def _targets_of_tree(node: Any, prefix: tuple[str, ...], into: dict[tuple[str, ...], set[str]]) -> None:
    stack = [(node, prefix)]
    while stack:
        current, path = stack.pop()
        if isinstance(current, dict):
            target = current.get("_target_")
            if isinstance(target, str) and target:
                into.setdefault(_generalised(path), set()).add(target)
            stack.extend((child, (*path, str(key))) for key, child in current.items() if key != "defaults")


def _package_of(file: Path, text: str) -> tuple[str, ...]:
    for line in text.splitlines()[:5]:
        if line.startswith("# @package"):
            package = line.split(None, 2)[2].strip()
            return () if package == "_global_" else tuple(package.split("."))
    return file.parent.relative_to(CONF_DIR).parts


def _targets_of_schema(schema: type, prefix: tuple[str, ...], into: dict[tuple[str, ...], set[str]]) -> None:
    for item in fields(schema):
        if item.name == "_target_" and isinstance(item.default, str):
            into.setdefault(_generalised(prefix), set()).add(item.default)
        elif item.name == "_partial_":
            continue
        else:
            factory = item.default_factory  # type: ignore[misc]
            default = factory() if callable(factory) else item.default
            if is_dataclass(default):
                _targets_of_schema(type(default), (*prefix, item.name), into)


@lru_cache(maxsize=1)
def classes_in_tree() -> dict[tuple[str, ...], frozenset[str]]:
    """Config path (freely named children as `*`) -> the `_target_` values the config tree gives there: every YAML
    under conf/ (at its package) and the model parts' schema defaults (an optimizer's `torch.optim.Adam`)."""
    found: dict[tuple[str, ...], set[str]] = {}
    for file in sorted(CONF_DIR.rglob("*.yaml")):
        text = file.read_text(encoding="utf-8")
        try:
            tree = yaml.safe_load(text)
        except yaml.YAMLError:
            continue  # composition reports a broken YAML of the tree itself
        _targets_of_tree(tree, _package_of(file, text), found)
    for group, _name, schema in contributed("SCHEMAS"):
        _targets_of_schema(schema, tuple(group.split("/")), found)
    return {path: frozenset(targets) for path, targets in found.items()}


def option_schema(group: str, option: str, schemas: Iterable[tuple[str, str, type]]) -> type | None:
    """The typed schema (dataclass) of `conf/<group>/<option>.yaml`: the `_..._schema` entry of its defaults list,
    looked up in `schemas` ((group, name, dataclass) rows, as registered in Hydra's ConfigStore)."""
    file = CONF_DIR / group / f"{option}.yaml"
    if not file.is_file():
        return None
    tree = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    names = [
        d for d in tree.get("defaults", []) if isinstance(d, str) and d.startswith("_") and d != "_self_"
    ]
    rows = {(g, n): cls for g, n, cls in schemas}
    return next((rows[(group, n)] for n in names if (group, n) in rows), None)


def field_schema(schema: type | None, name: str) -> type | None:
    """The dataclass that types field `name` of `schema` (None: untyped, or no schema)."""
    for item in fields(schema) if schema is not None else ():
        if item.name == name:
            factory = item.default_factory  # type: ignore[misc]
            default = factory() if callable(factory) else item.default
            return type(default) if is_dataclass(default) else None
    return None


def options_of(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml") if not p.stem.startswith("_"))


def check_section(
    section: str, node: Any, source: str, schema: type | None = None, classes: dict | None = None
) -> dict[str, Any]:
    """`node` (the stored `section`: model, data, augment), refused unless every `_target_` in it is one the tree
    gives at that place, every other `_`-key is `_partial_: bool`, and its values fit `schema` (the dataclass of the
    option it names) or, where untyped, its class's arguments. Returns the node as plain data, with the values as
    the schema types them; keys the file lacks stay absent (the class's defaults: the network it was trained as)."""
    if not isinstance(node, dict):
        raise _refuse(source, section, f"a {type(node).__name__} where a config node belongs")
    node = plain_tree(node, source, section)
    allowed = classes if classes is not None else classes_in_tree()
    # Every container at every depth: a dict inside a list (of lists) is as much a Hydra node as one in a dict, and
    # its path gets a `[]` part that no class of the tree has, so a `_target_` there is refused.
    stack: list[tuple[Any, tuple[str, ...]]] = [(node, tuple(section.split(".")))]
    while stack:
        current, path = stack.pop()
        if isinstance(current, list):
            stack.extend((item, (*path, "[]")) for item in current if isinstance(item, dict | list))
            continue
        where = ".".join(path)
        if "_target_" in current:
            target = current["_target_"]
            expected = allowed.get(_generalised(path), frozenset())
            if not isinstance(target, str) or target not in expected:
                named = f"the class {target!r}" if isinstance(target, str) else f"a {type(target).__name__}"
                where_allowed = ", ".join(sorted(expected)) or "no class at all"
                raise _refuse(
                    source,
                    f"{where}._target_",
                    f"{named}, which the config tree does not name there (it allows: {where_allowed})",
                    "A class of your own is allowed once a YAML under conf/ names it at that place (README: how to "
                    "add your own); a checkpoint from elsewhere is refused, whatever it holds.",
                )
        for key, value in current.items():
            if not key.isidentifier():
                raise _refuse(source, f"{where}.{key[:40]}", f"the key {key[:40]!r}, which is no config key")
            if key.startswith("_") and key not in UNDERSCORE_KEYS:
                raise _refuse(source, f"{where}.{key}", f"the key {key!r}, which this project never stores")
            if key == "_partial_" and not isinstance(value, bool):
                raise _refuse(source, f"{where}._partial_", f"{value!r} (must be true or false)")
            if isinstance(value, dict | list):
                stack.append((value, (*path, key)))
    if schema is not None:
        node = _merged_into_schema(node, schema, section, source)
    _check_untyped_arguments(node, schema, section, source)
    return node


def _merged_into_schema(node: dict, schema: type, section: str, source: str) -> dict:
    """`node` merged into `schema` (unknown keys and wrong types refused), returned with only the keys it had."""
    try:
        merged = OmegaConf.merge(typed(schema), node)
        as_typed = OmegaConf.to_container(merged, resolve=False)
    except OmegaConfBaseException as err:
        key = getattr(err, "full_key", "") or ""
        message = str(err).splitlines()[0][:300]
        raise _refuse(
            source, f"{section}.{key}" if key else section, f"{message} (schema {schema.__name__})"
        ) from None
    return _present_only(as_typed, node)


def _present_only(typed: Any, given: Any) -> Any:
    if isinstance(given, dict) and isinstance(typed, dict):
        return {k: _present_only(typed.get(k, v), v) for k, v in given.items()}
    return typed


def _check_untyped_arguments(node: dict, schema: type | None, section: str, source: str) -> None:
    """Each `_target_` node that no dataclass types: its keys must be arguments of the class it names (the class is
    one the config tree names, so importing it runs only this project's code)."""
    from hydra.utils import get_class  # the name is the tree's, checked above: never one only the file gives

    typed_paths = _typed_paths(schema, ()) if schema is not None else set()
    stack: list[tuple[dict, tuple[str, ...]]] = [(node, ())]
    while stack:
        current, path = stack.pop()
        stack.extend((v, (*path, k)) for k, v in current.items() if isinstance(v, dict))
        target = current.get("_target_")
        if not isinstance(target, str) or path in typed_paths:
            continue
        try:
            cls = get_class(target)
        except Exception as err:  # a part this checkout lacks
            where = ".".join((section, *path))
            raise _refuse(source, where, f"{target} cannot be imported here ({type(err).__name__})") from None
        accepted, any_key = accepted_arguments(cls)
        # `name`: the option's own name, which the builders read and remove before the class is called.
        unknown = sorted(k for k in current if not k.startswith("_") and k not in accepted and k != "name")
        if unknown and not any_key:
            where = ".".join((section, *path))
            raise _refuse(
                source,
                where,
                f"key(s) {unknown} that {cls.__name__} does not take (it takes {sorted(accepted)})",
            )


def _typed_paths(schema: type, prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
    """Paths of `schema`'s dataclass-typed nodes (the root included): their keys are checked by the merge."""
    paths = {prefix}
    for item in fields(schema):
        factory = item.default_factory  # type: ignore[misc]
        default = factory() if callable(factory) else item.default
        if is_dataclass(default):
            paths |= _typed_paths(type(default), (*prefix, item.name))
    return paths


def accepted_arguments(cls: type) -> tuple[set[str], bool]:
    """The keyword arguments `cls` takes, and whether it takes any (a `**kwargs` of its own). torch's Module is where
    the walk ends: its `*args, **kwargs` are not arguments its subclasses forward."""
    from torch import nn

    names: set[str] = set()
    for klass in cls.__mro__:
        if klass in (object, nn.Module):
            return names, False
        if "__init__" not in vars(klass):
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            return names, False
    return names, True


def _option_named(group: str, node: dict, source: str) -> str:
    """The `conf/<group>/` option a stored node comes from: by its `name` (model, data), else by its `_target_`
    (augment, which has no name). Refused when this checkout has no such option."""
    options = options_of(group)
    name = node.get("name")
    if isinstance(name, str) and name in options:
        return name
    for option in options if "name" not in node else ():  # a named node is its name's option or none
        tree = OmegaConf.to_container(OmegaConf.load(CONF_DIR / group / f"{option}.yaml"))
        if isinstance(tree, dict) and tree.get("_target_") and tree.get("_target_") == node.get("_target_"):
            return option
    named = name if isinstance(name, str) else node.get("_target_")
    raise _refuse(
        source,
        group,
        f"{named!r} is no option of conf/{group}/ in this checkout ({', '.join(options)})",
        "Use it with the checkout that trained it, or add that option's YAML under conf/.",
    )


def trusted_run_config(
    stored: Any,
    source: str,
    schemas: Iterable[tuple[str, str, type]],
    required: tuple[str, ...] = ("model", "data"),
) -> dict[str, Any]:
    """The parts of a checkpoint's stored run config that evaluation builds (model, data, augment) and reads (seed,
    the precision it trained in), each checked as data against the config tree and the option's typed schema
    (`schemas`: (group, name, dataclass) rows); `required` must be there, the others are checked where present (None
    where absent). The optimizers are dropped unread: nothing is trained."""
    if not isinstance(stored, dict):
        raise StoredConfigError(
            f"{source}: its stored run config is a {type(stored).__name__}, not a config."
        )
    schemas = list(schemas)
    trusted: dict[str, Any] = {}
    for group in ("model", "data"):
        node = stored.get(group)
        if node is None and group not in required:
            trusted[group] = None
            continue
        if not isinstance(node, dict):
            raise StoredConfigError(
                f"{source}: its stored run config has no {group} node; it was not written by train.py."
            )
        if group == "model":  # never read: nothing trains, so a class they name is never even looked at
            node = {k: v for k, v in node.items() if k not in OPTIMIZER_KEYS}
        option = _option_named(group, node, source)
        trusted[group] = check_section(group, node, source, option_schema(group, option, schemas))
    augment = stored.get("augment") or None
    if augment is not None:
        option = _option_named("augment", augment, source) if isinstance(augment, dict) else "?"
        augment = check_section("augment", augment, source, option_schema("augment", option, schemas))
    trusted["augment"] = augment
    seed = stored.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:
        raise _refuse(source, "seed", f"{seed!r}, which is no seed (an integer in [0, 2^32))")
    trusted["seed"] = seed
    plan = stored.get("runtime_plan") if isinstance(stored.get("runtime_plan"), dict) else {}
    precision = plan.get("precision")
    trusted["precision"] = precision if isinstance(precision, str) else None
    return trusted
