"""The comparison of a candidate's outputs with the reference's (the correctness phase's
verdict): flattening outputs, the element-wise tolerances and the scale rule, OutputCheck (fed an
output in pieces, as the judge's link delivers them; gpu/fused_check.py's one-pass kernel on a
GPU), fingerprints of earlier outputs (an output cached across calls) and exact digests (an input
the candidate wrote to). The judge (gpu/judge.py) compares with it in its own process; the
candidate's process (gpu/harness.py) only flattens its outputs and digests its inputs with it.
Imported before any candidate code runs, and frozen by the harness's watch (harness._watch).
"""

import math

import torch

from . import fused_check

# Captured at import, before any candidate runs: a candidate that rebinds torch.isclose or
# torch.isfinite cannot change what the comparison uses.
_isclose = torch.isclose
_isfinite = torch.isfinite


def _flatten(out):
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)):
        res = []
        for o in out:
            res.extend(_flatten(o))
        return res
    if isinstance(out, (int, float, bool)):
        return [torch.tensor(out)]
    raise TypeError(f"output of type {type(out).__name__} (expected tensors)")


def _shapes(xs):
    """Shapes and strides of the tensors among xs (None for the rest)."""
    return [(tuple(x.shape), tuple(x.stride())) if isinstance(x, torch.Tensor) else None for x in xs]


# Tolerance settings that ask for exact equality.
_EXACT = dict.fromkeys(("atol_half", "rtol_half", "atol_fp32", "rtol_fp32"), 0)


def _tolerance(dtype, s):
    if dtype in (torch.float16, torch.bfloat16):
        return s["atol_half"], s["rtol_half"]
    return s["atol_fp32"], s["rtol_fp32"]


# The scale rule (docs/EVALUATION.md): beside the element-wise tolerances, each floating-point
# output's root-mean-square error relative to the reference's own root-mean-square value must be
# at most this (where the reference's rounding noise is not larger: see judge.Judge._scale_noise).
# An output whose values all sit under atol (a softmax over 393,216 columns, a tensor divided by
# its norm) passes the element-wise check with zeros; it cannot pass this one.
SCALE_TOL_FP32 = 1e-2
SCALE_TOL_HALF = 5e-2
# How many times the reference's own rounding error (its float32 or half output against the same
# computation in float64) an output may differ by when it fails the scale rule: an output made of
# rounding noise (a mean of normalized values) is judged by the noise, not by its scale.
NOISE_FACTOR = 10.0


def _scale_tolerance(dtype, s):
    if dtype in (torch.float16, torch.bfloat16):
        return float(s.get("scale_tol_half", SCALE_TOL_HALF))
    return float(s.get("scale_tol_fp32", SCALE_TOL_FP32))


def scale_failure(where, figures, tol, noise=None):
    """'' or why an output fails the scale rule: figures = OutputCheck.scale(); noise: the
    reference's own rounding error's root-mean-square (None: not known)."""
    if figures is None or tol <= 0:
        return ""
    err, d_rms, r_rms = figures
    if err <= tol or (noise is not None and d_rms <= NOISE_FACTOR * noise):
        return ""
    why = (f"{where}: error {err:.3g} relative to the reference's scale (root-mean-square difference "
           f"{d_rms:.3g}, the reference's root-mean-square {r_rms:.3g}; the scale rule allows {tol:g}")
    if noise is None:
        return why + ")"
    return why + f", or {NOISE_FACTOR:g}x the reference's own rounding error in float64, {noise:.3g})"


# Elements per chunk of the harness's own passes over outputs (comparison, digests): their
# temporaries stay under a few hundred MB whatever the output's size (KernelBench's level-1
# problems have outputs of up to 7.5 GB; a whole-tensor float64 difference would need 15 GB).
CHUNK = 1 << 24

def _chunks(t):
    flat = t.reshape(-1)
    for i in range(0, flat.numel(), CHUNK):
        yield flat[i:i + CHUNK]


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


class OutputCheck:
    """Compares one output tensor with the reference's, fed the candidate's values in chunks of
    its flattened order (on the reference's device): element-wise as torch.allclose
    (|out - ref| <= atol + rtol * |ref|, NaN never close, equal infinities close), exact for
    integer and bool outputs, with one host synchronisation at the end. Keeps the candidate's
    values at the fingerprint's positions (see fingerprint) on the way."""

    def __init__(self, r, s, atol_scale=1.0, fused=None):
        """`fused`: a gpu/fused_check.py FusedCheck for the reference's device, which then folds a
        floating-point output's verdict and figures in one pass per piece (None: PyTorch's
        operations, as on CPU)."""
        self.flat = r.detach().reshape(-1).contiguous()
        self.dtype = r.dtype
        self.shape = tuple(r.shape)
        self.base_atol, self.rtol = _tolerance(r.dtype, s)
        self.atol = self.base_atol * atol_scale  # under another input distribution: its scale (judge.py)
        self.exact = not (r.is_floating_point() or r.is_complex())
        dev = self.flat.device
        self.zero = torch.zeros((), dtype=torch.float64, device=dev)
        self.mad, self.mrd = self.zero.clone(), self.zero.clone()
        self.bad_nonfinite = torch.zeros((), dtype=torch.bool, device=dev)
        self.close = torch.ones((), dtype=torch.bool, device=dev)
        self.d2, self.r2 = self.zero.clone(), self.zero.clone()  # sums of squares (scale rule)
        # max over elements of |out - ref| - (atol + rtol |ref|): how much more atol the output
        # would need (a slack given later decides, result()); and a NaN or Inf that is not the
        # reference's own value (no slack covers it)
        self.excess = torch.full((), -math.inf, dtype=torch.float64, device=dev)
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=dev)
        self.scale_tol = _scale_tolerance(r.dtype, s)
        self.pos = _sample_positions(self.flat.numel(), dev)
        self.samples = torch.zeros(self.pos.numel(), dtype=r.dtype, device=dev)
        self.fed = 0
        self.fused = fused if fused is not None and r.dtype in fused_check.KERNELS else None
        self.acc = self.fused.start(dev) if self.fused is not None else None
        # Whether feed() reads each value of a piece once (the exact comparison, the fused one):
        # then the judge may hand it the shared buffer itself, else a copy (judge.py _receive).
        self.reads_once = self.exact or self.fused is not None
        self._figures = None  # figures(), once every value is in

    def feed(self, oc):
        """The next len(oc) values of the candidate's output (a 1-d tensor of the reference's
        dtype, on its device)."""
        start, end = self.fed, self.fed + oc.numel()
        rc = self.flat[start:end]
        self.fed = end
        if start == end:
            return
        # The fingerprint's values in this piece, on the device (no host round trip per piece).
        inside = (self.pos >= start) & (self.pos < end)
        got = oc[(self.pos - start).clamp_(0, end - start - 1)]
        self.samples = torch.where(inside, got, self.samples)
        if self.exact:
            self.close &= (oc == rc).all()
            return
        if self.fused is not None:
            self.fused.feed(self.acc, oc.contiguous(), rc, self.atol, self.rtol)
            return
        finite_rc = _isfinite(rc)
        self.bad_nonfinite |= (~_isfinite(oc) & finite_rc).any()
        self.close &= _isclose(oc, rc, rtol=self.rtol, atol=self.atol).all()
        # The figures below in float32 (float64 for float64 outputs): a difference of two half or
        # bfloat16 values is exact there, of two float32 values within 2^-24 of itself; each pass
        # over an output of gigabytes costs the judge a pass, so as few as give every figure.
        work = torch.float64 if oc.dtype == torch.float64 else torch.float32
        rw = rc.to(work)
        d = torch.sub(oc.to(work), rw).abs_()
        both = _isfinite(d)  # infinities equal to the reference's are no difference
        self.nonfinite |= (~both & (oc != rc)).any()
        d.masked_fill_(~both, 0.0)
        ar = rw.abs()  # a new tensor: rw may be the reference itself
        self.excess = torch.maximum(self.excess, torch.add(d, ar, alpha=-self.rtol).max().double() - self.atol)
        self.mad = torch.maximum(self.mad, d.max().double())
        self.mrd = torch.maximum(self.mrd, torch.div(d, ar + 1e-12).max().double())
        self.d2 += torch.dot(d, d).double()
        ar.masked_fill_(~finite_rc, 0.0)
        self.r2 += torch.dot(ar, ar).double()

    def result(self, where, acc, slack=0.0):
        """'' or why the output differs; updates acc (max diffs, tolerances). `slack`: more atol
        allowed (the reference's own rounding error on another distribution's inputs, judge.py)."""
        if self.fed != self.flat.numel():
            return f"{where}: {self.fed} values, reference has {self.flat.numel()}"
        acc["atol"], acc["rtol"] = self.base_atol, self.rtol
        if self.exact:
            return "" if bool(self.close) else f"{where}: values differ"
        if self.flat.numel() == 0:
            return ""
        f = self.figures()
        acc["max_abs_diff"] = max(acc["max_abs_diff"], f["max_abs_diff"])
        acc["max_rel_diff"] = max(acc["max_rel_diff"], f["max_rel_diff"])
        if f["bad_nonfinite"]:
            return f"{where}: candidate output holds NaN or Inf where the reference is finite"
        if not f["close"] and (slack <= 0 or f["nonfinite"] or f["excess"] > slack):
            more = f" + {slack:.3g} for the reference's own rounding error on these inputs" if slack > 0 else ""
            return (f"{where}: values differ (max abs diff {f['max_abs_diff']:.3g}, "
                    f"atol {self.atol:.3g}{more}, rtol {self.rtol:g})")
        return ""

    def figures(self):
        """A floating-point output's accumulated comparison, on the host (one synchronisation):
        close (every element, as torch.isclose), bad_nonfinite (the candidate's NaN or Inf where
        the reference is finite), nonfinite (any non-finite difference between unequal values),
        excess (how much more atol the output would need), max_abs_diff, max_rel_diff, and the
        scale rule's sums of squares d2 (differences) and r2 (the reference's finite values).
        Fetched once the whole output is in (result() and scale() share it)."""
        if self._figures is not None and self.fed == self.flat.numel():
            return self._figures
        if self.fused is not None:
            a = self.acc.cpu().tolist()
            f = {"close": a[0] == 0, "bad_nonfinite": bool(a[1]), "nonfinite": bool(a[2]),
                 "excess": a[3] - self.atol, "max_abs_diff": a[4], "max_rel_diff": a[5], "d2": a[6], "r2": a[7]}
        else:
            a = torch.stack([self.close.double(), self.bad_nonfinite.double(), self.nonfinite.double(),
                             self.excess, self.mad, self.mrd, self.d2, self.r2]).cpu().tolist()
            f = {"close": bool(a[0]), "bad_nonfinite": bool(a[1]), "nonfinite": bool(a[2]),
                 "excess": a[3], "max_abs_diff": a[4], "max_rel_diff": a[5], "d2": a[6], "r2": a[7]}
        if self.fed == self.flat.numel():
            self._figures = f
        return f

    def scale(self):
        """The scale rule's figures for this output (after result() passed it): (error relative to
        the reference's scale, its root-mean-square difference, the reference's root-mean-square),
        or None where the rule does not apply (integer, bool or complex outputs, an empty output,
        a reference of exact zeros: there the element-wise check is exact enough)."""
        if self.exact or self.flat.is_complex() or self.flat.numel() == 0:
            return None
        f = self.figures()
        d2, r2 = f["d2"], f["r2"]
        if r2 <= 0.0:
            return None
        n = float(self.flat.numel())
        return math.sqrt(d2 / r2), math.sqrt(d2 / n), math.sqrt(r2 / n)

    def fingerprint(self):
        """The candidate's output's fingerprint entry (as fingerprint() would give it)."""
        return (self.shape, self.dtype, self.samples)


def structure_mismatch(refs, outs, where):
    """'' or why the candidate's flattened outputs (plain tensors, or (shape, dtype) pairs) cannot
    be compared with the reference's: their count, shapes or dtypes."""
    if len(refs) != len(outs):
        return f"{where}: {len(outs)} output tensors, reference has {len(refs)}"
    for i, (r, o) in enumerate(zip(refs, outs)):
        at = where + (f", output {i}" if len(refs) > 1 else "")
        shape, dtype = (tuple(o.shape), o.dtype) if isinstance(o, torch.Tensor) else o
        if tuple(shape) != tuple(r.shape):
            return f"{at}: shape {list(shape)} != reference {list(r.shape)}"
        if dtype != r.dtype:
            return f"{at}: dtype {dtype} != reference {r.dtype}"
    return ""


def compare(ref_out, out, s, trial, acc):
    """Compares one trial's outputs in this process (see OutputCheck); updates acc (max diffs);
    returns '' or why it failed. The judge (gpu/judge.py) compares the same way, fed through its
    link to the candidate's process."""
    try:
        refs = _flatten(ref_out)
    except TypeError as e:
        raise ValueError(f"reference returned an unsupported {e}")
    try:
        outs = _flatten(out)
    except TypeError as e:
        return f"trial {trial}: candidate returned an unsupported {e}"
    for o in outs:
        if type(o) not in _PLAIN_TENSORS:
            # A subclass's methods are the candidate's code, run by the comparison itself.
            return f"trial {trial}: candidate returned a {type(o).__name__} (expected a plain torch.Tensor)"
    why = structure_mismatch(refs, outs, f"trial {trial}")
    if why:
        return why
    for i, (r, o) in enumerate(zip(refs, outs)):
        check = OutputCheck(r, s)
        for oc in _chunks(o.detach()):
            check.feed(oc.to(r.device))
        where = f"trial {trial}" + (f", output {i}" if len(refs) > 1 else "")
        why = check.result(where, acc) or scale_failure(where, note_scale(check, acc), check.scale_tol)
        if why:
            return why
    return ""


def rms(t, fused=None):
    """The root-mean-square of a tensor's finite values (0 for an empty or non-floating one);
    `fused` (a gpu/fused_check.py FusedCheck): in one pass on its GPU."""
    if not t.is_floating_point() or t.numel() == 0:
        return 0.0
    if fused is not None and t.is_cuda and t.dtype in fused_check.KERNELS:
        return math.sqrt(fused.sum_squares(t) / t.numel())
    total = 0.0
    for c in _chunks(t.detach()):
        c = c.double()
        total += float(torch.where(_isfinite(c), c, torch.zeros((), dtype=c.dtype, device=c.device)).square().sum())
    return math.sqrt(total / t.numel())


def all_finite(t):
    """Whether every value of a floating-point tensor is finite (one host synchronisation)."""
    ok = torch.ones((), dtype=torch.bool, device=t.device)
    for c in _chunks(t.detach()):
        ok &= _isfinite(c).all()
    return bool(ok)


def note_scale(check, acc):
    """check.scale(), recorded in acc (the worst error relative to the scale, the rule's tolerance)."""
    figures = check.scale()
    acc["scale_tol"] = check.scale_tol
    if figures is not None:
        acc["max_scale_err"] = max(acc.get("max_scale_err", 0.0), figures[0])
    return figures


# Positions sampled by a fingerprint: enough that two different tensors of real data share all
# of them with vanishing probability, few enough that any number of them can be kept.
FINGERPRINT_SAMPLES = 4096


def _sample_positions(numel, device):
    if numel <= FINGERPRINT_SAMPLES:
        return torch.arange(numel, device=device)
    g = torch.Generator(device="cpu").manual_seed(numel)
    return torch.randint(0, numel, (FINGERPRINT_SAMPLES,), generator=g).to(device)


def fingerprint(out):
    """A small record of an output (shapes, dtypes and a few thousand values at positions fixed
    by its size) that later outputs can be matched against without keeping the output."""
    fp = []
    for t in _flatten(out):
        t = t.detach()
        flat = t.reshape(-1)
        fp.append((tuple(t.shape), t.dtype, flat[_sample_positions(flat.numel(), flat.device)].clone()))
    return fp


def matches_fingerprint(out, fp, s):
    """Whether `out` agrees with a fingerprint at its sampled positions (within tolerance)."""
    try:
        return fingerprints_agree(fingerprint(out), fp, s)
    except TypeError:
        return False


def fingerprints_agree(a, b, s):
    """Whether two fingerprints have the same shapes and dtypes and agree at every sampled
    position (within the tolerance of the dtype)."""
    if len(a) != len(b):
        return False
    for (shape, dtype, got), (shape_b, dtype_b, vals) in zip(a, b):
        if shape != shape_b or dtype != dtype_b:
            return False
        got = got.to(vals.device)
        if got.is_floating_point() or got.is_complex():
            atol, rtol = _tolerance(dtype, s)
            if not bool(_isclose(got, vals, rtol=rtol, atol=atol).all()):
                return False
        elif not bool((got == vals).all()):
            return False
    return True


_WEIGHTS = {}


def digest(out, fused=None):
    """An exact checksum of every bit of an output: per tensor, the sum of its 32-bit words (or
    bytes) and their sum weighted by position, in chunks, on the output's device. Equal digests of
    one tensor read twice mean unchanged contents (up to a collision no real kernel produces).
    With `fused` (gpu/fused_check.py Digest, of the output's device) a tensor on that device is
    read once by one kernel; the figures are the same, bit for bit."""
    sums = []
    for t in _flatten(out):
        flat = t.detach().reshape(-1)
        if flat.numel() == 0:
            sums.append(0)
            continue
        raw = flat.view(torch.uint8)
        words = raw.view(torch.int32) if raw.numel() % 4 == 0 and raw.data_ptr() % 4 == 0 else raw
        if fused is not None and words.device == fused.device:
            sums.append(fused(words))
            continue
        key = (words.device, CHUNK)
        w = _WEIGHTS.get(key)
        if w is None:
            w = _WEIGHTS[key] = (torch.arange(CHUNK, device=words.device) % 65521 + 1).to(torch.int32)
        s1 = torch.zeros((), dtype=torch.int64, device=words.device)
        s2 = torch.zeros((), dtype=torch.int64, device=words.device)
        for c in _chunks(words):
            v = c.to(torch.int64)
            s1 += v.sum()
            s2 += (v * w[:v.numel()]).sum()
        sums.append(torch.stack([s1, s2]))
    return [x if isinstance(x, int) else tuple(x.cpu().tolist()) for x in sums]
