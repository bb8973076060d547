#!/usr/bin/env python3
"""test_check_layout.py - scripts/check_layout.py's CLI rules (4: no circle of modules in
src/cli, 5: the CLI's three layers) on small trees written here, each with one fault that the
rule must name, and the same tree without it that must pass. The ctest unit_check_layout
checks the real tree; this one checks that the checker still sees what it claims to."""
import importlib.util
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "check_layout", os.path.join(HERE, "..", "..", "scripts", "check_layout.py"))
cl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cl)

# A tree in the CLI's shape: a front end, the harness in dist/, a toolbox module.
BASE = {
    "src/core/status.c": "int sph_status_probe(void) { return 0; }\n",
    "src/cli/main.c": '#include "cmd_run.h"\nint main(void) { return sph_cli_run(); }\n',
    "src/cli/cmd_run.h": "int sph_cli_run(void);\n",
    "src/cli/cmd_run.c": ('#include "cmd_run.h"\n#include "dist/run_dist.h"\n#include "tool.h"\n'
                          "int sph_cli_run(void) { return dist_run() + tool_fn(); }\n"),
    "src/cli/dist/run_dist.h": "int dist_run(void);\n",
    "src/cli/dist/run_dist.c": ('#include "run_dist.h"\n#include "tool.h"\n'
                                "int dist_run(void) { return tool_fn(); }\n"),
    "src/cli/tool.h": "int tool_fn(void);\n",
    "src/cli/tool.c": '#include "tool.h"\nint tool_fn(void) { return 1; }\n',
    "src/cli/other.h": "int other_fn(void);\n",
    "src/cli/other.c": '#include "other.h"\nint other_fn(void) { return 2; }\n',
}


def errors_of(files):
    with tempfile.TemporaryDirectory() as root:
        for rel, text in files.items():
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as f:
                f.write(text)
        return cl.check(root, 150, False, False)


def with_change(rel, text):
    files = dict(BASE)
    files[rel] = text
    return files


CASES = [
    # (name, files, a piece of the one message expected; None: no error)
    ("clean", BASE, None),
    ("toolbox names the harness",
     with_change("src/cli/tool.c", '#include "tool.h"\nint dist_run(void);\n'
                 "int tool_fn(void) { return dist_run(); }\n"),
     "tool (toolbox) reaches up to dist/run_dist (dist)"),
    ("toolbox includes the harness",
     with_change("src/cli/tool.c", '#include "tool.h"\n#include "dist/run_dist.h"\n'
                 "int tool_fn(void) { return 1; }\n"),
     "src/cli/tool.c:2 includes dist/run_dist.h"),
    ("harness includes a command",
     with_change("src/cli/dist/run_dist.c", '#include "run_dist.h"\n#include "cmd_run.h"\n'
                 "int dist_run(void) { return 0; }\n"),
     "dist/run_dist (dist) reaches up to cmd_run (front end)"),
    ("harness names a command",
     with_change("src/cli/dist/run_dist.c", '#include "run_dist.h"\nint sph_cli_run(void);\n'
                 "int dist_run(void) { return sph_cli_run(); }\n"),
     "src/cli/dist/run_dist.c names sph_cli_run"),
    ("circle in the toolbox",
     with_change("src/cli/other.c", '#include "other.h"\n#include "tool.h"\n'
                 "int other_fn(void) { return tool_fn(); }\n") | {
         "src/cli/tool.c": '#include "tool.h"\n#include "other.h"\n'
                           "int tool_fn(void) { return other_fn(); }\n"},
     "modules use each other around a circle: other -> tool -> other"),
]

fails = 0
for name, files, expect in CASES:
    errs = errors_of(files)
    if expect is None:
        ok = not errs
    else:
        ok = any(expect in e for e in errs)
    print("%s %s%s" % ("ok  " if ok else "FAIL", name, "" if ok else ": %r" % errs))
    fails += not ok
sys.exit(1 if fails else 0)
