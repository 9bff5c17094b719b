"""Experiment tracking for a kernelrl run: its steps' metrics, its config and its summary, logged through the tracking
library's own client (W&B, TensorBoard through tensorboardX, or MLflow).

    scripts/tracking-python tracking/tracker.py --run-dir RUN_DIR --backend wandb|tensorboard|mlflow
        [--project NAME] [--name NAME] [--dir DIR] [--pid PID] [--interval S]
    scripts/tracking-python tracking/tracker.py --comparison DIR/comparison.json --backend ... (the table)

`launch CONFIG` starts it beside the run when [tracking] backend is set. It follows the run's store (RUN_DIR/
store.sqlite, read-only) and live telemetry (RUN_DIR/metrics.jsonl, the monitor's snapshots): every step once it is
complete (with the learner's figures in a learning run) is logged at its step: reward, fast_1, fast_1.2, correct rate,
status counts, the learner's loss, entropy, grad norm, KL, clip fraction and learning rate, samples/s and staleness;
each held-out version's fast_1 and correct rate at its version. It stops once the run is finished (the store's runs
row) or --pid is gone, after logging the run's summary.

W&B runs offline unless WANDB_MODE says otherwise (its files under --dir, default RUN_DIR/tracking); TensorBoard
writes event files under --dir; MLflow logs to MLFLOW_TRACKING_URI, else a file store in --dir/mlruns.
"""
import argparse
import json
import os
import sqlite3
import sys
import time
import tomllib

import msgpack


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = prefix + k
        if isinstance(v, dict):
            out.update(flatten(v, key + "."))
        elif isinstance(v, list) and all(isinstance(x, dict) for x in v) and v:
            for i, x in enumerate(v):
                out.update(flatten(x, "%s.%d." % (key, i)))
        else:
            out[key] = v
    return out


class Backend:
    """One tracking library behind log(metrics, step), config(flat dict), summary(dict), table(columns, rows)."""

    def __init__(self, kind, project, name, folder, config):
        self.kind = kind
        os.makedirs(folder, exist_ok=True)
        if kind == "wandb":
            os.environ.setdefault("WANDB_MODE", "offline")
            os.environ.setdefault("WANDB_SILENT", "true")
            import wandb
            self.run = wandb.init(project=project, name=name, dir=folder, config=config, reinit="finish_previous")
            # W&B's own step only grows, but a held-out round can finish after later steps: each series is drawn
            # against a step metric of its own (the experiment step, or the policy version a round evaluated).
            self.run.define_metric("step")
            self.run.define_metric("version")
            self.run.define_metric("*", step_metric="step")
            self.run.define_metric("heldout/*", step_metric="version")
        elif kind == "tensorboard":
            from tensorboardX import SummaryWriter
            self.run = SummaryWriter(logdir=os.path.join(folder, "tensorboard", name))
            self.run.add_text("config", "\n".join("    %s = %r" % kv for kv in sorted(config.items())), 0)
        elif kind == "mlflow":
            if not os.environ.get("MLFLOW_TRACKING_URI"):  # a local file store (MLflow keeps it in maintenance mode)
                os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
            import mlflow
            mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI") or "file:" + os.path.join(folder, "mlruns"))
            mlflow.set_experiment(project)
            self.run = mlflow.start_run(run_name=name)
            params = {k[:250]: str(v)[:6000] for k, v in config.items()}
            keys = sorted(params)
            for i in range(0, len(keys), 100):  # MLflow takes at most 100 params a call
                mlflow.log_params({k: params[k] for k in keys[i:i + 100]})
        else:
            raise SystemExit("tracker: unknown backend %r (wandb, tensorboard or mlflow)" % kind)

    def log(self, metrics, step, axis="step"):
        metrics = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v}
        if not metrics:
            return
        if self.kind == "wandb":
            self.run.log(dict(metrics, **{axis: step}))
        elif self.kind == "tensorboard":
            for k, v in metrics.items():
                self.run.add_scalar(k, v, step)
            self.run.flush()
        else:
            import mlflow
            mlflow.log_metrics({k.replace("@", "_at_"): v for k, v in metrics.items()}, step=step)

    def summary(self, values):
        flat = {k: v for k, v in flatten(values).items() if isinstance(v, (int, float, str, bool))}
        if self.kind == "wandb":
            self.run.summary.update(flat)
        elif self.kind == "tensorboard":
            self.run.add_text("summary", "```\n%s\n```" % json.dumps(values, indent=1, default=str), 0)
        else:
            import mlflow
            mlflow.log_dict(values, "summary.json")

    def table(self, name, columns, rows):
        if self.kind == "wandb":
            import wandb
            self.run.log({name: wandb.Table(columns=columns, data=rows)})
        elif self.kind == "tensorboard":
            lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += ["| " + " | ".join(str(x) for x in r) + " |" for r in rows]
            self.run.add_text(name, "\n".join(lines), 0)
        else:
            import mlflow
            mlflow.log_dict({"columns": columns, "data": rows}, name + ".json")

    def close(self):
        if self.kind == "wandb":
            self.run.finish()
        elif self.kind == "tensorboard":
            self.run.close()
        else:
            import mlflow
            mlflow.end_run()


def alive(pid):
    if not pid:
        return True
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


class Run:
    """What the run's store and telemetry say so far."""

    def __init__(self, run_dir):
        self.run_dir = run_dir
        self.db_path = os.path.join(run_dir, "store.sqlite")
        self.seq = 0  # the newest sample read (samples.seq)
        self.verdicts = {}  # (split, step) -> [(status, speedup)] of the samples read so far

    def db(self):
        return sqlite3.connect("file:%s?mode=ro" % self.db_path, uri=True, timeout=5)

    def state(self):
        """(run id, mode, status, summary) of the run in the store, or None while there is none."""
        if not os.path.exists(self.db_path):
            return None
        with self.db() as c:
            row = c.execute("SELECT run_id, mode, status, summary_json FROM runs ORDER BY created_at DESC LIMIT 1"
                            ).fetchone()
        return row

    def steps(self, run_id):
        with self.db() as c:
            return [(s, json.loads(j)) for s, j in
                    c.execute("SELECT step, stats_json FROM steps WHERE run_id = ? ORDER BY step", (run_id,))]

    def read_samples(self, run_id):
        """Adds the samples stored since the last call to self.verdicts (each record unpacked once)."""
        with self.db() as c:
            for seq, step, status, speedup, record in c.execute(
                    "SELECT seq, step, status, speedup, record FROM samples WHERE run_id = ? AND seq > ? ORDER BY seq",
                    (run_id, self.seq)):
                split = msgpack.unpackb(record, raw=False, strict_map_key=False).get("rollout", {}).get("split", "")
                self.verdicts.setdefault((split, step), []).append((status, speedup))
                self.seq = seq

    def telemetry(self):
        """The monitor's latest snapshot (values by "source.key"): the file's last whole line, read from its end."""
        path = os.path.join(self.run_dir, "metrics.jsonl")
        if not os.path.exists(path):
            return {}
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            end = f.tell()
            back = 1 << 16
            while True:
                f.seek(max(0, end - back))
                lines = [x for x in f.read().split(b"\n") if x.strip()]
                if back >= end or len(lines) >= 2:  # the last line, whole (the first may be cut)
                    break
                back *= 4
        try:
            return json.loads(lines[-1])["values"] if lines else {}
        except (ValueError, KeyError):
            return {}


VERDICTS = {"ok", "format_error", "compile_error", "runtime_error", "timeout", "incorrect", "hacked"}


def rates(rows):
    """fast_1, fast_1.2 and the correct rate of (status, speedup) rows with a verdict."""
    n = sum(1 for st, _ in rows if st in VERDICTS)
    if n == 0:
        return {}
    ok = [sp for st, sp in rows if st == "ok"]
    return {"fast_1": sum(sp > 1.0 for sp in ok) / n, "fast_1.2": sum(sp > 1.2 for sp in ok) / n,
            "correct_rate": len(ok) / n}


def follow(a):
    run = Run(a.run_dir)
    folder = a.dir or os.path.join(a.run_dir, "tracking")
    config = {}
    cfg_path = os.path.join(a.run_dir, "config.resolved.toml")
    deadline = time.time() + 600
    while not os.path.exists(cfg_path) and time.time() < deadline and alive(a.pid):
        time.sleep(0.5)
    if os.path.exists(cfg_path):
        with open(cfg_path, "rb") as f:
            config = flatten(tomllib.load(f))
    backend = Backend(a.backend, a.project, a.name or os.path.basename(os.path.abspath(a.run_dir)), folder, config)
    logged_steps, logged_versions = set(), set()
    while True:
        state = run.state()
        finished = state is not None and state[2] != "running"
        gone = not alive(a.pid)
        if state is not None:
            run_id, mode = state[0], state[1]
            steps = run.steps(run_id)
            run.read_samples(run_id)
            tele = run.telemetry()
            last = max((s for s, _ in steps), default=-1)
            for s, st in steps:
                # Complete: a learning step once the learner's figures are in, another once a later one exists or
                # the run is over.
                if s in logged_steps or not ("learner" in st or s < last or finished or gone):
                    continue
                m = {"reward": st.get("mean_reward"), "samples": st.get("samples")}
                m.update(rates(run.verdicts.get(("", s), [])) or {"fast_1": st.get("fast_1")})
                for k, v in st.get("status_counts", {}).items():
                    m["status/" + k] = v
                for k, v in st.get("learner", {}).items():
                    m["learner/" + k] = v
                for k, key in [("samples_per_s", "supervisor.samples_per_s"),
                               ("staleness_mean", "supervisor.staleness_mean"),
                               ("staleness_max", "supervisor.staleness_max")]:
                    if key in tele:
                        m["throughput/" + k if k == "samples_per_s" else "staleness/" + k[10:]] = tele[key]
                backend.log(m, s)
                logged_steps.add(s)
            held = {step: rows for (split, step), rows in run.verdicts.items() if split}
            newest = max(held, default=-1)
            for v, rows in sorted(held.items()):
                if v in logged_versions or not (v < newest or finished or gone):
                    continue
                backend.log({"heldout/" + k: x for k, x in rates(rows).items()}, v, axis="version")
                logged_versions.add(v)
            if finished:
                summary = json.loads(state[3]) if state[3] else {}
                summary.pop("tasks", None)
                summary.pop("steps", None)
                backend.summary(summary)
                break
        if gone:
            break
        time.sleep(a.interval)
    backend.close()


def comparison(a):
    with open(a.comparison) as f:
        comp = json.load(f)
    folder = a.dir or os.path.join(os.path.dirname(os.path.abspath(a.comparison)), "tracking")
    backend = Backend(a.backend, a.project, a.name or "comparison", folder, {"comparison": a.comparison})
    columns = ["run", "arm", "seed", "mode", "rollouts", "student_tokens", "fast_1", "fast_1.2", "correct_rate",
               "score", "equivalent_k"]
    rows = []
    for r in comp.get("runs", []):
        an, co = r.get("analysis", {}), r.get("compute", {})
        ek = r.get("equivalent_k")
        rows.append([os.path.basename(r.get("run_dir", "")), r.get("arm", ""), r.get("seed"),
                     co.get("settings", {}).get("mode", ""), co.get("rollouts", 0), co.get("student_tokens", 0),
                     an.get("fast_1", 0.0), an.get("fast_1.2", 0.0), an.get("correct_rate", 0.0), r.get("score", 0.0),
                     ek if isinstance(ek, (int, float)) else str(ek)])
    backend.table("comparison", columns, rows)
    backend.close()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run-dir")
    p.add_argument("--comparison")
    p.add_argument("--backend", required=True, choices=["wandb", "tensorboard", "mlflow"])
    p.add_argument("--project", default="kernelrl")
    p.add_argument("--name", default="")
    p.add_argument("--dir", default="")
    p.add_argument("--pid", type=int, default=0)
    p.add_argument("--interval", type=float, default=2.0)
    a = p.parse_args()
    if bool(a.run_dir) == bool(a.comparison):
        p.error("give --run-dir or --comparison")
    if a.comparison:
        comparison(a)
    else:
        follow(a)


if __name__ == "__main__":
    sys.exit(main())
