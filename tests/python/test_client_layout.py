"""The Python client's rooms and the one direction of their dependencies
(ARCHITECTURE.md, "The Python client"), checked on the source as CMake checks
the C++ side: every import of a kiln module, function-local ones included, and
every module named by a string ("kiln.x" in sys.modules, _patches' installers).
Needs no kilnd."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "client" / "python" / "kiln"

# A room may use the rooms below it, never one above it.
ROOMS = ("commands", "inductor", "triton", "local", "service")  # top to bottom
# kiln's top: activation, the command line, the cache manager's old name. It
# may use every room; no room uses it.
TOP = {"kiln", "kiln.__main__", "kiln._autoload", "kiln._patches", "kiln._after_import", "kiln._cache",
       "kiln._own_modules"}
# Imports that close a circle, each a lazy load that cannot be undone without
# changing when Triton's side loads: (importer, imported, why).
LAZY_CIRCLES = {
    ("kiln.triton.build_hook", "kiln.triton.remote"):
        "knobs.build.impl is set as triton.knobs is imported and loads the manager over kilnd on the first "
        "build; that manager sets the knob again when Kiln is enabled after kiln.disable()",
}


def module_names():
    names = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def imports(name, path, modules):
    """{kiln module: "import" or "string"} that `name` imports (anywhere in it) or names."""
    found = {}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in modules and node.value != "kiln":
                found.setdefault(node.value, "string")
            continue
        else:
            continue
        for target in targets:
            if target == "kiln" or target.startswith("kiln."):
                found[target] = "import"
    found.pop(name, None)
    return found


def room_of(name):
    if name in TOP:
        return None
    return name.split(".")[1]


def graph():
    modules = module_names()
    return modules, {name: imports(name, path, modules) for name, path in modules.items()}


def test_every_module_is_at_the_top_or_in_a_room():
    modules, _ = graph()
    strays = [name for name in modules if name not in TOP and room_of(name) not in ROOMS]
    assert not strays, f"{strays}: put each in a room (ROOMS) or, if it activates Kiln, at the top (TOP)"


def test_dependencies_point_down():
    _, edges = graph()
    wrong = []
    for importer, targets in edges.items():
        if importer in TOP:
            continue
        for target, how in targets.items():
            if target in TOP:
                wrong.append(f"{importer} -> {target} ({how}): no room uses kiln's top")
            elif target.split(".")[1] in ROOMS and ROOMS.index(room_of(target)) < ROOMS.index(room_of(importer)):
                wrong.append(f"{importer} -> {target} ({how}): {room_of(importer)} is below {room_of(target)}")
    assert not wrong, "against the direction of ARCHITECTURE.md:\n" + "\n".join(wrong)


def test_no_circles():
    _, edges = graph()
    follows = {importer: sorted(target for target, how in targets.items()
                                if how == "import" and (importer, target) not in LAZY_CIRCLES
                                and target in edges and not importer.startswith(target + "."))
               for importer, targets in edges.items()}
    state, stack, circles = {}, [], []

    def visit(name):
        state[name] = "open"
        stack.append(name)
        for target in follows[name]:
            if state.get(target) == "open":
                circles.append(stack[stack.index(target):] + [target])
            elif target not in state:
                visit(target)
        stack.pop()
        state[name] = "done"

    for name in sorted(follows):
        if name not in state:
            visit(name)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(circle) for circle in circles)


def test_the_lazy_circles_are_still_there():
    """An exception that no longer happens is dropped from LAZY_CIRCLES (and ARCHITECTURE.md)."""
    _, edges = graph()
    assert all(edges.get(importer, {}).get(target) == "import" for importer, target in LAZY_CIRCLES)


def test_no_room_is_bound_to_the_name_of_the_library_it_plugs_into():
    """kiln.triton is a room, triton the library: `import triton` inside kiln is
    always Triton (imports are absolute), and no module calls a room `triton`."""
    bound = []
    for name, path in module_names().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("kiln")):
                bound += [f"{name}: {alias.name}" for alias in node.names
                          if (alias.asname or alias.name) in ("triton", "torch", "inductor")]
            elif isinstance(node, ast.Import):
                bound += [f"{name}: {alias.name} as {alias.asname}" for alias in node.names
                          if alias.name.startswith("kiln.") and alias.asname in ("triton", "torch", "inductor")]
    assert not bound, bound
