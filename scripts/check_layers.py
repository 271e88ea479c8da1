#!/usr/bin/env python3
"""Fails when a file of src/trellis includes a folder its layer does not link.

The layers are the trellis_layer(...) lines of cmake/layers.cmake, lowest first: the same lines
make each folder a library that links only the folders it names. This script holds the includes
to them: a file of folder A may include its own folder's headers and those of the folders A's
line names, and a header of A only those named PUBLIC (its includers see them too). A line may
name only folders above it, so the graph has no cycle. A named folder that no file includes is
an error too, so the lines say exactly what each folder uses.

  scripts/check_layers.py            check (exit 1 and one line per problem)
  scripts/check_layers.py --derive   print the lines the includes imply, in the table's order
"""
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TABLE = ROOT / "cmake" / "layers.cmake"
SRC = ROOT / "src" / "trellis"
LAYER_LINE = re.compile(r"^\s*trellis_layer\(([^)]*)\)", re.M)
INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]')


def read_layers():
    """[(folder, {dep: 'PUBLIC'|'PRIVATE'})] in the table's order, lowest first."""
    layers = []
    for match in LAYER_LINE.finditer(TABLE.read_text()):
        words = match.group(1).split()
        name, deps, kind = words[0], {}, None
        for word in words[1:]:
            if word in ("PUBLIC", "PRIVATE"):
                kind = word
            else:
                deps[word] = kind
        layers.append((name, deps))
    return layers


def scan_includes():
    """{folder: [(path, line number, included folder, included path, from a header)]}"""
    found = {}
    for path in sorted(SRC.rglob("*")):
        if path.suffix not in (".h", ".hpp", ".cpp", ".cc", ".inc"):
            continue
        folder = path.relative_to(SRC).parts[0]
        for number, text in enumerate(path.read_text(errors="replace").splitlines(), 1):
            match = INCLUDE.match(text)
            if not match:
                continue
            target = match.group(1)
            if target.startswith("trellis/") and target.count("/") >= 2:
                to = target.split("/")[1]
            elif ".." in target or target.startswith("trellis/"):
                to = None  # a path we cannot place: reported below
            else:
                continue  # the standard library or a third-party header
            found.setdefault(folder, []).append(
                (path.relative_to(ROOT), number, to, target, path.suffix in (".h", ".hpp")))
    return found


def check(layers, found):
    order = [name for name, _ in layers]
    rank = {name: i for i, name in enumerate(order)}
    table = TABLE.relative_to(ROOT)
    errors = []
    for name, deps in layers:
        for dep, kind in deps.items():
            if kind is None:
                errors.append(f"{table}: {name}: name {dep} after PUBLIC or PRIVATE")
            if dep not in rank:
                errors.append(f"{table}: {name} names {dep}, which has no trellis_layer line")
            elif rank[dep] >= rank[name]:
                errors.append(f"{table}: {name} names {dep}, which is not below it "
                              f"(a layer names only the lines before its own)")
    folders = {p.name for p in SRC.iterdir() if p.is_dir()}
    for folder in sorted(folders - set(order)):
        errors.append(f"src/trellis/{folder}/: a folder with no trellis_layer line in {table}")
    for name in order:
        if name not in folders:
            errors.append(f"{table}: {name} has no folder src/trellis/{name}/")

    deps_of = dict(layers)
    for folder, includes in sorted(found.items()):
        deps = deps_of.get(folder, {})
        used = {}
        for path, number, to, target, from_header in includes:
            where = f"{path}:{number}"
            if to is None:
                errors.append(f'{where}: include "{target}": name trellis headers as '
                              f'"trellis/<folder>/<file>"')
                continue
            if to == folder:
                continue
            if to not in rank or folder not in rank:
                continue  # reported above as a folder without a line
            if to not in deps:
                if rank[to] > rank[folder]:
                    errors.append(f"{where}: {folder} includes {target}: {to} is above {folder} "
                                  f"in the layers ({table}); move what {folder} needs down, "
                                  f"or the including code up")
                else:
                    errors.append(f"{where}: {folder} includes {target}, but {folder}'s line in "
                                  f"{table} does not name {to}; name it there if {folder} "
                                  f"should use {to}")
                continue
            if from_header and deps[to] != "PUBLIC":
                errors.append(f"{where}: a header of {folder} includes {target}, so {folder}'s "
                              f"line in {table} must name {to} PUBLIC, not PRIVATE")
            used[to] = used.get(to, False) or from_header
        for dep, kind in deps.items():
            if dep not in used:
                errors.append(f"{table}: {folder} names {dep}, but no file of {folder} includes "
                              f"it: drop it from the line")
            elif kind == "PUBLIC" and not used[dep]:
                errors.append(f"{table}: {folder} names {dep} PUBLIC, but only its sources "
                              f"include it: name it PRIVATE")
    return errors


def derive(layers, found):
    for name, _ in layers:
        public, private = set(), set()
        for _, _, to, _, from_header in found.get(name, []):
            if to and to != name:
                (public if from_header else private).add(to)
        private -= public
        order = [n for n, _ in layers]
        line = name
        if public:
            line += " PUBLIC " + " ".join(sorted(public, key=order.index))
        if private:
            line += " PRIVATE " + " ".join(sorted(private, key=order.index))
        print(f"trellis_layer({line})")


def main():
    layers = read_layers()
    found = scan_includes()
    if "--derive" in sys.argv[1:]:
        derive(layers, found)
        return 0
    if not layers:
        print(f"check_layers: no trellis_layer lines in {TABLE}", file=sys.stderr)
        return 1
    errors = check(layers, found)
    for error in errors:
        print(error, file=sys.stderr)
    if errors:
        print(f"check_layers: {len(errors)} problem(s); the layers and why: docs/design.md, "
              f"\"Layers and folders\"", file=sys.stderr)
        return 1
    count = sum(len(v) for v in found.values())
    print(f"check_layers: {count} includes in {len(layers)} layers, none upward")
    return 0


if __name__ == "__main__":
    sys.exit(main())
