"""The package's shape, read from its own imports with ast: one folder per
layer, imports only downward, no circles, nothing loose at the top.

Every import counts, wherever it is written: at module level, inside a
function (a lazy import is still a dependency) and under TYPE_CHECKING (a
type a module names is part of what it knows). A name imported from a
package's ``__init__`` counts as an import of the module that defines it
(the ``__init__``'s own imports, or its lazy_names table), so a facade
cannot hide a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "cartonstore"

# From the ground up; a module may import its own layer and those below.
LAYERS = [
    ["errors"],
    ["system"],
    ["format", "zipfmt"],
    ["v2", "sources"],
    ["carton", "runner"],
    ["runner.backends"],
    ["store.root"],
    ["store.content"],
    ["store.metadata"],
    ["store.materialize"],
    ["store.gc"],
    ["store"],
    ["fetch.http"],
    ["fetch.transfer"],
    ["fetch.sources"],
    ["fetch", "client"],
    ["oci", "hf", "config"],
    ["csi"],
    ["server.tensors", "server.checks"],
    ["server.runner_processes"],
    ["server.models"],
    ["server.calls"],
    ["server.inference"],
    ["server.api", "server.rpc", "server.http", "server.mirror"],
    ["server"],
    ["cli"],
]
RANK = {folder: rank for rank, folders in enumerate(LAYERS) for folder in folders}
# The daemon's doors: equal adapters over the inference core, none importing another; and the CSI plugin,
# a door of its own beside them that reaches the daemon only through its socket (client/).
DOORS = {"server.api", "server.rpc", "server.http", "server.mirror", "csi"}
# What the core and what lies below the doors never import: a door's wire library.
WIRE_LIBRARIES = {"aiohttp", "grpc"}
TOP_ALLOWED = {"__init__.py", "errors.py"}
MAX_LINES = 600


def module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    return ".".join(parts[:-1] if is_package else parts), is_package


def read_modules() -> dict[str, tuple[ast.Module, bool]]:
    return {name: (ast.parse(p.read_text(), str(p)), is_pkg)
            for p in sorted(PACKAGE.rglob("*.py")) for name, is_pkg in [module_name(p)]}


def absolute(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def facade_names(tree: ast.Module, package: str, is_package: bool) -> dict[str, str]:
    """What an ``__init__`` hands out, name -> the module defining it."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = absolute(node, package, is_package)
            for alias in node.names:
                names[alias.asname or alias.name] = source
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_names":
            table = node.args[1]
            if isinstance(table, ast.Name):  # a module-level constant
                table = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                             and any(getattr(t, "id", None) == table.id for t in n.targets))
            for key, value in zip(table.keys, table.values, strict=True):
                for name in ast.literal_eval(value).split():
                    names[name] = f"{package}.{ast.literal_eval(key)}"
    return names


def import_graph() -> dict[str, set[str]]:
    modules = read_modules()
    facades = {name: facade_names(tree, name, True) for name, (tree, is_pkg) in modules.items() if is_pkg}
    graph: dict[str, set[str]] = {}
    for name, (tree, is_pkg) in modules.items():
        deps = graph.setdefault(name, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.split(".")[0] == "cartonstore")
            elif isinstance(node, ast.ImportFrom):
                source = absolute(node, name, is_pkg)
                if source.split(".")[0] != "cartonstore":
                    continue
                for alias in node.names:
                    if f"{source}.{alias.name}" in modules:
                        deps.add(f"{source}.{alias.name}")
                    elif source in facades and alias.name in facades[source] and source != name:
                        deps.add(facades[source][alias.name])
                    else:
                        deps.add(source)
        deps.discard(name)
        deps.intersection_update(modules)
    return graph


def layer_of(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "errors"  # the package's own __init__: the version and the errors
    if len(parts) >= 2 and f"{parts[0]}.{parts[1]}" in RANK:
        return f"{parts[0]}.{parts[1]}"
    return parts[0]


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circles_between_modules() -> None:
    assert circles(import_graph()) == []


def test_no_import_circles_between_layers() -> None:
    graph = import_graph()
    folders: dict[str, set[str]] = {}
    for module, deps in graph.items():
        folders.setdefault(layer_of(module), set()).update(layer_of(d) for d in deps)
    for folder, deps in folders.items():
        deps.discard(folder)
    assert circles(folders) == []


def test_imports_only_go_down() -> None:
    upward = [f"{module} ({layer_of(module)}) imports {dep} ({layer_of(dep)})"
              for module, deps in sorted(import_graph().items()) for dep in sorted(deps)
              if RANK[layer_of(dep)] > RANK[layer_of(module)]]
    assert upward == []


def test_no_door_imports_another_door() -> None:
    crossing = [f"{module} ({layer_of(module)}) imports {dep} ({layer_of(dep)})"
                for module, deps in sorted(import_graph().items()) for dep in sorted(deps)
                if layer_of(module) in DOORS and layer_of(dep) in DOORS and layer_of(dep) != layer_of(module)]
    assert crossing == []


def third_party_imports(tree: ast.Module) -> set[str]:
    """The top-level names of the packages a module imports, wherever it imports them."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_the_inference_core_and_what_the_doors_share_import_no_wire_library() -> None:
    """tritonclient.grpc counts as grpc: its package imports grpcio."""
    found = {}
    for name, (tree, _) in read_modules().items():
        if layer_of(name) in ("server.inference", "server.calls"):
            wires = third_party_imports(tree) & WIRE_LIBRARIES
            modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
            if any(m.startswith("tritonclient.grpc") for m in modules):
                wires.add("grpc")
            if wires:
                found[name] = sorted(wires)
    assert found == {}


def test_every_module_is_in_a_known_layer() -> None:
    unknown = sorted(m for m in import_graph() if layer_of(m) not in RANK)
    assert unknown == []


def test_only_init_and_errors_at_the_package_top() -> None:
    assert {p.name for p in PACKAGE.glob("*.py")} == TOP_ALLOWED
    assert {p.name for p in (PACKAGE / "server").glob("*.py")} == {"__init__.py", "daemon.py"}


def test_every_folder_is_a_package_that_says_what_it_is() -> None:
    for folder in [PACKAGE, *(d for d in PACKAGE.rglob("*") if d.is_dir() and d.name != "__pycache__")]:
        init = folder / "__init__.py"
        assert init.is_file(), f"{folder} has no __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), f"{init} opens with no docstring"


def test_modules_stay_small() -> None:
    """Modules protoc generates (``*_pb2*.py``) are as long as their .proto."""
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if "_pb2" not in p.name and (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_the_checker_sees_a_circle_and_an_upward_import() -> None:
    """The checks above would pass on a graph they could not read; these
    graphs prove they can fail."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    assert layer_of("cartonstore.server.api.app") == "server.api"
    assert layer_of("cartonstore.server.inference.pipeline") == "server.inference"
    assert layer_of("cartonstore.server.daemon") == "server"
    assert RANK[layer_of("cartonstore.store.store")] > RANK[layer_of("cartonstore.format.manifest")]
