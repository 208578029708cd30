"""The training package's import structure, read from the source with `ast` (nothing is imported): no import circle
between its parts, every import goes down the declared layers, and nothing under src/ imports the benchmarks.

A "part" is a sub-package (`pixelsmith.core`, `pixelsmith.gan`, ...), a top-level module (`pixelsmith.errors`, ...) or a module of a room
(`pixelsmith.run.fit`: ROOMS). Every `import` counts, at module level, inside functions and under `TYPE_CHECKING`
alike: a deferred import is still a dependency, it only moves the failure to run time.

Adding a part: put it in `LAYERS`. An import that breaks a rule is fixed by moving the shared piece down to where it
belongs, not by hiding the import in a function.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "pixelsmith"

# Rooms: packages that group modules by their job (the run, the configs, the hardware, the reports), each module of
# which sits in a layer of its own. Elsewhere a sub-package is one part.
ROOMS = ("run", "config", "hardware", "reports")

# Bottom to top. A part may import parts of lower layers only (never its own layer's, never a higher one's).
LAYERS: list[tuple[str, ...]] = [
    # no Pixelsmith import at all (config.choices: the schemas' choice fields; config.rules: range rules)
    # (parts: finds the optional model parts at run time, by their part.py, without importing them by name)
    # (owned_outputs: what overwrite=true may replace, for the commands that write datasets and checkpoints)
    ("errors", "hashing", "run.launch", "config.choices", "parts", "config.argv_options", "owned_outputs"),
    # where the config tree and data live; user files as data; Hydra's composition errors as paragraphs
    ("config.paths", "safe_load", "config.rules", "config.hydra_errors"),
    # the training core (loop bookkeeping, optimizers, precision, strategies) and its schemas; a checkpoint's stored
    # config checked as data
    ("core", "config.stored"),
    ("hardware.schema",),  # the hardware/precision/strategy schemas
    ("hardware.settings",),  # profiles -> the one set of hardware settings
    ("run.build",),  # hardware settings, core settings, datamodule and model from the composed config
    ("augment", "data", "perf"),  # augmentation, data modules, the performance hooks training uses
    ("metrics",),  # evaluation: reads the data; the Gram matrix the style loss imports
    # The optional model parts (MODEL_PARTS): leaves that only they import, so a fork deletes one with no other edit.
    ("gan", "style"),
    ("callbacks", "loggers", "reports.html", "run.run_dir", "reports.optuna"),
    ("run.resume",),  # the checks before a resume, the command that resumes (reads run_dir's marker)
    ("config.schema",),  # the root schema: registers every part's schema (each beside its code)
    ("config.validate",),  # range checks of the composed config
    ("run.trainer",),  # the Lightning Trainer: strategy, loggers, callbacks
    ("run.fit", "reports.sweep_summary"),  # builds and fits a run
    ("run.evaluate", "run.entry"),
    ("cli", PACKAGE, *ROOMS),  # installed entry points; the package's and the rooms' own __init__
]

# The optional parts (README "Removing a part"): no other part imports them (general code reaches them through
# `pixelsmith.parts`, `_target_` paths in the config tree and the model object), and they do not import each other.
MODEL_PARTS = ("gan", "style")

# Edges that break the layering, each with the change that removes it (none today: keep it that way). An entry whose
# import is gone fails `test_allow_list_has_no_stale_entries`: delete it then.
ALLOWED: dict[tuple[str, str, str], str] = {}


def _modules() -> dict[str, Path]:
    modules = {}
    for path in sorted((SRC / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _part(module: str) -> str:
    names = module.split(".")
    if len(names) > 2 and names[1] in ROOMS:
        return f"{names[1]}.{names[2]}"
    return names[1] if len(names) > 1 else PACKAGE


def _imports(module: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, int]]:
    """(imported module, line) for every import statement in the file, wherever it sits."""
    found = []
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                found.append((submodule if submodule in modules else source, node.lineno))
    return found


def _edges() -> tuple[dict[tuple[str, str], list[str]], list[str]]:
    """{(importer part, imported part): ["file:line", ...]} within the package, and imports of `benchmarks`."""
    modules = _modules()
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    benchmarks = []
    for module, path in modules.items():
        where = path.relative_to(SRC).as_posix()
        for target, line in _imports(module, path, modules):
            top = target.split(".")[0]
            if top == "benchmarks":
                benchmarks.append(f"{where}:{line} imports {target}")
            elif top == PACKAGE and _part(target) != _part(module):
                places = edges[(_part(module), _part(target))]
                if f"{where}:{line}" not in places:
                    places.append(f"{where}:{line}")
    return edges, benchmarks


def _checked_edges() -> dict[tuple[str, str], list[str]]:
    """The edges minus the allow-listed imports (an edge whose every import is allowed disappears)."""
    edges, _ = _edges()
    checked = {}
    for (a, b), places in edges.items():
        rest = [p for p in places if (a, b, p.split(":")[0]) not in ALLOWED]
        if rest:
            checked[(a, b)] = rest
    return checked


def _graph_text(edges: dict[tuple[str, str], list[str]]) -> str:
    targets: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        targets[a].add(b)
    return "\n".join(f"{a} -> {', '.join(sorted(targets[a]))}" for a in sorted(targets))


def _cycles(edges: dict[tuple[str, str], list[str]]) -> list[list[str]]:
    """The strongly connected components with more than one part (Tarjan)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
        graph[b]
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                component.append(item)
                if item == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_every_part_of_the_package_has_a_layer():
    layered = [part for layer in LAYERS for part in layer]
    assert len(layered) == len(set(layered)), "a part is listed in two layers"
    parts = {_part(module) for module in _modules()}
    missing = sorted(parts - set(layered))
    assert not missing, (
        f"not in LAYERS of tests/test_architecture.py (add each to the layer it belongs): {missing}"
    )


def test_no_import_circle_between_the_parts_of_the_package():
    edges = _checked_edges()
    circles = _cycles(edges)
    lines = []
    for component in circles:
        lines.append(" <-> ".join(component) + ":")
        lines += [
            f"  {a} -> {b}: {', '.join(places)}"
            for (a, b), places in sorted(edges.items())
            if a in component and b in component
        ]
    assert not circles, "import circles:\n" + "\n".join(lines) + "\n\nthe graph:\n" + _graph_text(edges)


def test_imports_go_down_the_declared_layers():
    layer_of = {part: depth for depth, layer in enumerate(LAYERS) for part in layer}
    wrong = [
        f"{a} (layer {layer_of[a]}) -> {b} (layer {layer_of[b]}): {', '.join(places)}"
        for (a, b), places in sorted(_checked_edges().items())
        if a in layer_of and b in layer_of and layer_of[b] >= layer_of[a]
    ]
    assert not wrong, (
        "imports that do not go down the layers (LAYERS in tests/test_architecture.py):\n" + "\n".join(wrong)
    )


def test_the_rules_the_layers_stand_for():
    """The same rules spelled out, so a change of LAYERS cannot quietly drop them."""
    forbidden = {
        "core": {"perf", "run.fit", "gan", "style", "callbacks", "data", "metrics"},
        "data": {"metrics"},
        "metrics": set(MODEL_PARTS),
        "errors": {part for layer in LAYERS for part in layer} - {"errors"},
        # the schemas' choice fields and the part schemas import no training code
        "config.choices": {part for layer in LAYERS for part in layer} - {"config.choices"},
        "hardware.schema": {part for layer in LAYERS for part in layer} - {"config.choices", "core"},
        # the root schema composes the parts' schemas; it reaches no model, loop or entry code
        "config.schema": {"run.fit", "run.evaluate", "run.entry", "cli", "run.build", "callbacks"},
    }
    broken = [
        f"{a} -> {b}: {', '.join(places)}"
        for (a, b), places in sorted(_checked_edges().items())
        if b in forbidden.get(a, ())
    ]
    assert not broken, "forbidden imports:\n" + "\n".join(broken)


def test_no_general_part_imports_a_model_part():
    """Deleting `src/pixelsmith/<part>/` (README "Removing a part") must leave every other module importable."""
    layered = {part for layer in LAYERS for part in layer}
    assert set(MODEL_PARTS) <= layered
    broken = [
        f"{a} -> {b}: {', '.join(places)}"
        for (a, b), places in sorted(_edges()[0].items())
        if b in MODEL_PARTS and a != b
    ]
    assert not broken, "imports of an optional model part (use pixelsmith.parts or a _target_ instead):\n" + (
        "\n".join(broken)
    )


def test_nothing_in_the_package_imports_the_benchmarks():
    _, benchmarks = _edges()
    assert not benchmarks, (
        "the training package must not import benchmarks/ (not in the wheel):\n" + "\n".join(benchmarks)
    )


def test_allow_list_has_no_stale_entries():
    edges, _ = _edges()
    present = {(a, b, place.split(":")[0]) for (a, b), places in edges.items() for place in places}
    stale = sorted(key for key in ALLOWED if key not in present)
    assert not stale, f"allow-listed imports that no longer exist (delete them from ALLOWED): {stale}"


if __name__ == "__main__":  # print the graph: python tests/test_architecture.py
    print(_graph_text(_edges()[0]))


def _part_config_keys() -> dict[str, str]:
    """Config keys only one part's schemas declare (`model.generator`, `model.objective`, `model.stylizer`, ...),
    with that part: a general module that spells one out knows the part's business."""
    import dataclasses
    import sys

    sys.path.insert(0, str(SRC))
    from pixelsmith.core.config import CoreModelConfig
    from pixelsmith.data import config as data_config
    from pixelsmith.parts import part_modules

    # The general schemas' keys: every data option's, and the model keys the training core reads.
    general = {
        f"data.{f.name}"
        for value in vars(data_config).values()
        if dataclasses.is_dataclass(value)
        for f in dataclasses.fields(value)
    } | {f"model.{f.name}" for f in dataclasses.fields(CoreModelConfig)}
    owners: dict[str, set[str]] = defaultdict(set)
    for module in part_modules():
        for group, _, schema in getattr(module, "SCHEMAS", ()):
            for f in dataclasses.fields(schema):
                owners[f"{group}.{f.name}"].add(module.__name__.split(".")[1])
    return {key: next(iter(parts)) for key, parts in owners.items() if len(parts) == 1 and key not in general}


def _string_constants(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every string constant in the file but its docstrings."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_general_module_names_a_part_in_its_strings():
    """A part keeps its knowledge: general code names no part module (`pixelsmith.gan.…` as a `_target_` string)
    and no config key only a part declares (`model.objective.…`); the part hands such things over through its
    part.py (`pixelsmith.parts`) or the model object. Docstrings and comments may still give examples."""
    keys = _part_config_keys()
    present = {path.name for path in (SRC / PACKAGE).iterdir() if (path / "part.py").is_file()}
    for part, key in (("gan", "model.objective"), ("style", "model.stylizer")):
        assert part not in present or keys.get(key) == part  # the check sees each present part's keys
    key_pattern = re.compile(r"(?<![\w.])(" + "|".join(re.escape(k) for k in sorted(keys)) + r")\b")
    module_pattern = re.compile(rf"\b{PACKAGE}[./]({'|'.join(MODEL_PARTS)})\b")
    found = []
    for module, path in _modules().items():
        if _part(module) in MODEL_PARTS:
            continue
        for line, text in _string_constants(path):
            for match in [*module_pattern.finditer(text), *key_pattern.finditer(text)]:
                found.append(f"{path.relative_to(SRC)}:{line}: {match.group(0)}")
    assert not found, "general modules that name a part's module or config key:\n" + "\n".join(found)


def test_no_import_circle_between_the_modules_of_a_part():
    """Inside a part, modules import each other one way too (deferred imports count): stylize.py starts the
    processes of devices.py, which takes the job as a callable instead of importing it back."""
    modules = _modules()
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for module, path in modules.items():
        for target, line in _imports(module, path, modules):
            if target in modules and target != module and _part(target) == _part(module):
                edges[(module, target)].append(f"{path.relative_to(SRC)}:{line}")
    circles = _cycles(edges)
    assert not circles, "module import circles inside a part:\n" + "\n".join(" <-> ".join(c) for c in circles)
