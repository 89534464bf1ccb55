"""The package's design, checked on its source (stdlib ast): no import cycles, and the layers.

- No module imports, directly or through others, a module that imports it back (imports
  inside functions count: a lazy import that closes a cycle is still a cycle).
- launch/ imports no TensorFlow (it supervises processes; a launcher that imported
  TensorFlow took its start-up time and memory in every `cluster` command).
- Nothing imports cli/ but the entry points (__main__): the CLI is the outermost layer.
- No file is longer than 450 lines.
"""
import ast
import os

import pytest

from support import REPO

PACKAGE = os.path.join(REPO, "estimator_dist")
MAX_LINES = 450


def modules():
    """{dotted module name: path} of every module of the package."""
    found = {}
    for dirpath, _, names in os.walk(PACKAGE):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                dotted = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def imports_of(path, known):
    """The package modules `path` imports (a `from pkg import name` of a submodule counts as
    that submodule), with every other module it imports (for the layer rules)."""
    tree = ast.parse(open(path).read(), path)
    inside, outside = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                     else node.module for a in node.names]
        else:
            continue
        for name in names:
            (inside if name.split(".")[0] == "estimator_dist" else outside).add(name)
    return {n for n in inside if n in known}, outside


def graph():
    known = modules()
    return {name: imports_of(path, known) for name, path in known.items()}


def cycles(edges):
    """Every strongly connected set of more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.add(member)
                if member == node:
                    break
            if len(group) > 1 or node in edges.get(node, ()):
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def without_parents(edges):
    """A package's __init__ is imported with each of its modules; importing it is not a
    dependency on every sibling, so `a.b -> a` edges do not count."""
    return {m: {n for n in deps if not m.startswith(n + ".")} for m, deps in edges.items()}


def test_no_import_cycle():
    edges = without_parents({m: inside for m, (inside, _) in graph().items()})
    assert cycles(edges) == []


def test_cycle_finder_finds_one():
    """The check can fail: a two-module and a three-module cycle are found."""
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}}) == \
        [["a", "b"], ["c", "d", "e"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_launch_imports_no_tensorflow():
    """Directly, or through any package module it imports."""
    g = graph()
    launch = [m for m in g if m.startswith("estimator_dist.launch")]
    seen, todo = set(), list(launch)
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(g[m][0])
    offenders = sorted(m for m in seen
                       if any(o.split(".")[0] == "tensorflow" for o in g[m][1]))
    assert offenders == []


def test_nothing_imports_the_cli():
    g = graph()
    importers = sorted(m for m, (inside, _) in g.items()
                       if not m.startswith("estimator_dist.cli") and m != "estimator_dist.__main__"
                       and any(n.startswith("estimator_dist.cli") for n in inside))
    assert importers == []


@pytest.mark.parametrize("root", ["estimator_dist", "model_fns", "input_fns"])
def test_no_file_over_450_lines(root):
    long = []
    for dirpath, _, names in os.walk(os.path.join(REPO, root)):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                lines = sum(1 for _ in open(path))
                if lines > MAX_LINES:
                    long.append(f"{os.path.relpath(path, REPO)}: {lines}")
    assert long == []


# Who may read a task type, a Horovod rank or a strategy's name (issue 23): the Role, the
# StrategySpec table, the strategy builders and TF_CONFIG/Horovod-environment parsing.
DECIDERS = {"estimator_dist.training.roles", "estimator_dist.distribute.specs",
            "estimator_dist.distribute.strategies", "estimator_dist.distribute.tf_config",
            "estimator_dist.distribute.horovod"}
ROLE_NAMES = {"local", "chief", "worker", "ps", "evaluator"}
# "none" is left out: it is also a value of --export, --mixed_precision and the like.
STRATEGY_NAMES = {"one_device", "mirrored", "central_storage", "tower", "multi_worker_mirrored",
                  "parameter_server", "horovod"}
RANK_ATTRIBUTES = {"task_type", "is_root", "task_index"}  # and `ranks.rank`


def decisions(path):
    """'line: what' for each comparison with a role or strategy name and each read of a
    task type or rank in a module's source."""
    found = []
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Compare):
            values = []
            for side in [node.left] + node.comparators:
                items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
                values += [i.value for i in items
                           if isinstance(i, ast.Constant) and isinstance(i.value, str)]
            named = sorted(set(values) & (ROLE_NAMES | STRATEGY_NAMES))
            if named:
                found.append(f"{node.lineno}: compares with {', '.join(named)}")
        elif isinstance(node, ast.Attribute) and (
                node.attr in RANK_ATTRIBUTES or node.attr == "rank" and _names_ranks(node.value)):
            if not (isinstance(node.value, ast.Name) and node.value.id == "roles"):
                found.append(f"{node.lineno}: reads .{node.attr}")
    return found


def _names_ranks(node) -> bool:
    """`ranks.rank`, `p.ranks.rank`: a Horovod rank (a tensor's `shape.rank` is not one)."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return name.endswith("ranks")


def test_only_roles_and_specs_decide_who_does_what():
    offenders = {name: decisions(path) for name, path in modules().items()
                 if name not in DECIDERS}
    assert {name: lines for name, lines in offenders.items() if lines} == {}


def test_decision_finder_finds_them(tmp_path):
    """The check can fail: the three kinds of decision are found."""
    code = tmp_path / "m.py"
    code.write_text("if p.role == 'chief' or s in ('tower', 'x'):\n    r = ranks.is_root\n"
                    "n = p.ranks.rank + t.shape.rank\n")
    assert decisions(str(code)) == ["1: compares with chief", "1: compares with tower",
                                    "2: reads .is_root", "3: reads .rank"]
