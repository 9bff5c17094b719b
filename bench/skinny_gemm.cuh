// Matrix products for few rows, as the decode step needs them: y [M, N] = x [M, K] W [N, K]^T
// (+ bias), bf16 in and out, float32 accumulation, M <= 64. Header-only CUDA, an experiment that
// bench/gemm_probe.cu times beside cuBLASLt; the decoder does not use it (measured slower, see
// docs/BENCHMARKS.md, "Products of our own").
//
// At M <= 64 the product is a stream of W: every byte of it is read once and used M times.
// W goes straight into the tensor cores' B fragments and x into their A fragments:
//  - mma.sync m16n8k16 wants, of thread (g = lane / 4, t = lane % 4), B at k {2t, 2t+1, 2t+8,
//    2t+9} of column g and A at the same k of rows g and g + 8. Reading logical k 2t+i as memory
//    k 8t+i and 2t+8+i as 8t+2+i (the same on both operands, so the sum runs over the same
//    pairs), a 32-wide chunk of k is one 16-byte load a thread for each 8 rows of W (k 8t..8t+7:
//    its halves are the chunk's two mma steps) and for each 8 rows of x.
//  - A warp owns 16 outputs (two n-tiles) and every row (MT m-tiles of 16); a block of NW warps
//    owns 16 NW outputs. Version 1 loads W from global memory into registers kDepth chunks ahead
//    of use; version 2 copies it into a per-warp shared-memory ring (cp.async, 256 contiguous bytes
//    of a row a stage). x (small, read by every warp) is loaded through L1.
//  - K is split over `splits` blocks of one thread-block cluster (Hopper): each writes its float32
//    partial tile to its shared memory, and after a cluster barrier each block sums one slice of
//    the tile's rows across the cluster's shared memories (in a fixed order: deterministic), adds
//    the bias and stores bf16. No partials go through global memory and no second kernel runs.
#pragma once

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

namespace kernelrl::cuda::skinny {

constexpr int kChunk = 32;  // k per step: one 16-byte load a thread per 8 rows
constexpr int kDepth = 4;   // chunks of W in flight per warp
constexpr int kMaxRows = 64;
constexpr int kMaxSplits = 16;

__device__ __forceinline__ uint4 ld_stream(const void* p) {
  uint4 r;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
  return r;
}

__device__ __forceinline__ void mma16816(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_bf16(float a, float b) {
  __nv_bfloat162 v = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<uint32_t*>(&v);
}

// The block's output tile from each warp's accumulators (rows g and g + 8, outputs 2t and 2t + 1
// of its two n-tiles): with one split straight to y (+ bias); with more, through `red` (this
// block's shared memory, MT * 16 rows of 16 NW + 4 floats) and the cluster: each block sums one
// slice of the rows over the cluster's blocks in rank order, adds the bias and stores bf16.
template <int MT, int NW>
__device__ __forceinline__ void store_tile(const float (&acc)[MT][2][4], float* red,
                                           const __nv_bfloat16* __restrict__ bias, __nv_bfloat16* __restrict__ y, int M,
                                           int N) {
  constexpr int BN = NW * 16, LD = BN + 4;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int splits = gridDim.x, split = blockIdx.x;
  const int nw0 = blockIdx.y * BN + warp * 16;
  if (splits == 1) {  // straight from the accumulators: rows g and g + 8, outputs 2t and 2t + 1
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int n = nw0 + j * 8 + 2 * t;
      float bx = 0.f, by = 0.f;
      if (bias) bx = __bfloat162float(bias[n]), by = __bfloat162float(bias[n + 1]);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int r = mt * 16 + g + 8 * h;
          if (r < M)
            *reinterpret_cast<uint32_t*>(y + int64_t(r) * N + n) =
                pack_bf16(acc[mt][j][2 * h] + bx, acc[mt][j][2 * h + 1] + by);
        }
    }
    return;
  }

  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
#pragma unroll
  for (int j = 0; j < 2; ++j)
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        *reinterpret_cast<float2*>(&red[(mt * 16 + g + 8 * h) * LD + warp * 16 + j * 8 + 2 * t]) =
            make_float2(acc[mt][j][2 * h], acc[mt][j][2 * h + 1]);
  cl.sync();
  // This block's slice of the tile's rows, summed over the cluster in rank order.
  const int rows = min(M, MT * 16), per = (rows + splits - 1) / splits;
  const int r0 = split * per, r1 = min(rows, r0 + per);
  const int n0 = blockIdx.y * BN;
  for (int e = threadIdx.x; e < (r1 - r0) * (BN / 4); e += NW * 32) {
    const int r = r0 + e / (BN / 4), col = (e % (BN / 4)) * 4;
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q = 0; q < splits; ++q) {
      const float4 v = *reinterpret_cast<const float4*>(cl.map_shared_rank(&red[r * LD + col], q));
      s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    if (bias) {
      s.x += __bfloat162float(bias[n0 + col]), s.y += __bfloat162float(bias[n0 + col + 1]);
      s.z += __bfloat162float(bias[n0 + col + 2]), s.w += __bfloat162float(bias[n0 + col + 3]);
    }
    *reinterpret_cast<uint2*>(y + int64_t(r) * N + n0 + col) = make_uint2(pack_bf16(s.x, s.y), pack_bf16(s.z, s.w));
  }
  cl.sync();  // no block leaves while another still reads its shared memory
}

// grid (splits, N / (16 NW)), cluster (splits, 1, 1), NW * 32 threads; dynamic shared memory
// MT * 16 * (16 NW + 4) floats when splits > 1.
template <int MT, int NW>
__global__ void __launch_bounds__(NW * 32)
    gemm_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ W,
                const __nv_bfloat16* __restrict__ bias, __nv_bfloat16* __restrict__ y, int M, int N, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int BN = NW * 16;
  extern __shared__ float red[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int splits = gridDim.x, split = blockIdx.x;
  const int nw0 = blockIdx.y * BN + warp * 16;  // the warp's first output
  const int nch = K / kChunk, c0 = int(int64_t(split) * nch / splits), c1 = int(int64_t(split + 1) * nch / splits);

  const __nv_bfloat16* w0 = W + int64_t(nw0 + g) * K + 8 * t;
  const __nv_bfloat16* w1 = w0 + int64_t(8) * K;
  const __nv_bfloat16* xr[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    xr[mt][0] = x + int64_t(min(mt * 16 + g, M - 1)) * K + 8 * t;
    xr[mt][1] = x + int64_t(min(mt * 16 + g + 8, M - 1)) * K + 8 * t;
  }
  float acc[MT][2][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;

  uint4 wr[kDepth][2];
#pragma unroll
  for (int u = 0; u < kDepth; ++u)
    if (c0 + u < c1) {
      wr[u][0] = ld_stream(w0 + (c0 + u) * kChunk);
      wr[u][1] = ld_stream(w1 + (c0 + u) * kChunk);
    }
  for (int c = c0; c < c1; c += kDepth) {
#pragma unroll
    for (int u = 0; u < kDepth; ++u) {
      const int cc = c + u;
      if (cc < c1) {
        uint4 xa[MT], xb[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          xa[mt] = __ldg(reinterpret_cast<const uint4*>(xr[mt][0] + cc * kChunk));
          xb[mt] = __ldg(reinterpret_cast<const uint4*>(xr[mt][1] + cc * kChunk));
        }
        const uint4 b0 = wr[u][0], b1 = wr[u][1];
        if (cc + kDepth < c1) {
          wr[u][0] = ld_stream(w0 + (cc + kDepth) * kChunk);
          wr[u][1] = ld_stream(w1 + (cc + kDepth) * kChunk);
        }
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma16816(acc[mt][0], xa[mt].x, xb[mt].x, xa[mt].y, xb[mt].y, b0.x, b0.y);
          mma16816(acc[mt][1], xa[mt].x, xb[mt].x, xa[mt].y, xb[mt].y, b1.x, b1.y);
          mma16816(acc[mt][0], xa[mt].z, xb[mt].z, xa[mt].w, xb[mt].w, b0.z, b0.w);
          mma16816(acc[mt][1], xa[mt].z, xb[mt].z, xa[mt].w, xb[mt].w, b1.z, b1.w);
        }
      }
    }
  }

  store_tile<MT, NW>(acc, red, bias, y, M, N);
#else
  __trap();
#endif
}

// Version 2: W through a per-warp ring of shared memory filled by cp.async, 256 contiguous bytes a
// row a stage (16 lanes a row: long runs for DRAM), 16-byte units of odd rows XOR-swizzled by 4 so
// that the fragment reads (rows g and g+1 of one phase) fall in distinct banks. Each warp owns its
// ring (no block barrier, only __syncwarp). x as in version 1, one 32-k step ahead.
constexpr int kStageK = 128;  // k per stage: 256 bytes of each row
constexpr int kStages = 4;

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(a), "l"(gmem) : "memory");
}

template <int MT, int NW>
__global__ void __launch_bounds__(NW * 32)
    gemm2_kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ W,
                 const __nv_bfloat16* __restrict__ bias, __nv_bfloat16* __restrict__ y, int M, int N, int K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int BN = NW * 16;
  constexpr int kRing = kStages * 16 * kStageK * 2;  // bytes of one warp's ring
  extern __shared__ __align__(16) unsigned char smem_raw[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  unsigned char* ring = smem_raw + warp * kRing;
  const int splits = gridDim.x, split = blockIdx.x;
  const int nw0 = blockIdx.y * BN + warp * 16;
  const int nst = K / kStageK, s0 = int(int64_t(split) * nst / splits), s1 = int(int64_t(split + 1) * nst / splits);

  // Copy role: lane copies unit (lane & 15) of rows 2i + (lane >> 4), i = 0..7.
  const int cu = lane & 15, crow = lane >> 4;
  const __nv_bfloat16* wsrc = W + int64_t(nw0 + crow) * K + cu * 8;
  auto issue = [&](int st) {
    if (st < s1) {
      unsigned char* dst = ring + (st % kStages) * (16 * kStageK * 2);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int row = 2 * i + crow;
        cp_async16(dst + row * (kStageK * 2) + ((cu ^ ((row & 1) << 2)) * 16),
                   wsrc + int64_t(2 * i) * K + int64_t(st) * kStageK);
      }
    }
    asm volatile("cp.async.commit_group;" ::: "memory");
  };

  const __nv_bfloat16* xr[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
    xr[mt][0] = x + int64_t(min(mt * 16 + g, M - 1)) * K + 8 * t;
    xr[mt][1] = x + int64_t(min(mt * 16 + g + 8, M - 1)) * K + 8 * t;
  }
  float acc[MT][2][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mt][j][e] = 0.f;

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) issue(s0 + i);
  uint4 xa[2][MT], xb[2][MT];
  auto load_x = [&](int buf, int k) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      xa[buf][mt] = __ldg(reinterpret_cast<const uint4*>(xr[mt][0] + k));
      xb[buf][mt] = __ldg(reinterpret_cast<const uint4*>(xr[mt][1] + k));
    }
  };
  if (s0 < s1) load_x(0, s0 * kStageK);
  const int sw = (g & 1) << 2;
  for (int st = s0; st < s1; ++st) {
    asm volatile("cp.async.wait_group %0;" ::"n"(kStages - 2) : "memory");
    __syncwarp();
    issue(st + kStages - 1);
    const unsigned char* src = ring + (st % kStages) * (16 * kStageK * 2);
#pragma unroll
    for (int q = 0; q < kStageK / kChunk; ++q) {
      const int cur = q & 1;
      if (q + 1 < kStageK / kChunk)
        load_x(cur ^ 1, st * kStageK + (q + 1) * kChunk);
      else if (st + 1 < s1)
        load_x(cur ^ 1, (st + 1) * kStageK);
      const uint4 b0 = *reinterpret_cast<const uint4*>(src + g * (kStageK * 2) + (((q * 4 + t) ^ sw) * 16));
      const uint4 b1 = *reinterpret_cast<const uint4*>(src + (g + 8) * (kStageK * 2) + (((q * 4 + t) ^ sw) * 16));
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        const uint4 a = xa[cur][mt], b = xb[cur][mt];
        mma16816(acc[mt][0], a.x, b.x, a.y, b.y, b0.x, b0.y);
        mma16816(acc[mt][1], a.x, b.x, a.y, b.y, b1.x, b1.y);
        mma16816(acc[mt][0], a.z, b.z, a.w, b.w, b0.z, b0.w);
        mma16816(acc[mt][1], a.z, b.z, a.w, b.w, b1.z, b1.w);
      }
    }
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");

  if (gridDim.x > 1) __syncthreads();  // the partial tile reuses the rings once every warp is done
  store_tile<MT, NW>(acc, reinterpret_cast<float*>(smem_raw), bias, y, M, N);
#else
  __trap();
#endif
}

// Whether the kernel takes this product: M <= 64 rows, N a multiple of 64, K of 32, 16-byte
// aligned rows (K % 8 == 0 follows), on a device of compute capability 9.0 or later.
inline bool supported(int M, int N, int K, int cc_major) {
  return cc_major >= 9 && M >= 1 && M <= kMaxRows && N % 64 == 0 && K % kChunk == 0 && K >= kChunk;
}

// The split of K that gives about `waves` blocks an SM without fewer than 4 chunks a block.
inline int auto_splits(int N, int K, int sms, int nw = 4) {
  const int blocks = N / (16 * nw), nch = K / kChunk;
  int s = 1;
  while (s < 8 && blocks * s < 2 * sms && nch / (2 * s) >= 4) s *= 2;
  return s;
}

template <int MT, int NW, int VER>
inline cudaError_t launch_t(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, __nv_bfloat16* y,
                            int M, int N, int K, int splits, cudaStream_t st) {
  auto kern = VER == 2 ? gemm2_kernel<MT, NW> : gemm_kernel<MT, NW>;
  size_t smem = splits > 1 ? size_t(MT) * 16 * (16 * NW + 4) * sizeof(float) : 0;
  if (VER == 2) smem = std::max(smem, size_t(NW) * kStages * 16 * kStageK * 2);
  static bool attrs_set = false;  // per instantiation; the attributes are idempotent
  if (!attrs_set) {
    cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, 160 * 1024);
    attrs_set = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(splits, N / (16 * NW), 1);
  cfg.blockDim = dim3(NW * 32, 1, 1);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = splits;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kern, x, W, bias, y, M, N, K);
}

// y = x W^T (+ bias): NW warps a block (2, 4 or 8), K split over `splits` blocks (1..16).
inline cudaError_t gemm(const __nv_bfloat16* x, const __nv_bfloat16* W, const __nv_bfloat16* bias, __nv_bfloat16* y,
                        int M, int N, int K, int splits, int nw, cudaStream_t st, int ver = 2) {
  if (splits < 1 || splits > kMaxSplits || K / kChunk < splits || N % (16 * nw) != 0) return cudaErrorInvalidValue;
  if (ver == 2 && (K % kStageK != 0 || K / kStageK < splits)) return cudaErrorInvalidValue;
  const int mt = (M + 15) / 16;
#define KERNELRL_SKINNY_CASE(MT_, NW_)                                          \
  if (mt == MT_ && nw == NW_)                                                   \
    return ver == 2 ? launch_t<MT_, NW_, 2>(x, W, bias, y, M, N, K, splits, st) \
                    : launch_t<MT_, NW_, 1>(x, W, bias, y, M, N, K, splits, st);
#define KERNELRL_SKINNY_NW(MT_) KERNELRL_SKINNY_CASE(MT_, 2) KERNELRL_SKINNY_CASE(MT_, 4) KERNELRL_SKINNY_CASE(MT_, 8)
  KERNELRL_SKINNY_NW(1)
  KERNELRL_SKINNY_NW(2)
  KERNELRL_SKINNY_NW(3)
  KERNELRL_SKINNY_NW(4)
#undef KERNELRL_SKINNY_NW
#undef KERNELRL_SKINNY_CASE
  return cudaErrorInvalidValue;
}

// Asks L2 to fetch [p, p + bytes) (Hopper's bulk prefetch, cp.async.bulk.prefetch.L2): one warp
// issues it in 32 KB pieces and exits; the copy engine fetches while later kernels run. For a
// weight that a coming product will read, queued before a kernel that leaves DRAM idle (the
// attention). No effect before compute capability 9.0.
__global__ void prefetch_l2_kernel(const char* p, size_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr size_t kPiece = 32 * 1024;
  for (size_t off = size_t(threadIdx.x) * kPiece; off < bytes; off += 32 * kPiece) {
    const uint32_t n = uint32_t(bytes - off < kPiece ? bytes - off : kPiece) & ~15u;
    if (n) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
  }
#endif
}

inline void prefetch_l2(const void* p, size_t bytes, cudaStream_t st) {
  prefetch_l2_kernel<<<1, 32, 0, st>>>(static_cast<const char*>(p), bytes);
}

}  // namespace kernelrl::cuda::skinny
