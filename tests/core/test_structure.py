"""The shape issue 23 asked for, kept: no import circle in supervisor/ (type-only and lazy
imports included, a module importing its package's ``__init__`` too), config knows nothing of
sync, no module reaches into another package's private modules, and the conductor stays small.
Issue 32: nothing outside supervisor/sched/ compares a scheduler's name; issue 46: nor names
a scheduler's variable."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "supervisor"
CONDUCTOR_MAX = 220  # the conductor class, `Agent` (issue 46: one conductor class on every node)
CLASS_MAX = 300


def _modules() -> dict[str, Path]:
    out = {}
    for f in SRC.rglob("*.py"):
        name = ".".join(f.relative_to(SRC.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of supervisor/ that ``name`` imports, anywhere in it."""
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                out.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    out = {m for m in out if m in known and m != name}
    for m in list(out):  # importing supervisor.sync._x runs supervisor/sync/__init__.py first
        package = m.rsplit(".", 1)[0]
        if package != "supervisor" and package in known and not name.startswith(package + "."):
            out.add(package)
    return out - {name}


@cache
def _graph() -> dict[str, set[str]]:
    known = _modules()
    return {name: _imports(name, path, known) for name, path in known.items()}


def test_no_import_circle() -> None:
    graph = _graph()
    circles = []
    for start in graph:  # a path back to itself, by depth-first search
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.append(path + [start])
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))
    assert not circles, circles[0]


def test_the_structure_check_sees_a_circle(tmp_path: Path) -> None:
    """The check above can fail: a package whose module imports what imports the package."""
    pkg = tmp_path / "supervisor"
    (pkg / "sync").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "config.py").write_text("def f():\n    from supervisor.sync._x import y\n")
    (pkg / "sync" / "__init__.py").write_text("from supervisor.config import f\n")
    (pkg / "sync" / "_x.py").write_text("y = 1\n")
    known = {"supervisor": pkg / "__init__.py", "supervisor.config": pkg / "config.py",
             "supervisor.sync": pkg / "sync" / "__init__.py", "supervisor.sync._x": pkg / "sync" / "_x.py"}
    assert "supervisor.sync" in _imports("supervisor.config", known["supervisor.config"], known)
    assert "supervisor.config" in _imports("supervisor.sync", known["supervisor.sync"], known)


def test_config_imports_nothing_of_sync_nor_the_job() -> None:
    deps = _graph()["supervisor.config"]
    assert not {d for d in deps if d.startswith(("supervisor.sync", "supervisor.sched"))}, deps


def test_no_module_imports_another_packages_private_modules() -> None:
    bad = []
    for name, deps in _graph().items():
        for d in deps:
            package, _, leaf = d.rpartition(".")
            if leaf.startswith("_") and leaf != "__init__" and package != "supervisor" and not name.startswith(package):
                bad.append(f"{name} → {d}")
    assert not bad, bad


def test_the_conductor_is_small_and_no_class_is_huge() -> None:
    conductors = [n for f in (SRC / "conduct").glob("*.py") for n in ast.walk(ast.parse(f.read_text()))
                  if isinstance(n, ast.ClassDef) and n.name.endswith("Agent")]
    assert [c.name for c in conductors] == ["Agent"], "one conductor class on every node: a role is a collaborator"
    agent = (conductors[0].end_lineno or 0) - conductors[0].lineno + 1
    assert agent <= CONDUCTOR_MAX, f"the conductor (class Agent) has {agent} lines: move logic into its role or parts"
    big = []
    for f in SRC.rglob("*.py"):
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                if lines > CLASS_MAX:
                    big.append(f"{f.relative_to(SRC.parent)}: {node.name} {lines} lines")
    assert not big, big


SCHEDULER_NAMES = frozenset({"slurm", "pbs", "local"})
SCHED = SRC / "sched"


def _scheduler_name_comparisons(source: str) -> list[int]:
    """Lines where ``==``, ``!=``, ``in`` or ``not in`` has a scheduler's name on one side: the
    literal, a tuple/set/list holding one, or a module-level name bound to such a collection
    (``SCHEDULERS = ("slurm", "pbs")`` … ``x not in SCHEDULERS``)."""
    tree = ast.parse(source)

    def names_one(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in SCHEDULER_NAMES
        if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
            return any(names_one(e) for e in node.elts)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("frozenset", "set", "tuple"):
            return any(names_one(a) for a in node.args)
        return isinstance(node, ast.Name) and node.id in bound

    bound: set[str] = set()
    bound = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None
             and names_one(n.value) for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
             if isinstance(t, ast.Name)}
    hits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            for op, left, right in zip(node.ops, sides, sides[1:]):
                if isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn)) and (names_one(left) or names_one(right)):
                    hits.append(node.lineno)
    return hits


def test_no_scheduler_name_is_compared_outside_the_scheduler_package() -> None:
    """A scheduler's facts are its class's (supervisor/sched/): a caller asks ``job.sched``
    (``is_batch``, ``signals_every_node``, ``refine_reason``…), never ``job.scheduler == "pbs"``."""
    found = [f"{f.relative_to(SRC.parent)}:{line}" for f in sorted(SRC.rglob("*.py")) if SCHED not in f.parents
             for line in _scheduler_name_comparisons(f.read_text())]
    assert not found, f"{len(found)} comparison(s) of a scheduler's name outside supervisor/sched/: {found}"


def test_the_scheduler_name_check_sees_each_form() -> None:
    """The check above can fail: every form it looks for, and what it leaves alone."""
    caught = """
SCHEDULERS = ("slurm", "pbs")
if job.scheduler == "local": pass
if "pbs" != name: pass
if job.scheduler in ("slurm", "pbs"): pass
if job.scheduler not in SCHEDULERS: pass
if name in {"local"}: pass
x = "Slurm" if job.scheduler == "slurm" else "PBS"
"""
    assert _scheduler_name_comparisons(caught) == [3, 4, 5, 6, 7, 8]
    left_alone = """
emit("node-lost", scheduler="slurm")
where = "local"
LABELS = {"slurm": "Slurm"}
if kind == "local-disk-full": pass
"""
    assert _scheduler_name_comparisons(left_alone) == []


def _room(m: str, graph: dict[str, set[str]]) -> str:
    """The room a module lives in: a subpackage is one room (``supervisor.sync`` for all of
    sync/), a root module its own."""
    top = ".".join(m.split(".")[:2])
    return top if any(k.startswith(top + ".") for k in graph) else m


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Imports that run back up: from a room to a room that depends on it, directly or through
    others (a circle between rooms, where each module alone may have none)."""
    rooms: dict[str, set[str]] = {}
    for name, deps in graph.items():
        rooms.setdefault(_room(name, graph), set()).update(_room(d, graph) for d in deps)
    for r, deps in rooms.items():
        deps.discard(r)

    def reaches(a: str, b: str) -> bool:
        stack, seen = [a], {a}
        while stack:
            for nxt in rooms.get(stack.pop(), ()):
                if nxt == b:
                    return True
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return False

    return sorted(f"{name} → {d}" for name, deps in graph.items() for d in deps
                  if _room(name, graph) != _room(d, graph) and reaches(_room(d, graph), _room(name, graph)))


def test_no_import_runs_back_up() -> None:
    """docs/design.md: data flows one way and no import runs back up. A circle between rooms
    is one even when no module is in a circle (``plan`` typing its mirror with the conductor's
    port, while the conductor imports ``plan``): the ports sit below both sides."""
    assert _upward(_graph()) == []


def test_the_direction_check_sees_an_import_back_up() -> None:
    graph = {"supervisor.plan": {"supervisor.conduct.ports"}, "supervisor.conduct.agent": {"supervisor.plan"},
             "supervisor.conduct.ports": set(), "supervisor.conduct": set()}
    assert _upward(graph) == ["supervisor.conduct.agent → supervisor.plan", "supervisor.plan → supervisor.conduct.ports"]
    graph["supervisor.plan"] = {"supervisor.ports"}
    graph["supervisor.ports"] = set()
    assert _upward(graph) == []


def test_the_layers_the_design_names() -> None:
    """Nothing but the CLI imports the conductor; the report reads the run directory through the
    journal alone (its only project imports: journal, _units, policy's named states, stacks, and
    the scheduler package for a scheduler's label: the one home of what a scheduler is called)."""
    graph = _graph()
    into_conduct = sorted(f"{n} → {d}" for n, deps in graph.items() for d in deps
                          if d.startswith("supervisor.conduct") and not n.startswith("supervisor.conduct")
                          and n != "supervisor.cli")
    assert into_conduct == []
    allowed = {"supervisor.journal", "supervisor._units", "supervisor.policy", "supervisor.stacks", "supervisor.sched",
               "supervisor"}
    report = sorted(f"{n} → {d}" for n, deps in graph.items() if n.startswith("supervisor.report") for d in deps
                    if not d.startswith("supervisor.report") and d not in allowed)
    assert report == []


def test_the_tests_import_helpers_from_support_never_from_a_conftest_or_a_test_module() -> None:
    """conftest.py files hold pytest's fixtures and hooks; what tests share is a module of
    tests/support (or a package's own ``_name`` module). Issue 32, item 6."""
    tests = Path(__file__).resolve().parents[1]
    bad = []
    for path in sorted(tests.rglob("*.py")):
        where = path.relative_to(tests.parent)
        package = ".".join(where.parent.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                modules = [base, *(f"{base}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            else:
                continue
            for module in modules:
                leaf = module.rpartition(".")[2]
                if leaf == "conftest" or (leaf.startswith("test_") and module.startswith("tests.")):
                    bad.append(f"{where}:{node.lineno} imports {module}")
                    break
    assert not bad, "import helpers from tests/support, not from a conftest.py or a test module:\n" + "\n".join(bad)


SCHEDULER_VARIABLE = ("SLURM_", "SLURMD_", "PBS_")


def _scheduler_variable_literals(source: str) -> list[int]:
    """Lines of the string constants (docstrings and f-strings' parts included) that name a
    scheduler's variable: ``SLURM_…``, ``SLURMD_…`` or ``PBS_…``."""
    return sorted({node.lineno for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Constant)
                   and isinstance(node.value, str) and any(p in node.value for p in SCHEDULER_VARIABLE)})


def test_no_scheduler_variable_is_named_outside_the_scheduler_package() -> None:
    """Issue 46: a scheduler's variables are read in its class (supervisor/sched/); a caller asks
    the package (``job_key``, ``local_dirs``, ``visible_gpus``, ``job.restart_count``…), never
    ``env.get("SLURM_…")``. Any string that names one counts, prose too: a module outside sched/
    that must name one holds knowledge that belongs there."""
    found = [f"{f.relative_to(SRC.parent)}:{line}" for f in sorted(SRC.rglob("*.py")) if SCHED not in f.parents
             for line in _scheduler_variable_literals(f.read_text())]
    assert not found, f"{len(found)} string(s) naming a scheduler variable outside supervisor/sched/: {found}"


def test_the_scheduler_variable_check_sees_each_form() -> None:
    """The check above can fail: a docstring, a read, a tuple of names, an f-string, a node name;
    and it leaves alone a scheduler's name and the names of what the package answers."""
    caught = '''
"""Reads ``PBS_JOBID``."""
x = env.get("SLURM_JOB_ID")
VARS = ("TMPDIR", "PBS_JOBFS")
y = f"no {name} or SLURM_JOB_ID here"
z = env.get("SLURMD_NODENAME")
'''
    assert _scheduler_variable_literals(caught) == [2, 3, 4, 5, 6]
    left_alone = '''
"""Reads the job's id from the scheduler."""
x = env.get(key.variable)
NAME = "slurm"
y = "pbs.toml"
PREFIX = "SUPERVISE_"
'''
    assert _scheduler_variable_literals(left_alone) == []


DESIGN = SRC.parent / "docs" / "design.md"


def _rooms_table(text: str) -> list[str]:
    """The first cells of docs/design.md's rooms table: the rows of the table under
    ``## Rooms``, up to the next heading."""
    section = re.split(r"^## Rooms", text, maxsplit=1, flags=re.M)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # past the header and rule
    return [row.split("|")[1] for row in rows]


def _unnamed(text: str, modules: list[str]) -> list[str]:
    named = {span for cell in _rooms_table(text) for span in re.findall(r"`([^`]+)`", cell)}
    return [m for m in modules if m not in named]


def _code_modules() -> list[str]:
    """Every .py file under supervisor/, by its path relative to supervisor/; a package's
    ``__init__.py`` that holds nothing but its docstring is no module of its own."""
    out = []
    for f in sorted(SRC.rglob("*.py")):
        tree = ast.parse(f.read_text())
        if f.name == "__init__.py" and len(tree.body) <= (ast.get_docstring(tree) is not None):
            continue
        out.append(f.relative_to(SRC).as_posix())
    return out


def test_the_design_rooms_table_names_every_module() -> None:
    """Issue 46, item 5: docs/design.md's rooms table names every module under supervisor/. A
    module is named when its path relative to supervisor/ (``sync/_parts.py``, ``cli.py``)
    stands in backticks in the first cell of one of the table's rows; one row may name several.
    Only the full relative path counts: a basename (``_job.py``) or a package (``sync/``) is
    ambiguous, and prose in the second cell is not the room's name."""
    missing = _unnamed(DESIGN.read_text(), _code_modules())
    assert not missing, f"{len(missing)} module(s) not named in docs/design.md's rooms table: {missing}"


def test_the_rooms_check_sees_a_module_left_out() -> None:
    text = ("## Rooms\n\n| module | owns |\n|---|---|\n| `cli.py`, `sync/_parts.py` | … |\n"
            "| `sched/` | `sched/_job.py` in prose |\n\n## Next\n| `plan.py` | … |\n")
    assert _unnamed(text, ["cli.py", "sync/_parts.py", "sched/_job.py", "plan.py"]) == ["sched/_job.py", "plan.py"]


WIRE = SRC / "conduct" / "wire.py"
SPEAKERS = (SRC / "conduct", SCHED)  # the rooms that speak the leader↔node conversation, and may import wire.py


@cache
def _wire_names() -> frozenset[str]:
    """The names the conversation owns: every public module-level string of conduct/wire.py, less
    the names of the rows its table marks not ``own`` (``ok``, ``end``: words every room uses)."""
    from supervisor.conduct import wire

    names = {node.value.value for node in ast.parse(WIRE.read_text()).body
             if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
             and not any(isinstance(t, ast.Name) and t.id.startswith("_") for t in node.targets)}
    return frozenset(names - {row.name for row in wire.TABLE if not row.own})


def _spelled(source: str, names: frozenset[str]) -> list[tuple[int, str]]:
    """(line, name) of each string constant, an f-string's pieces included, that is exactly
    one of ``names``. Not a name of the conversation: a docstring (prose), and a field of a
    file or an event (a dict display's key, a subscript, ``.get``'s first argument: the
    choice file's ``"choice"`` field is its format, kept with its reader)."""
    tree = ast.parse(source)
    fields: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            fields.update(id(k) for k in node.keys if k is not None)
        elif isinstance(node, ast.Subscript):
            fields.add(id(node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and node.args:
            fields.add(id(node.args[0]))
        elif isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                fields.add(id(first.value))  # a docstring
    return sorted((node.lineno, node.value) for node in ast.walk(tree)
                  if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in fields
                  and node.value in names)


def test_the_conversation_is_spelled_in_wire_alone() -> None:
    """Issue 46, item 2: ``conduct/wire.py`` owns the leader↔node conversation. The rule: in
    ``conduct/`` and ``sched/`` (the rooms that speak it) no module but wire.py spells a name
    wire.py defines (a word of the line, a word of an agent's lines, a variable, a file, a
    request or answer kind) as a string; they import it (``sched/`` is handed what it needs:
    ``AgentLaunch.said_file``). ``ok`` and ``end`` are not the conversation's alone. Rooms below
    the conductor may not import it: ``sync/`` is held to the table by the next test, and
    ``report/`` reads the journal's kinds, the record."""
    names = _wire_names()
    assert {"journal", "nodes-flush", "supervise-node-agent", "agent.lock", "said-"} <= names, names
    found = [f"{f.relative_to(SRC.parent)}:{line}: {name!r}" for room in SPEAKERS for f in sorted(room.rglob("*.py"))
             if f != WIRE for line, name in _spelled(f.read_text(), names)]
    assert not found, f"{len(found)} name(s) of the conversation spelled outside conduct/wire.py: {found}"


def test_the_wire_check_sees_a_name_spelled_elsewhere() -> None:
    names = frozenset({"journal", "nodes-flush", "supervise-node-agent", "said-", "choice"})
    caught = '''
line.ring("journal")
emit("nodes-flush", request=r)
if words[0] == "supervise-node-agent": pass
where = run_dir / f"said-{pid}"
'''
    assert _spelled(caught, names) == [(2, "journal"), (3, "nodes-flush"), (4, "supervise-node-agent"), (5, "said-")]
    left_alone = '''
"""Rings ``journal`` when a request is journaled."""
body = {"choice": choice, "round": 1}
c = body.get("choice") or body["choice"]
def f():
    """journal"""
'''
    assert _spelled(left_alone, names) == []


def _constants(source: str) -> list[str]:
    return [n.value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _told(source: str) -> set[str]:
    """The words a module of sync/ says on the line: the string given to a ``tell(…)``."""
    return {n.args[0].value for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call) and n.args
            and isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str)
            and (getattr(n.func, "attr", None) == "tell" or getattr(n.func, "id", None) == "tell")}


def test_the_rooms_below_the_conductor_spell_what_the_table_says() -> None:
    """``sync/`` sits below the conductor and may not import wire.py, so it spells the words
    its mirror says on the line (``go``, ``taken``, ``part``) and the parts' names itself. Each
    row of wire's table spelled there is found in the module the row names, and every word a
    module of sync/ tells the line is a row of the table spelled in that module: a word or a
    file renamed on one side only fails here."""
    from supervisor.conduct import wire

    elsewhere = [row for row in wire.TABLE if row.spelled != "wire"]
    assert elsewhere, "the table names where sync/ spells its words and files"
    for row in elsewhere:
        consts = _constants((SRC / row.spelled).read_text())
        pieces = [p for p in re.split(r"<[^>]*>|/|K", row.name) if p and p != "nodes"]
        missing = [p for p in pieces if not any(p in c for c in consts)]
        assert not missing, f"{row.name}: {missing} not spelled in {row.spelled}"
    for f in sorted((SRC / "sync").rglob("*.py")):
        where = f.relative_to(SRC).as_posix()
        for word in _told(f.read_text()):
            assert any(r.name == word and r.over == wire.LINE and r.spelled == where for r in wire.TABLE), \
                f"{where} tells the line {word!r}: no row of conduct/wire.py's TABLE says so"


MULTINODE = SRC.parent / "docs" / "multinode.md"


def _doc_table(text: str, heading: str) -> list[tuple[str, ...]]:
    """The rows of the first table under ``heading`` (up to the next heading of its level), each
    a tuple of its cells."""
    level = heading.split(" ", 1)[0]
    section = text.split(f"\n{heading}\n", 1)[1].split(f"\n{level} ", 1)[0]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    rows = lines[start + 2:end]  # past the header and rule
    return [tuple(cell.strip() for cell in row.strip().strip("|").split(" | ")) for row in rows]


def _wire_rows() -> list[tuple[str, ...]]:
    from supervisor.conduct import wire

    return [(f"`{r.name}`", r.what, r.way, r.over, r.carries) for r in wire.TABLE]


def test_the_protocol_table_of_multinode_md_is_wires() -> None:
    """Issue 46, item 2: docs/multinode.md's "The conversation, whole" is conduct/wire.py's
    ``TABLE``, row by row (a name, a direction, a channel added or changed on one side fails);
    the words of the line's table ("At scale") are said on the line in wire's."""
    from supervisor.conduct import wire

    text = MULTINODE.read_text()
    doc, ours = _doc_table(text, "## The conversation, whole"), _wire_rows()
    assert doc == ours, ("docs/multinode.md's table and conduct/wire.py's TABLE differ:\n"
                         + "\n".join(f"  doc only: {r}" for r in doc if r not in ours)
                         + "\n" + "\n".join(f"  wire only: {r}" for r in ours if r not in doc))
    on_line = {r.name for r in wire.TABLE if r.over in (wire.LINE, wire.LINE_AND_JOURNALS)}
    words = [w for row in _doc_table(text, "## At scale") for w in re.findall(r"^`([^` ]+)|, `([^` ]+)", row[0])]
    said = {w for pair in words for w in pair if w}
    assert said and said <= on_line, said - on_line


def test_the_protocol_table_check_sees_a_row_left_out() -> None:
    text = ("\n## The conversation, whole\n\n| name | what | from → to | over | carries |\n|---|---|---|---|---|\n"
            "| `hello` | word | node → leader | the line | x |\n\n## Next\n| `ok` | b |\n")
    assert _doc_table(text, "## The conversation, whole") == [("`hello`", "word", "node → leader", "the line", "x")]
    assert _doc_table(text, "## The conversation, whole") != _wire_rows()
