// Version 3 of the few-row product (bench/skinny_gemm.cuh has versions 1 and 2): y [M, N] =
// x [M, K] W [N, K]^T (+ bias), bf16 in and out, float32 accumulation, M <= 64, N and K multiples
// of 64. An experiment that bench/gemm_probe.cu (mode `pdl`) times beside cuBLASLt; the decoder
// does not use it.
//
// What it tries: the products' fixed cost (4-5 us a call even with the weight in L2, measured)
// taken off the critical path by programmatic dependent launch. A block requests its first
// weight stages (cp.async into shared memory) before griddepcontrol.wait: the weight does not
// depend on the kernel before, so its bytes stream while that kernel ends; only the activations
// wait for it.
//  - A block owns BN = 64 outputs and a K range (split-K over gridDim.y); its 4 warps own 16
//    outputs each and every row. Each stage copies 64 K-columns of its W rows and of x's rows into
//    padded shared memory (row stride 72 bf16: the fragment loads below hit 32 distinct banks).
//  - Operands swapped for mma.sync m16n8k16: A = 16 rows of W (outputs), B = 8 rows of x, so that
//    M = 16 costs two m-tiles' worth of work, not the 64 of an M tile.
//  - Split-K: each block writes its float32 partial tile (L2, .cg) and the last block of a tile
//    (a counter per tile, left zero) sums the partials in split order (deterministic), adds the
//    bias and stores bf16.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "skinny_gemm.cuh"

#include <algorithm>
#include <cstdint>

namespace kernelrl::cuda::skinny3 {

constexpr int kBN = 64, kBK = 64, kLD = kBK + 8, kStages = 6, kThreads = 128;

__device__ __forceinline__ void cp16(void* s, const void* g) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(s))),
               "l"(g)
               : "memory");
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ uint32_t lds32(const __nv_bfloat16* p) { return *reinterpret_cast<const uint32_t*>(p); }
using skinny::mma16816;
// RT: n-tiles of 8 rows of x (M <= 8 RT). grid (N / 64, splits), 128 threads, smem_bytes(RT).
template <int RT>
__global__ void __launch_bounds__(kThreads)
    kernel(const __nv_bfloat16* __restrict__ x, const __nv_bfloat16* __restrict__ w,
           const __nv_bfloat16* __restrict__ bias, __nv_bfloat16* __restrict__ y, int M, int N, int K, int kps,
           float* __restrict__ part, int* __restrict__ counters) {
  extern __shared__ __align__(16) unsigned char smem[];
  __shared__ int last;
  __nv_bfloat16* ws = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* xs = ws + kStages * kBN * kLD;
  const int tile = blockIdx.x, split = blockIdx.y, S = gridDim.y;
  const int kb0 = split * kps;
  const int nkb = min(kps, K / kBK - kb0);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const __nv_bfloat16* wt = w + size_t(tile) * kBN * K + size_t(kb0) * kBK;
  const __nv_bfloat16* xt = x + size_t(kb0) * kBK;
  auto load_w = [&](int i) {
    __nv_bfloat16* d = ws + (i % kStages) * kBN * kLD;
    const __nv_bfloat16* s = wt + size_t(i) * kBK;
#pragma unroll
    for (int c = tid; c < kBN * 8; c += kThreads)
      cp16(d + (c >> 3) * kLD + (c & 7) * 8, s + size_t(c >> 3) * K + (c & 7) * 8);
  };
  auto load_x = [&](int i) {
    __nv_bfloat16* d = xs + (i % kStages) * (8 * RT) * kLD;
    const __nv_bfloat16* s = xt + size_t(i) * kBK;
    for (int c = tid; c < M * 8; c += kThreads)
      cp16(d + (c >> 3) * kLD + (c & 7) * 8, s + size_t(c >> 3) * K + (c & 7) * 8);
  };
  const int pre = min(kStages - 1, nkb);
  for (int i = 0; i < pre; ++i) load_w(i);  // before the kernel before has ended
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < pre) load_x(i);
    commit();
  }
  float acc[RT][4];
#pragma unroll
  for (int j = 0; j < RT; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
  for (int i = 0; i < nkb; ++i) {
    wait_group<kStages - 2>();
    __syncthreads();  // stage i is everyone's; stage i - 1 is read by no one any more
    const int nx = i + kStages - 1;
    if (nx < nkb) {
      load_w(nx);
      load_x(nx);
    }
    commit();
    const __nv_bfloat16* a = ws + (i % kStages) * kBN * kLD + (warp * 16 + g) * kLD + 2 * t;
    const __nv_bfloat16* b = xs + (i % kStages) * (8 * RT) * kLD + g * kLD + 2 * t;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      const uint32_t a0 = lds32(a + kk), a1 = lds32(a + 8 * kLD + kk), a2 = lds32(a + kk + 8),
                     a3 = lds32(a + 8 * kLD + kk + 8);
#pragma unroll
      for (int j = 0; j < RT; ++j) {
        const __nv_bfloat16* bj = b + j * 8 * kLD + kk;
        mma16816(acc[j], a0, a1, a2, a3, lds32(bj), lds32(bj + 8));
      }
    }
  }
  wait_group<0>();
  __syncthreads();
  // The tile through shared memory (float, rows of x by outputs), for coalesced stores.
  constexpr int OLD = kBN + 4;
  float* o = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < RT; ++j) {
    const int r = j * 8 + 2 * t, c = warp * 16 + g;
    o[r * OLD + c] = acc[j][0];
    o[(r + 1) * OLD + c] = acc[j][1];
    o[r * OLD + c + 8] = acc[j][2];
    o[(r + 1) * OLD + c + 8] = acc[j][3];
  }
  __syncthreads();
  const int n0 = tile * kBN;
  if (S == 1) {
    for (int e = tid; e < M * (kBN / 4); e += kThreads) {
      const int r = e / (kBN / 4), c = 4 * (e % (kBN / 4));
      float v[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) v[q] = o[r * OLD + c + q] + (bias ? __bfloat162float(bias[n0 + c + q]) : 0.f);
      *reinterpret_cast<uint2*>(y + size_t(r) * N + n0 + c) =
          make_uint2(skinny::pack_bf16(v[0], v[1]), skinny::pack_bf16(v[2], v[3]));
    }
    return;
  }
  for (int e = tid; e < M * (kBN / 4); e += kThreads) {
    const int r = e / (kBN / 4), c = 4 * (e % (kBN / 4));
    __stcg(reinterpret_cast<float4*>(part + (size_t(split) * M + r) * N + n0 + c),
           make_float4(o[r * OLD + c], o[r * OLD + c + 1], o[r * OLD + c + 2], o[r * OLD + c + 3]));
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(counters + tile, 1) == S - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int e = tid; e < M * (kBN / 4); e += kThreads) {
    const int r = e / (kBN / 4), c = 4 * (e % (kBN / 4));
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int q = 0; q < S; ++q) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(part + (size_t(q) * M + r) * N + n0 + c));
      s.x += v.x, s.y += v.y, s.z += v.z, s.w += v.w;
    }
    if (bias) {
      s.x += __bfloat162float(bias[n0 + c]), s.y += __bfloat162float(bias[n0 + c + 1]);
      s.z += __bfloat162float(bias[n0 + c + 2]), s.w += __bfloat162float(bias[n0 + c + 3]);
    }
    *reinterpret_cast<uint2*>(y + size_t(r) * N + n0 + c) =
        make_uint2(skinny::pack_bf16(s.x, s.y), skinny::pack_bf16(s.z, s.w));
  }
  if (tid == 0) counters[tile] = 0;
}

// `k` on `st` with `smem` bytes of dynamic shared memory, with programmatic stream serialization
// when pdl (its blocks may start before the kernel before ends; it waits with griddepcontrol.wait).
template <typename... P, typename... A>
inline cudaError_t launch_pdl_smem(bool pdl, void (*k)(P...), dim3 grid, dim3 block, cudaStream_t st, size_t smem,
                                   A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[1];
  if (pdl) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  return cudaLaunchKernelEx(&cfg, k, static_cast<P>(args)...);
}

template <typename... P, typename... A>
inline cudaError_t launch_pdl(bool pdl, void (*k)(P...), dim3 grid, dim3 block, cudaStream_t st, A... args) {
  return launch_pdl_smem(pdl, k, grid, block, st, 0, args...);
}

constexpr size_t smem_bytes(int RT) { return size_t(kStages) * (kBN + 8 * RT) * kLD * 2; }

// Split count actually used for `splits` requested (each split a whole number of 64-wide k blocks).
inline int splits_used(int K, int splits) {
  const int kbs = K / kBK, kps = (kbs + splits - 1) / splits;
  return (kbs + kps - 1) / kps;
}

template <int RT>
inline cudaError_t launch_t(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
                            int M, int N, int K, int splits, float* part, int* counters, bool pdl, cudaStream_t st) {
  static bool sized = false;
  if (!sized) {
    cudaError_t e = cudaFuncSetAttribute(kernel<RT>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes(RT)));
    if (e != cudaSuccess) return e;
    sized = true;
  }
  const int kbs = K / kBK, kps = (kbs + splits - 1) / splits, S = (kbs + kps - 1) / kps;
  return launch_pdl_smem(pdl, kernel<RT>, dim3(N / kBN, S), dim3(kThreads), st, smem_bytes(RT), x, w, bias, y, M, N, K,
                         kps, part, counters);
}

// part: splits * M * N floats (unused with one split); counters: N / 64 ints, zero.
inline cudaError_t gemm(const __nv_bfloat16* x, const __nv_bfloat16* w, const __nv_bfloat16* bias, __nv_bfloat16* y,
                        int M, int N, int K, int splits, float* part, int* counters, bool pdl, cudaStream_t st) {
  if (M < 1 || M > 64 || N % kBN || K % kBK || splits < 1) return cudaErrorInvalidValue;
  if (M <= 16) return launch_t<2>(x, w, bias, y, M, N, K, splits, part, counters, pdl, st);
  if (M <= 32) return launch_t<4>(x, w, bias, y, M, N, K, splits, part, counters, pdl, st);
  return launch_t<8>(x, w, bias, y, M, N, K, splits, part, counters, pdl, st);
}

}  // namespace kernelrl::cuda::skinny3
