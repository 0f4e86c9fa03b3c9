"""
The learner's path, measured: the lines of project code a reader follows to see a tiny training run (train.py
config/char_hrm.py: 4 iterations, 2 evaluations, a save) and one sampled text (sample.py). It records every project
function that runs (sys.setprofile, threads too) and counts, per file, its module-level lines (outside any function
body) plus the whole span of each function that ran (decorators and docstrings included; a decorated function's
code object starts at its decorator, so it is looked up there too); blank lines are free.

    python tools/learner_path.py [--json]      # train: N lines in F files (model.py M), sample: ...
"""

import ast
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRACER = r'''
import json, os, runpy, sys, threading
root, out, seen = sys.argv[1], sys.argv[2], set()
def prof(frame, event, arg):
    f = os.path.abspath(frame.f_code.co_filename)
    if event == "call" and f.startswith(root + os.sep) and not f.startswith((root + "/tests/", root + "/config/")):
        seen.add((os.path.relpath(f, root), frame.f_code.co_firstlineno))
sys.argv = sys.argv[3:]
sys.setprofile(prof), threading.setprofile(prof)
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit as e:
    code = e.code
else:
    code = 0
sys.setprofile(None)
json.dump({"seen": sorted(seen), "code": code}, open(out, "w"))
'''


def lines_run(seen):
    """{file: lines} for the (file, first line of a code object) pairs that ran."""
    per = {}
    for rel in {f for f, _ in seen}:
        path = os.path.join(ROOT, rel)
        if not rel.endswith(".py") or not os.path.isfile(path):
            continue
        src, firsts = open(path).read(), {first for f, first in seen if f == rel}
        spans, inside = {}, set()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                start = min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])
                spans[start] = spans[node.lineno] = (start, node.end_lineno)   # co_firstlineno: the decorator
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inside.update(range(node.lineno + 1, node.end_lineno + 1))
        text = src.splitlines()
        counted = {i for i in range(1, len(text) + 1) if i not in inside}   # module level (its "<module>" ran)
        for first in firsts & spans.keys():
            counted.update(range(spans[first][0], spans[first][1] + 1))
        per[rel] = sum(1 for i in counted if text[i - 1].strip())
    return dict(sorted(per.items()))


def run(script, *args):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "seen.json")
        p = subprocess.run([sys.executable, "-c", TRACER, ROOT, out, script, *args], cwd=ROOT, capture_output=True,
                           text=True, timeout=900, env=dict(os.environ, PYTHONPATH=ROOT))
        res = json.load(open(out)) if os.path.exists(out) else {"code": p.returncode}
        if res["code"] not in (0, None):
            sys.exit(f"learner_path.py: error: {script} did not run (exit {res['code']}): {p.stderr.strip()[-300:]}")
        return lines_run([tuple(x) for x in res["seen"]])


def measure():
    with tempfile.TemporaryDirectory() as tmp:
        if not os.path.exists(os.path.join(ROOT, "data", "shakespeare_char", "meta.json")):
            subprocess.run([sys.executable, "prepare.py", "--dataset=shakespeare_char"], cwd=ROOT, check=True,
                           capture_output=True)
        tiny = ["--device=cpu", "--n_embd=32", "--n_head=4", "--batch_size=2", "--block_size=32", "--eval_iters=1",
                "--max_iters=4", "--eval_interval=2", "--log_interval=1", "--compile=False", f"--out_dir={tmp}/r"]
        paths = {"train": run("train.py", "config/char_hrm.py", *tiny),
                 "sample": run("sample.py", f"--out_dir={tmp}/r", "--num_samples=1", "--max_new_tokens=8",
                               "--start=ROMEO:")}
    return {k: {"lines": sum(v.values()), "files": len(v), "model.py": v.get("model.py", 0), "per file": v}
            for k, v in paths.items()}


if __name__ == "__main__":
    res = measure()
    lines = [f"{k}: {r['lines']} lines in {r['files']} files (model.py {r['model.py']}): {r['per file']}"
             for k, r in res.items()]
    print(json.dumps(res, indent=1) if "--json" in sys.argv else "\n".join(lines))
