"""The embedded default end to end (issue 8's target: `launch configs/local.toml` done in at most 10
minutes on 2 cores): runs it as a user does into a fresh folder and prints one JSON object with
the wall time, the time of each arm, rl's train fast_1 at the first and last step, its held-out
fast_1 per version, and the compared arms' figures from comparison.json.

    scripts/python bench/local_run.py [--launch build/launch] [--config configs/local.toml]
"""
import argparse
import json
import os
import re
import sqlite3
import subprocess
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def summary(run_dir):
    db = sqlite3.connect(os.path.join(run_dir, "store.sqlite"))
    s = json.loads(db.execute("SELECT summary_json FROM runs").fetchone()[0])
    db.close()
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--launch", default=os.path.join(ROOT, "build", "launch"))
    ap.add_argument("--config", default=os.path.join(ROOT, "configs", "local.toml"))
    a = ap.parse_args()
    root = os.path.join(tempfile.mkdtemp(prefix="kernelrl-local-bench-"), "run")
    t0 = time.monotonic()
    p = subprocess.run([a.launch, a.config, "--run-dir", root], capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit("launch failed (%d):\n%s" % (p.returncode, p.stderr[-3000:]))
    out = {"config": os.path.relpath(a.config, ROOT), "wall_s": round(wall, 1), "cores": os.cpu_count(), "arms": {}}
    for arm in re.findall(r"^arm (\S+) \(", p.stdout, flags=re.M):
        s = summary(os.path.join(root, arm))
        x = {"wall_s": round(s["wall_s"], 1), "samples": s["samples"], "fast_1": round(s["fast_1"], 3)}
        if s.get("steps"):
            x["step_fast_1"] = [round(st["fast_1"], 3) for st in s["steps"]]
        if s.get("eval"):
            x["held_out_fast_1"] = {str(e["policy_version"]): round(e["fast_1"], 3) for e in s["eval"]}
        out["arms"][arm] = x
    with open(os.path.join(root, "comparison.json")) as f:
        c = json.load(f)
    out["compared"] = {os.path.basename(r["run_dir"]): {"score": r["score"], "equivalent_k": r["equivalent_k"]}
                       for r in c["runs"]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
