"""The data-parallel learner against one rank, on the same groups at a real model's shape: the
learner's engine as `launch` makes it from `[learner] devices` (tests/e2e/policy_probe
engine-step), once on one device and once over several (c10d NCCL on GPUs), for each dtype.
Reports the adapters' difference after the first step and after the last: ||a - b|| / ||b|| over
all LoRA tensors (what the check holds to: 1e-5 in f32, 1e-3 in bf16), beside the largest
elementwise difference (max |a - b| / max |b|) and the difference relative to what the steps
changed (||a - b|| / ||b - b0||). AdamW divides each gradient element by its own running scale, so
an element whose gradient is as small as the summation-order noise moves by a full step either
way: the elementwise figures show that, the norm does not hide a real disagreement. The one-rank
run is made twice: the second shows how far one GPU is from itself (its kernels' own
nondeterminism) on the same figures. Also the step time of each (the median wall time of the
steps after the first).

    scripts/gpu-check --two-gpus                                        (on a two-GPU machine)
    scripts/python bench/dp_learner.py --probe build/tests/policy_probe --size tiny \\
        --one cpu --many cpu,cpu --dtypes f32                           (anywhere, small)
"""
import argparse
import json
import os
import statistics
import string
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def groups(n, g, prompt, completion, vocab, seed):
    """n groups of g samples: a prompt of about `prompt` tokens (random letters: the benchmark
    tokenizer has a token for each), `completion` random token ids with logprobs near -2, and
    rewards that differ within each group (none is skipped)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        text = "".join(rng.choice(list(string.ascii_lowercase), prompt))
        out.append([{"prompt": text, "token_ids": [int(t) for t in rng.integers(0, vocab, completion)],
                     "logprobs": [float(x) for x in -2.0 + 0.1 * rng.standard_normal(completion)],
                     "reward": float(r)} for r in rng.random(g)])
    return out


def run(probe, model, data, devices, dtype, steps, lr, minibatch, out):
    p = subprocess.run([probe, "engine-step", "--model", model, "--groups", data, "--out", out, "--devices", devices,
                        "--dtype", dtype, "--steps", str(steps), "--lr", str(lr), "--minibatch", str(minibatch),
                        "--each", "1"],
                       capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise RuntimeError("engine-step on %s (%s) failed:\n%s" % (devices, dtype, p.stderr[-3000:]))
    with open(os.path.join(out, "report.json")) as f:
        return json.load(f), p.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--probe", default=os.path.join(ROOT, "build", "tests", "policy_probe"))
    ap.add_argument("--model", help="a model directory (else one of --size is made with random weights)")
    ap.add_argument("--size", default="1.5b", help="with no --model: bench/policy_throughput.py's sizes")
    ap.add_argument("--models", default="/tmp/models")
    ap.add_argument("--one", default="cuda:0", help="the one-rank learner's device")
    ap.add_argument("--many", default="cuda:0,cuda:1", help="the data-parallel ranks' devices")
    ap.add_argument("--dtypes", default="f32,bf16")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--completion", type=int, default=512)
    ap.add_argument("--minibatch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    from safetensors.torch import load_file
    if not a.model:
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        import policy_throughput
        a.model = policy_throughput.make_model("qwen2", a.size, os.path.join(a.models, "qwen2-" + a.size),
                                               a.one if a.one.startswith("cuda") else "cpu")
    with open(os.path.join(a.model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    d = tempfile.mkdtemp(prefix="kernelrl-dp-bench-")
    data = os.path.join(d, "groups.json")
    with open(data, "w") as f:
        json.dump(groups(a.groups, a.group, a.prompt, a.completion, vocab, 0), f)
    out = {"model": a.model, "one": a.one, "many": a.many, "groups": a.groups, "group": a.group, "prompt": a.prompt,
           "completion": a.completion, "steps": a.steps, "lr": a.lr, "runs": []}
    # Relative to the adapter's norm after one step: 1e-5 in f32, 1e-3 in bf16.
    tolerance = {"f32": 1e-5, "bf16": 1e-3, "f16": 1e-3}
    ok = True
    print("%-6s %-22s %8s %8s | %-29s | %-29s" % ("", "", "", "", "after step 1", "after step %d" % a.steps))
    print("%-6s %-22s %8s %8s | %9s %9s %9s | %9s %9s %9s" % ("dtype", "run", "step s", "tokens", "norm", "max elt",
                                                            "of update", "norm", "max elt", "of update"))
    for dtype in a.dtypes.split(","):
        o = os.path.join(d, "%s-init" % dtype)
        run(a.probe, a.model, data, a.one, dtype, 0, a.lr, a.minibatch, o)  # the fresh adapter, as saved
        init = load_file(os.path.join(o, "adapter_model.safetensors"))
        res = {}
        for name, devices in (("one", a.one), ("one again", a.one), ("data-parallel", a.many)):
            o = os.path.join(d, "%s-%s" % (dtype, name.replace(" ", "-")))
            report, _ = run(a.probe, a.model, data, devices, dtype, a.steps, a.lr, a.minibatch, o)
            res[name] = ([load_file(os.path.join(o + ".step-%d" % k, "adapter_model.safetensors"))
                          for k in range(1, a.steps + 1)], report, devices)

        def compare(got, ref, b0):
            keys = sorted(ref)
            if sorted(got) != keys:
                return None
            d2 = sum((got[k].double() - ref[k].double()).pow(2).sum().item() for k in keys)
            r2 = sum(ref[k].double().pow(2).sum().item() for k in keys)
            u2 = sum((ref[k].double() - b0[k].double()).pow(2).sum().item() for k in keys)
            dmax = max((got[k].double() - ref[k].double()).abs().max().item() for k in keys)
            rmax = max(ref[k].double().abs().max().item() for k in keys)
            return {"norm": (d2 / r2) ** 0.5 if r2 else d2 ** 0.5, "max_elt": dmax / rmax if rmax else dmax,
                    "of_update": (d2 / u2) ** 0.5 if u2 else d2 ** 0.5}

        ref_adapters, _, _ = res["one"]
        tol = tolerance.get(dtype, 1e-3)
        for name, (adapters, report, devices) in res.items():
            first = compare(adapters[0], ref_adapters[0], init)
            last = compare(adapters[-1], ref_adapters[-1], init)
            step_s = statistics.median(r["wall_s"] for r in report[1:]) if len(report) > 1 else report[0]["wall_s"]
            passed = first is not None and first["norm"] <= tol
            if name == "data-parallel":
                ok = ok and passed
            row = {"dtype": dtype, "run": name, "devices": devices, "step_s": step_s, "tokens": report[-1]["tokens"],
                   "loss": [r["loss"] for r in report], "grad_norm": [r["grad_norm"] for r in report],
                   "after_first": first, "after_last": last, "tolerance": tol, "passed": passed}
            out["runs"].append(row)
            f = lambda c: ("%9s %9s %9s" % ("-", "-", "-") if c is None else  # noqa: E731
                           "%9.2e %9.2e %9.2e" % (c["norm"], c["max_elt"], c["of_update"]))
            print("%-6s %-22s %8.3f %8d | %s | %s" % (dtype, "%s (%s)" % (name, devices), step_s, row["tokens"],
                                                      f(first), f(last)))
            if name == "data-parallel" and not passed:
                print("  %s: after one step the data-parallel adapter is %s from the one-rank adapter (limit %g)" %
                      (dtype, "-" if first is None else "%.3g" % first["norm"], tol))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    import shutil
    shutil.rmtree(d, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
