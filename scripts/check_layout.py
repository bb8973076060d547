#!/usr/bin/env python3
"""check_layout.py - the structure rules of src/ (issue 27), checked from the code as text.

  1. No function in src/ is longer than --max-lines (150) lines, signature to closing brace.
  2. The folders are layered (LAYERS below): core at the bottom, then the services over it
     (comm, pack), the head (and spans), the losses (policy, distill), and on top cuda, cli and
     python/csrc. A file may include, and may name a function or object defined in, its own
     folder or a folder of a lower layer only: no folder reaches up, so the folder graph has no
     circle. Exceptions are listed in ALLOWED with their reason.
  3. No file in src/core names a symbol of src/head or src/policy (a function, type, macro or
     enum constant declared or defined there and not declared by core itself).
  4. No circle inside src/cli: modules (a .c and its .h, named by their path below src/cli:
     `npy`, `dist/run_dist_main`) that include each other's headers or name each other's
     functions and objects, directly or around a loop.
  5. src/cli stands in three layers of its own (CLI_LAYERS): the front ends (main.c and the
     commands, cmd_*.c) over the MPI verification harness (src/cli/dist/) over the toolbox and
     the one-process runners (every other module). A module uses its own layer or a lower one
     only: the harness never reaches back into a command, the toolbox never into the harness.

Prints the longest functions and the folder graph; exits 1 listing every broken rule. Reads the
files only (comments, strings and preprocessor lines are stripped before the braces are
counted). Run from anywhere: `python3 scripts/check_layout.py` (`--list` prints every
function's length). `make test` runs it as the ctest `unit_check_layout`.
"""
import argparse
import os
import re
import sys

LAYERS = {
    "core": 0,
    "comm": 1, "pack": 1,
    "spans": 2,
    "head": 3,
    "policy": 4, "distill": 4,
    "cuda": 5, "cli": 5, "python": 5,
}
# (from folder, to folder, symbol or include): why it may reach up
REGISTRY = ("core/registry.c hands out the device tables (core/backend.h): the host device's "
            "(src/head/host_device.c) and, behind SPH_HAVE_CUDA, CUDA's; the one place that "
            "names them, so that the rest of core asks the registry")
ALLOWED = {
    ("core", "cuda", "sph_cuda_device_ops"): REGISTRY,
    ("core", "head", "sph_host_device_ops"): REGISTRY,
}
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")
IDENT = re.compile(r"[A-Za-z_]\w*")
KEYWORDS = set("""if else for while do switch case return sizeof typedef struct union enum static
inline extern const volatile void char short int long float double signed unsigned auto register
goto break continue default restrict _Bool bool true false NULL template typename class public
private protected namespace using new delete operator this virtual constexpr noexcept decltype
__global__ __device__ __host__ __forceinline__ __launch_bounds__ __restrict__ asm""".split())


def strip_code(text):
    """Comments, string and char literals blanked (newlines kept); preprocessor lines blanked
    (their continuations too). Returns (code, include lines [(lineno, path, angle)])."""
    out, incs = [], []
    i, n, line = 0, len(text), 1
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if at_line_start and c == "#":
            j = i
            while j < n:
                k = text.find("\n", j)
                if k < 0:
                    k = n
                if k > j and text[k - 1] == "\\":
                    j = k + 1
                    continue
                break
            directive = text[i:k]
            m = re.match(r'#\s*include\s*([<"])([^>"]+)[>"]', directive)
            if m:
                incs.append((line, m.group(2), m.group(1) == "<"))
            nl = directive.count("\n")
            out.append("\n" * nl)
            line += nl
            i = k
            continue
        at_line_start = False
        if c == "\n":
            out.append(c)
            line += 1
            at_line_start = True
            i += 1
        elif text.startswith("//", i):
            k = text.find("\n", i)
            i = n if k < 0 else k
        elif text.startswith("/*", i):
            k = text.find("*/", i + 2)
            k = n if k < 0 else k + 2
            nl = text.count("\n", i, k)
            out.append("\n" * nl if nl else " ")
            line += nl
            i = k
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            nl = text.count("\n", i, j)
            out.append('""' if c == '"' else "''")
            out.append("\n" * nl)
            line += nl
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out), incs


def top_level(code):
    """Yields (kind, name, first line, last line, text) of the file's top-level items:
    'func' definitions, 'decl' statements (prototypes, objects, typedefs)."""
    depth, start, stmt_start = 0, 0, None
    opened = []  # per '{': (is transparent (extern "C" / namespace), item info)
    line = 1
    i = 0
    n = len(code)
    while i < n:
        c = code[i]
        if c == "\n":
            line += 1
        elif depth == 0 and stmt_start is None and not c.isspace():
            stmt_start = (i, line)
        if c == "{":
            if depth == 0:
                text = code[stmt_start[0]:i] if stmt_start else ""
                flat = " ".join(text.split())
                if re.fullmatch(r'(extern\s*""|namespace(\s+\w+)?)', flat):
                    stmt_start = None
                    opened.append(("transparent", None))
                    i += 1
                    continue
                opened.append(("item", (text, stmt_start[1] if stmt_start else line)))
            else:
                opened.append(("inner", None))
            depth += 1
        elif c == "}":
            kind, info = opened.pop() if opened else ("inner", None)
            if kind == "transparent":
                stmt_start = None
            else:
                depth -= 1
                if depth == 0 and kind == "item":
                    text, first = info
                    fn = func_name(text)
                    if fn:
                        yield ("func", fn, first, line, text)
                        stmt_start = None
                    # else: a struct / initializer: the statement goes on to its ';'
        elif c == ";" and depth == 0:
            if stmt_start:
                yield ("decl", None, stmt_start[1], line, code[stmt_start[0]:i])
            stmt_start = None
        i += 1


def func_name(text):
    """The name of the function whose header is text, or None (struct, initializer, ...)."""
    t = text.rstrip()
    t = re.sub(r"\b(const|noexcept|override)\s*$", "", t).rstrip()
    if not t.endswith(")"):
        return None
    # drop the parameter list (the last top-level parenthesized group)
    depth = 0
    for k in range(len(t) - 1, -1, -1):
        if t[k] == ")":
            depth += 1
        elif t[k] == "(":
            depth -= 1
            if depth == 0:
                head = t[:k]
                break
    else:
        return None
    if "=" in re.sub(r"\([^()]*\)", "", head):
        return None
    m = re.search(r"([A-Za-z_]\w*)\s*$", head)
    if not m or m.group(1) in KEYWORDS:
        return None
    return m.group(1)


def decl_names(text):
    """Names a top-level declaration introduces: typedef names, struct/enum tags, enum
    constants, function prototypes, objects."""
    names = set()
    flat = " ".join(text.split())
    for m in re.finditer(r"\b(?:struct|union|enum)\s+([A-Za-z_]\w*)", flat):
        names.add(m.group(1))
    if re.match(r"(typedef\b)", flat):
        m = re.search(r"([A-Za-z_]\w*)\s*(\[[^\]]*\])?\s*$", flat)
        if m:
            names.add(m.group(1))
        m = re.match(r"typedef[^{]*?\(\s*\*\s*([A-Za-z_]\w*)\s*\)", flat)
        if m and "{" not in flat:  # a function pointer typedef
            names.add(m.group(1))
    body = re.search(r"\benum\b[^{]*\{(.*)\}", flat)
    if body:
        for part in body.group(1).split(","):
            m = re.match(r"\s*([A-Za-z_]\w*)", part)
            if m:
                names.add(m.group(1))
    if not flat.startswith("typedef"):
        m = re.match(r"(?:extern\s*(?:\"\")?\s*)?[^(=]*?\b([A-Za-z_]\w*)\s*\(", flat)
        if m and "{" not in flat.split("(")[0] and m.group(1) not in KEYWORDS:
            names.add(m.group(1))  # a prototype
    return names


def is_static(text):
    return re.search(r"^\s*(template\s*<[^>]*>\s*)?(static|namespace)\b", text) is not None


def object_def(text):
    """A non-static top-level object definition's name (`T name = ...` / `T name;`)."""
    flat = " ".join(text.split())
    if is_static(flat) or flat.startswith(("typedef", "extern ")) and "=" not in flat:
        return None
    m = re.match(r"(?:extern\s*(?:\"\")?\s*)?(?:const\s+)?[A-Za-z_]\w*[\s*]+(?:const\s+)?"
                 r"([A-Za-z_]\w*)\s*(\[[^\]]*\])?\s*=", flat)
    return m.group(1) if m else None


class Tree:
    def __init__(self, root):
        self.root = root
        self.files = {}  # rel path -> (folder, code, includes)
        for base, folder_of in (("src", None), ("python/csrc", "python")):
            top = os.path.join(root, base)
            for dirpath, _, names in os.walk(top):
                for nm in sorted(names):
                    if not nm.endswith(SOURCE_EXT):
                        continue
                    path = os.path.join(dirpath, nm)
                    rel = os.path.relpath(path, root)
                    folder = folder_of or os.path.relpath(path, top).split(os.sep)[0]
                    if folder == nm:
                        folder = "."
                    with open(path, encoding="utf-8", errors="replace") as f:
                        code, incs = strip_code(f.read())
                    self.files[rel] = (folder, code, incs)


def check(root, max_lines, list_all, show):
    t = Tree(root)
    errors = []
    funcs = []
    defs = {}      # symbol -> folder (non-static functions and objects)
    defs_file = {}  # symbol -> the file that defines it
    declared = {}  # folder -> names declared or defined at top level
    for rel, (folder, code, _) in t.files.items():
        header = rel.endswith((".h", ".cuh"))
        names = declared.setdefault(folder, set())
        for kind, name, first, last, text in top_level(code):
            if kind == "func":
                funcs.append((last - first + 1, rel, name, first))
                if not is_static(text):
                    defs.setdefault(name, folder)
                    defs_file.setdefault(name, rel)
                    names.add(name)
                elif header:
                    names.add(name)  # a header's inline function
            else:
                if header:
                    names |= decl_names(text)
                obj = object_def(text)
                if obj:
                    names.add(obj)
                    defs.setdefault(obj, folder)
                    defs_file.setdefault(obj, rel)
        if header:
            with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as f:
                for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+([A-Za-z_]\w*)", f.read(), re.M):
                    names.add(m.group(1))

    # 1. function length
    funcs.sort(reverse=True)
    for length, rel, name, first in funcs:
        if length > max_lines and rel.startswith("src" + os.sep):
            errors.append("%s:%d: %s is %d lines (at most %d)" % (rel, first, name, length,
                                                                  max_lines))
    if show:
        print("longest functions:")
        for length, rel, name, first in (funcs if list_all else funcs[:15]):
            print("  %5d  %s:%d %s" % (length, rel, first, name))

    # 2. layering: includes and named symbols
    for folder in sorted({f for f, _, _ in t.files.values()}):
        if folder not in LAYERS and folder != ".":
            errors.append("src/%s: a folder without a layer: add it to LAYERS in "
                          "scripts/check_layout.py (where it sits decides what it may use)"
                          % folder)
    graph = {}
    for rel, (folder, code, incs) in t.files.items():
        for line, inc, angle in incs:
            if angle or "/" not in inc:
                continue
            to = inc.split("/")[0]
            if to == folder or not os.path.isdir(os.path.join(root, "src", to)):
                continue
            graph.setdefault((folder, to), []).append("%s:%d includes %s" % (rel, line, inc))
        used = set(IDENT.findall(code))
        for sym in sorted(used):
            to = defs.get(sym)
            if to and to != folder:
                graph.setdefault((folder, to), []).append("%s names %s" % (rel, sym))
    for (a, b), why in sorted(graph.items()):
        if a not in LAYERS or b not in LAYERS or LAYERS[b] < LAYERS[a]:
            continue
        for w in why:
            sym = w.split()[-1]
            if (a, b, sym) in ALLOWED:
                continue
            errors.append("%s -> %s reaches up (or across) the layers: %s" % (a, b, w))
    if show:
        print("folder graph (includes and named symbols):")
        for (a, b), why in sorted(graph.items()):
            print("  %-7s -> %-7s %4d" % (a, b, len(why)))

    # 3. core names no head / policy symbol
    upper = set()
    for folder in ("head", "policy"):
        upper |= declared.get(folder, set())
    upper -= declared.get("core", set())
    for rel, (folder, code, _) in t.files.items():
        if folder != "core":
            continue
        for ln, text in enumerate(code.split("\n"), 1):
            for sym in set(IDENT.findall(text)) & upper:
                errors.append("%s:%d names %s, a symbol of src/head or src/policy" % (rel, ln,
                                                                                    sym))

    # 4. no circle inside src/cli (modules: a file's path below src/cli without its ending),
    # by includes and by named symbols; 5. the CLI's own layers
    cli = {}
    why = {}
    cli_root = os.path.join(root, "src", "cli")
    module = lambda path: os.path.splitext(os.path.relpath(os.path.join(root, path),
                                                           cli_root))[0].replace(os.sep, "/")
    for rel, (folder, code, incs) in t.files.items():
        if folder != "cli":
            continue
        mod = module(rel)
        # a source file's uses (a header's prototypes are its interface: the includes cover it)
        for sym in sorted(set(IDENT.findall(code))) if rel.endswith(".c") else ():
            where = defs_file.get(sym)
            if where and t.files[where][0] == "cli" and module(where) != mod:
                cli.setdefault(mod, set()).add(module(where))
                why.setdefault((mod, module(where)), "%s names %s" % (rel, sym))
        for line, inc, angle in incs:
            if angle:
                continue
            # as the compiler finds it: beside the file, then src/cli (the CLI's include
            # path), then src
            for base in (os.path.dirname(os.path.join(root, rel)), cli_root,
                         os.path.join(root, "src")):
                path = os.path.normpath(os.path.join(base, inc))
                if os.path.exists(path):
                    break
            else:
                continue
            if os.path.commonpath([path, cli_root]) != cli_root:
                continue
            tmod = module(os.path.relpath(path, root))
            if tmod != mod:
                cli.setdefault(mod, set()).add(tmod)
                why.setdefault((mod, tmod), "%s:%d includes %s" % (rel, line, inc))
    for cycle in cycles(cli):
        errors.append("src/cli: modules use each other around a circle: %s" %
                      " -> ".join(cycle + [cycle[0]]))
    for a in sorted(cli):
        for b in sorted(cli[a]):
            if cli_layer(b) > cli_layer(a):
                errors.append("src/cli: %s (%s) reaches up to %s (%s): %s" % (
                    a, CLI_LAYER_NAMES[cli_layer(a)], b, CLI_LAYER_NAMES[cli_layer(b)],
                    why[(a, b)]))
    if show:
        print("src/cli layers (modules that use a lower layer):")
        for k in sorted(CLI_LAYER_NAMES, reverse=True):
            mods = sorted(m for m in cli if cli_layer(m) == k)
            print("  %d %-9s %s" % (k, CLI_LAYER_NAMES[k], " ".join(mods)))
    return errors


# The layers inside src/cli (rule 5): the front ends over the MPI verification harness over
# the toolbox and the one-process runners.
CLI_LAYER_NAMES = {0: "toolbox", 1: "dist", 2: "front end"}


def cli_layer(mod):
    if mod == "main" or mod.startswith("cmd_"):
        return 2
    if mod.startswith("dist/"):
        return 1
    return 0


def cycles(graph):
    """The strongly connected components of more than one node (Tarjan), each as a list."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(__file__), ".."),
                    help="the checkout (default: this script's parent folder)")
    ap.add_argument("--max-lines", type=int, default=150)
    ap.add_argument("--list", action="store_true", help="print every function's length")
    ap.add_argument("--quiet", action="store_true", help="print the broken rules only")
    a = ap.parse_args()
    errors = check(os.path.abspath(a.root), a.max_lines, a.list, not a.quiet)
    for e in errors:
        print("check_layout: " + e)
    print("check_layout: %s" % ("%d broken rule(s)" % len(errors) if errors else "ok"))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
