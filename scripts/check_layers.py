#!/usr/bin/env python3
"""Checks that the tree follows docs/design/layers.md.

  check_layers.py includes   every #include "folio/X/..." and every linked folio_X in a layer
                             names that layer or one above it; FOLIO_LAYERS has the table's order
  check_layers.py docs       every layer with sources has docs/design/<layer>.md naming each of
                             its headers

Prints one line per violation and exits 1 when there is any.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SOURCE_SUFFIXES = {".h", ".cc", ".cu", ".cuh", ".inc"}


def layer_order():
    """The layers in the order of the table in docs/design/layers.md."""
    text = (ROOT / "docs/design/layers.md").read_text()
    rows = re.findall(r"^\|\s*(\d+)\s*\|\s*`([a-z_]+)`\s*\|", text, re.MULTILINE)
    return [name for _, name in sorted(rows, key=lambda row: int(row[0]))]


def layer_files(layer):
    folder = ROOT / "src/folio" / layer
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.rglob("*") if p.suffix in SOURCE_SUFFIXES)


def check_includes(order):
    problems = []
    rank = {name: index for index, name in enumerate(order)}
    cmake = (ROOT / "CMakeLists.txt").read_text()
    listed = re.search(r"set\(FOLIO_LAYERS ([^)]*)\)", cmake)
    if not listed or listed.group(1).split() != order:
        problems.append(
            f"CMakeLists.txt: FOLIO_LAYERS is {listed.group(1).split() if listed else None}, "
            f"docs/design/layers.md orders {order}")
    for folder in sorted((ROOT / "src/folio").iterdir()):
        if folder.is_dir() and folder.name not in rank:
            problems.append(f"src/folio/{folder.name}/: not a layer of docs/design/layers.md")
    for layer in order:
        for path in layer_files(layer):
            for number, line in enumerate(path.read_text().splitlines(), 1):
                match = re.match(r'\s*#\s*include\s+"folio/([a-z_]+)/', line)
                if not match:
                    continue
                used = match.group(1)
                if used not in rank:
                    problems.append(f"{path.relative_to(ROOT)}:{number}: includes unknown layer "
                                    f"'{used}'")
                elif rank[used] > rank[layer]:
                    problems.append(f"{path.relative_to(ROOT)}:{number}: layer '{layer}' includes "
                                    f"'{used}', which is below it in docs/design/layers.md")
        cmake_file = ROOT / "src/folio" / layer / "CMakeLists.txt"
        if cmake_file.exists():
            for used in re.findall(r"\bfolio_([a-z_]+)\b", cmake_file.read_text()):
                if used in rank and rank[used] > rank[layer]:
                    problems.append(f"{cmake_file.relative_to(ROOT)}: layer '{layer}' links "
                                    f"folio_{used}, which is below it")
    return problems


def check_docs(order):
    problems = []
    for layer in order:
        files = layer_files(layer)
        if not files:
            continue
        headers = [p for p in files if p.suffix in {".h", ".cuh"}]
        doc = ROOT / "docs/design" / f"{layer}.md"
        if not doc.exists():
            problems.append(f"docs/design/{layer}.md: missing (layer '{layer}' has sources)")
            continue
        text = doc.read_text()
        for header in headers:
            if header.name not in text:
                problems.append(f"{doc.relative_to(ROOT)}: does not name "
                                f"{header.relative_to(ROOT / 'src')}")
    return problems


def main():
    if len(sys.argv) != 2 or sys.argv[1] not in ("includes", "docs"):
        print(__doc__)
        return 2
    order = layer_order()
    if not order:
        print("docs/design/layers.md: no layer table found")
        return 1
    problems = check_includes(order) if sys.argv[1] == "includes" else check_docs(order)
    for problem in problems:
        print(problem)
    print(f"check_layers {sys.argv[1]}: {len(problems)} problem(s) in {len(order)} layers")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
