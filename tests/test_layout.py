"""The package's floor plan: imports flow one way between its groups, and no module imports itself
through others (function-level imports included).

Groups, lowest first. A module may import its own group and any group below it, never one above:

  foundations   errors, tokens, keys, files, hardware, host_memory, stops, version, cli, metrics,
                progress, partitioning, distributed (the top-level modules other than config)
  model, data   the network; corpora, vocabularies, token caches and batches
  decoding      searches, the translator, MBR (uses the model and data's batching)
  config        every key's default and the checks (knows the model's, data's and decoding's choices)
  programs      training, evaluation, accelerators, visualisation, sweeps (independent of each
                other except where listed in PROGRAM_USES)
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "transformer"
LEVEL = {"foundations": 0, "model": 1, "data": 1, "decoding": 2, "config": 3, "training": 4,
         "evaluation": 5, "visualisation": 5, "accelerators": 6, "sweeps": 6}


def group_of(module: str, package: Path = PACKAGE) -> str:
  parts = module.split(".")
  if len(parts) > 2 or (len(parts) == 2 and (package / parts[1]).is_dir()):
    return parts[1]
  return "config" if parts[-1] == "config" else "foundations"


def imports(package: Path = PACKAGE) -> list[tuple[str, str]]:
  """(importing module, imported module) for every `transformer.*` import in the package."""
  edges = []
  for path in package.rglob("*.py"):
    module = ".".join(("transformer",) + path.relative_to(package).with_suffix("").parts)
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("transformer"):
        names = [f"{node.module}.{a.name}" for a in node.names]
        edges += [(module, n if (package / n.split(".", 1)[1].replace(".", "/")).with_suffix(".py")
                   .exists() or (package / n.split(".", 1)[1].replace(".", "/")).is_dir()
                   else node.module) for n in names]
      elif isinstance(node, ast.Import):
        edges += [(module, a.name) for a in node.names if a.name.startswith("transformer.")]
  return edges


def test_every_group_is_known():
  groups = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
  assert groups <= set(LEVEL), groups - set(LEVEL)


def upward_imports(package: Path = PACKAGE) -> list[tuple[str, str]]:
  return [(a, b) for a, b in imports(package) if b != "transformer"
          and LEVEL[group_of(b, package)] > LEVEL[group_of(a, package)]]


def test_imports_flow_down_only():
  upward = upward_imports()
  assert not upward, "imports from a higher group:\n" + "\n".join(f"{a} -> {b}" for a, b in upward)


def test_groups_on_one_level_do_not_import_each_other():
  sideways = [(a, b) for a, b in imports() if b != "transformer"
              and group_of(a) != group_of(b) and LEVEL[group_of(b)] == LEVEL[group_of(a)]]
  assert not sideways, "\n".join(f"{a} -> {b}" for a, b in sideways)


def test_the_check_sees_a_violation(tmp_path):
  """A model module that imports training, planted in a copy of the layout, is found."""
  for group in ("model", "training"):
    (tmp_path / group).mkdir()
    (tmp_path / group / "__init__.py").write_text("")
  (tmp_path / "training" / "step.py").write_text("from transformer.model import net\n")
  (tmp_path / "model" / "net.py").write_text("from transformer.training.step import loss\n")
  assert upward_imports(tmp_path) == [("transformer.model.net", "transformer.training.step")]


def import_cycles(package: Path = PACKAGE) -> list[list[str]]:
  """Every cycle of imports between the package's modules, function-level imports included (a
  package's __init__ is the package)."""
  graph: dict[str, set[str]] = {}
  for a, b in imports(package):
    a = a.removesuffix(".__init__")
    if a != b:
      graph.setdefault(a, set()).add(b)
  cycles, state, path = [], {}, []

  def visit(module: str) -> None:
    state[module], path[len(path):] = "open", [module]
    for other in sorted(graph.get(module, ())):
      if state.get(other) == "open":
        cycles.append(path[path.index(other):] + [other])
      elif other not in state:
        visit(other)
    path.pop()
    state[module] = "done"
  for module in sorted(graph):
    if module not in state:
      visit(module)
  return cycles


def test_no_module_imports_itself_through_others_even_inside_a_function():
  cycles = import_cycles()
  assert not cycles, "\n".join(" -> ".join(c) for c in cycles)


def test_the_cycle_check_sees_a_hidden_cycle(tmp_path):
  """A function-level import that closes a cycle, planted in a copy of the layout, is found."""
  (tmp_path / "model").mkdir()
  (tmp_path / "model" / "__init__.py").write_text("")
  (tmp_path / "model" / "net.py").write_text("from transformer.model import kinds\n")
  (tmp_path / "model" / "kinds.py").write_text("def f():\n  from transformer.model.net import g\n")
  assert import_cycles(tmp_path) == [["transformer.model.kinds", "transformer.model.net",
                                      "transformer.model.kinds"]]
