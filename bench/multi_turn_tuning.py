#!/usr/bin/env python3
"""Multi-turn RL on the embedded policy, on CPU (issue 56, item 1): does training lift the second
turn? For each seed: the base policy's 2-turn evaluation, a 2-turn train run, then the last
checkpoint's 2-turn evaluation, all on tests/e2e/test_local.py's TURNS_CONFIG (the test's recipe:
policies/local-turns, GRPO on the last turn, turn_progress 2, failure_reward -1, its 8 tasks, all 8 in
every step x 8 episodes, 16 episodes a task in the evaluations). Printed per turn, before and after: format
errors, the second turn's repairs (of the samples after a format error, how many are none),
correct, fast_1 (over every sample, as `launch analyze`'s table by turn counts it), the best so far,
the mean reward, the distinct completions a task, and how often a second turn after a correct
but slow first answer is faster; the same over the train run's own samples, its first and last
quarter of steps (train_first, train_last); and turn 2's repairs and fast_1 as the test counts
and asserts them (test_local.second_turn_lifts).
--set SECTION.KEY=VALUE changes the train run's config (and the evaluations' where it applies),
e.g. --set learner.turn_gamma=0 --set learner.turn_progress=1.

--keep DIR keeps the runs (DIR/before-SEED, train-SEED, after-SEED) for `launch analyze` and
`launch export`, e.g. the train run's per-step figures.

  scripts/python bench/multi_turn_tuning.py [--seeds 0,1,2] [--steps 8] [--set ...] [--json FILE] [--keep DIR]
"""
import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "e2e"))
from test_local import TURNS_CONFIG, second_turn_lifts, turn_counts, turns_values  # noqa: E402  (the test's)

LAUNCH = os.environ.get("KERNELRL_LAUNCH", os.path.join(ROOT, "build", "launch"))


def with_settings(text, settings):
    """TURNS_CONFIG with each SECTION.KEY=VALUE set (replaced in its section, or added to it)."""
    lines = text.split("\n")
    for item in settings:
        where, value = item.split("=", 1)
        section, key = where.split(".", 1)
        start = lines.index(f"[{section}]")
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("[")), len(lines))
        at = next((i for i in range(start + 1, end) if lines[i].split("=")[0].strip() == key), None)
        if at is None:
            lines.insert(start + 1, f"{key} = {value}")
        else:
            lines[at] = f"{key} = {value}"
    return "\n".join(lines)


def figures(samples):
    by = {s["sample_id"]: s for s in samples}

    def best(s):  # the best speedup of the episode so far (0: nothing correct yet)
        own = s["speedup"] if s["status"] == "ok" else 0.0
        return max(own, best(by[s["parent_id"]])) if s["parent_id"] else own
    out = {}
    counts = turn_counts(samples)  # samples, format errors, after a format error, repaired
    for t in sorted(counts):
        mine = [s for s in samples if s["turn"] == t]
        n = len(mine)
        c = counts[t]
        out[t] = {"samples": c["samples"], "format_errors": c["format_errors"],
                  "after_format_error": c["after_format_error"], "repaired": c["format_fixed"],
                  "correct": sum(s["status"] == "ok" for s in mine),
                  "fast_1": sum(s["status"] == "ok" and s["speedup"] > 1 for s in mine) / n,
                  "best_fast_1": sum(best(s) > 1 for s in mine) / n,
                  "mean_reward": sum(s["reward"] for s in mine) / n,
                  "distinct_a_task": len({(s["task_id"], s["completion"]) for s in mine})
                  / len({s["task_id"] for s in mine})}
        slow = [s for s in mine if s["parent_id"] and by[s["parent_id"]]["status"] == "ok"
                and by[s["parent_id"]]["speedup"] <= 1]
        if slow:
            out[t]["after_slow_correct"] = len(slow)
            out[t]["faster_after_slow_correct"] = sum(s["status"] == "ok" and s["speedup"] > 1 for s in slow)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--set", action="append", default=[], help="SECTION.KEY=VALUE (TOML value), repeatable")
    ap.add_argument("--json", default="")
    ap.add_argument("--keep", default="", help="a folder to keep the runs in (default: a temporary one, removed)")
    args = ap.parse_args()
    if any(s.startswith("learner.steps=") for s in args.set):
        ap.error("give the steps with --steps (the evaluation after reads that checkpoint)")
    report = {"date": time.strftime("%Y-%m-%d"), "steps": args.steps, "set": args.set, "seeds": {}}
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
        taken = [n for n in os.listdir(args.keep) if n.split("-")[0] in ("before", "train", "after")]
        if taken:
            ap.error(f"--keep {args.keep} already holds runs ({', '.join(sorted(taken)[:3])}...): give an empty folder")
    with (contextlib.nullcontext(args.keep) if args.keep else
          tempfile.TemporaryDirectory(prefix="kernelrl-turn-tuning-")) as tmp:
        for seed in [int(s) for s in args.seeds.split(",")]:
            def run(name, mode, adapter=""):
                cfg = os.path.join(tmp, f"{name}-{seed}.toml")
                with open(cfg, "w") as f:
                    f.write(with_settings(TURNS_CONFIG % turns_values(seed, args.steps, mode, adapter), args.set))
                d = os.path.join(tmp, f"{name}-{seed}")
                t0 = time.monotonic()
                p = subprocess.run([LAUNCH, cfg, "--run-dir", d], capture_output=True, text=True)
                if p.returncode != 0:
                    sys.exit(f"{name} (seed {seed}) failed ({p.returncode}):\n{p.stderr[-3000:]}")
                wall = time.monotonic() - t0
                out = subprocess.run([LAUNCH, "export", d, "--jsonl"], capture_output=True, text=True, check=True)
                return d, [json.loads(line) for line in out.stdout.splitlines()], wall
            _, before, w0 = run("before", "eval")
            train, trained, w1 = run("train", "train")
            _, after, w2 = run("after", "eval", os.path.join(train, "checkpoints", f"step-{args.steps}"))
            row = {"before": figures(before), "after": figures(after), "wall_s": [w0, w1, w2]}
            # The train run's own samples, its first and last quarter of steps (on-policy; with the
            # test's tasks every step draws all eight, with --set tasks.split=... the steps' tasks differ).
            quarter = max(1, args.steps // 4)
            row["train_first"] = figures([x for x in trained if x["step"] < quarter])
            row["train_last"] = figures([x for x in trained if x["step"] >= args.steps - quarter])
            early, late, fast = second_turn_lifts(before, trained, after, args.steps)
            row["as_the_test_counts"] = {"repaired_early": early, "repaired_late": late, "fast_1_one_reference": fast}
            report["seeds"][seed] = row
            for when in ("before", "after", "train_first", "train_last"):
                print(f"seed {seed} {when:11}: " + " | ".join(
                    f"turn {t}: format errors {x['format_errors']}/{x['samples']}"
                    + (f", repaired {x['repaired']}/{x['after_format_error']}" if t > 1 else "")
                    + f", correct {x['correct']}, fast_1 {x['fast_1']:.3f}, best so far {x['best_fast_1']:.3f}, "
                    f"mean reward {x['mean_reward']:.2f}, {x['distinct_a_task']:.2f} distinct a task"
                    + (f", faster after a slow correct one {x['faster_after_slow_correct']}/{x['after_slow_correct']}"
                       if "after_slow_correct" in x else "") for t, x in row[when].items()), flush=True)
            print(f"seed {seed} as the test counts: turn 2 repaired {early[0]}/{early[1]} -> {late[0]}/{late[1]}, "
                  f"fast_1 against one reference {fast[0]:.3f} -> {fast[1]:.3f}", flush=True)
            print(f"seed {seed}: {w0:.0f} s + {w1:.0f} s + {w2:.0f} s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
