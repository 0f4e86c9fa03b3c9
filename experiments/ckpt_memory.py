"""
Peak host memory per rank of an FSDP run's checkpoint save and resume, on the CPU with gloo (docs/MEMORY.md):

    python experiments/ckpt_memory.py                       # this checkout
    python experiments/ckpt_memory.py --code=/path/to/other/checkout --label=before

Three train.py runs on 2 ranks of a ~140M-parameter HRM (d=1536) on the character data: "start" builds the model and
evaluates it, "save" trains 1 iteration and saves (ckpt.pt and the resume state), "resume" loads that state and
evaluates. Each rank samples its RssAnon (the heap, not file pages the kernel can drop, such as a memory-mapped
checkpoint) every 2 ms; one markdown row per phase and rank.
"""

import argparse
import json
import os
import runpy
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIZE = ["config/char_hrm.py", "--n_embd=1536", "--n_head=12", "--block_size=64", "--batch_size=1",
        "--gradient_accumulation_steps=2", "--eval_iters=1", "--log_interval=1", "--device=cpu", "--dtype=float32"]


def rss_anon():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("RssAnon:"))


def worker(out):
    """A torchrun rank: train.py in this process, with a thread keeping the peak RssAnon; written at exit."""
    peak = [0]

    def sample():
        while True:
            peak[0] = max(peak[0], rss_anon())
            time.sleep(0.002)
    threading.Thread(target=sample, daemon=True).start()
    try:
        sys.argv = ["train.py"] + sys.argv[1:]
        runpy.run_path(os.path.join(os.getcwd(), "train.py"), run_name="__main__")
    finally:
        peak[0] = max(peak[0], rss_anon())
        with open(f"{out}.{os.environ['RANK']}", "w") as f:
            json.dump(peak[0], f)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--code", default=HERE, help="the checkout whose train.py runs")
    ap.add_argument("--label", default="this checkout", help="the row label")
    ap.add_argument("--data_dir", default=os.path.join(HERE, "data"), help="where shakespeare_char is")
    args = ap.parse_args()
    if not os.path.isfile(os.path.join(args.data_dir, "shakespeare_char", "train.bin")):   # one line, not 2 tracebacks
        raise UserError(f"no {args.data_dir}/shakespeare_char; run `python prepare.py --dataset=shakespeare_char` first")
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = os.path.join(tmp, "run")
        phases = {"start": ["--eval_only=True", f"--out_dir={out_dir}-start"],   # the model built, one evaluation
                  "save": ["--max_iters=1", "--eval_interval=1"],
                  "resume": ["--max_iters=1", "--init_from=resume", "--eval_only=True"]}
        for phase, extra in phases.items():
            mark = os.path.join(tmp, phase)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", __file__, *SIZE,
                   "--fsdp=True", f"--data_dir={args.data_dir}", f"--out_dir={out_dir}", *extra]
            env = dict(os.environ, CKPT_MEM_OUT=mark, OMP_NUM_THREADS="1", PYTHONPATH=args.code)
            p = subprocess.run(cmd, cwd=args.code, env=env, capture_output=True, text=True)
            if p.returncode:   # stop with the run's own exit status (a signal n: 128 + n)
                raise UserError(f"{phase} failed:\n{p.stderr[-3000:]}",
                                p.returncode if p.returncode > 0 else 128 - p.returncode)
            if phase == "start":
                params = next(l for l in p.stdout.splitlines() if "parameters" in l).split(":")[1].split("parameters")[0]
            for rank in (0, 1):
                gb = json.load(open(f"{mark}.{rank}")) / 1e9
                print(f"| {args.label} | {params.strip()} | {phase} | {rank} | {gb:.2f} |", flush=True)
        print(f"resume state on disk: {sorted(os.listdir(out_dir))}", flush=True)


if __name__ == "__main__":
    if "RANK" in os.environ and "CKPT_MEM_OUT" in os.environ:
        worker(os.environ["CKPT_MEM_OUT"])
    else:   # this checkout's modules only here: a rank (above) must import --code's, for the train.py it runs
        import runner  # noqa: F401  (this checkout's root on sys.path, for hrmlm)
        from hrmlm.common import UserError
        from hrmlm.signals import main as entry_point
        entry_point(main)
