"""The judge's comparison of a floating-point output with the reference's, on a GPU, in one pass.

gpu/checks.py OutputCheck compares with PyTorch operations: torch.isclose for the verdict, then
the figures (largest absolute and relative difference, the excess over the tolerance, the scale
rule's sums of squares, whether a non-finite value differs). That is about a dozen elementwise
passes over each piece of the candidate's output; for a 6.4 GB output, checked a dozen times per
candidate, it was most of the judge's time. Here one kernel reads each pair of values once and
folds every figure into eight accumulators on the device:

  0 elements not close        1 candidate non-finite where the reference is finite
  2 a non-finite difference between unequal values
  3 max (|out - ref| - rtol |ref|) over finite references      4 max |out - ref|
  5 max |out - ref| / (|ref| + 1e-12)   6 sum |out - ref|^2   7 sum |ref|^2 over finite references

The verdict is torch.isclose's, bit for bit: its arithmetic in the output's own dtype (for half
and bfloat16, each intermediate rounded to it as PyTorch's kernels store it), no fused
multiply-add. The figures are computed as OutputCheck computes them (differences in float32, or
float64 for float64 outputs), their sums in float64.

Compiled at run time with NVRTC (PyTorch's copy of the library), once per worker: its device
probe compiles both programs here and every process it forks (the judge, candidates' processes)
loads the cubins. Where that fails the caller keeps the PyTorch operations and says why.

Digest (below): the side-stream check's exact digest of an output (gpu/checks.py digest), in one
read of it.
"""

import torch

SOURCE = r"""
typedef unsigned short u16;

__device__ __forceinline__ float h2f(u16 x) { float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x)); return f; }
__device__ __forceinline__ float bf2f(u16 x) { return __uint_as_float(((unsigned)x) << 16); }

struct F16 {
    typedef u16 S; typedef float W; enum { V = 8 };
    static __device__ __forceinline__ float load(u16 x) { return h2f(x); }
    static __device__ __forceinline__ float rnd(float f) {
        u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h2f(h);
    }
};
struct BF16 {
    typedef u16 S; typedef float W; enum { V = 8 };
    static __device__ __forceinline__ float load(u16 x) { return bf2f(x); }
    static __device__ __forceinline__ float rnd(float f) {  // round to nearest even, as c10::BFloat16
        if (f != f) return __uint_as_float(0x7fc00000u);
        unsigned u = __float_as_uint(f);
        u += 0x7fffu + ((u >> 16) & 1u);
        return __uint_as_float(u & 0xffff0000u);
    }
};
struct F32 {
    typedef float S; typedef float W; enum { V = 8 };
    static __device__ __forceinline__ float load(float x) { return x; }
    static __device__ __forceinline__ float rnd(float f) { return f; }
};
struct F64 {
    typedef double S; typedef double W; enum { V = 4 };
    static __device__ __forceinline__ double load(double x) { return x; }
    static __device__ __forceinline__ double rnd(double f) { return f; }
};

__device__ __forceinline__ void atomic_max(double* p, double v) {
    unsigned long long* q = (unsigned long long*)p;
    unsigned long long old = *q;
    while (v > __longlong_as_double(old)) {
        unsigned long long seen = atomicCAS(q, old, __double_as_longlong(v));
        if (seen == old) break;
        old = seen;
    }
}

template <class T>
__device__ void check(const typename T::S* out, const typename T::S* ref, int n, double atol,
                      double rtol, double* acc) {
    typedef typename T::W W;
    const W at = (W)atol, rt = (W)rtol;
    int notclose = 0, badnf = 0, nf = 0;
    double excess = __longlong_as_double(0xfff0000000000000ULL), d2 = 0.0, r2 = 0.0;
    W mad = 0, mrd = 0;
    // V independent, coalesced loads of each side in flight per thread (one load at a time
    // leaves the kernel bound by latency, at about a fifth of the memory's bandwidth).
    const long long threads = (long long)gridDim.x * blockDim.x;
    for (long long base = (long long)blockIdx.x * blockDim.x + threadIdx.x; base < n; base += threads * T::V) {
        typename T::S os[T::V], rs[T::V];
#pragma unroll
        for (int j = 0; j < T::V; ++j) {
            const long long i = base + j * threads;
            if (i < n) { os[j] = out[i]; rs[j] = ref[i]; }
        }
#pragma unroll
        for (int j = 0; j < T::V; ++j) {
            if (base + j * threads >= n) break;
            const W a = T::load(os[j]), b = T::load(rs[j]);
            const bool fb = isfinite(b);
            // torch.isclose(out, ref, rtol, atol): equal, or a finite |a - b| within atol + |rtol b|
            const W allowed = T::rnd(at + fabs(T::rnd(rt * b)));
            const W actual = fabs(T::rnd(a - b));
            notclose |= !(a == b || (isfinite(actual) && actual <= allowed));
            badnf |= !isfinite(a) && fb;
            W d = fabs(a - b);
            if (!isfinite(d)) {  // equal infinities are no difference; anything else non-finite is
                nf |= a != b;
                d = 0;
            }
            const W ar = fabs(b);
            if (fb) {
                excess = fmax(excess, (double)d - rtol * (double)ar);
                r2 += (double)ar * (double)ar;
            }
            mad = fmax(mad, d);
            mrd = fmax(mrd, d / (ar + (W)1e-12));
            d2 += (double)d * (double)d;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        notclose |= __shfl_down_sync(0xffffffffu, notclose, o);
        badnf |= __shfl_down_sync(0xffffffffu, badnf, o);
        nf |= __shfl_down_sync(0xffffffffu, nf, o);
        excess = fmax(excess, __shfl_down_sync(0xffffffffu, excess, o));
        mad = fmax(mad, __shfl_down_sync(0xffffffffu, mad, o));
        mrd = fmax(mrd, __shfl_down_sync(0xffffffffu, mrd, o));
        d2 += __shfl_down_sync(0xffffffffu, d2, o);
        r2 += __shfl_down_sync(0xffffffffu, r2, o);
    }
    __shared__ double part[32][8];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        part[warp][0] = notclose; part[warp][1] = badnf; part[warp][2] = nf; part[warp][3] = excess;
        part[warp][4] = mad; part[warp][5] = mrd; part[warp][6] = d2; part[warp][7] = r2;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double v[8];
        for (int k = 0; k < 8; ++k) v[k] = part[0][k];
        for (int w = 1; w < (int)(blockDim.x >> 5); ++w) {
            for (int k = 0; k < 6; ++k) v[k] = fmax(v[k], part[w][k]);
            v[6] += part[w][6];
            v[7] += part[w][7];
        }
        for (int k = 0; k < 6; ++k) atomic_max(acc + k, v[k]);
        atomicAdd(acc + 6, v[6]);
        atomicAdd(acc + 7, v[7]);
    }
}

extern "C" __global__ void check_f16(const u16* o, const u16* r, int n, double atol, double rtol, double* acc) { check<F16>(o, r, n, atol, rtol, acc); }
extern "C" __global__ void check_bf16(const u16* o, const u16* r, int n, double atol, double rtol, double* acc) { check<BF16>(o, r, n, atol, rtol, acc); }
extern "C" __global__ void check_f32(const float* o, const float* r, int n, double atol, double rtol, double* acc) { check<F32>(o, r, n, atol, rtol, acc); }
extern "C" __global__ void check_f64(const double* o, const double* r, int n, double atol, double rtol, double* acc) { check<F64>(o, r, n, atol, rtol, acc); }
"""

KERNELS = {torch.float16: "check_f16", torch.bfloat16: "check_bf16", torch.float32: "check_f32",
           torch.float64: "check_f64"}
THREADS = 256
FIELDS = 8


class FusedCheck:
    """The compiled kernels of one device."""

    def __init__(self, device):
        props = torch.cuda.get_device_properties(device)
        self.kernels = _load_module("check", device, KERNELS.values())
        self.blocks = props.multi_processor_count * 8

    def start(self, device):
        """A fresh set of accumulators (see the module's docstring)."""
        acc = torch.zeros(FIELDS, dtype=torch.float64, device=device)
        acc[3] = -float("inf")
        return acc

    def feed(self, acc, out, ref, atol, rtol):
        """Folds a piece: `out` and `ref` contiguous 1-d tensors of the same floating dtype, on
        the current device, fewer than 2^31 elements."""
        n = out.numel()
        if n == 0:
            return
        blocks = min(self.blocks, -(-n // THREADS))
        self.kernels[KERNELS[out.dtype]](grid=(blocks, 1, 1), block=(THREADS, 1, 1),
                                         args=[out, ref, n, float(atol), float(rtol), acc])

    def sum_squares(self, t):
        """The sum of squares of a tensor's finite values, in float64 (the accumulator the
        reference's side of a comparison fills, fed the tensor as both sides)."""
        acc = self.start(t.device)
        flat = t.detach().reshape(-1).contiguous()
        for a in range(0, flat.numel(), 1 << 30):
            c = flat[a:a + (1 << 30)]
            self.feed(acc, c, c, 0.0, 0.0)
        return float(acc[7])


_LOADED = {}


def _load_once(kind, device, make, what):
    """(make(index), '') for a CUDA device, once per process and device, or (None, why not)."""
    device = torch.device(device)
    if device.type != "cuda":
        return None, "not on a GPU"
    index = device.index if device.index is not None else torch.cuda.current_device()
    if (kind, index) not in _LOADED:
        try:
            _LOADED[kind, index] = (make(index), "")
        except Exception as e:  # the run-time compiler or its library missing, a driver refusal
            _LOADED[kind, index] = (None, f"the fused {what} is not loaded here: {str(e).strip()[:300]}")
    return _LOADED[kind, index]


def load(device):
    """(FusedCheck, '') for a CUDA device, or (None, why not)."""
    return _load_once("check", device, FusedCheck, "comparison")

# The exact digest of gpu/checks.py digest() in one read of the tensor: per tensor, the sum of its
# 32-bit words (or bytes) and their sum weighted by (position mod DIGEST_CHUNK) mod 65521 + 1, both
# modulo 2^64 as PyTorch's int64 sums wrap. PyTorch's operations for the same figures write and
# read int64 copies of every chunk (about a dozen bytes moved per byte digested); the side-stream
# check digests a candidate's output twice.
DIGEST_SOURCE = r"""
typedef unsigned long long u64;
#define V 8

template <class W>
__device__ void digest(const W* x, int n, u64* acc) {
    u64 s1 = 0, s2 = 0;
    const long long threads = (long long)gridDim.x * blockDim.x;
    for (long long base = (long long)blockIdx.x * blockDim.x + threadIdx.x; base < n; base += threads * V) {
        W v[V];
#pragma unroll
        for (int j = 0; j < V; ++j) {
            const long long i = base + j * threads;
            if (i < n) v[j] = x[i];
        }
#pragma unroll
        for (int j = 0; j < V; ++j) {
            const long long i = base + j * threads;
            if (i >= n) break;
            const long long w = (long long)((i & (DIGEST_CHUNK - 1)) % 65521) + 1;
            const long long value = (long long)v[j];
            s1 += (u64)value;
            s2 += (u64)(value * w);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        s1 += __shfl_down_sync(0xffffffffu, s1, o);
        s2 += __shfl_down_sync(0xffffffffu, s2, o);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(acc, s1);
        atomicAdd(acc + 1, s2);
    }
}

extern "C" __global__ void digest_i32(const int* x, int n, u64* acc) { digest<int>(x, n, acc); }
extern "C" __global__ void digest_u8(const unsigned char* x, int n, u64* acc) { digest<unsigned char>(x, n, acc); }
"""

DIGEST_CHUNK = 1 << 24  # gpu/checks.py CHUNK: the weights restart at each chunk
DIGEST_KERNELS = {torch.int32: "digest_i32", torch.uint8: "digest_u8"}
DIGEST_PIECE = 1 << 30  # elements a launch (an int count; a multiple of DIGEST_CHUNK)

_CUBINS = {}  # (program, arch "90") -> (cubin bytes or None, why not)


def _nvrtc_cubin(source, arch, options=()):
    """source compiled by NVRTC for sm_<arch>, as a cubin (no CUDA context is needed: a
    process that must stay CUDA-free, the worker, compiles for its children)."""
    import ctypes
    from torch.cuda import _utils as cu
    lib = cu._get_gpu_rtc_library()
    prog = ctypes.c_void_p()

    def check(rc, what):
        if rc != 0:
            lib.nvrtcGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: {lib.nvrtcGetErrorString(rc).decode()}")

    check(lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), b"fused_check.cu", 0, None, None),
          "nvrtcCreateProgram")
    try:
        opts = [f"--gpu-architecture=sm_{arch}".encode()] + [o.encode() for o in options]
        rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
        if rc != 0:
            size = ctypes.c_size_t()
            lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
            log = ctypes.create_string_buffer(size.value)
            lib.nvrtcGetProgramLog(prog, log)
            raise RuntimeError(f"nvrtcCompileProgram: {log.value.decode(errors='replace')[:600]}")
        size = ctypes.c_size_t()
        check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
        out = ctypes.create_string_buffer(size.value)
        check(lib.nvrtcGetCUBIN(prog, out), "nvrtcGetCUBIN")
        return out.raw
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


def programs():
    """program -> (source, NVRTC options). The comparison compiles without fused multiply-add:
    torch.isclose's arithmetic, bit for bit (see the module's docstring)."""
    return {"check": (SOURCE, ("--fmad=false",)),
            "digest": (DIGEST_SOURCE, (f"-DDIGEST_CHUNK={DIGEST_CHUNK}LL",))}


def cubin(program, arch):
    """(program's cubin for sm_<arch>, '') or (None, why not), compiled once per process.
    NVRTC initialises the CUDA driver: the worker, which forks CUDA users, keeps the copies its
    device probe compiled (keep_cubin), and the processes it forks inherit them (loading a cubin
    takes a fraction of a millisecond where compiling takes a tenth of a second)."""
    arch = str(arch).replace(".", "")
    if (program, arch) not in _CUBINS:
        source, options = programs()[program]
        try:
            _CUBINS[program, arch] = (_nvrtc_cubin(source, arch, options), "")
        except Exception as e:  # no NVRTC library, an architecture it does not know
            _CUBINS[program, arch] = (None, f"the fused {program} did not compile: {str(e).strip()[:300]}")
    return _CUBINS[program, arch]


def keep_cubin(program, arch, binary, why=""):
    """Keeps program's cubin for sm_<arch>, compiled elsewhere (None: why it was not)."""
    _CUBINS[program, str(arch).replace(".", "")] = (binary, "") if binary else (None, why or "no cubin")


def _load_module(program, index, names):
    """program's kernels `names` loaded on CUDA device `index` (raises why not)."""
    from torch.cuda import _utils as cu
    major, minor = torch.cuda.get_device_capability(index)
    binary, why = cubin(program, f"{major}{minor}")
    if binary is None:
        raise RuntimeError(why)
    with torch.cuda.device(index):
        return cu._cuda_load_module(binary, list(names))


class Digest:
    """The digest kernels loaded on one device."""

    def __init__(self, index):
        self.kernels = _load_module("digest", index, DIGEST_KERNELS.values())
        self.device = torch.device("cuda", index)
        self.blocks = torch.cuda.get_device_properties(index).multi_processor_count * 8

    def __call__(self, words):
        """(sum, weighted sum) of a contiguous 1-d int32 or uint8 tensor on this device, as two
        int64s (a tensor of 2 on the device: the caller reads it when it needs the figures)."""
        acc = torch.zeros(2, dtype=torch.int64, device=words.device)
        kernel = self.kernels[DIGEST_KERNELS[words.dtype]]
        for a in range(0, words.numel(), DIGEST_PIECE):
            piece = words[a:a + DIGEST_PIECE]
            n = piece.numel()
            blocks = min(self.blocks, -(-n // THREADS))
            kernel(grid=(blocks, 1, 1), block=(THREADS, 1, 1), args=[piece, n, acc])
        return acc


def load_digest(device):
    """(Digest, '') for a CUDA device, or (None, why not)."""
    return _load_once("digest", device, Digest, "digest")
