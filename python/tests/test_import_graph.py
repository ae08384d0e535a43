"""The attend package's import graph has no circle.

A circle (a imports b, b imports a, even from inside a function) makes import
order matter: the module imported first sees the other half-initialised, and
which one a user imports first is not ours to choose. The graph is read
statically from the source tree, with every import statement counted wherever
it sits (module level, function bodies, conditionals), so a lazy import that
closes a circle fails here too.
"""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "attend"


def modules(root=PACKAGE):
    """{dotted module name: source path} of every .py file in the package tree."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = ("attend",) + path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imported(name, path, known):
    """The package modules that module `name` (at `path`) imports, anywhere in its body."""
    is_package = path.name == "__init__.py"
    package = name if is_package else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(base + ([node.module] if node.module else []))
            else:
                base = node.module
            targets.add(base)
            # `from pkg import sub` imports the submodule pkg.sub when there is one.
            targets.update(f"{base}.{alias.name}" for alias in node.names)
    # A module's own package is always initialised before the module runs:
    # importing from it (e.g. `from . import _C`) cannot close a circle.
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
    return {t for t in targets if t in known and t != name and t not in ancestors}


def find_cycle(graph):
    """One import circle as a list of module names (first == last), or None."""
    state = {}  # name -> "open" while on the DFS path, "done" after
    path = []

    def visit(node):
        state[node] = "open"
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        path.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def graph_of(root=PACKAGE):
    known = modules(root)
    return {name: imported(name, path, known) for name, path in known.items()}


def test_the_package_has_no_import_circle():
    graph = graph_of()
    assert {"attend.torch", "attend.module", "attend._autograd"} <= set(graph), sorted(graph)
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_the_checker_finds_a_lazy_circle(tmp_path):
    # The shape of the circle this test was written against: a module-level
    # import one way, an import inside a function the other way.
    pkg = tmp_path / "attend"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import _C\n")
    (pkg / "torch.py").write_text("from .module import DotProductAttention\n")
    (pkg / "module.py").write_text("def f():\n    from .torch import _autocast\n    return _autocast\n")
    (pkg / "plain.py").write_text("from . import torch\nimport attend.module\n")
    graph = graph_of(pkg)
    assert graph["attend.plain"] == {"attend.torch", "attend.module"}
    assert find_cycle(graph) == ["attend.module", "attend.torch", "attend.module"]
    (pkg / "module.py").write_text("def f():\n    return 1\n")
    assert find_cycle(graph_of(pkg)) is None
