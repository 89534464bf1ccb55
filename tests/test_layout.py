"""The package's design, checked on its source (stdlib ast): no import cycles, and the layers.

- No module imports, directly or through others, a module that imports it back (imports
  inside functions count: a lazy import that closes a cycle is still a cycle).
- launch/ imports no TensorFlow (it supervises processes; a launcher that imported
  TensorFlow took its start-up time and memory in every `cluster` command).
- Nothing imports cli/ but the entry points (__main__): the CLI is the outermost layer.
- No file is longer than 450 lines.
- TensorFlow's internals only in estimator_dist/compat/internals.py (the one door): no other
  module imports tensorflow.python or tensorflow_estimator, touches a private name of another
  object, or patches one; no subclass of a TensorFlow class uses TensorFlow's private state.
"""
import ast
import importlib
import importlib.util
import inspect
import os
import re
import sys

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


def tensorflow_importers(prefix: str):
    """The modules that import TensorFlow among those under `prefix` and every package
    module they import, directly or through others."""
    g = graph()
    seen, todo = set(), [m for m in g if m.startswith(prefix)]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(g[m][0])
    return sorted(m for m in seen if any(o.split(".")[0] == "tensorflow" for o in g[m][1]))


def test_launch_imports_no_tensorflow():
    """Directly, or through any package module it imports."""
    assert tensorflow_importers("estimator_dist.launch") == []


def test_signal_handling_imports_no_tensorflow():
    """cli/main.py installs guards/signals.py's default SIGTERM reaction before TensorFlow
    is imported (and before it sets TF_ENABLE_ONEDNN_OPTS, read at TensorFlow's import)."""
    assert tensorflow_importers("estimator_dist.guards.signals") == []


def test_nothing_imports_the_cli():
    g = graph()
    importers = sorted(m for m, (inside, _) in g.items()
                       if not m.startswith("estimator_dist.cli") and m != "estimator_dist.__main__"
                       and any(n.startswith("estimator_dist.cli") for n in inside))
    assert importers == []


# The package's layers, outermost first (docs/architecture.md draws them). A module may import
# its own package and the packages below its own, never one above. "core" is the top-level
# modules (errors, files, paths, timers, quiet, config_schema, config_yaml) and compat/.
LAYERS = ("cli", "bench", "training", "launch", "serving", "guards", "graph", "distribute",
          "records", "core")


def layer_of(module: str) -> str:
    parts = module.split(".")
    if module == "estimator_dist.__main__":
        return "cli"  # the entry point
    if len(parts) == 2 or parts[1] == "compat":
        return "core"
    return parts[1]


def upward_imports(edges):
    """Every `module -> imported module` that goes up the layers (or into an unknown one)."""
    up = []
    for module, deps in sorted(edges.items()):
        for dep in sorted(deps):
            src, dst = layer_of(module), layer_of(dep)
            if src != dst and (dst not in LAYERS or src not in LAYERS
                               or LAYERS.index(dst) < LAYERS.index(src)):
                up.append(f"{module} ({src}) -> {dep} ({dst})")
    return up


def test_packages_are_layers_no_import_goes_up():
    edges = without_parents({m: inside for m, (inside, _) in graph().items()})
    assert upward_imports(edges) == []


def test_layer_check_finds_an_upward_import():
    """The check can fail: graph importing training, and a package no layer names."""
    assert upward_imports({"estimator_dist.graph.towers": {"estimator_dist.training.run"},
                           "estimator_dist.training.run": {"estimator_dist.graph.towers",
                                                           "estimator_dist.errors"},
                           "estimator_dist.extra.x": set()}) == [
        "estimator_dist.graph.towers (graph) -> estimator_dist.training.run (training)"]
    assert upward_imports({"estimator_dist.newpkg.a": {"estimator_dist.errors"}}) == [
        "estimator_dist.newpkg.a (newpkg) -> estimator_dist.errors (core)"]


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


# Who may compare with a strategy's name: the StrategySpec table, the strategy builders and
# the Role. Every other strategy difference is a StrategySpec field.
DECIDERS = {"estimator_dist.distribute.role", "estimator_dist.distribute.specs",
            "estimator_dist.distribute.strategies"}
# Who may also read a task type or a Horovod rank: the parsers of TF_CONFIG and of Horovod's
# environment, whose input they are (never a strategy's name).
PARSERS = {"estimator_dist.distribute.tf_config", "estimator_dist.distribute.horovod"}
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
    offenders = {name: not_theirs(name, decisions(path)) for name, path in modules().items()}
    assert {name: lines for name, lines in offenders.items() if lines} == {}


def not_theirs(module: str, found):
    """The decisions of `found` that `module` may not take."""
    if module in DECIDERS:
        return []
    if module in PARSERS:  # a task type or rank is theirs to read; a strategy name is not
        return [line for line in found
                if set(line.partition("compares with ")[2].split(", ")) & STRATEGY_NAMES]
    return list(found)


def test_a_parser_may_read_task_types_but_not_strategy_names():
    parser = "estimator_dist.distribute.tf_config"
    assert not_theirs(parser, ["3: compares with chief", "4: reads .task_type"]) == []
    assert not_theirs(parser, ["5: compares with chief, parameter_server"]) == [
        "5: compares with chief, parameter_server"]
    assert not_theirs("estimator_dist.training.run", ["3: compares with chief"]) == [
        "3: compares with chief"]


def test_decision_finder_finds_them(tmp_path):
    """The check can fail: the three kinds of decision are found."""
    code = tmp_path / "m.py"
    code.write_text("if p.role == 'chief' or s in ('tower', 'x'):\n    r = ranks.is_root\n"
                    "n = p.ranks.rank + t.shape.rank\n")
    assert decisions(str(code)) == ["1: compares with chief", "1: compares with tower",
                                    "2: reads .is_root", "3: reads .rank"]


# TensorFlow's internals have one door, estimator_dist/compat/internals.py (pinned by
# tests/test_tf_compat.py): nowhere else may import TensorFlow's private modules, read or set a
# private name of another object, getattr/setattr one by its name, reach a private name a
# TensorFlow base class set, or replace or delete an attribute of another object with a
# function of its own (a monkeypatch). Tests may import only through the door (they read the
# package's own private names on purpose).
DOOR = "estimator_dist.compat.internals"
INTERNAL_MODULES = ("tensorflow.python", "tensorflow_estimator", "keras.src", "tf_keras.src")
# Python's own private names the package uses: namedtuple's public API (which starts with an
# underscore), os._exit, and argparse's lists of actions (no public way to list them).
NOT_TENSORFLOW = {"_replace", "_asdict", "_fields", "_make", "_exit", "_actions",
                  "_option_string_actions", "_SubParsersAction"}
BY_NAME = {"getattr", "setattr", "hasattr", "delattr"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name not in NOT_TENSORFLOW


def _is_self(node) -> bool:
    return isinstance(node, ast.Name) and node.id in ("self", "cls")


def _root(node) -> str:
    while isinstance(node, (ast.Attribute, ast.Call, ast.Subscript)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return getattr(node, "id", "")


def _internal_imports(tree):
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        hit = sorted({n for n in names if n.startswith(INTERNAL_MODULES)}, key=len)
        if hit:
            found.append(f"{node.lineno}: imports {hit[0]}")
    return found


def _inherited_privates(tree):
    """self._x in a class built on a TensorFlow class (`tf.` or `internals.` base) that the
    class itself never sets or defines: a private name of TensorFlow's."""
    found = []
    for cls in [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]:
        if not any(_root(b) in ("tf", "internals") for b in cls.bases):
            continue
        own = {n.name for n in ast.walk(cls)
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        own |= {n.attr for n in ast.walk(cls) if isinstance(n, ast.Attribute)
                and _is_self(n.value) and isinstance(n.ctx, ast.Store)}
        for n in ast.walk(cls):
            if isinstance(n, ast.Attribute) and _is_self(n.value) and _private(n.attr) \
                    and n.attr not in own:
                found.append(f"{n.lineno}: reads TensorFlow's self.{n.attr}")
    return found


def internals_used(path, imports_only=False):
    """'line: what' for each use of a TensorFlow internal outside the door."""
    tree = ast.parse(open(path).read(), path)
    found = _internal_imports(tree)
    if imports_only:
        return found
    functions = {n.name for n in ast.walk(tree)
                 if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and not _is_self(node.value) and _private(node.attr):
            verb = {ast.Load: "reads", ast.Store: "sets", ast.Del: "deletes"}[type(node.ctx)]
            found.append(f"{node.lineno}: {verb} .{node.attr}")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in BY_NAME \
                and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value):
            found.append(f"{node.lineno}: {node.func.id} {node.args[1].value}")
        elif isinstance(node, (ast.Assign, ast.Delete)):
            patched = [t for t in node.targets if isinstance(t, ast.Attribute)
                       and not _is_self(t.value)]
            by_function = isinstance(node, ast.Delete) or isinstance(node.value, ast.Lambda) or \
                (isinstance(node.value, ast.Name) and node.value.id in functions)
            verb = "deletes" if isinstance(node, ast.Delete) else "patches"
            found += [f"{node.lineno}: {verb} .{t.attr}" for t in patched
                      if by_function and not _private(t.attr)]
    found += _inherited_privates(tree)
    return sorted(set(found), key=lambda line: (int(line.split(":")[0]), line))


def _sources(root):
    for dirpath, _, names in os.walk(os.path.join(REPO, root)):
        for name in sorted(names):
            if name.endswith(".py"):
                yield os.path.join(dirpath, name)


def test_tensorflow_internals_only_behind_the_door():
    door = os.path.join(REPO, *DOOR.split(".")) + ".py"
    offenders = {}
    for root in ("estimator_dist", "model_fns", "input_fns", "tests"):
        for path in _sources(root):
            if path != door:
                found = internals_used(path, imports_only=root == "tests")
                if found:
                    offenders[os.path.relpath(path, REPO)] = found
    assert offenders == {}


def test_internals_finder_finds_them(tmp_path):
    """The check can fail: each kind of use is found, planted in a copy of a real module."""
    code = tmp_path / "m.py"
    code.write_text(open(os.path.join(REPO, "estimator_dist", "distribute", "xla.py")).read() +
                    "from tensorflow.python.eager import context\n"
                    "import tensorflow_estimator.python.estimator.training\n"
                    "v = graph._collections\n"
                    "ext._enable_check_health = False\n"
                    "r = getattr(hook, '_q_runner', None)\n"
                    "def reduce(*a):\n    return a\n"
                    "ext.batch_reduce_to = reduce\n"
                    "del ext.batch_reduce_to\n"
                    "class Hook(tf.compat.v1.train.CheckpointSaverHook):\n"
                    "    def __init__(self):\n        self._mine = 1\n"
                    "    def end(self, session):\n        self._save(session, self._mine)\n"
                    "s = spec._replace(loss=1)\n")
    base = len(open(os.path.join(REPO, "estimator_dist", "distribute", "xla.py")).read().splitlines())
    found = [f"{int(line.split(':')[0]) - base}:{line.split(':', 1)[1]}"
             for line in internals_used(str(code))]
    assert found == ["1: imports tensorflow.python.eager",
                     "2: imports tensorflow_estimator.python.estimator.training",
                     "3: reads ._collections", "4: sets ._enable_check_health",
                     "5: getattr _q_runner", "8: patches .batch_reduce_to",
                     "9: deletes .batch_reduce_to", "14: reads TensorFlow's self._save"]


SELF_PRIVATE = re.compile(r"self\.(_[A-Za-z]\w*)")


def tensorflow_privates_of(cls):
    """The private names `cls` reads or sets on self that a class it derives from outside the
    package uses too: TensorFlow's state, even when the subclass sets it itself."""
    ours = set(SELF_PRIVATE.findall(inspect.getsource(cls))) - NOT_TENSORFLOW
    theirs = set()
    for base in cls.__mro__[1:]:
        if base.__module__.split(".")[0] in ("estimator_dist", "builtins"):
            continue
        try:
            theirs |= set(SELF_PRIVATE.findall(inspect.getsource(base)))
        except (OSError, TypeError):  # built in C: nothing to read
            continue
    return sorted(ours & theirs)


def test_subclasses_keep_out_of_tensorflow_state():
    """Imports the modules that define classes on a base from outside the package."""
    door = os.path.join(REPO, *DOOR.split(".")) + ".py"
    offenders = {}
    for name, path in sorted(modules().items()):
        tree = ast.parse(open(path).read(), path)
        derived = [c.name for c in tree.body if isinstance(c, ast.ClassDef) and c.bases]
        if not derived or path == door:
            continue
        module = importlib.import_module(name)
        for cls in derived:
            found = tensorflow_privates_of(getattr(module, cls))
            if found:
                offenders[f"{name}.{cls}"] = found
    assert offenders == {}


def test_subclass_finder_finds_tensorflow_state(tmp_path, monkeypatch):
    """The check can fail: a BestExporter that sets TensorFlow's own flag is found."""
    path = tmp_path / "planted.py"
    path.write_text("import tensorflow as tf\n\n\nclass Exporter(tf.estimator.BestExporter):\n"
                    "    def export(self, *args):\n        self._has_exported = False\n"
                    "        self._mine = 1\n")
    spec = importlib.util.spec_from_file_location("planted", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "planted", module)  # where inspect finds its source
    spec.loader.exec_module(module)
    assert tensorflow_privates_of(module.Exporter) == ["_has_exported"]
