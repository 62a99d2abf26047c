#!/usr/bin/env python3
"""Checks that every `#include "meshtrain/<folder>/..."` in src/meshtrain/<module>/ names the
module itself or a module below it: one of the DEPS that src/meshtrain/CMakeLists.txt gives
the module, or theirs, transitively (the dependency arrows of docs/architecture.md). All headers share one include root, so without
this check a module could include a header of a module above it and, as long as it uses only
inline code, still build. Exits 1 listing every violation.

    python3 tools/check_layering.py [repo root]
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
src = root / "src" / "meshtrain"
cmake = (src / "CMakeLists.txt").read_text()

allowed = {}
folders = {"apps": "apps"}  # folder under src/meshtrain → module name
for m in re.finditer(r"meshtrain_module\((\w+)(.*?)\)", cmake, re.S):
    name, args = m.group(1), m.group(2)
    folder = re.search(r"FOLDER\s+([\w/]+)", args)
    folders[folder.group(1) if folder else name] = name
    deps = re.search(r"DEPS\s+([\w\s]+?)(?:EXTERNAL|$)", args, re.S)
    allowed[name] = {name} | (set(deps.group(1).split()) if deps else set())
# A module may use what lies below it, directly or through another module.
changed = True
while changed:
    changed = False
    for name, deps in allowed.items():
        closure = set().union(*(allowed.get(d, {d}) for d in deps))
        if not closure <= deps:
            deps |= closure
            changed = True
allowed["apps"] = set(allowed) | {"apps"}  # the executable sits on top of everything



def module_of(relative):
    """The module of a path below src/meshtrain (its longest folder that is a module)."""
    parts = pathlib.PurePosixPath(relative).parts
    for n in range(len(parts) - 1, 0, -1):
        if "/".join(parts[:n]) in folders:
            return folders["/".join(parts[:n])]
    return None


violations = []
for path in sorted(src.rglob("*")):
    if path.suffix not in (".h", ".cpp"):
        continue
    module = module_of(path.relative_to(src).as_posix())
    if module not in allowed:
        violations.append(f"{path.relative_to(root)}: folder {path.parent.name} is not a known module")
        continue
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        inc = re.match(r'\s*#include\s+"meshtrain/([\w/]+\.h)"', line)
        used = module_of(inc.group(1)) if inc else None
        if inc and used not in allowed[module]:
            violations.append(f"{path.relative_to(root)}:{lineno}: {module} may not include "
                              f"{inc.group(1)} (allowed: {', '.join(sorted(allowed[module]))})")

for v in violations:
    print(v)
print(f"{0 if violations else 1} passed, {1 if violations else 0} failed: "
      f"{len(allowed)} modules, {len(violations)} layering violation(s)")
sys.exit(1 if violations else 0)
