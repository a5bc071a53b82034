#!/usr/bin/env python3
"""The figures of ARCHITECTURE.md that the repository can compute itself.

Prints a markdown block: the size of each crate (lines of Rust in src/, tests/, examples/ and
benches/; the Python package and the CUDA sources too), the largest files, the graph among the
workspace's crates (`cargo metadata`), and whether the rules on what some crates may not pull
in hold (RULES below, checked in `cargo tree -e normal` of each). ARCHITECTURE.md holds the block between the lines
`<!-- facts: begin -->` and `<!-- facts: end -->`.

Usage (from any directory; needs cargo and the dependencies already fetched, as after a build):
  scripts/architecture-facts.py           print the block
  scripts/architecture-facts.py --write   rewrite the block in ARCHITECTURE.md
  scripts/architecture-facts.py --check   exit 1 when the block in ARCHITECTURE.md differs from
                                          what this prints, or when ARCHITECTURE.md names a
                                          path that does not exist (tests/architecture.rs runs
                                          this, so `cargo test` and scripts/test.sh do)

Sizes are rounded (crates to 0.1 k lines, files to 50 lines) so that small edits leave the
block as it is; the check compares exactly what is printed. Cargo is `$CARGO` when set (as
under `cargo test`), else `cargo` on PATH; every cargo call is `--offline --locked` and builds nothing.
"""

import json
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOC = os.path.join(ROOT, "ARCHITECTURE.md")
BEGIN = "<!-- facts: begin -->"
END = "<!-- facts: end -->"
WRITE_CMD = "scripts/architecture-facts.py --write"

# The dependencies whose presence says what a crate can be used without.
HEAVY = ["tokio", "quinn", "rustls", "hyper", "cudarc", "candle-core", "plotters", "pyo3"]
# How many of the largest files are listed.
LARGEST = 10
# What some crates must be usable without (ARCHITECTURE.md, "The crates"): the block says
# whether each rule holds in `cargo tree`, so a broken one changes the block and fails the check.
RULES = [
    ("pushpull-proto", HEAVY, "I/O-free"),
    ("pushpull-codecs", HEAVY, "no sockets, no GPU"),
    ("pushpull-kernels", ["tokio", "quinn", "rustls"], "no network stack"),
    ("pushpull-scheduler", ["pushpull-kernels", "cudarc"], "the codecs, not the device"),
    ("pushpull-server", ["pushpull-kernels", "cudarc"], "the codecs, not the device"),
    ("pushpull-node", ["pushpull-kernels", "cudarc", "candle-core", "plotters"],
     "the scheduler's and server's binaries"),
    ("pushpull-jobs", ["plotters"], "plots are the benchmarks'"),
]
SKIP_DIRS = {"target", "__pycache__", "node_modules"}


def cargo(*args):
    exe = os.environ.get("CARGO", "cargo")
    env = dict(os.environ, LC_ALL="C")
    try:
        out = subprocess.run(
            [exe, *args],
            cwd=ROOT,
            env=env,
            check=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    except subprocess.CalledProcessError as e:
        sys.exit(f"architecture-facts: `cargo {' '.join(args)}` failed:\n{e.stderr}")
    return out.stdout


def git_files():
    """The repository's files as git sees them (tracked, and untracked but not ignored), or
    None outside a git checkout: build outputs, caches and ignored files never count."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT, check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return {os.path.join(ROOT, f) for f in out.decode().split("\0") if f}


GIT_FILES = git_files()


def files_under(folder, exts):
    """Every file below `folder` whose name ends in one of `exts`, sorted: those git sees, or
    outside a git checkout every file but build outputs and hidden folders."""
    found = []
    if not os.path.isdir(folder):
        return found
    if GIT_FILES is not None:
        prefix = os.path.join(os.path.abspath(folder), "")
        return sorted(
            f for f in GIT_FILES
            if f.startswith(prefix) and f.endswith(exts) and os.path.isfile(f)
        )
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        for f in filenames:
            if f.endswith(exts):
                found.append(os.path.join(dirpath, f))
    return sorted(found)


def line_count(path):
    with open(path, "rb") as f:
        data = f.read()
    return data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)


def kilo(n):
    """`n` lines in thousands, to the nearest 0.1 (halves up)."""
    tenths = (n + 50) // 100
    return f"{tenths // 10}.{tenths % 10}"


def fifty(n):
    """`n` to the nearest 50 (halves up)."""
    return (n + 25) // 50 * 50


def rel(path):
    return os.path.relpath(path, ROOT)


def packages():
    meta = json.loads(cargo("metadata", "--offline", "--locked", "--format-version", "1", "--no-deps"))
    members = set(meta["workspace_members"])
    pkgs = [p for p in meta["packages"] if p["id"] in members]
    return sorted(pkgs, key=lambda p: p["name"])


def folder_of(pkg):
    d = rel(os.path.dirname(pkg["manifest_path"]))
    return "." if d == "." else d


def short(name):
    return name[len("pushpull-"):] if name.startswith("pushpull-") else name


def graph(pkgs):
    """Each crate's direct workspace dependencies: normal ones and dev-only ones."""
    names = {p["name"] for p in pkgs}
    normal, dev = {}, {}
    for p in pkgs:
        n, d = set(), set()
        for dep in p["dependencies"]:
            if dep["name"] not in names:
                continue
            if dep["kind"] is None:
                n.add(dep["name"])
            elif dep["kind"] == "dev":
                d.add(dep["name"])
        normal[p["name"]] = sorted(n)
        dev[p["name"]] = sorted(d - n)
    return normal, dev


def layers(normal):
    """A crate's layer: 0 with no workspace dependency, else one above its highest one."""
    memo = {}

    def layer(c, seen=()):
        if c in seen:
            sys.exit(f"architecture-facts: a dependency cycle through {c}")
        if c not in memo:
            memo[c] = 1 + max((layer(d, seen + (c,)) for d in normal[c]), default=-1)
        return memo[c]

    return {c: layer(c) for c in normal}


def tree_names(pkg_name):
    """Every crate in `cargo tree -e normal` of one package (its own features only)."""
    tree = cargo(
        "tree", "--offline", "--locked", "-p", pkg_name, "-e", "normal", "--prefix", "none", "--format", "{p}",
    )
    return {line.split(" ")[0] for line in tree.splitlines() if line.strip()}


def facts():
    pkgs = packages()
    normal, dev = graph(pkgs)
    layer = layers(normal)
    order = sorted(pkgs, key=lambda p: (layer[p["name"]], p["name"]))
    out = []
    w = out.append

    # Sizes.
    w("**Lines of code** (thousands, to the nearest 0.1; `src/` holds the unit tests too):")
    w("")
    w("| crate | folder | src/ | tests/ | examples/, benches/ |")
    w("|---|---|---|---|---|")
    every = []
    total = [0, 0, 0]
    for p in order:
        d = folder_of(p)
        base = os.path.join(ROOT, d)
        counts = []
        for parts in (["src"], ["tests"], ["examples", "benches"]):
            fs = [f for part in parts for f in files_under(os.path.join(base, part), (".rs",))]
            every += fs
            counts.append(sum(line_count(f) for f in fs))
        if d != ".":
            build = os.path.join(base, "build.rs")
            if os.path.isfile(build):
                every.append(build)
                counts[0] += line_count(build)
        total = [a + b for a, b in zip(total, counts)]
        shown = "(root)" if d == "." else f"`{d}/`"
        w(f"| {p['name']} | {shown} | {kilo(counts[0])} | {kilo(counts[1])} | {kilo(counts[2])} |")
    w(f"| all Rust | | {kilo(total[0])} | {kilo(total[1])} | {kilo(total[2])} |")
    py = [files_under(os.path.join(ROOT, "python", d), (".py",))
          for d in ("pushpull", "tests", "examples")]
    every += [f for fs in py for f in fs]
    w("| the Python package (`*.py`) | `python/pushpull/`, `python/tests/`, `python/examples/` | "
      + " | ".join(kilo(sum(line_count(f) for f in fs)) for fs in py) + " |")
    cuda = files_under(os.path.join(ROOT, "kernels", "cuda"), (".cu", ".cuh", ".cpp"))
    every += cuda
    w(f"| the CUDA kernels and the host twin's shim (`*.cu`, `*.cuh`, `*.cpp`) | "
      f"`kernels/cuda/` | {kilo(sum(line_count(f) for f in cuda))} | | |")
    w("")

    # The largest files.
    sized = sorted(((fifty(line_count(f)), rel(f)) for f in every), key=lambda t: (-t[0], t[1]))
    w(f"**The {LARGEST} largest files** of those above (lines, to the nearest 50; ties by name):")
    w("")
    w("| file | lines |")
    w("|---|---|")
    for n, f in sized[:LARGEST]:
        w(f"| `{f}` | {n} |")
    w("")

    # The crate graph.
    w(f"**The crate graph** ({len(pkgs)} crates; `cargo metadata`: direct normal dependencies "
      "among the workspace's crates, `pushpull-` left off; a crate's layer is one above its "
      "highest dependency's):")
    w("")
    w("| layer | crate | depends on |")
    w("|---|---|---|")
    for p in order:
        deps = ", ".join(short(d) for d in normal[p["name"]]) or "(none)"
        w(f"| {layer[p['name']]} | {p['name']} | {deps} |")
    devs = [f"{short(c)} → {', '.join(short(d) for d in dev[c])}"
            for c in sorted(dev, key=lambda c: (layer[c], c)) if dev[c]]
    if devs:
        w("")
        w("Dev-dependencies only (for tests): " + "; ".join(devs) + ".")
    w("")

    # What each crate may not pull in, checked in its tree.
    w("**What a crate may not pull in** (`cargo tree --offline -p CRATE -e normal`: each crate "
      "with its own features, on this platform; a rule is BROKEN when its tree holds a crate it "
      "names):")
    w("")
    names = {p["name"] for p in order}
    trees = {c: tree_names(c) for c, _, _ in RULES if c in names}
    for crate, without, why in RULES:
        found = [c for c in without if c in trees.get(crate, ())]
        verdict = "holds" if crate in trees and not found else (
            "BROKEN: " + (", ".join(found) if found else "no such crate"))
        w(f"- {crate} ({why}): no {', '.join(without)}: **{verdict}**")
    return "\n".join(out) + "\n"


def split_doc(text):
    """(before, block, after) of ARCHITECTURE.md around the marker lines."""
    lines = text.splitlines(keepends=True)
    try:
        b = next(i for i, l in enumerate(lines) if l.strip() == BEGIN)
        e = next(i for i, l in enumerate(lines) if l.strip() == END and i > b)
    except StopIteration:
        sys.exit(f"architecture-facts: ARCHITECTURE.md has no `{BEGIN}` ... `{END}` lines")
    return "".join(lines[: b + 1]), "".join(lines[b + 1 : e]), "".join(lines[e:])


# A path named in ARCHITECTURE.md: in backquotes or a link's target, of folder names and a
# file name, its first part an entry of the repository's top folder.
PATHISH = re.compile(r"`([A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-]*)+)`|\]\(([^)#\s]+)")


def missing_paths(text):
    top = set(os.listdir(ROOT))
    missing = set()
    for m in PATHISH.finditer(text):
        p = m.group(1) or m.group(2)
        if "://" in p or p.startswith("/"):
            continue
        if p.split("/")[0] not in top and "/" in p:
            continue
        if not os.path.exists(os.path.join(ROOT, p)):
            missing.add(p)
    return sorted(missing)


def main(argv):
    mode = argv[1] if len(argv) > 1 else None
    if mode not in (None, "--write", "--check") or len(argv) > 2:
        sys.exit(__doc__)
    block = facts()
    if mode is None:
        sys.stdout.write(block)
        return 0
    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    before, old, after = split_doc(text)
    if mode == "--write":
        if old != block:
            with open(DOC, "w", encoding="utf-8") as f:
                f.write(before + block + after)
            print("architecture-facts: ARCHITECTURE.md's facts block rewritten")
        else:
            print("architecture-facts: ARCHITECTURE.md's facts block is current")
        return 0
    failed = False
    if old != block:
        failed = True
        import difflib

        diff = difflib.unified_diff(
            old.splitlines(keepends=True), block.splitlines(keepends=True),
            "ARCHITECTURE.md", "what the script prints now",
        )
        sys.stderr.write(
            "architecture-facts: ARCHITECTURE.md's facts block is stale; run "
            f"`{WRITE_CMD}` and commit the result. The difference:\n" + "".join(diff)
        )
    gone = missing_paths(text)
    if gone:
        failed = True
        sys.stderr.write(
            "architecture-facts: ARCHITECTURE.md names paths that do not exist (fix the text): "
            + ", ".join(gone) + "\n"
        )
    if failed:
        return 1
    print("architecture-facts: ARCHITECTURE.md's facts block is current and its paths exist")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
