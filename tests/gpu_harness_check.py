"""Runs the evaluation harness on a CUDA device over every bundled replayed candidate and checks
each verdict's status against its replay line. (The two candidates that kill or hang their worker
need the C++ evaluator's process control and are left to tests/test_launch.py on CPU.)

Usage: python tests/gpu_harness_check.py [--device cuda:0] [--json OUT.json]
Exits 1 when a status differs from the expected one or CUDA is not available.
"""

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "gpu"))

import torch  # noqa: E402
from harness import Harness  # noqa: E402

SETTINGS = {"correctness_trials": 5, "warmup": 3, "fast_trials": 20, "full_trials": 100,
            "atol_fp32": 1e-4, "rtol_fp32": 1e-4, "atol_half": 1e-2, "rtol_half": 1e-2}
NEEDS_PROCESS_CONTROL = {"kills_worker", "hangs"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("gpu_harness_check: CUDA is not available", file=sys.stderr)
        return 1
    h = Harness(args.device, 1)
    print(f"device {h.device_name}, torch {torch.__version__}")
    replay_dir = os.path.join(ROOT, "tasks", "replay")
    rows, bad = [], 0
    for name in sorted(os.listdir(replay_dir)):
        with open(os.path.join(replay_dir, name)) as f:
            for i, line in enumerate(l for l in f if l.strip()):
                rec = json.loads(line)
                if rec["label"] in NEEDS_PROCESS_CONTROL:
                    continue
                req = {"sample_id": f"{rec['task_id']}#{i}", "task_id": rec["task_id"],
                       "task_path": os.path.join(ROOT, "tasks", "bundled", rec["task_id"] + ".py"),
                       "action": rec["completion"], "action_space": "forward_body", "mode": "fast",
                       "seed": 42}
                res = h.evaluate(req, SETTINGS)
                ok = res["status"] == rec["expect_status"]
                bad += not ok
                rows.append({"task_id": rec["task_id"], "label": rec["label"], "status": res["status"],
                             "expected": rec["expect_status"], "speedup": res["speedup"],
                             "runtime_ms": res["runtime"]["median_ms"],
                             "ref_runtime_ms": res["ref_runtime"]["median_ms"], "error": res["error"]})
                print(f"{'ok ' if ok else 'BAD'} {rec['task_id']:22} {rec['label']:8} {res['status']:14} "
                      f"speedup {res['speedup']:7.2f}  cand {res['runtime']['median_ms']:.4f} ms  "
                      f"ref {res['ref_runtime']['median_ms']:.4f} ms  {res['error'][:60]}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": h.device_name, "torch": torch.__version__, "rows": rows}, f, indent=1)
    print(f"{len(rows) - bad} passed, {bad} failed")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
