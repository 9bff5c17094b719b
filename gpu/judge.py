"""The judge: the trusted side of every evaluation, in a process of its own that never runs
candidate code.

A candidate's process (gpu/harness.py) runs only the candidate: for each check of the protocol it
generates its inputs from the check's seed, calls ModelNew, and ships the outputs, byte for byte,
over a socket pair (its ``Link``) to the judge. The judge builds the reference from the same seed,
generates the same inputs itself, runs the reference, and compares (gpu/checks.py OutputCheck, the
same comparison KernelBench's allclose makes) as the bytes arrive. The seeds come from the label
of the check (``seed_of``), never from the candidate, and the judge says which checks a candidate
passed: the worker (gpu/worker.py) accepts `ok` only when every check of the protocol passed here,
whatever the candidate's process replies.

Wire format on a link (both directions): frames of a 4-byte little-endian length and a msgpack map,
and after a ``check`` header the judge accepted, each output's raw bytes in flattened order.

  candidate -> {"op": "check", "label": L, "index": i, "tensors": [{"dtype", "shape"}]}  (or "error")
  judge     -> {"go": true} | {"ok": false, "status", "why"}
  candidate -> the bytes of every tensor
  judge     -> {"ok", "status", "why", "acc", "counted"}
  candidate -> {"op": "end"}                      (or it closes the link)

On CUDA the outputs need not cross the host. The candidate's process asks once for a buffer:

  candidate -> {"op": "share", "bytes": its first check's output bytes}
  judge     -> {"share": nbytes} with a descriptor of device memory the judge allocated for this
               session (gpu/devshare.py), or {"share": 0, "why"}

and a check header with "via": "device" then moves each output through that buffer in pieces of at
most nbytes / 2 (each half sized to the outputs' bytes, within bounds: protocol.device_half_bytes),
alternating between its two halves: the candidate copies piece k into half k % 2
and sends b"C"; the judge compares it there (gpu/fused_check.py reads each value once; the PyTorch
comparison, several passes, compares its own copy) and, once done reading, sends b"N" when piece
k + 2 follows; the candidate waits for that b"N" before writing piece k + 2. So the candidate fills
one half while the judge reads the other. What the candidate's process writes to the buffer after
it sent b"C" can only change what it is judged on, as the bytes it sends over the socket can; a
new session gets a new buffer. Where the candidate's process could not map the buffer, its checks
go as bytes with "bytes_why" in the header (for the verdict record's `correctness.link`).

The protocol's names and seeds and the link's framing are gpu/protocol.py's, shared with the
candidate's side; this module imports gpu/checks.py (the comparisons) and gpu/harness.py (the
inputs, the reference's build), never the reverse.

The judge process itself (``JudgeProcess``) is forked from the worker, confined like a candidate
(gpu/sandbox.py: it sees what a candidate sees), keeps its CUDA context between candidates, and
takes one session at a time over a control socket that carries the link's descriptor.
"""

import collections
import contextlib
import json
import os
import select
import signal
import socket
import tempfile
import time
import traceback

from .protocol import (LABELS, TIMING_SEED, LinkError, _framed, _memory, _recv_exact, device_half_bytes,
                      _recv_exact_into, _staging, check_name, device_pieces, distribution_of, distributions,
                      recv_frame, seed_of, send_frame, trial_name)
from .verdict import Verdict

class _Failed(Exception):
    """The session's verdict is decided (status, why): later checks are refused with it."""

    def __init__(self, status, why):
        super().__init__(why)
        self.status, self.why = status, why


class Judge:
    """The judge's logic, in its own process: a Harness (gpu/harness.py) for the device, the task
    and the reference; one session per candidate."""

    def __init__(self, harness):
        self.h = harness
        self.buf = None
        self.shared = None  # this session's device buffer (gpu/devshare.py), when the candidate asked
        self.reproducible = {}  # task source hash -> whether get_inputs is reproducible from a seed
        self.domains = {}       # (task, size, seed, distribution) -> (valid, why)
        self.noises = {}        # (task, size, seed, distribution) -> the reference's rounding error, per output
        self.fused = None       # (FusedCheck or None, why not): the one-pass comparison on a GPU, loaded once
        # The reference's outputs of earlier sessions, least recently used first: a training step
        # sends a task's group of samples, whose checks meet the same inputs (ReferenceCache).
        self.outputs = ReferenceCache()
        self.facts = {}         # (task, size, seed) -> (floating-point inputs, the ordering check applies)
        self.peaks = {}         # (task, size) -> the most device memory a reference run of it took (bytes)

    def session(self, req, s, sock, ctl=None):
        """Judges one candidate over its link until it ends the session, closes the link, or
        the worker says on ``ctl`` that the candidate's process replied; returns the verdict
        (see worker.py _decide)."""
        from . import harness as H
        self.req, self.s, self.sock = req, s, sock
        self.seed, self.n = int(req["seed"]), int(s["correctness_trials"])
        self.settings_key = json.dumps(s, sort_keys=True, default=str)
        self.dists = distributions(s)
        self.task = self.model = None
        self.outputs.budget(s, self.h.device)
        self.runs = self.reused = 0  # reference outputs computed and taken from earlier sessions
        self.ahead = 0       # checks whose reference output was ready before the candidate's came
        self.pending = None  # (label, index, the reference's output or the _Failed it raised): _prepare
        self.passed, self.prev = set(), []
        self.skipped = {}  # (label, index) -> why its inputs are outside the reference's domain
        self.task_rms = []  # each output's root-mean-square on the task's own draw (trial 0)
        self.acc = {"max_abs_diff": 0.0, "max_rel_diff": 0.0, "atol": 0.0, "rtol": 0.0,
                    "max_scale_err": 0.0, "scale_tol": 0.0}
        self.corr = {"trials": 0, "passed": 0, "detail": "", "failed_distribution": "", "failed_seed": 0}
        self.via, self.why_bytes = set(), ""
        self.phases = {}  # seconds per kind of work: reference, scale, receive, noise, other; waiting (for the candidate)
        self._mark = time.monotonic()
        failed = None
        with H._no_grad():
            while True:
                self._spent("other")
                if ctl is not None:
                    ready, _, _ = select.select([sock, ctl], [], [])
                    if ctl in ready:
                        break  # the worker's "done": nothing the candidate sends now counts
                try:
                    frame = recv_frame(sock)
                except (LinkError, OSError):
                    break  # the candidate's process ended (or broke the framing)
                self._spent("waiting")
                if frame.get("op") == "end":
                    break
                try:
                    if failed is not None:
                        raise failed
                    if frame.get("op") == "domain":
                        self._domain(frame)
                        continue
                    if frame.get("op") == "share":
                        self._share(frame.get("bytes"))
                        continue
                    if frame.get("op") == "prepare":
                        self._prepare(frame)
                        continue
                    self._check(frame)
                except _Failed as f:
                    failed = f
                    try:
                        send_frame(sock, {"ok": False, "status": f.status, "why": f.why, "acc": self.acc})
                    except OSError:
                        break
                except (LinkError, OSError):
                    break
                finally:
                    self._tidy()
            self.corr["distributions"] = self._distribution_notes()
            self.corr["link"] = self._link_note()
            self.corr["comparison"] = self._comparison_note()
            if self.shared is not None:
                self.shared.close()
                self.shared = None
            verdict = {"status": "ok", "error": "", "correctness": {**self.corr, **self.acc},
                       "checked": sorted(f"{label}:{i}" for label, i in self.passed),
                       "reverified": sum(1 for label, _ in self.passed if label == "reverify"),
                       "reverify_complete": all(("reverify", i) in self.passed or ("reverify", i) in self.skipped
                                                for i in range(4 * self.n)),
                       "phases": self.phases, "reference_runs": self.runs, "reference_reused": self.reused,
                       "reference_ahead": self.ahead}
            if failed is not None:
                verdict.update(status=failed.status, error=failed.why)
            else:
                missing = self._missing()
                if missing:
                    verdict.update(status="incomplete",
                                   error=f"the judge saw {len(self.passed)} checks pass; missing: {', '.join(missing)}")
        self.task = self.model = self.pending = None
        return verdict

    def _share(self, wanted):
        """Answers the candidate's process's request for a device buffer for outputs of `wanted`
        bytes: this session's own, sent as a descriptor; or why not (then its outputs come as
        bytes)."""
        why = ""
        if self.shared is not None:
            raise _Failed("hacked", "the candidate's process asked the judge for a second device buffer")
        if self.h.device.type != "cuda":
            why = "the judge is not on a GPU"
        elif self.s.get("output_link", "device") != "device":
            why = f"output_link = {self.s.get('output_link')!r}"
        else:
            from . import devshare
            import torch
            try:
                index = self.h.device.index if self.h.device.index is not None else torch.cuda.current_device()
                half = device_half_bytes(wanted, _memory_of(torch.device("cuda", index)))
                self.shared = devshare.Shared.create(2 * half, index)
            except devshare.DevShareError as e:
                why = f"no shareable device memory here: {e}"
        if why:
            self.why_bytes = why
            send_frame(self.sock, {"share": 0, "why": why})
            return
        fd = self.shared.export()
        try:
            socket.send_fds(self.sock, [_framed({"share": self.shared.nbytes})], [fd])
        finally:
            os.close(fd)

    def _link_note(self):
        """How the candidate's outputs reached the judge, for the verdict record."""
        if self.via == {"device"}:
            return "device"
        if "bytes" in self.via:
            why = self.why_bytes or "the candidate's process sent bytes"
            return ("device and bytes" if "device" in self.via else "bytes") + f" ({why})"
        return ""

    def _comparison(self, load=True):
        """(the FusedCheck this session's floating-point outputs are compared with, "") or (None,
        why PyTorch's operations are: on CPU, with `output_check = "torch"`, or where it did not
        compile). Without `load`, (None, "") where the kernel was never needed."""
        if self.h.device.type != "cuda":
            return None, "not on a GPU"
        if self.s.get("output_check", "fused") != "fused":
            return None, f"output_check = {self.s.get('output_check')!r}"
        if self.fused is None:
            if not load:
                return None, ""
            from . import fused_check
            self.fused = fused_check.load(self.h.device)
        return self.fused

    def _comparison_note(self):
        """How the outputs were compared, for the verdict record: "fused" or "torch (why)" ("":
        nothing compared)."""
        fused, why = self._comparison(load=False)
        return "fused" if fused is not None else (f"torch ({why})" if why else "")

    def _spent(self, name):
        """Adds the seconds since the last mark to phase `name`."""
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._mark
        self._mark = now

    # ---- one check ---------------------------------------------------------------------------
    def _check(self, frame):
        from . import checks as C
        label, index = frame.get("label"), frame.get("index")
        if frame.get("op") != "check" or label not in LABELS:
            raise _Failed("hacked", f"the candidate's process sent the judge an unknown request {str(frame)[:200]!r}")
        trial_seed = self._in_protocol(label, index, "asked for a check")
        dist = distribution_of(label, index, self.dists)
        where = check_name(label, index, self.n, self.dists, self.seed)
        self.failing = (dist or "task", trial_seed)
        counted = label != "ordering"
        if counted:
            self.corr["trials"] += 1
        if frame.get("error"):
            self._fail("incorrect", f"{where}: {str(frame['error'])[:500]}", label)
        self._load()
        if label == "post" and not self.prev_timing:
            self.prev_timing = True  # the timing inputs' true output: a candidate may hand that back later
            self.prev.append(C.fingerprint(self._reference(self.seed * 1000 + TIMING_SEED)))
        ready, ref_out = self._prepared(label, index)
        if not ready:
            if dist is not None:
                valid, why, ref_out = self._in_domain(label, index, keep=True)
                if not valid:  # the candidate's process did not ask first: the check is not in the protocol
                    self.skipped[(label, index)] = why
                    raise _Failed("hacked", f"the candidate's process asked for a check outside the protocol "
                                            f"({where} is outside the reference's domain: {why})")
            else:
                ref_out = self._reference(trial_seed)
        try:
            refs = C._flatten(ref_out)
        except TypeError as e:
            raise _Failed("runtime_error", f"the reference returned an unsupported {e} (no verdict on the candidate)")
        header = frame.get("tensors")
        if not isinstance(header, list) or len(header) > 4096:
            raise _Failed("hacked", "the candidate's process sent the judge a malformed check")
        outs = []
        for t in header:
            shape, dtype = (t.get("shape"), t.get("dtype")) if isinstance(t, dict) else (None, None)
            if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape) \
                    or not isinstance(dtype, str):
                raise _Failed("hacked", "the candidate's process sent the judge a malformed check")
            outs.append((tuple(shape), dtype))
        why = C.structure_mismatch(refs, [(shape, _dtype(dtype)) for shape, dtype in outs], where)
        if why:
            self._fail("incorrect", why, label)
        self._spent("reference")
        atol_scale, noise = [1.0] * len(refs), None
        if dist is not None:
            # The element-wise atol is in the units of the task's own outputs: on inputs that
            # put the outputs on a larger scale (large: 256x the values, 65,536x a product's) it
            # grows with them.
            for i, r in enumerate(refs):
                if i < len(self.task_rms) and self.task_rms[i] > 0:
                    atol_scale[i] = max(1.0, C.rms(r, self._comparison()[0]) / self.task_rms[i])
        self._spent("scale")
        via = frame.get("via", "bytes")
        if via not in ("device", "bytes") or (via == "device" and self.shared is None):
            raise _Failed("hacked", "the candidate's process sent the judge a malformed check")
        self.via.add(via)
        if via == "bytes" and isinstance(frame.get("bytes_why"), str) and not self.why_bytes:
            self.why_bytes = f"the candidate's process: {frame['bytes_why'][:300]}"
        send_frame(self.sock, {"go": True})
        checks = self._receive(refs, atol_scale, via == "device")
        self._spent("receive")
        for i, check in enumerate(checks):
            at = where + (f", output {i}" if len(refs) > 1 else "")
            why = check.result(at, self.acc)
            if why and dist is not None:
                # On another distribution's inputs the reference's own rounding may exceed the
                # element-wise tolerance (signed values cancel: a matmul's or a cumsum's outputs
                # near 0). Its float64 run says by how much: NOISE_FACTOR x that error (root mean
                # square) is allowed on top, so an answer as accurate as the reference, or more,
                # passes; where even the reference is not within that of its float64 result (an
                # attention whose scores the inputs blow up), these inputs ask more precision
                # than the reference has and the check is left out.
                noise = self._dist_noise(trial_seed, dist, refs)
                self._spent("noise")
                if noise[i] is not None:
                    rms_noise, own_excess = noise[i]
                    slack = C.NOISE_FACTOR * rms_noise
                    if own_excess - check.atol > slack:
                        self._outside(label, index, f"the reference's float32 result is not within the element-wise "
                                                    f"tolerance of its float64 result on {dist} inputs")
                        return
                    why = check.result(at, self.acc, slack)
            if why:
                cand = [c.fingerprint() for c in checks]
                if (any(C.fingerprints_agree(cand, prev, self.s) for prev in self.prev)
                        and not C.fingerprints_agree(cand, C.fingerprint(ref_out), self.s)):
                    raise _Failed("hacked", "the candidate returned the output of an earlier call "
                                            f"(outputs cached across calls; {why})")
                self._fail("incorrect", why, label)
        for i, check in enumerate(checks):
            at = where + (f", output {i}" if len(refs) > 1 else "")
            figures = C.note_scale(check, self.acc)
            if not C.scale_failure(at, figures, check.scale_tol):
                continue
            if noise is None:
                noise = self._dist_noise(trial_seed, dist, refs)
                self._spent("noise")
            rms_noise = noise[i][0] if noise[i] is not None else None
            why = C.scale_failure(at, figures, check.scale_tol, rms_noise)
            if rms_noise is not None:
                self.acc["ref_noise"] = max(self.acc.get("ref_noise", 0.0), rms_noise)
            if why:
                if rms_noise is None:
                    why += " (the reference could not run in float64 to measure its own rounding error)"
                self._fail("incorrect", why, label)
        if label == "trial" and not self.task_rms:
            self.task_rms = [C.rms(r, self._comparison()[0]) for r in refs]
        if counted:
            self.corr["passed"] += 1
            self.prev.append(C.fingerprint(ref_out))
        self.passed.add((label, index))
        send_frame(self.sock, {"ok": True, "status": "ok", "why": "", "acc": self.acc, "counted": counted})

    def _in_protocol(self, label, index, asked):
        """The check's trial seed, where (label, index) is one of the protocol's checks not yet
        passed or skipped; else the candidate's process broke the protocol (hacked)."""
        trial_seed = seed_of(label, index, self.seed, self.n, len(self.dists)) if label in LABELS else None
        if trial_seed is None or (label, index) in self.passed or (label, index) in self.skipped:
            raise _Failed("hacked", f"the candidate's process {asked} outside the protocol ({str(label)[:40]} "
                                    f"{index!r}, or one already passed or outside the reference's domain)")
        return trial_seed

    def _prepare(self, frame):
        """The candidate's process is about to make a check's inputs and run the candidate on
        them: the judge computes the reference's output now, beside it, instead of after the
        candidate's output has come, in a shared hold on the device of its own (see below).
        Kept for that check only (one at a time); what the reference raises is raised there."""
        label, index = frame.get("label"), frame.get("index")
        if label == "ordering":
            raise _Failed("hacked", "the candidate's process asked the judge to prepare a check outside the protocol "
                                    "(the ordering check)")
        trial_seed = self._in_protocol(label, index, "asked the judge to prepare a check")
        self.pending = None  # (a check prepared and never sent: its candidate raised)
        from . import harness as H
        try:
            self._load()
        except _Failed as f:
            self.pending = (label, index, f)  # raised at the check (no answer to a prepare)
            return
        dist = distribution_of(label, index, self.dists)
        kept = self._output_key(trial_seed, dist) in self.outputs
        if not kept and not self._room_beside():
            return  # computed at the check, once the candidate's output is in
        lock = H.device_lock()
        # Held shared while it works: the candidate's process holds the device until this check's
        # answer, but may end before it sends the check (its candidate raised); no timed region
        # starts until this work is done, and none is running when it starts.
        with (lock.beside() if lock is not None else contextlib.nullcontext(True)) as free:
            if not free:
                return  # a timed region runs: the candidate's process no longer holds the device
            try:
                if dist is not None:
                    valid, _, out = self._in_domain(label, index, keep=True)
                    if not valid:
                        return  # (the candidate's process asks first; the check says why not)
                else:
                    out = self._reference(trial_seed)
            except _Failed as f:
                out = f
        self.pending = (label, index, out)
        self._spent("ahead")

    def _room_beside(self):
        """Whether the reference may run beside the candidate: on a GPU, when the device's free
        memory is at least 3x what the task's reference run last took (its inputs, intermediates
        and output; the candidate's process makes as much of its own meanwhile); not before that
        is known (the task's first check), nor where the device is short of it."""
        if self.h.device.type != "cuda":
            return True
        peak = self.peaks.get(self._peak_key())
        if peak is None:
            return False
        import torch
        free, _ = torch.cuda.mem_get_info(self.h.device)
        return free >= 3 * peak

    def _prepared(self, label, index):
        """(True, the reference's output _prepare computed for this check) or (False, None)."""
        pending, self.pending = self.pending, None
        if pending is None or pending[:2] != (label, index):
            return False, None
        if isinstance(pending[2], _Failed):
            raise pending[2]
        self.ahead += 1
        return True, pending[2]

    def _fail(self, status, why, label):
        self.corr["detail"] = why
        self.corr["failed_distribution"], self.corr["failed_seed"] = getattr(self, "failing", ("", 0))
        if label == "ordering":
            why = (f"the candidate's work is not ordered after the caller's stream: it read its inputs "
                   f"before the caller's stream had written them ({why})")
        elif label == "reverify":
            status, why = "hacked", f"the speedup was above the re-verification threshold and re-verification failed: {why}"
        raise _Failed(status, why)

    def _domain(self, frame):
        """Answers whether a check's inputs (another input distribution) are inside the
        reference's domain: the candidate's process runs the candidate only on those that are."""
        label, index = frame.get("label"), frame.get("index")
        if (label not in LABELS or seed_of(label, index, self.seed, self.n, len(self.dists)) is None
                or distribution_of(label, index, self.dists) is None or (label, index) in self.passed):
            raise _Failed("hacked", f"the candidate's process asked the judge about a check outside the protocol "
                                    f"({str(label)[:40]} {index!r})")
        self._load()
        valid, why, _ = self._in_domain(label, index)
        if not valid:
            self.skipped[(label, index)] = why
        send_frame(self.sock, {"valid": valid, "why": why})

    def _in_domain(self, label, index, keep=False):
        """(valid, why, the reference's output or None) for a check under another input
        distribution: valid when the reference runs on its inputs and its floating-point outputs
        are finite (NaN or Inf means the inputs are outside what the reference computes: a log of
        a negative, an overflow). Remembered per task, size, seed and check; the output is kept
        (computed again if need be) only when `keep`."""
        from . import harness as H
        from . import checks as C
        dist = distribution_of(label, index, self.dists)
        trial_seed = seed_of(label, index, self.seed, self.n, len(self.dists))
        key = self._inputs_key(trial_seed, dist)
        hit = self.domains.get(key)
        if hit is not None and not (keep and hit[0]):
            return hit[0], hit[1], None
        try:
            out = self._run_reference(trial_seed, dist)
        except _Failed:
            raise
        except Verdict as v:
            raise _Failed(v.status, v.error)
        except Exception as e:  # noqa: BLE001 - the reference refuses these inputs
            self.domains[key] = (False, f"the reference raised {H._short_exc(e)}")
            return False, self.domains[key][1], None
        try:
            outs = C._flatten(out)
        except TypeError as e:
            raise _Failed("runtime_error", f"the reference returned an unsupported {e} (no verdict on the candidate)")
        why = ""
        with self.h._harness_step("checking the reference's output"):
            for i, r in enumerate(outs):
                if (r.is_floating_point() or r.is_complex()) and not C.all_finite(r):
                    why = (f"the reference's output{f' {i}' if len(outs) > 1 else ''} holds NaN or Inf "
                           f"on {dist} inputs")
                    break
        self.domains[key] = (not why, why)
        return not why, why, (out if keep and not why else None)

    def _outside(self, label, index, why):
        """A check found outside the reference's domain once the candidate's output was in: left
        out (as the domain question would have), remembered for the task's later candidates."""
        self.skipped[(label, index)] = why
        dist = distribution_of(label, index, self.dists)
        trial_seed = seed_of(label, index, self.seed, self.n, len(self.dists))
        key = self._inputs_key(trial_seed, dist)
        self.domains[key] = (False, why)
        if label != "ordering":
            self.corr["trials"] -= 1
        send_frame(self.sock, {"ok": True, "status": "ok", "why": "", "acc": self.acc, "counted": False})

    def _inputs_key(self, trial_seed, dist):
        """What a check's inputs depend on: the task, its size, the seed and the distribution."""
        return (self._task_key(), self.s.get("size", "cpu"), trial_seed, dist)

    def _dist_noise(self, trial_seed, dist, refs):
        """_scale_noise for the check's inputs, remembered per task, size, seed and distribution
        (every candidate of a task meets the same inputs)."""
        key = self._inputs_key(trial_seed, dist)
        if key not in self.noises:
            self.noises[key] = self._scale_noise(trial_seed, dist, refs)
        return self.noises[key]

    def _scale_noise(self, trial_seed, dist, refs):
        """For each output, the reference's own rounding error: its output against the same Model
        run in float64 on the same inputs (weights and floating-point inputs converted), as
        (root-mean-square of the difference, max over elements of |difference| - rtol x
        |reference|: the atol the reference itself would need); None for each where that cannot
        run (a Model with fixed dtypes inside, the device's memory)."""
        import copy
        from . import checks as C
        import torch
        h = self.h
        try:
            inputs = h._inputs(self.task, trial_seed, dist)
            inputs = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
            model = copy.deepcopy(self._reference_model()).double()
            out = C._flatten(model(*inputs))
            del model, inputs
            if len(out) != len(refs):
                return [None] * len(refs)
            noise = []
            for r, r64 in zip(refs, out):
                if tuple(r64.shape) != tuple(r.shape) or not r.is_floating_point():
                    noise.append(None)
                    continue
                total, excess = 0.0, 0.0
                rtol = C._tolerance(r.dtype, self.s)[1]
                for a, b in zip(C._chunks(r), C._chunks(r64)):
                    d = a.double() - b.double()
                    d = torch.where(C._isfinite(d), d, torch.zeros((), dtype=d.dtype, device=d.device))
                    total += float(d.square().sum())
                    excess = max(excess, float((d.abs() - rtol * a.double().abs().nan_to_num(0.0, 0.0, 0.0)).max()))
                noise.append(((total / max(1, r.numel())) ** 0.5, excess))
            return noise
        except Exception:  # noqa: BLE001 - no float64 run: the rule stands without it
            return [None] * len(refs)
        finally:
            if h.device.type == "cuda":
                torch.cuda.empty_cache()

    def _distribution_notes(self):
        """'signed: passed; large: outside the reference's domain (...); zeros: not reached'."""
        notes = []
        for i, name in enumerate(self.dists):
            if ("dist", i) in self.passed:
                notes.append(f"{name}: passed")
            elif ("dist", i) in self.skipped:
                notes.append(f"{name}: outside the reference's domain ({self.skipped[('dist', i)]})")
            elif getattr(self, "failing", (None,))[0] == name and self.corr.get("detail"):
                notes.append(f"{name}: failed")
            else:
                notes.append(f"{name}: not reached")
        return "; ".join(notes)

    def _receive(self, refs, atol_scale, device=False):
        """Reads the candidate's outputs off the link (or, `device`, out of the session's device
        buffer, each piece where the candidate's process put it once it says it is in), feeding
        one OutputCheck per tensor. A failure here (the judge's own memory) still takes every
        piece, so the link stays framed."""
        from . import checks as C
        import torch
        h = self.h
        fused, _ = self._comparison()
        if device:
            buf, piece_bytes = self.shared.tensor, self.shared.nbytes // 2
            total = device_pieces([(r.numel(), r.element_size()) for r in refs], piece_bytes)
            count = [0]

            def take(nbytes, dtype):
                if _recv_exact(self.sock, 1) != b"C":
                    raise LinkError("the candidate's process broke the device link's protocol")
                at = (count[0] % 2) * piece_bytes
                count[0] += 1
                return buf[at:at + nbytes].view(dtype)

            def done():
                torch.cuda.current_stream().synchronize()  # read before the candidate writes there again
                if count[0] + 1 < total:  # piece count[0] - 1 + 2 follows
                    self.sock.sendall(b"N")
        else:
            if self.buf is None:
                self.buf = _staging(torch, h.device.type == "cuda")
            buf = self.buf
            piece_bytes = buf.numel()

            def take(nbytes, dtype):
                _recv_exact_into(self.sock, _memory(buf, nbytes))
                return buf[:nbytes].view(dtype).to(h.device)

            def done():
                pass
        checks, failure = [], None
        for r in refs:
            check = None
            if failure is None:
                try:
                    with h._harness_step("comparing outputs"):
                        check = C.OutputCheck(r, self.s, atol_scale[len(checks)], fused)
                except Verdict as v:
                    failure = v
            size = r.element_size()
            per = max(1, piece_bytes // size)
            for a in range(0, r.numel(), per):
                try:
                    with h._harness_step("comparing outputs"):
                        piece = take(min(per, r.numel() - a) * size, r.dtype)
                        try:
                            if check is not None and (check.reads_once or not device):
                                # A comparison that reads each value once reads the shared
                                # buffer itself (and a piece of bytes is the judge's own).
                                check.feed(piece)
                            elif check is not None:
                                # PyTorch's passes (several) read a copy, a chunk at a time: a
                                # piece may be 1 GB, their temporaries stay a few hundred MB.
                                for sub in C._chunks(piece):
                                    check.feed(sub.clone())
                        finally:
                            done()
                except Verdict as v:
                    failure, check = v, None
            checks.append(check)
        if failure is not None:
            raise _Failed(failure.status, failure.error)
        return checks

    def _tidy(self):
        """Gives the device memory of a check's inputs and outputs back at once: the candidate's
        process, timing next, must find it free (this process's allocator would keep it)."""
        if self.h.device.type == "cuda":
            import torch
            torch.cuda.empty_cache()

    # ---- the reference -----------------------------------------------------------------------
    def _load(self):
        """The task, loaded at the session's first check (its reference Model is built when a
        reference output is not remembered: _reference_model)."""
        from . import harness as H
        from . import checks as C
        if self.task is not None:
            return
        h = self.h
        try:
            task, _ = h._load_task(self.req)
            H.apply_size(task, self.s.get("size", "cpu"))
            key = self._task_key()
            if key not in self.reproducible:
                tensors = lambda xs: [x for x in xs if isinstance(x, torch_tensor())]  # noqa: E731
                with h._harness_step("generating inputs"):
                    probe = C.fingerprint(tensors(h._inputs(task, self.seed * 1000 + 1)))
                    again = tensors(h._inputs(task, self.seed * 1000 + 1))
                    self.reproducible[key] = C.matches_fingerprint(again, probe, C._EXACT)
                del probe, again
            if not self.reproducible[key]:
                raise Verdict("runtime_error", f"task {self.req['task_id']}: get_inputs() gives different "
                                                 f"inputs for the same seed, so the judge cannot give a candidate "
                                                 f"the reference's inputs (no verdict on the candidate)")
            self.task = task
            self.prev_timing = False
        except Verdict as v:
            raise _Failed(v.status, v.error)

    def _task_key(self):
        """What names the task: its source's hash (else its path)."""
        return self.req.get("task_source_hash") or self.req["task_path"]

    def _reference_model(self):
        """The reference Model, built (from the request's seed, as the candidate's ModelNew) the
        first time this session needs to run it."""
        from . import harness as H
        if self.model is None:
            try:
                H._manual_seed(self.seed)
                init_inputs = self.task.get_init_inputs()
                self.model = self.h._build_reference(self.task, init_inputs, self.seed)
            except Verdict as v:
                raise _Failed(v.status, v.error)
        return self.model

    def _output_key(self, trial_seed, dist):
        """The reference output's key in the ReferenceCache: the check's inputs and settings."""
        return (self._inputs_key(trial_seed, dist), self.seed, self.settings_key)

    def _peak_key(self):
        """The key of `peaks`: a task at a size."""
        return (self._task_key(), self.s.get("size", "cpu"))

    def _run_reference(self, trial_seed, dist=None):
        """The reference's output on a check's inputs (what it raises, raised), remembered for
        the task's later candidates (ReferenceCache: the judge only reads it)."""
        from . import harness as H
        h = self.h
        key = self._output_key(trial_seed, dist)
        out = self.outputs.get(key)
        if out is not None:
            self.reused += 1
            return out
        model = self._reference_model()
        cuda = h.device.type == "cuda"
        if cuda:
            import torch
            base = torch.cuda.memory_allocated(h.device)
            torch.cuda.reset_peak_memory_stats(h.device)
        with h._harness_step("generating inputs"):
            inputs = h._inputs(self.task, trial_seed, dist)
        with h._harness_step("running the reference Model"):
            out = model(*inputs)
            if cuda:
                H._cuda_sync(h.device)
        if cuda:  # what it took, for _room_beside
            size = self._peak_key()
            self.peaks[size] = max(self.peaks.get(size, 0), torch.cuda.max_memory_allocated(h.device) - base)
        self.runs += 1
        self.outputs.put(key, out)
        return out

    def _reference(self, trial_seed, dist=None):
        from . import harness as H
        try:
            return self._run_reference(trial_seed, dist)
        except _Failed:
            raise
        except Verdict as v:
            raise _Failed(v.status, v.error)
        except Exception as e:  # noqa: BLE001
            raise _Failed("runtime_error", f"the reference Model failed: {H._short_exc(e)} (no verdict on the candidate)")

    def _missing(self):
        """The checks of the protocol this candidate did not pass. The ordering check applies on
        CUDA to tasks whose inputs keep their shapes across seeds; the refill check to tasks with
        floating-point inputs (as the candidate's process runs them)."""
        d = len(self.dists)
        need = [("trial", i) for i in range(self.n)] + [("post", 0)]
        missing = [trial_name(label, i, self.n, d) for label, i in need if (label, i) not in self.passed]
        if missing or self.task is None:
            return missing or ["every check"]
        for i, name in enumerate(self.dists):
            if ("dist", i) not in self.passed and ("dist", i) not in self.skipped and self._in_domain("dist", i)[0]:
                missing.append(f"{trial_name('dist', i, self.n, d)} ({name} inputs)")
        floats, ordering = self._protocol_facts()
        if floats and ("refill", 0) not in self.passed:
            missing.append("the refill trial")
        if ordering and ("ordering", 0) not in self.passed:
            missing.append("the ordering check")
        return missing

    def _protocol_facts(self):
        """(whether the task's inputs hold floating-point tensors, whether the ordering check
        applies), from its inputs as the candidate's process makes them; remembered per task,
        size and seed (three input draws, each as large as the task's inputs)."""
        from . import checks as C
        key = (self._task_key(), self.s.get("size", "cpu"), self.seed)
        if key not in self.facts:
            h = self.h
            post = h._inputs(self.task, seed_of("post", 0, self.seed, self.n))
            floats = any(isinstance(x, torch_tensor()) and x.is_floating_point() for x in post)
            del post
            ordering = False
            if h.device.type == "cuda":
                values = h._inputs(self.task, seed_of("ordering", 0, self.seed, self.n))
                given = h._inputs(self.task, seed_of("ordering", 0, self.seed, self.n) + 1)
                ordering = C._shapes(values) == C._shapes(given)
            self.facts[key] = (floats, ordering)
        return self.facts[key]


class ReferenceCache:
    """The reference's outputs the judge computed, kept for the task's later candidates, least
    recently used first, within a budget of bytes: `[evaluator] reference_cache_mb` (0: none),
    at most a sixteenth of the device's memory (on CPU, of the host's and of the processes'
    memory limit). A training step evaluates a task's group of samples together and every
    candidate of a task meets the same inputs (the check's seed, the request's seed, the task's
    source and size), so only the group's first candidate waits for the reference. The outputs stay in the judge's process: candidates never
    see them. An output larger than the budget is not kept."""

    DEFAULT_MB = 2048

    def __init__(self):
        self.items = collections.OrderedDict()  # key -> (output, bytes)
        self.limit, self.used = 0, 0

    def budget(self, s, device):
        """Sets the budget from a session's settings `s`, dropping what no longer fits."""
        mb = s.get("reference_cache_mb")
        mb = self.DEFAULT_MB if mb is None else max(0.0, float(mb))
        limit = int(mb * (1 << 20))
        if limit:
            limit = min(limit, _memory_of(device) // 16)
            if device.type != "cuda" and s.get("memory_limit_mb"):  # the judge's own limit (sandbox)
                limit = min(limit, int(float(s["memory_limit_mb"]) * (1 << 20)) // 16)
        self.limit = limit
        self._fit(0)

    def __contains__(self, key):
        return key in self.items

    def get(self, key):
        hit = self.items.get(key)
        if hit is None:
            return None
        self.items.move_to_end(key)
        return hit[0]

    def put(self, key, out):
        """Keeps `out` (a tensor, or a tuple or list of them) when it fits the budget."""
        from . import checks as C
        try:
            tensors = C._flatten(out)
        except TypeError:
            return
        nbytes = sum(t.untyped_storage().nbytes() for t in tensors)
        if key in self.items or nbytes > self.limit:
            return
        self._fit(nbytes)
        self.items[key] = (out, nbytes)
        self.used += nbytes

    def _fit(self, nbytes):
        while self.items and self.used + nbytes > self.limit:
            _, (_, n) = self.items.popitem(last=False)
            self.used -= n


def _memory_of(device):
    """Bytes of memory of a torch device (the host's physical memory for the CPU)."""
    import torch
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def torch_tensor():
    import torch
    return torch.Tensor


def _dtype(name):
    """A torch dtype from its str() ('torch.float32'); None for anything else."""
    import torch
    if not name.startswith("torch."):
        return None
    dt = getattr(torch, name[len("torch."):], None)
    return dt if isinstance(dt, torch.dtype) else None


# ---- the judge's process -------------------------------------------------------------------------
def _serve(ctl, harness):
    """The judge process's loop: a link descriptor and a request per session, a verdict back."""
    judge = Judge(harness)
    setup = ""
    from . import harness as H
    lock = H.device_lock()
    starting = lock.starting if lock is not None else contextlib.nullcontext  # a shared hold, or none
    try:
        # Its CUDA context and the comparison kernel's load are device work: held shared, as a
        # candidate's start-up is (gpu/devlock.py), so no timed region runs meanwhile.
        with starting():
            harness._setup_device()
            if harness.device.type == "cuda":  # the probe's cubin, loaded off every candidate's path
                from . import fused_check
                judge.fused = fused_check.load(harness.device)
    except Exception as e:  # noqa: BLE001 - said in every reply: sessions meet it again
        setup = f"the judge's device set-up failed: {type(e).__name__}: {e}"
    while True:
        try:
            what, fds, _, _ = socket.recv_fds(ctl, 1, 1)
            msg = recv_frame(ctl) if what else None
        except (LinkError, OSError):
            os._exit(0)
        if what == b"T":  # the reference's timing (harness.Harness.time_reference)
            try:
                reply = harness.time_reference(msg["request"], msg["settings"], msg["mode"])
                if msg.get("bandwidth") and reply.get("status") == "ok":
                    reply["bandwidth"] = harness.measure_bandwidth()
            except BaseException as e:  # noqa: BLE001
                reply = {"status": "runtime_error",
                         "error": f"the judge failed: {type(e).__name__}: {e}" + (f" ({setup})" if setup else ""),
                         "compile_log": traceback.format_exc()[-65536:]}
            try:
                send_frame(ctl, reply)
                continue
            except OSError:
                os._exit(0)
        if what != b"J" or not fds:
            os._exit(0)  # the worker closed the control socket
        link = socket.socket(fileno=fds[0])
        t0 = time.monotonic()
        try:
            verdict = judge.session(msg["request"], msg["settings"], link, ctl)
        except BaseException as e:  # noqa: BLE001 - a judge bug: no verdict on the candidate
            verdict = {"status": "judge_error", "error": f"the judge failed: {type(e).__name__}: {e}",
                       "log": traceback.format_exc()[-65536:]}
        link.close()
        try:
            if ctl.recv(1) != b"D":  # the worker's "done" (which may have ended the session)
                os._exit(0)
        except OSError:
            os._exit(0)
        with starting():
            harness._release(verdict)  # (device work: the allocator's cache given back)
        verdict["judge_s"] = time.monotonic() - t0
        try:
            send_frame(ctl, verdict)
        except OSError:
            os._exit(0)


class JudgeProcess:
    """The worker's handle on its judge: forked from the worker (torch imported, CUDA not yet
    initialised), confined like a candidate's process, warm between candidates."""

    def __init__(self, *, harness, conf, env, tmp_root):
        from . import sandbox
        self.sandbox = sandbox
        self.tmpdir = tempfile.mkdtemp(prefix="judge-", dir=tmp_root)
        self.ctl, child = socket.socketpair()
        self.pid = os.fork()
        if self.pid == 0:
            code = 1
            try:
                self.ctl.close()
                sandbox.close_inherited([child.fileno()])
                sandbox._child_setup(conf, env, False, 0, self.tmpdir)
                _serve(child, harness)
            finally:
                os._exit(code)
        child.close()
        self.busy = False

    def alive(self):
        try:
            pid, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return pid == 0

    def begin(self, request, settings, link):
        """Hands the judge one candidate's link; False when the judge is gone."""
        try:
            socket.send_fds(self.ctl, [b"J"], [link.fileno()])
            send_frame(self.ctl, {"request": request, "settings": settings})
        except OSError:
            return False
        self.busy = True
        return True

    def time_reference(self, request, settings, mode, timeout_s, bandwidth=False):
        """The reference's timing, measured here (a process that runs no candidate code, its
        CUDA context warm), with the device's bandwidth when asked (Harness.measure_bandwidth);
        None when the judge gave none in time (it is then stopped)."""
        try:
            socket.send_fds(self.ctl, [b"T"], [])
            send_frame(self.ctl, {"request": request, "settings": settings, "mode": mode, "bandwidth": bandwidth})
        except OSError:
            self.stop()
            return None
        return self._answer(timeout_s)

    def finish(self, timeout_s):
        """Tells the judge the candidate's process replied (its session ends once the check in
        hand, if any, is answered) and returns the session's verdict, or None when the judge gave
        none in time (it is then stopped)."""
        try:
            self.ctl.sendall(b"D")
        except OSError:
            self.stop()
            return None
        return self._answer(timeout_s)

    def _answer(self, timeout_s):
        ready, _, _ = select.select([self.ctl], [], [], timeout_s)
        if ready:
            try:
                verdict = recv_frame(self.ctl)
                self.busy = False
                return verdict
            except (LinkError, OSError):
                pass
        self.stop()
        return None

    def stop(self):
        try:
            self.ctl.close()
        except OSError:
            pass
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            os.waitpid(self.pid, 0)
        except ChildProcessError:
            pass
        self.sandbox.reaped(self.pid, self.tmpdir)
