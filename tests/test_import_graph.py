"""No module of rlkit/ or kernels/ takes part in an import cycle, counting imports inside functions.

The graph is built from the source (ast), not from what happens to be imported at run time, so a cycle that
only works through a late import fails here too. An edge goes from a module to every module it imports:
`import a.b` and `from a import b` (b a module) point at a.b; `from a.b import name` points at a.b; an
`importlib.import_module("a.b")` with a constant name counts as well. Imports under `if TYPE_CHECKING:` never
run and are left out. Importing a submodule also runs its package's `__init__`; that implicit edge is left
out, as a package re-exporting its submodules is not a cycle of the code's own making.
"""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("rlkit", "kernels")


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for package in PACKAGES:
    for path in (ROOT / package).rglob("*.py"):
      parts = list(path.relative_to(ROOT).with_suffix("").parts)
      if parts[-1] == "__init__":
        parts.pop()
      out[".".join(parts)] = path
  return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
  skipped = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
      skipped.update(id(n) for child in node.body for n in ast.walk(child))
  return skipped


def _imported(module: str, path: pathlib.Path, tree: ast.AST, modules) -> set[str]:
  skipped = _type_checking_nodes(tree)
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  names: list[str] = []
  for node in ast.walk(tree):
    if id(node) in skipped:
      continue
    if isinstance(node, ast.Import):
      names += [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([node.module] if node.module else []))
      for alias in node.names:
        names.append(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    elif (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
          and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
      names.append(node.args[0].value)
  out = set()
  for name in names:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
      if ".".join(parts[:k]) in modules:
        out.add(".".join(parts[:k]))
        break
  out.discard(module)
  return out


def import_graph() -> dict[str, set[str]]:
  modules = _modules()
  return {m: _imported(m, p, ast.parse(p.read_text(), str(p)), modules) for m, p in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan, iterative)."""
  index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
  for root in sorted(graph):
    if root in index:
      continue
    work = [(root, iter(sorted(graph[root])))]
    index[root] = low[root] = counter[0]
    counter[0] += 1
    stack.append(root)
    on_stack.add(root)
    while work:
      node, children = work[-1]
      child = next(children, None)
      if child is not None:
        if child not in index:
          index[child] = low[child] = counter[0]
          counter[0] += 1
          stack.append(child)
          on_stack.add(child)
          work.append((child, iter(sorted(graph[child]))))
        elif child in on_stack:
          low[node] = min(low[node], index[child])
        continue
      work.pop()
      if work:
        low[work[-1][0]] = min(low[work[-1][0]], low[node])
      if low[node] == index[node]:
        component = []
        while True:
          member = stack.pop()
          on_stack.discard(member)
          component.append(member)
          if member == node:
            break
        if len(component) > 1:
          found.append(sorted(component))
  return found


def test_no_module_takes_part_in_an_import_cycle():
  found = cycles(import_graph())
  assert not found, "import cycles (each line one strongly connected set of modules):\n" + "\n".join(
      " <-> ".join(c) for c in found)


@pytest.mark.parametrize("edges, expected", [
    ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
    ({"a": {"b"}, "b": set()}, []),
    ({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}, [["a", "b"], ["c", "d"]]),
])
def test_cycle_finder(edges, expected):
  assert sorted(cycles(edges)) == expected


def test_graph_sees_imports_inside_functions():
  """The late imports the cycle test must count: `cli.py` imports the run inside a function."""
  graph = import_graph()
  assert "rlkit.train.run" in graph["rlkit.cli"]
  assert "rlkit.train.config" in graph["rlkit.train.config_checks"]


def test_test_files_have_unique_names():
  """tests/ has no __init__.py files, so pytest imports each test file by its basename: two files of one name
  cannot be collected in one process ("import file mismatch"), which a per-file xdist run would hide."""
  import collections
  import glob
  import os
  root = os.path.dirname(os.path.abspath(__file__))
  names = collections.Counter(os.path.basename(p) for p in glob.glob(os.path.join(root, "**", "test_*.py"),
                                                                      recursive=True))
  assert not [n for n, k in names.items() if k > 1], sorted(n for n, k in names.items() if k > 1)
