"""The import layering of prime_values (docs/design.md §6), read from the source: every module under prime_values/
is parsed (ast), nothing is imported: the whole check takes 0.3-0.8 s on the 2-core machine (parsed once per session).

Rules (each failure names the module, the line and the import):

1. No import cycles between modules, counting function-local imports and the command-line block under
   `if __name__ == "__main__":` too (a cycle hidden in a function or a CLI is still two modules that cannot be
   understood, tested or moved apart).
2. `prime_values/algo` imports only torch, numpy, the standard library and itself.
3. `prime_values/log` imports nothing of models, roles, tasks, algo (nor torch, transformers): the log knows no
   models.
4. Roles use algo, log, weights, models, tasks and critic_io (the critic's inputs and step: library code, not a
   role); none of those imports roles.
5. A function-local import is for a heavy or optional dependency only: it must bring in a package of HEAVY or an
   optional extra (setup.cfg) that the importing module does not already import at module level (directly or
   through the modules it imports). Everything else is imported at the top.
6. The command-line tools (prime_values/tools: check, show, status, report, ...) may use everything; none of algo,
   log, weights, models, tasks, critic_io, roles imports them.
7. The modules the fork server preloads (PRELOAD in prime_values/launch/zygote.py) import no pyarrow, whose
   allocator starts a thread before the zygote forks.
8. One spelling per module: no module is a shim of another (a star import, a runpy hand-over, or imports and
   nothing defined); a tool is `python -m prime_values.tools.<tool>` only. A package's `__main__.py` (what
   `python -m <package>` runs) is exempt.
9. recipes/ holds recipes (markdown) only; scripts live in bench/ or launchers/.
10. `prime_values/config` imports nothing of prime_values above it, at module level or in a function: only itself
    and what lies below it (CONFIG_BELOW: the estimator registry's package algo and importpath, which import nothing
    of prime_values outside themselves). A check that needs the code above config is a hook
    (prime_values/config/checks.py) that code registers; data config needs lives in config.
"""

from __future__ import annotations

import ast
import configparser
import functools
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# Dependencies that take 0.1 s or more to import (`python -X importtime -c "import X"`, 2-core machine, 2026-12-02):
# torch 5.2 s, transformers 2.2 s, matplotlib 0.85 s, hydra 0.57 s, pyarrow 0.43 s, numpy 0.34 s, omegaconf 0.18 s,
# submitit 0.12 s, asyncio 0.1 s (of the standard library: tasks.verifiers_env). A module that does not import one
# of them at the top may import it (or a module that does) in the function that needs it; the optional extras of
# setup.cfg likewise.
HEAVY = frozenset({"torch", "transformers", "matplotlib", "hydra", "pyarrow", "numpy", "omegaconf", "submitit",
                   "asyncio"})
ALGO_ALLOWED = frozenset({"torch", "numpy"})
LOWER = ("algo", "log", "weights", "models", "tasks", "critic_io")  # what roles use; none of them uses roles
BELOW_TOOLS = LOWER + ("roles",)  # none of them imports prime_values.tools
LOG_FORBIDDEN = ("prime_values.models", "prime_values.roles", "prime_values.tasks", "prime_values.algo", "torch",
                 "transformers", "peft", "vllm")
CONFIG = "prime_values.config"
CONFIG_BELOW = ("prime_values.algo", "prime_values.importpath")  # below config: they import nothing of prime_values
# outside themselves (checked too), so config may use them (the estimator registry, classes named by import path)


@dataclass(frozen=True)
class Import:
    importer: str  # the module whose code holds the import ("<module>:__main__" for its script block, which runs
    # only as a script: what importing the module loads leaves it out; its imports are edges of the module graph)
    target: str  # the imported module: a prime_values module (the nearest one named), or a third-party / stdlib one
    line: int
    local: bool  # inside a function
    text: str

    def where(self) -> str:
        return f"{self.importer} (line {self.line}: {self.text})"


def optional_extras(setup_cfg: Path) -> frozenset[str]:
    """Import names of the packages only an extra brings (setup.cfg's extras_require minus install_requires)."""
    parser = configparser.ConfigParser()
    parser.read(setup_cfg)

    def names(text: str) -> set[str]:
        return {re.split(r"[\[<>=!~; ]", line.strip(), maxsplit=1)[0].replace("-", "_").lower()
                for line in text.splitlines() if line.strip() and not line.strip().startswith("#")}

    required = names(parser["options"]["install_requires"])
    extras = set().union(*(names(v) for v in parser["options.extras_require"].values()))
    return frozenset(extras - required)


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_main_guard(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__" and \
        len(test.comparators) == 1 and getattr(test.comparators[0], "value", None) == "__main__"


def _is_type_checking(node: ast.stmt) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _statements(node: ast.AST):
    """The statements directly inside `node` (imports are statements: expressions are not searched)."""
    for name in ("body", "orelse", "finalbody", "handlers", "cases"):
        for child in getattr(node, name, ()):
            if isinstance(child, (ast.stmt, ast.excepthandler, ast.match_case)):
                yield child


def parse_imports(root: Path) -> tuple[dict[str, Path], list[Import]]:
    """Every module of `root`/prime_values and every import statement in it, resolved to module names."""
    modules = {module_name(p, root): p for p in sorted((root / "prime_values").rglob("*.py"))
               if "conf" not in p.relative_to(root / "prime_values").parts[:1]}

    def target_of(name: str, member: str | None) -> str:
        if name.split(".")[0] != "prime_values":
            return name
        if member and f"{name}.{member}" in modules:  # from package import submodule
            return f"{name}.{member}"
        while name not in modules and "." in name:
            name = name.rpartition(".")[0]
        return name

    found: list[Import] = []
    for mod, path in modules.items():
        is_package = path.name == "__init__.py"

        def visit(node: ast.AST, owner: str, local: bool) -> None:
            for child in _statements(node):
                if _is_type_checking(child):
                    continue  # annotations only: never executed
                if isinstance(child, ast.Import):
                    for alias in child.names:
                        found.append(Import(owner, target_of(alias.name, None), child.lineno, local,
                                            ast.unparse(child)))
                elif isinstance(child, ast.ImportFrom):
                    if child.level:
                        base = mod.split(".") if is_package else mod.split(".")[:-1]
                        base = base[:len(base) - (child.level - 1)]
                        name = ".".join(base + ([child.module] if child.module else []))
                    else:
                        name = child.module
                    if name == "__future__":
                        continue
                    for alias in child.names:
                        found.append(Import(owner, target_of(name, alias.name), child.lineno, local,
                                            ast.unparse(child)))
                elif _is_main_guard(child) and node is tree:
                    visit(child, f"{mod}:__main__", local)
                else:
                    visit(child, owner, local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        tree = ast.parse(path.read_text(), filename=str(path))
        visit(tree, mod, False)
    return modules, found


def _module(imp: Import) -> str:
    """The module whose code holds the import: a script block's imports are its module's."""
    return imp.importer.split(":")[0]


def find_cycles(imports: list[Import]) -> list[list[Import]]:
    """One cycle (as the imports that close it) per strongly connected component of the module graph; an import
    under `if __name__ == "__main__":` is an edge of its module like any other."""
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        if imp.target.startswith("prime_values") and imp.target != _module(imp):
            edges.setdefault(_module(imp), {}).setdefault(imp.target, imp)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[list[str]] = []

    def connect(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, {}):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    for v in sorted(edges):
        if v not in index:
            connect(v)
    cycles = []
    for component in components:  # a shortest path back to the component's first module
        members, start = set(component), min(component)
        paths, frontier = {start: []}, [start]
        while frontier and not any(start in edges.get(v, {}) for v in frontier):
            nxt = []
            for v in frontier:
                for w, imp in sorted(edges.get(v, {}).items()):
                    if w in members and w not in paths:
                        paths[w] = paths[v] + [imp]
                        nxt.append(w)
            frontier = nxt
        last = next(v for v in sorted(paths, key=lambda v: len(paths[v])) if start in edges.get(v, {}))
        cycles.append(paths[last] + [edges[last][start]])
    return cycles


def module_level_packages(modules: dict[str, Path], imports: list[Import]) -> dict[str, set[str]]:
    """For each module: the third-party and stdlib top-level packages importing it loads (its module-level imports,
    and theirs, through the prime_values modules it imports and their parent packages)."""
    direct: dict[str, set[str]] = {m: set() for m in modules}
    deps: dict[str, set[str]] = {m: set() for m in modules}
    for imp in imports:
        if imp.local or imp.importer not in modules:
            continue
        if imp.target.startswith("prime_values"):
            parts = imp.target.split(".")
            deps[imp.importer].update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        else:  # `import a.b.c` loads a, a.b and a.b.c
            parts = imp.target.split(".")
            direct[imp.importer].update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
    closure: dict[str, set[str]] = {}
    for mod in modules:  # importing a.b.c runs a and a.b first
        parts = mod.split(".")
        todo = [m for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if m in modules]
        seen, packages = set(todo), set()
        while todo:
            m = todo.pop()
            packages |= direct.get(m, set())
            for d in deps.get(m, ()):
                if d in modules and d not in seen:
                    seen.add(d)
                    todo.append(d)
        closure[mod] = packages
    return closure


def violations(root: Path, parsed: tuple | None = None) -> dict[str, list[str]]:
    modules, imports = parsed or parse_imports(root)
    closure = module_level_packages(modules, imports)
    stdlib = set(sys.stdlib_module_names)
    costly = HEAVY | optional_extras(root / "setup.cfg")
    reported: set[tuple[str, int]] = set()  # one message per statement
    found: dict[str, list[str]] = {"cycles": [], "algo": [], "log": [], "roles": [], "tools": [], "local": [],
                                   "config": []}
    for cycle in find_cycles(imports):
        found["cycles"].append(" -> ".join([_module(cycle[0])] + [i.target for i in cycle]) + ": " +
                               "; ".join(i.where() for i in cycle))
    for imp in imports:
        importer = _module(imp)
        if importer.startswith("prime_values.algo"):
            top = imp.target.split(".")[0]
            if not (top in stdlib or top in ALGO_ALLOWED or imp.target.startswith("prime_values.algo")):
                found["algo"].append(f"{imp.where()}: algo imports only torch, numpy, the standard library and "
                                     "algo")
        if importer.startswith("prime_values.log") and imp.target.startswith(LOG_FORBIDDEN):
            found["log"].append(f"{imp.where()}: the log knows no models (nothing of models, roles, tasks, algo, "
                                "torch, transformers)")
        if (importer.split(".")[1:2] and importer.split(".")[1] in LOWER
                and imp.target.startswith("prime_values.roles")):
            found["roles"].append(f"{imp.where()}: {importer.split('.')[1]} is below roles and must not import "
                                  "them")
        if (importer.split(".")[1:2] and importer.split(".")[1] in BELOW_TOOLS
                and imp.target.startswith("prime_values.tools")):
            found["tools"].append(f"{imp.where()}: {importer.split('.')[1]} is below the command-line tools and must "
                                  "not import them")
        if _within(importer, CONFIG) and _within(imp.target, "prime_values") and not _within(imp.target, CONFIG) \
                and not any(_within(imp.target, below) for below in CONFIG_BELOW) \
                and not any(f"(line {imp.line}:" in x and x.startswith(imp.importer + " ") for x in found["config"]):
            found["config"].append(f"{imp.where()}: config imports nothing of prime_values above it; make the check a "
                                   "hook (prime_values/config/checks.py) that module registers, or move the data "
                                   "into config")
        below = next((b for b in CONFIG_BELOW if _within(importer, b)), None)
        if below and _within(imp.target, "prime_values") and not _within(imp.target, below):
            found["config"].append(f"{imp.where()}: {below} is below config and imports nothing of prime_values "
                                   "outside itself")
        if imp.local and (imp.importer, imp.line) not in reported:
            reported.add((imp.importer, imp.line))
            have = closure.get(importer, set())
            if imp.target.startswith("prime_values"):  # the packages that module (and its parent packages) loads
                parts = imp.target.split(".")
                loads = set().union(*(closure.get(".".join(parts[:i]), set()) for i in range(1, len(parts) + 1)))
            else:
                loads = {imp.target}
            new = {name for name in loads - have if name.split(".")[0] in costly}
            if not new:
                why = "the standard library" if imp.target.split(".")[0] in stdlib else \
                    "nothing that is not imported at module level already" if imp.target in have else \
                    f"nothing heavy or optional that {importer} lacks"
                found["local"].append(f"{imp.where()}: a function-local import brings {why}; import it at the "
                                      "top")
    return found


def _within(module: str, package: str) -> bool:
    """`module` is `package` or one of its submodules."""
    return module == package or module.startswith(package + ".")


def zygote_preloads(root: Path) -> tuple[str, ...]:
    """The modules the fork server imports before it forks (PRELOAD in prime_values/launch/zygote.py)."""
    tree = ast.parse((root / "prime_values" / "launch" / "zygote.py").read_text())
    value = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(isinstance(t, ast.Name) and t.id == "PRELOAD" for t in node.targets))
    return tuple(ast.literal_eval(value))


@functools.lru_cache(maxsize=None)
def _repo() -> tuple[dict[str, Path], list[Import]]:
    return parse_imports(REPO)  # once per session: the whole tree in ~0.3 s on a quiet 2-core machine


@functools.lru_cache(maxsize=None)
def _repo_violations() -> dict[str, list[str]]:
    return violations(REPO, _repo())


def _fail_on(kind: str, rule: str) -> None:
    bad = _repo_violations()[kind]
    assert not bad, f"{rule}:\n  " + "\n  ".join(bad)


def test_no_import_cycles():
    _fail_on("cycles", "import cycles (break one by moving the shared piece to the lower module, or by passing it in)")


def test_algo_imports_only_torch_numpy_and_the_standard_library():
    _fail_on("algo", "prime_values/algo imports only torch, numpy, the standard library and itself")


def test_the_log_knows_no_models():
    _fail_on("log", "prime_values/log imports nothing of models, roles, tasks, algo, torch or transformers")


def test_nothing_below_roles_imports_roles():
    _fail_on("roles", "roles use algo, log, weights, models, tasks, critic_io; none of those imports roles")


def test_nothing_below_the_tools_imports_them():
    _fail_on("tools", "the command-line tools (prime_values/tools) use everything; nothing of algo, log, weights, "
             "models, tasks, critic_io or roles imports them")


def test_config_imports_nothing_of_prime_values_above_it():
    _fail_on("config", "prime_values/config is the bottom layer: it imports nothing of prime_values but itself, algo "
             "and importpath, at module level or in a function (its checks that need more are hooks: config/checks.py)")


def test_function_local_imports_are_for_heavy_or_optional_dependencies():
    _fail_on("local", "function-local imports only for heavy or optional dependencies")


def test_the_fork_server_preloads_nothing_that_imports_pyarrow():
    """The zygote forks every local role job from itself: what it preloads must start no thread (pyarrow's allocator
    does), so none of its prime_values modules may import pyarrow at module level, directly or through others."""
    modules, imports = _repo()
    closure = module_level_packages(modules, imports)
    preloaded = [m for m in zygote_preloads(REPO) if m.startswith("prime_values")]
    assert "prime_values.config" in preloaded
    bad = {m: sorted(x for x in closure[m] if x.split(".")[0] == "pyarrow") for m in preloaded}
    assert not any(bad.values()), f"the zygote preloads modules that import pyarrow: {bad}"


def shim_reason(source: str) -> str | None:
    """Why a module is a shim of another (it adds nothing of its own), or None: a star import, a runpy hand-over,
    or statements that are all imports (or a script block) with no definition."""
    tree = ast.parse(source)
    nodes = list(ast.walk(tree))
    if any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in nodes):
        return "a star import"
    if any((isinstance(n, ast.Import) and any(a.name == "runpy" for a in n.names))
           or (isinstance(n, ast.ImportFrom) and n.module == "runpy") for n in nodes):
        return "a runpy hand-over"
    body = [s for s in tree.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    defines = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Assign, ast.AnnAssign, ast.AugAssign)
    if body and not any(isinstance(s, defines) for s in body):
        return "imports and nothing defined"
    return None


def test_no_module_is_a_shim():
    """Each module is the one place its names are spelled: no module re-exports or runs another under a second
    path (the tools are `python -m prime_values.tools.<tool>`, nothing at the package root stands in for them)."""
    shims = [f"{path.relative_to(REPO)}: {reason}" for path in sorted((REPO / "prime_values").rglob("*.py"))
             if path.name != "__main__.py" and "conf" not in path.relative_to(REPO / "prime_values").parts[:1]
             and (reason := shim_reason(path.read_text()))]
    assert not shims, "modules that only stand in for another (import from the real module instead):\n  " + \
        "\n  ".join(shims)


def test_the_shim_check_catches_both_kinds():
    runs = '"""Old path."""\nimport runpy\n\nif __name__ == "__main__":\n    runpy.run_module("p.tools.x")\n' \
           'else:\n    from p.tools.x import *  # noqa: F401,F403\n'
    assert shim_reason(runs) == "a star import"
    assert shim_reason('import runpy\nrunpy.run_module("p.tools.x", run_name="__main__")\n') == "a runpy hand-over"
    assert shim_reason('"""Old path."""\nfrom p.tools.x import main, view  # noqa: F401\n') == \
        "imports and nothing defined"
    assert shim_reason('"""A tool."""\nimport sys\n\n\ndef main():\n    return sys.argv\n') is None
    assert shim_reason("") is None  # an empty __init__.py is a package, not a shim


def test_recipes_holds_only_recipes():
    """recipes/ is markdown; a script that runs a recipe (a GPU check, a launcher) lives in bench/ or launchers/."""
    other = sorted(str(p.relative_to(REPO)) for p in (REPO / "recipes").rglob("*")
                   if p.is_file() and p.suffix != ".md" and "__pycache__" not in p.parts)
    assert not other, f"not a recipe (move it to bench/ or launchers/ and fix its references): {other}"


def imported_test_modules(source: str) -> list[str]:
    """The test modules (`test_*`, by any path) a test file's source imports at any depth."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module] + [f"{node.module}.{a.name}" for a in node.names]
    return sorted({n for n in names if n.rsplit(".", 1)[-1].startswith("test_")})


def test_no_test_module_imports_another():
    """Tests live in one folder per layer (tests/algo, tests/log, ...); what several share is a fixture in a
    conftest.py or a shared module beside them, never another test module (which would run its tests twice under two
    names and tie two folders together)."""
    found = {str(p.relative_to(REPO)): imported_test_modules(p.read_text())
             for p in sorted((REPO / "tests").rglob("test_*.py"))}
    assert len(found) > 50 and not (REPO / "tests" / "test_gae.py").exists()
    offenders = {path: names for path, names in found.items() if names}
    assert not offenders, f"move what these share into a conftest.py or a shared module: {offenders}"
    assert imported_test_modules("from tests.algo.test_gae import x\nimport os\n") == ["tests.algo.test_gae"]
    assert imported_test_modules("def f():\n    from tests.roles import test_dist\n") == ["tests.roles.test_dist"]


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "setup.cfg").write_text("[options]\ninstall_requires =\n    torch\n[options.extras_require]\n"
                                        "lora =\n    peft>=0.21\n")
    for name, text in files.items():
        path = tmp_path / "prime_values" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_the_checker_catches_each_kind_of_violation(tmp_path):
    """A made-up tree with one violation of each rule: each is reported, naming the module and the import."""
    root = _tree(tmp_path, {
        "__init__.py": "",
        "algo/__init__.py": "import pyarrow\n",
        "log/__init__.py": "from prime_values.models import build\n",
        "models/__init__.py": "from prime_values.tools import check\n",
        "models/build.py": "import torch\n\ndef load():\n    from prime_values.models.lora import merge\n",
        "models/lora.py": "from prime_values.models.build import load\n"
                          "def wrap():\n    import peft\n    import json\n    import torch\n",
        "roles/__init__.py": "",
        "tasks/__init__.py": "def make():\n    from prime_values.roles import x\n",
        "tools/__init__.py": "",
        "tools/check.py": "",
        "tool.py": "from prime_values.models.lora import wrap\n"
                   "if __name__ == '__main__':\n    from prime_values.user import y\n",
        "user.py": "from prime_values.tool import z\n",
    })
    found = violations(root)
    assert found["cycles"] == ["prime_values.models.build -> prime_values.models.lora -> prime_values.models.build: "
                               "prime_values.models.build (line 4: from prime_values.models.lora import merge); "
                               "prime_values.models.lora (line 1: from prime_values.models.build import load)",
                               "prime_values.tool -> prime_values.user -> prime_values.tool: "
                               "prime_values.tool:__main__ (line 3: from prime_values.user import y); "
                               "prime_values.user (line 1: from prime_values.tool import z)"]  # through a CLI block too
    assert found["algo"] == ["prime_values.algo (line 1: import pyarrow): algo imports only torch, numpy, the "
                             "standard library and algo"]
    assert len(found["log"]) == 1 and found["log"][0].startswith("prime_values.log (line 1: from prime_values.models")
    assert len(found["roles"]) == 1 and found["roles"][0].startswith("prime_values.tasks (line 2: from prime_values"
                                                                     ".roles import x)")
    assert found["tools"] == ["prime_values.models (line 1: from prime_values.tools import check): models is below "
                              "the command-line tools and must not import them"]
    local = found["local"]
    assert [x.split(":")[0] for x in local] == ["prime_values.models.build (line 4", "prime_values.models.lora (line 4",
                                                "prime_values.models.lora (line 5", "prime_values.tasks (line 2"], local
    assert "the standard library" in local[1] and "not imported at module level already" in local[2]


def test_the_config_rule_catches_imports_above_it(tmp_path):
    """config importing a task (at the top), the launch (in a function) or the package root is reported; config
    importing itself, algo and importpath is not, nor anything above config importing config; algo or importpath
    importing the rest is."""
    root = _tree(tmp_path, {
        "__init__.py": "",
        "algo/__init__.py": "",
        "algo/estimators.py": "from prime_values.tasks import x\n",
        "importpath.py": "import importlib\n",
        "config/__init__.py": "from prime_values.config.base import y\nfrom prime_values.algo.estimators import z\n"
                              "from prime_values.importpath import split\nfrom prime_values.tasks import make\n",
        "config/base.py": "import prime_values\n\ndef check():\n    from prime_values.launch import slurm\n",
        "launch/__init__.py": "",
        "launch/slurm.py": "from prime_values.config import base\n",
        "tasks/__init__.py": "from prime_values.config.base import y\n",
    })
    found = violations(root)["config"]
    assert [x.split(":")[0] for x in found] == ["prime_values.algo.estimators (line 1",
                                                "prime_values.config (line 4", "prime_values.config.base (line 1",
                                                "prime_values.config.base (line 4"], found
    assert "config imports nothing of prime_values above it" in found[1]
    assert "prime_values.algo is below config" in found[0]
