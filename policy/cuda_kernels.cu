// Fused CUDA kernels of the sampler's decode step: see cuda_kernels.hpp.
#include "policy/cuda_kernels.hpp"

#include "policy/wgmma_gemm.cuh"

#include <cuda_bf16.h>
#include <cuda_pipeline.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <tuple>
#include <mutex>
#include <map>
#include <atomic>
#include <cfloat>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace kernelrl::cuda {

namespace {

__device__ __forceinline__ float bf(bf16_t x) { return __uint_as_float(uint32_t(x) << 16); }
__device__ __forceinline__ bf16_t to_bf(float x) {
  __nv_bfloat16 b = __float2bfloat16_rn(x);
  return *reinterpret_cast<bf16_t*>(&b);
}
// x rounded to bf16 and back: what a bf16 tensor op stores.
__device__ __forceinline__ float rnd(float x) { return bf(to_bf(x)); }

void check(const char* what) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// Programmatic dependent launch (Hopper): the decode step's own kernels are launched with
// programmatic stream serialization (launch_k), so that a kernel's launch and block scheduling
// overlap the end of the kernel before it; each begins with pdl_wait (griddepcontrol.wait), which
// returns once the kernel before has completed and its memory is visible, so nothing is read or
// written earlier than under plain stream order, and then lets its own successor start launching.
// KERNELRL_PDL=0 launches them plainly; devices before compute capability 9.0 always do.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// The current device's value of `compute(dev)` (nonzero), computed once a device; 0 when there is
// no current device (or more than 64).
template <class F>
int once_per_device(std::array<std::atomic<int>, 64>& cache, F&& compute) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= int(cache.size())) return 0;
  if (cache[dev].load() == 0) cache[dev] = compute(dev);
  return cache[dev].load();
}

bool pdl_on() {
  static const bool off = [] {
    const char* v = std::getenv("KERNELRL_PDL");
    return v != nullptr && std::string(v) == "0";
  }();
  if (off) return false;
  static std::array<std::atomic<int>, 64> major{};  // per device, 0 until asked
  return once_per_device(major, [](int dev) {
           int m = 0;
           cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev);
           return m > 0 ? m : -1;
         }) >= 9;
}

template <typename... P, typename... A>
void launch_k(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, Stream s, A... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  if (pdl_on()) {
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }
  cudaLaunchKernelEx(&cfg, kernel, static_cast<P>(args)...);
}

template <int N>
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = N / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// ---------------------------------------------------------------- add + RMSNorm

constexpr int kNormThreads = 256;

__device__ __forceinline__ float block_sum(float v, float* part) {
  v = warp_sum<32>(v);
  if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float x = threadIdx.x < kNormThreads / 32 ? part[threadIdx.x] : 0.f;
    x = warp_sum<32>(x);
    if (threadIdx.x == 0) part[0] = x;
  }
  __syncthreads();
  return part[0];
}

// One row per block, its pairs of elements held in registers between the sum and the output
// (PAIRS per thread at most: H <= 2 * 256 * PAIRS, H even).
template <int PAIRS>
__global__ void __launch_bounds__(kNormThreads)
    add_rmsnorm_kernel(bf16_t* h, const bf16_t* delta, const float* dl, const bf16_t* w, bf16_t* out, float* out32,
                       int H, float eps) {
  pdl_wait();
  const int64_t row = blockIdx.x;
  const int H2 = H / 2;
  uint32_t* hr = reinterpret_cast<uint32_t*>(h + row * H);
  const uint32_t* dr = delta ? reinterpret_cast<const uint32_t*>(delta + row * H) : nullptr;
  const float2* lr = dl ? reinterpret_cast<const float2*>(dl + row * H) : nullptr;
  float2 x[PAIRS];
  float ss = 0;
#pragma unroll
  for (int k = 0; k < PAIRS; ++k) {
    const int i = threadIdx.x + k * kNormThreads;
    if (i < H2) {
      const uint32_t hv = hr[i];
      float a = __uint_as_float(hv << 16), b = __uint_as_float(hv & 0xffff0000u);
      if (dr) {
        const uint32_t dv = dr[i];
        float da = __uint_as_float(dv << 16), db = __uint_as_float(dv & 0xffff0000u);
        if (lr) {
          const float2 l = lr[i];
          da = rnd(da + l.x);
          db = rnd(db + l.y);
        }
        a = rnd(a + da);
        b = rnd(b + db);
        hr[i] = uint32_t(to_bf(a)) | (uint32_t(to_bf(b)) << 16);
      }
      x[k] = make_float2(a, b);
      ss += a * a + b * b;
    }
  }
  __shared__ float part[kNormThreads / 32];
  const float inv = rsqrtf(block_sum(ss, part) / float(H) + eps);
  const uint32_t* wr = reinterpret_cast<const uint32_t*>(w);
  uint32_t* orow = reinterpret_cast<uint32_t*>(out + row * H);
  float2* o32 = out32 ? reinterpret_cast<float2*>(out32 + row * H) : nullptr;
#pragma unroll
  for (int k = 0; k < PAIRS; ++k) {
    const int i = threadIdx.x + k * kNormThreads;
    if (i < H2) {
      const uint32_t wv = wr[i];
      const float ya = rnd(__uint_as_float(wv << 16) * rnd(x[k].x * inv));
      const float yb = rnd(__uint_as_float(wv & 0xffff0000u) * rnd(x[k].y * inv));
      orow[i] = uint32_t(to_bf(ya)) | (uint32_t(to_bf(yb)) << 16);
      if (o32) o32[i] = make_float2(ya, yb);
    }
  }
}

// ---------------------------------------------------------------- rotary embedding + cache write

__global__ void rope_qkv_kernel(const bf16_t* qkv, const float* lora, const int64_t* pos, const float* inv_freq, int nh,
                                int nkv, int D, bf16_t* q_out, bf16_t* kc, bf16_t* vc, int64_t cap) {
  pdl_wait();
  const int64_t r = blockIdx.x;
  const int half = D / 2, width = (nh + 2 * nkv) * D;
  const int64_t p = pos[r];
  const bool write = p >= 0 && p < cap;
  auto val = [&](int col) {
    float x = bf(qkv[r * width + col]);
    return lora ? rnd(x + lora[r * width + col]) : x;
  };
  const int rot = (nh + nkv) * half;
  for (int idx = threadIdx.x; idx < rot + nkv * D; idx += blockDim.x) {
    if (idx < rot) {
      const int hh = idx / half, i = idx % half, col = hh * D;
      const float2 o = wgmma_gemm::rotate_pair(val(col + i), val(col + i + half), p, inv_freq[i]);
      const float o1 = o.x, o2 = o.y;
      if (hh < nh) {
        q_out[(r * nh + hh) * D + i] = to_bf(o1);
        q_out[(r * nh + hh) * D + i + half] = to_bf(o2);
      } else if (write) {
        const int64_t base = ((r * nkv + (hh - nh)) * cap + p) * D;
        kc[base + i] = to_bf(o1);
        kc[base + i + half] = to_bf(o2);
      }
    } else if (write) {
      const int j = idx - rot, g = j / D, d = j % D;
      vc[((r * nkv + g) * cap + p) * D + d] = to_bf(val((nh + nkv) * D + j));
    }
  }
}

// ---------------------------------------------------------------- decode attention

constexpr int kMaxSplits = 64;  // decode_attention_splits() never asks for more

// The last block of a (row, kv head) to finish merges the splits' partials of its rep heads,
// work[head][split] = (max, sum, unnormalised weighted values [D]), into out (and out32): the maxima
// and sums read by all threads at once, each head's weights exp(max - M) / L computed once, then
// every output a sum over the splits of independent loads (ld.global.cg: written by other blocks,
// made visible by their fences; L1 is not coherent).
template <int D>
__device__ void merge_splits(const float* work, int splits, int64_t head0, int rep, bf16_t* out, float* out32) {
  __shared__ float ms[8 * kMaxSplits], ls[8 * kMaxSplits];
  for (int i = threadIdx.x; i < rep * splits; i += blockDim.x) {
    const float* wp = work + ((head0 + i / splits) * splits + i % splits) * (D + 2);
    ms[i] = __ldcg(wp);
    ls[i] = __ldcg(wp + 1);
  }
  __syncthreads();
  if (threadIdx.x < rep) {
    const int j = threadIdx.x;
    float M = -INFINITY, L = 0.f;
    for (int k = 0; k < splits; ++k) M = fmaxf(M, ms[j * splits + k]);
    for (int k = 0; k < splits; ++k) {
      const float f = M == -INFINITY ? 0.f : __expf(ms[j * splits + k] - M);
      ms[j * splits + k] = f;
      L += ls[j * splits + k] * f;
    }
    const float inv = L > 0 ? 1.f / L : 0.f;
    for (int k = 0; k < splits; ++k) ms[j * splits + k] *= inv;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < rep * D; i += blockDim.x) {
    const int j = i / D, d = i % D;
    const float* wp = work + (head0 + j) * splits * (D + 2) + 2 + d;
    float o = 0.f;
#pragma unroll 8
    for (int k = 0; k < splits; ++k) o += ms[j * splits + k] * __ldcg(wp + k * (D + 2));
    out[(head0 + j) * D + d] = to_bf(o);
    if (out32) out32[(head0 + j) * D + d] = rnd(o);
  }
}

// The keys a block of (row r, kv head g, split) takes: [s0, s1), s1 at most the row's length
// pos[r] + 1, klen and cap; where its keys and values start; and, where share is given (pairs
// (source row, count) a row), the first count of them read from the source row's cache instead: a
// group's rows hold copies of their common prompt's keys and values, and reading one copy lets the
// rows of a group share it in L2 (the same values, so the same bits).
struct KeySpan {
  int s0, s1, sh;
  const bf16_t *k, *v;    // the row's own
  const bf16_t *ks, *vs;  // keys below sh: the source row's
  __device__ __forceinline__ const bf16_t* krow(int key, int D) const { return (key < sh ? ks : k) + int64_t(key) * D; }
  __device__ __forceinline__ const bf16_t* vrow(int key, int D) const { return (key < sh ? vs : v) + int64_t(key) * D; }
};
__device__ __forceinline__ KeySpan key_span(const int64_t* pos, const int32_t* share, int r, int g, int nkv,
                                            int64_t cap, int klen, int span, int split, const bf16_t* kc,
                                            const bf16_t* vc, int D) {
  int64_t n = pos[r] + 1;
  if (n > klen) n = klen;
  if (n > cap) n = cap;
  const int s0 = split * span;
  const int64_t base = (int64_t(r) * nkv + g) * cap * D;
  int sh = 0;
  int64_t sbase = base;
  if (share != nullptr) {
    sh = share[2 * r + 1];
    sbase = (int64_t(share[2 * r]) * nkv + g) * cap * D;
  }
  return {s0, int(n < int64_t(s0) + span ? n : int64_t(s0) + span), sh, kc + base, vc + base, kc + sbase, vc + sbase};
}

// The block's warps' partials of its rep heads, wm/wl [warp * 8 + head] (max, sum) and wo (warp w's
// unnormalised weighted values at wo + w * wstride, [head][D]), combined: with one split the
// output; with more, this block's partial to work [R * nh, splits, D + 2], and the last block of
// the (row, kv head) to finish (an atomic count in counters, reset by that block) merges the
// splits' partials (merge_splits). A warp that took no key has max -inf and adds nothing.
template <int D>
__device__ void combine_warps(const float* wm, const float* wl, const float* wo, int wstride, int warps, int rep,
                              int64_t head0, int split, int splits, float* work, int* counters, bf16_t* out,
                              float* out32) {
  __shared__ bool last;
  for (int i = threadIdx.x; i < rep * D; i += blockDim.x) {
    const int j = i / D, d = i % D;
    float M = -INFINITY;
    for (int w = 0; w < warps; ++w) M = fmaxf(M, wm[w * 8 + j]);
    float L = 0.f, O = 0.f;
    if (M != -INFINITY)
      for (int w = 0; w < warps; ++w) {
        const float f = __expf(wm[w * 8 + j] - M);
        L += wl[w * 8 + j] * f;
        O += wo[w * wstride + j * D + d] * f;
      }
    const int64_t head = head0 + j;
    if (splits == 1) {
      const float v = L > 0 ? O / L : 0.f;
      out[head * D + d] = to_bf(v);
      if (out32) out32[head * D + d] = rnd(v);
    } else {
      float* wp = work + (head * splits + split) * (D + 2);
      wp[2 + d] = O;
      if (d == 0) {
        wp[0] = M;
        wp[1] = L;
      }
    }
  }
  if (splits == 1) return;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    const int done = atomicAdd(&counters[blockIdx.x], 1);
    last = done == splits - 1;
    if (last) counters[blockIdx.x] = 0;  // ready for the next step
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  merge_splits<D>(work, splits, head0, rep, out, out32);
}

constexpr int kAttnWarps = 8;  // warps of a block; two blocks fit an SM
constexpr int kTile = 32;      // keys of a warp's tile: one a lane in the score product

// Shared memory of decode_attention_kernel<D, REP>: the scaled queries [REP][D] (float), each
// warp's tile of values [32][D] (bf16; at the end its partial [REP][D], float) and probabilities
// [32][REPP], and the warps' maxima and sums [warps][8].
constexpr int attention_smem(int D, int REP) {
  return REP * D * 4 + kAttnWarps * kTile * D * 2 + kAttnWarps * kTile * ((REP + 3) / 4 * 4) * 4 +
         2 * kAttnWarps * 8 * 4;
}

// Block (row r, kv head g, split) of 8 warps over keys [s0, s1) (key_span): warp w takes the
// 32-key tiles w, w + 8, ... on its own, with no block barrier until the end. Per tile: the
// values are copied to the warp's shared memory (cp.async, 16 bytes a lane at a time) while lane
// i loads key s0 + i whole (16-byte loads, all in flight at once) and scores it against the
// group's REP queries; the tile's maximum is the only cross-lane step of the online softmax (each
// lane keeps its own share of the sum, added up once at the end); then lane i adds dimensions
// [D/32 i, D/32 (i + 1)) of p times v over the tile's keys. The warps' partials are combined in
// shared memory, the splits' by the last block (combine_warps).
template <int D, int REP>
__global__ void __launch_bounds__(kAttnWarps * 32, 2)
    decode_attention_kernel(const bf16_t* q, const bf16_t* kc, const bf16_t* vc, const int64_t* pos,
                            const int32_t* share, int nkv, int64_t cap, int klen, int span, float scale, float* work,
                            int* counters, bf16_t* out, float* out32) {
  pdl_wait();
  constexpr int KV = D / 8;                // 16-byte pieces of a key or value row
  constexpr int DPL = D / 32;              // value dimensions a lane takes
  constexpr int REPP = (REP + 3) / 4 * 4;  // a key's probabilities, padded for 16-byte access
  extern __shared__ __align__(16) unsigned char smem[];
  float* qs = reinterpret_cast<float*>(smem);
  bf16_t* vs = reinterpret_cast<bf16_t*>(qs + REP * D);
  float* ps = reinterpret_cast<float*>(vs + kAttnWarps * kTile * D);
  float* wm = ps + kAttnWarps * kTile * REPP;
  float* wl = wm + kAttnWarps * 8;
  const int r = blockIdx.x / nkv, g = blockIdx.x % nkv, split = blockIdx.y, splits = gridDim.y;
  const int nh = nkv * REP;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t head0 = int64_t(r) * nh + g * REP;
  for (int i = threadIdx.x; i < REP * D; i += kAttnWarps * 32) qs[i] = bf(q[head0 * D + i]) * scale;
  const KeySpan ks = key_span(pos, share, r, g, nkv, cap, klen, span, split, kc, vc, D);
  const int s1 = ks.s1;
  bf16_t* myv = vs + warp * kTile * D;
  float* myp = ps + warp * kTile * REPP;
  float m[REP], lsum[REP], acc[REP][DPL];
#pragma unroll
  for (int j = 0; j < REP; ++j) {
    m[j] = -INFINITY;
    lsum[j] = 0.f;
#pragma unroll
    for (int e = 0; e < DPL; ++e) acc[j][e] = 0.f;
  }
  __syncthreads();
  for (int c0 = ks.s0 + warp * kTile; c0 < s1; c0 += kAttnWarps * kTile) {
    const int cn = min(kTile, s1 - c0);
    {
      uint4* dst = reinterpret_cast<uint4*>(myv);
      for (int i = lane; i < cn * KV; i += 32)
        __pipeline_memcpy_async(dst + i, reinterpret_cast<const uint4*>(ks.vrow(c0 + i / KV, D)) + i % KV, 16);
      __pipeline_commit();
    }
    float dot[REP];
#pragma unroll
    for (int j = 0; j < REP; ++j) dot[j] = 0.f;
    if (lane < cn) {
      const uint4* kr = reinterpret_cast<const uint4*>(ks.krow(c0 + lane, D));
      uint4 kv[KV];
#pragma unroll
      for (int v = 0; v < KV; ++v) kv[v] = kr[v];
#pragma unroll
      for (int v = 0; v < KV; ++v) {
        const uint32_t w4[4] = {kv[v].x, kv[v].y, kv[v].z, kv[v].w};
        float k8[8];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          k8[2 * e] = __uint_as_float(w4[e] << 16);
          k8[2 * e + 1] = __uint_as_float(w4[e] & 0xffff0000u);
        }
#pragma unroll
        for (int j = 0; j < REP; ++j) {
          const float4 qa = *reinterpret_cast<const float4*>(&qs[j * D + v * 8]);
          const float4 qb = *reinterpret_cast<const float4*>(&qs[j * D + v * 8 + 4]);
          dot[j] += k8[0] * qa.x + k8[1] * qa.y + k8[2] * qa.z + k8[3] * qa.w + k8[4] * qb.x + k8[5] * qb.y +
                    k8[6] * qb.z + k8[7] * qb.w;
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < REP; ++j) dot[j] = -INFINITY;
    }
    float p[REPP];
#pragma unroll
    for (int j = 0; j < REP; ++j) {
      const float mn = fmaxf(m[j], warp_max(dot[j]));  // finite: lane 0 holds a key
      const float corr = __expf(m[j] - mn);            // 0 for the warp's first tile (m = -inf)
      p[j] = __expf(dot[j] - mn);                      // 0 past the tile's keys
      lsum[j] = lsum[j] * corr + p[j];
      m[j] = mn;
#pragma unroll
      for (int e = 0; e < DPL; ++e) acc[j][e] *= corr;
    }
#pragma unroll
    for (int j = REP; j < REPP; ++j) p[j] = 0.f;
#pragma unroll
    for (int k = 0; k < REPP / 4; ++k)
      *reinterpret_cast<float4*>(&myp[lane * REPP + 4 * k]) =
          make_float4(p[4 * k], p[4 * k + 1], p[4 * k + 2], p[4 * k + 3]);
    __pipeline_wait_prior(0);
    __syncwarp();
#pragma unroll 4
    for (int k = 0; k < cn; ++k) {
      float v[DPL];
      const bf16_t* vr = myv + k * D + lane * DPL;
      if constexpr (DPL == 4) {
        const uint2 w = *reinterpret_cast<const uint2*>(vr);
        v[0] = __uint_as_float(w.x << 16);
        v[1] = __uint_as_float(w.x & 0xffff0000u);
        v[2] = __uint_as_float(w.y << 16);
        v[3] = __uint_as_float(w.y & 0xffff0000u);
      } else if constexpr (DPL == 2) {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(vr);
        v[0] = __uint_as_float(w << 16);
        v[1] = __uint_as_float(w & 0xffff0000u);
      } else {
        v[0] = bf(vr[0]);
      }
      float pk[REPP];
#pragma unroll
      for (int i = 0; i < REPP / 4; ++i) {
        const float4 p4 = *reinterpret_cast<const float4*>(&myp[k * REPP + 4 * i]);
        pk[4 * i] = p4.x;
        pk[4 * i + 1] = p4.y;
        pk[4 * i + 2] = p4.z;
        pk[4 * i + 3] = p4.w;
      }
#pragma unroll
      for (int j = 0; j < REP; ++j)
#pragma unroll
        for (int e = 0; e < DPL; ++e) acc[j][e] += pk[j] * v[e];
    }
    __syncwarp();  // the tile's values and probabilities read before the next tile's land
  }
  // This warp's partial: its maxima and sums, and its weighted values over its own tile buffer.
  float* wo = reinterpret_cast<float*>(myv);
#pragma unroll
  for (int j = 0; j < REP; ++j) {
    const float l = warp_sum<32>(lsum[j]);
    if (lane == 0) {
      wm[warp * 8 + j] = m[j];
      wl[warp * 8 + j] = l;
    }
#pragma unroll
    for (int e = 0; e < DPL; ++e) wo[j * D + lane * DPL + e] = acc[j][e];
  }
  __syncthreads();
  combine_warps<D>(wm, wl, reinterpret_cast<const float*>(vs), kTile * D / 2, kAttnWarps, REP, head0, split, splits,
                   work, counters, out, out32);
}

// The same attention on the tensor cores (D = 64 or 128, REP <= 8; sm_80+), the default: a block of
// 8 warps per (row r, kv head g, split), each warp taking 16-key tiles w, w + 8, ... of the split's
// keys with mma.sync m16n8k16 (bf16 in, float32 accumulate): scores S = Q K^T with the group's REP
// queries as the rows of A (rows REP..15 zero), then O += P V with P (bf16) as A. Every operand
// comes straight from global memory in 16-byte loads: a dot product does not care in which order
// its terms are summed, so lane (gid, t4) takes dimensions [8 t4 + 32 j, + 8) of key gid for the
// score product (and the queries' in the same order), and for P V dimensions [(D / 8) gid, + D / 8)
// of its four keys 2 t4, 2 t4 + 1, 8 + 2 t4, 9 + 2 t4, so that output column gid of n-tile t is
// dimension (D / 8) gid + t. Online softmax per warp in registers; the warps' partials and the
// splits' are combined by combine_warps. bench/attention_probe.cu, H200, 64 rows of 384 keys (12/2
// heads of 128): 10.7 us a call against 19.0 for the scalar kernel at its split count; with 4
// warps a block (as first written) 17.2 us, with each warp's next tile loaded ahead 10.9 us.
__device__ __forceinline__ void mma_16816(float (&d)[4], uint32_t a0, uint32_t a2, uint32_t b0, uint32_t b1) {
  const uint32_t z = 0;  // rows 8..15 of A are zero
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(z), "r"(a2), "r"(z), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t word(const uint4& v, int w) {
  return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
}

__device__ __forceinline__ uint32_t pack_bf2(float lo, float hi) {
  return uint32_t(to_bf(lo)) | (uint32_t(to_bf(hi)) << 16);
}

constexpr int kMmaWarps = 8;  // one block an SM (174 registers a thread at D = 128)

template <int D>
__global__ void __launch_bounds__(kMmaWarps * 32)
    decode_attention_mma_kernel(const bf16_t* q, const bf16_t* kc, const bf16_t* vc, const int64_t* pos,
                                const int32_t* share, int nkv, int rep, int64_t cap, int klen, int span, float scale,
                                float* work, int* counters, bf16_t* out, float* out32, int prefetch) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The keys before this step's own are in the cache already (the kernel before writes only the new
  // one): their span is requested into L2 before waiting for that kernel, so that the stream starts
  // while it still runs (the shared prefix from its source row). A hint only: every key and value
  // is read after pdl_wait.
  if (prefetch && threadIdx.x == 0) {
    const int r = blockIdx.x / nkv, g = blockIdx.x % nkv;
    const KeySpan ks = key_span(pos, share, r, g, nkv, cap, klen, span, blockIdx.y, kc, vc, D);
    const int last = int(min(int64_t(ks.s1), __ldcg(pos + r)));  // (the new key: written by the kernel before)
    auto request = [&](const bf16_t* k, const bf16_t* v, int a, int b) {
      if (b <= a) return;
      const uint32_t bytes = uint32_t(b - a) * D * 2;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(k + int64_t(a) * D), "r"(bytes) : "memory");
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(v + int64_t(a) * D), "r"(bytes) : "memory");
    };
    request(ks.ks, ks.vs, ks.s0, min(last, ks.sh));
    request(ks.k, ks.v, max(ks.s0, ks.sh), last);
  }
#endif
  pdl_wait();
  constexpr int KJ = D / 32;  // 16-byte pieces of a key row per lane (score product)
  constexpr int NT = D / 8;   // n-tiles of the value product; also the dimensions per lane and key
  constexpr int VJ = NT / 8;  // 16-byte pieces of a value row per lane and key
  const int r = blockIdx.x / nkv, g = blockIdx.x % nkv, split = blockIdx.y, splits = gridDim.y;
  const int nh = nkv * rep;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, t4 = lane & 3;
  __shared__ float wm[kMmaWarps][8], wl[kMmaWarps][8];
  extern __shared__ float wo_dyn[];  // [kMmaWarps][8][D]: the warps' partials

  const KeySpan ks = key_span(pos, share, r, g, nkv, cap, klen, span, split, kc, vc, D);
  const int s0 = ks.s0, s1 = ks.s1;

  uint4 qf[KJ];  // this lane's query pieces (head gid), zero for rows past the group
#pragma unroll
  for (int j = 0; j < KJ; ++j)
    qf[j] = gid < rep ? *reinterpret_cast<const uint4*>(q + (int64_t(r) * nh + g * rep + gid) * D + 8 * t4 + 32 * j)
                      : make_uint4(0, 0, 0, 0);
  float o[NT][4];
#pragma unroll
  for (int t = 0; t < NT; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
  float m = -INFINITY, l = 0.f;

  // Keys k0 + gid and k0 + 8 + gid for the scores; k0 + 2 t4 (+1) and k0 + 8 + 2 t4 (+1) for the
  // values. Keys past s1 read key s1 - 1 (held memory) and are masked (values zeroed).
  auto load = [&](int k0, uint4(&kf)[2][KJ], uint4(&vf)[4][VJ]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int key = min(k0 + 8 * h + gid, s1 - 1);
#pragma unroll
      for (int j = 0; j < KJ; ++j) kf[h][j] = *reinterpret_cast<const uint4*>(ks.krow(key, D) + 8 * t4 + 32 * j);
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int key = k0 + 8 * (c >> 1) + 2 * t4 + (c & 1);
      const bf16_t* vr = ks.vrow(min(key, s1 - 1), D) + NT * gid;
#pragma unroll
      for (int j = 0; j < VJ; ++j)
        vf[c][j] = key < s1 ? *reinterpret_cast<const uint4*>(vr + 8 * j) : make_uint4(0, 0, 0, 0);
    }
  };
  auto compute = [&](int k0, const uint4(&kf)[2][KJ], const uint4(&vf)[4][VJ]) {
    // Scores of head gid: sc[h][0..1] for keys k0 + 8 h + 2 t4 (+1).
    float sc[2][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sc[h][0] = sc[h][1] = sc[h][2] = sc[h][3] = 0.f;
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks) {
        const int j = ks >> 1, w = 2 * (ks & 1);
        mma_16816(sc[h], word(qf[j], w), word(qf[j], w + 1), word(kf[h][j], w), word(kf[h][j], w + 1));
      }
    }
    float s[4];
    float mt = -INFINITY;
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int key = k0 + 8 * (c >> 1) + 2 * t4 + (c & 1);
      s[c] = key < s1 ? sc[c >> 1][c & 1] * scale : -INFINITY;
      mt = fmaxf(mt, s[c]);
    }
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
    mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
    const float mn = fmaxf(m, mt);      // finite: the tile holds at least one key
    const float corr = __expf(m - mn);  // 0 while m = -inf
    float p[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) p[c] = __expf(s[c] - mn);
    l = l * corr + (p[0] + p[1] + p[2] + p[3]);
    m = mn;
    const uint32_t a0 = pack_bf2(p[0], p[1]), a2 = pack_bf2(p[2], p[3]);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      o[t][0] *= corr;
      o[t][1] *= corr;
      // Element t of each of the four value rows (dimension NT gid + t), two keys to a register.
      const int j = t >> 3, w = (t & 7) >> 1;
      const uint32_t sel = (t & 1) ? 0x7632u : 0x5410u;
      const uint32_t b0 = __byte_perm(word(vf[0][j], w), word(vf[1][j], w), sel);
      const uint32_t b1 = __byte_perm(word(vf[2][j], w), word(vf[3][j], w), sel);
      mma_16816(o[t], a0, a2, b0, b1);
    }
  };
  for (int k0 = s0 + 16 * warp; k0 < s1; k0 += 16 * kMmaWarps) {
    uint4 kf[2][KJ], vf[4][VJ];
    load(k0, kf, vf);
    compute(k0, kf, vf);
  }
  // The warps' partials: l summed over the row's four lanes; o[t][0..1] is head gid, columns 2 t4
  // and 2 t4 + 1 of n-tile t, i.e. dimensions NT (2 t4) + t and NT (2 t4 + 1) + t.
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  float* wo = wo_dyn + warp * 8 * D;
  if (gid < rep) {
    if (t4 == 0) {
      wm[warp][gid] = m;
      wl[warp][gid] = l;
    }
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      wo[gid * D + NT * (2 * t4) + t] = o[t][0];
      wo[gid * D + NT * (2 * t4 + 1) + t] = o[t][1];
    }
  }
  __syncthreads();
  combine_warps<D>(&wm[0][0], &wl[0][0], wo_dyn, 8 * D, kMmaWarps, rep, int64_t(r) * nh + g * rep, split, splits, work,
                   counters, out, out32);
}

// ---------------------------------------------------------------- SwiGLU

__global__ void silu_mul_kernel(const bf16_t* gu, const float* lora, int64_t n, int I, bf16_t* out, float* out32) {
  pdl_wait();
  for (int64_t k = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; k < n; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = k / I, i = k % I;
    const int64_t gi = r * 2 * I + i, ui = gi + I;
    float g = bf(gu[gi]), u = bf(gu[ui]);
    if (lora) {
      g = rnd(g + lora[gi]);
      u = rnd(u + lora[ui]);
    }
    const float a = rnd(g / (1.f + expf(-g)));
    const float y = rnd(a * u);
    out[k] = to_bf(y);
    if (out32) out32[k] = y;
  }
}

// ---------------------------------------------------------------- sampling

__device__ __forceinline__ uint4 philox(uint4 c, uint2 k) {
#pragma unroll
  for (int i = 0; i < 10; ++i) {
    const uint32_t lo0 = c.x * 0xD2511F53u, hi0 = __umulhi(c.x, 0xD2511F53u);
    const uint32_t lo1 = c.z * 0xCD9E8D57u, hi1 = __umulhi(c.z, 0xCD9E8D57u);
    c = make_uint4(hi1 ^ c.y ^ k.x, lo1, hi0 ^ c.w ^ k.y, lo0);
    k.x += 0x9E3779B9u;
    k.y += 0xBB67AE85u;
  }
  return c;
}

constexpr int kSampleChunks = 64;  // vocabulary chunks a row, where the draw makes its own partials
constexpr int kSampleThreads = 256;

// Block (row, chunk): the chunk's (per logits from chunk per) max (and the lowest index holding it)
// and its sum of exp relative to that max, at work[(row chunks + chunk) 4]. Block (0, 0) also copies
// the step counter into the work area, where the final kernel's blocks read it (the final kernel
// moves the counter on). The Hopper head (wgmma_gemm's kDraw) leaves the same partials of its
// 128-logit tiles.
__global__ void sample_partial_kernel(const bf16_t* logits, int V, int per, float inv_t, const int64_t* step,
                                      float* work) {
  pdl_wait();
  const int r = blockIdx.y, chunk = blockIdx.x, C = gridDim.x;
  const int i0 = chunk * per, i1 = min(V, i0 + per);
  if (r == 0 && chunk == 0 && threadIdx.x == 0) *reinterpret_cast<int64_t*>(work + int64_t(gridDim.y) * C * 4) = *step;
  float m = -INFINITY, s = 0;
  int mi = 0x7fffffff;
  const bf16_t* row = logits + int64_t(r) * V;
  for (int i = i0 + threadIdx.x; i < i1; i += kSampleThreads) {
    const float x = bf(row[i]) * inv_t;
    if (x == -INFINITY) continue;
    if (x > m) {
      s = s * __expf(m - x) + 1.f;
      m = x;
      mi = i;
    } else {
      s += __expf(x - m);
    }
  }
  // Reduce (m, s) and (m, its index) over the block.
  __shared__ float sm[kSampleThreads / 32], ssum[kSampleThreads / 32];
  __shared__ int si[kSampleThreads / 32];
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) wgmma_gemm::merge_draw(m, s, mi, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    sm[warp] = m;
    ssum[warp] = s;
    si[warp] = mi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = -INFINITY, S = 0;
    int MI = 0x7fffffff;
    for (int w = 0; w < kSampleThreads / 32; ++w) M = fmaxf(M, sm[w]);
    for (int w = 0; w < kSampleThreads / 32; ++w) {
      if (sm[w] == -INFINITY) continue;
      S += ssum[w] * __expf(sm[w] - M);
      if (sm[w] == M && si[w] < MI) MI = si[w];
    }
    float* wp = work + (int64_t(r) * C + chunk) * 4;
    wp[0] = M;
    wp[1] = S;
    wp[3] = __int_as_float(MI);
  }
}

// The block's max (MAX) or min of one value a thread.
template <bool MAX, class T>
__device__ __forceinline__ T block_reduce(T v, T* sh) {
  auto pick = [](T a, T b) { return MAX ? (a > b ? a : b) : (a < b ? a : b); };
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = pick(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x >> 5;
  __syncthreads();  // sh may still be read from a previous call
  if ((threadIdx.x & 31) == 0) sh[warp] = v;
  __syncthreads();
  T t = sh[0];
  for (int w = 1; w < kSampleThreads / 32; ++w) t = pick(t, sh[w]);
  return t;
}

// Block r: row r's token by inverse transform sampling over C chunks of `per` logits. The chunks'
// sums are rescaled to the row's max and laid end to end in index order (each thread a contiguous
// run of chunks, then a scan over the threads); one uniform u (Philox 4x32-10 keyed by the seed,
// counter (row, step)) lands in the chunk where the cumulative mass first passes u S, whose
// probabilities the block then scans in index order (each thread a contiguous segment) to the token.
// Float rounding that leaves u S at or past a total picks the last token of positive mass before it.
// T = 0: the lowest index of the row's max. Block 0 moves the step counter on.
__global__ void __launch_bounds__(kSampleThreads)
    sample_final_kernel(const bf16_t* logits, int R, int V, int C, int per, float inv_t, bool greedy, uint64_t seed,
                        int64_t* step, const float* work, int64_t* ids, int64_t* pos, int64_t cap, int32_t* hist_tokens,
                        float* hist_logprobs, int64_t hist_steps) {
  pdl_wait();
  const int r = blockIdx.x, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int64_t st = *reinterpret_cast<const int64_t*>(work + int64_t(R) * C * 4);
  const bf16_t* row = logits + int64_t(r) * V;
  const float* w = work + int64_t(r) * C * 4;
  __shared__ float s_f[kSampleThreads / 32];
  __shared__ int s_i[kSampleThreads / 32];
  __shared__ float s_t;
  __shared__ int s_chunk, s_token, s_last;
  if (tid == 0) s_chunk = 0x7fffffff, s_token = 0x7fffffff, s_last = -1;
  // Each thread a contiguous run of chunks: the row's max, then the run's mass, its last chunk of
  // positive mass and (T = 0) its lowest index of the max.
  const int cpt = (C + kSampleThreads - 1) / kSampleThreads, c0 = min(C, tid * cpt), c1 = min(C, c0 + cpt);
  float lm = -INFINITY;
  for (int c = c0; c < c1; ++c) lm = fmaxf(lm, w[4 * c]);
  const float M = block_reduce<true>(lm, s_f);
  float local = 0;
  int lastpos = -1, cand = 0x7fffffff;
  for (int c = c0; c < c1; ++c) {
    const float mc = w[4 * c];
    if (mc == -INFINITY) continue;
    const float p = w[4 * c + 1] * __expf(mc - M);
    local += p;
    if (p > 0) lastpos = c;
    if (mc == M) cand = min(cand, __float_as_int(w[4 * c + 3]));
  }
  // Where this thread's run starts and ends in the row's cumulative mass (the next thread's start
  // is this one's end, bit for bit), and the total.
  float incl = local;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float a = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += a;
  }
  float exin = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane == 0) exin = 0;
  __syncthreads();
  if (lane == 31) s_f[warp] = incl;
  __syncthreads();
  float base = 0, S = 0;
  for (int v = 0; v < kSampleThreads / 32; ++v) {
    if (v == warp) base = S;
    S += s_f[v];
  }
  const float start = base + exin, end = base + incl;
  const uint4 u4 = philox(make_uint4(uint32_t(r), 0x5A3Du, uint32_t(st), uint32_t(uint64_t(st) >> 32)),
                          make_uint2(uint32_t(seed), uint32_t(seed >> 32)));
  const float t = (float(u4.x >> 8) + 0.5f) * (1.0f / 16777216.0f) * S;  // u in (0, 1)
  if (!greedy && local > 0 && t >= start && t < end) {
    float cum = start;
    int hit = lastpos;  // (rounding within the run: its last chunk of positive mass)
    float before = -INFINITY;
    for (int c = c0; c < c1; ++c) {
      const float mc = w[4 * c];
      if (mc == -INFINITY) continue;
      const float p = w[4 * c + 1] * __expf(mc - M);
      if (p > 0 && t < cum + p) {
        hit = c;
        before = cum;
        break;
      }
      cum += p;
    }
    s_chunk = hit;
    s_t = t - before;
  }
  const int lastc = block_reduce<true>(lastpos, s_i);  // (also the barrier after s_chunk's write)
  const int greedy_tok = block_reduce<false>(cand, s_i);
  int chunk = s_chunk;
  if (!greedy && chunk == 0x7fffffff) {  // rounding: the last chunk of positive mass, and its last token
    chunk = max(lastc, 0);
    if (tid == 0) s_t = INFINITY;
  }
  __syncthreads();
  if (greedy) {
    if (tid == 0) s_token = greedy_tok;
  } else {
    const int i0 = chunk * per, i1 = min(V, i0 + per);
    const int seg = (max(i1 - i0, 0) + kSampleThreads - 1) / kSampleThreads;
    const int j0 = min(i1, i0 + tid * seg), j1 = min(i1, j0 + seg);
    float loc = 0;
    int last = -1;  // this segment's last token of positive mass
    for (int i = j0; i < j1; ++i) {
      const float x = bf(row[i]) * inv_t;
      if (x == -INFINITY) continue;
      const float e = __expf(x - M);
      loc += e;
      if (e > 0) last = i;
    }
    // Where this thread's segment starts and ends in the chunk's cumulative mass (the next
    // thread's start is this one's end, bit for bit, as for the chunks above).
    float inc = loc;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float a = __shfl_up_sync(0xffffffffu, inc, o);
      if (lane >= o) inc += a;
    }
    float exin = __shfl_up_sync(0xffffffffu, inc, 1);
    if (lane == 0) exin = 0;
    if (lane == 31) s_f[warp] = inc;
    if (last >= 0) atomicMax(&s_last, last);
    __syncthreads();
    float b = 0;
    for (int v = 0; v < warp; ++v) b += s_f[v];
    const float excl = b + exin, tt = s_t;
    if (last >= 0 && tt >= excl && tt < b + inc) {
      float cum = excl;
      int tok = last;
      for (int i = j0; i < j1; ++i) {
        const float x = bf(row[i]) * inv_t;
        if (x == -INFINITY) continue;
        cum += __expf(x - M);
        if (cum > tt) {
          tok = i;
          break;
        }
      }
      atomicMin(&s_token, tok);
    }
    __syncthreads();
    if (tid == 0 && s_token == 0x7fffffff) s_token = s_last;
  }
  __syncthreads();
  if (tid == 0) {
    const int tok = s_token >= 0 && s_token < V ? s_token : 0;  // (no token of positive mass: a row of -inf)
    const float lp = bf(row[tok]) * inv_t - (M + logf(S));
    ids[r] = tok;
    if (pos[r] > 0 && pos[r] + 1 < cap) pos[r] += 1;  // (0: a parked row, which stays)
    const int64_t slot = st % hist_steps;
    hist_tokens[slot * R + r] = tok;
    hist_logprobs[slot * R + r] = lp;
    if (r == 0) *step = st + 1;
  }
}

// ---------------------------------------------------------------- LoRA of the decode step (float32)

constexpr int kShrinkRows = 2;                  // rows a block of the A product takes
constexpr int kShrinkK = 8;                     // stacked-rank outputs a block takes
constexpr int kShrinkChunk = 2048;              // inputs a block takes (8 a thread)
constexpr int kShrinkPer = kShrinkChunk / 256;  // ... and a thread
constexpr int kLoraMaxRank = 192;               // the group's stacked rank (three rank-64 adapters)

// Block (rows 2b, 2b + 1; input chunk s; outputs 8z .. 8z + 7): part[s][row][k] = the sum over the
// chunk's inputs h of x[row][h] a[k][h]. Every load is independent of the others (the rows' chunk,
// then the 8 rows of a: 64 loads a thread in flight), then 16 warp reductions side by side and one
// over the block's warps in a fixed order (the same bits every call).
__global__ void __launch_bounds__(256)
    lora_shrink_kernel(const float* x, const float* a, int R, int in, int rs, float* part) {
  pdl_wait();
  __shared__ float red[8][kShrinkRows][kShrinkK];
  const int r0 = blockIdx.x * kShrinkRows, s = blockIdx.y, k0 = blockIdx.z * kShrinkK;
  const int h0 = s * kShrinkChunk + threadIdx.x, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float xr[kShrinkRows][kShrinkPer];
#pragma unroll
  for (int i = 0; i < kShrinkRows; ++i)
#pragma unroll
    for (int j = 0; j < kShrinkPer; ++j) {
      const int h = h0 + 256 * j;
      xr[i][j] = r0 + i < R && h < in ? x[int64_t(r0 + i) * in + h] : 0.f;
    }
  float acc[kShrinkK][kShrinkRows] = {};
#pragma unroll
  for (int k = 0; k < kShrinkK; ++k)
#pragma unroll
    for (int j = 0; j < kShrinkPer; ++j) {
      const int h = h0 + 256 * j;
      const float av = h < in && k0 + k < rs ? a[int64_t(k0 + k) * in + h] : 0.f;
#pragma unroll
      for (int i = 0; i < kShrinkRows; ++i) acc[k][i] += xr[i][j] * av;
    }
#pragma unroll
  for (int k = 0; k < kShrinkK; ++k)
#pragma unroll
    for (int i = 0; i < kShrinkRows; ++i) {
      const float v = warp_sum<32>(acc[k][i]);
      if (lane == 0) red[warp][i][k] = v;
    }
  __syncthreads();
  if (threadIdx.x < kShrinkRows * kShrinkK) {
    const int i = threadIdx.x / kShrinkK, k = threadIdx.x % kShrinkK;
    if (r0 + i < R && k0 + k < rs) {
      float v = 0.f;
#pragma unroll
      for (int w = 0; w < 8; ++w) v += red[w][i][k];
      part[(int64_t(s) * R + r0 + i) * rs + k0 + k] = v;
    }
  }
}

constexpr int kExpandTileCols = 32, kExpandTileRows = 16;

// Block (32 columns, 16 rows): out[row][n] = sum_k t[row][k] bt[k][n], t the sum of the shrink's
// `parts` partials. The rows' t and the columns' bt are first copied to shared memory (independent
// loads, all threads), then thread (column c, group g) adds up rows 2 g and 2 g + 1.
__global__ void __launch_bounds__(256)
    lora_expand_kernel(const float* part, int parts, const float* bt, int R, int rs, int N, float* out) {
  pdl_wait();
  __shared__ float ts[kExpandTileRows][kLoraMaxRank + 1];
  __shared__ float bs[kLoraMaxRank][kExpandTileCols];
  const int n0 = blockIdx.x * kExpandTileCols, r0 = blockIdx.y * kExpandTileRows;
  for (int i = threadIdx.x; i < kExpandTileRows * rs; i += blockDim.x) {
    const int rr = i / rs, k = i % rs;
    float v = 0.f;
    if (r0 + rr < R)
      for (int p = 0; p < parts; ++p) v += part[(int64_t(p) * R + r0 + rr) * rs + k];
    ts[rr][k] = v;
  }
  for (int i = threadIdx.x; i < rs * kExpandTileCols; i += blockDim.x) {
    const int k = i / kExpandTileCols, c = i % kExpandTileCols;
    bs[k][c] = n0 + c < N ? bt[int64_t(k) * N + n0 + c] : 0.f;
  }
  __syncthreads();
  const int c = threadIdx.x % kExpandTileCols, g = threadIdx.x / kExpandTileCols;
  float acc0 = 0.f, acc1 = 0.f;
#pragma unroll 8
  for (int k = 0; k < rs; ++k) {
    const float b = bs[k][c];
    acc0 += ts[2 * g][k] * b;
    acc1 += ts[2 * g + 1][k] * b;
  }
  const int n = n0 + c;
  if (n < N) {
    if (r0 + 2 * g < R) out[int64_t(r0 + 2 * g) * N + n] = acc0;
    if (r0 + 2 * g + 1 < R) out[int64_t(r0 + 2 * g + 1) * N + n] = acc1;
  }
}

// ---------------------------------------------------------------- LoRA: y + t B^T

constexpr int kExpandCols = 128, kExpandRows = 32, kExpandMaxRank = 64;

// Block: 32 rows x 128 columns; thread (column c, row group g of 16 rows). The adapter's rank-r
// inputs t and scaled B^T tiles in shared memory; out = bf16(f32(y) + sum_j t[n, j] sBt[j, c]).
__global__ void __launch_bounds__(256) lora_expand_add_kernel(const bf16_t* y, const float* t, const float* sbt,
                                                              int64_t N, int out_cols, int r, bf16_t* out) {
  __shared__ float ts[kExpandRows][kExpandMaxRank + 1];
  __shared__ float bs[kExpandMaxRank][kExpandCols];
  const int64_t n0 = int64_t(blockIdx.y) * kExpandRows;
  const int c0 = blockIdx.x * kExpandCols;
  for (int i = threadIdx.x; i < kExpandRows * r; i += blockDim.x) {
    const int rr = i / r, j = i % r;
    ts[rr][j] = n0 + rr < N ? t[(n0 + rr) * r + j] : 0.f;
  }
  for (int i = threadIdx.x; i < r * kExpandCols; i += blockDim.x) {
    const int j = i / kExpandCols, c = i % kExpandCols;
    bs[j][c] = c0 + c < out_cols ? sbt[int64_t(j) * out_cols + c0 + c] : 0.f;
  }
  __syncthreads();
  const int c = threadIdx.x % kExpandCols, g = threadIdx.x / kExpandCols;
  if (c0 + c >= out_cols) return;
  float acc[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) acc[i] = 0;
  for (int j = 0; j < r; ++j) {
    const float b = bs[j][c];
#pragma unroll
    for (int i = 0; i < 16; ++i) acc[i] += ts[g * 16 + i][j] * b;
  }
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const int64_t n = n0 + g * 16 + i;
    if (n < N) {
      const int64_t k = n * out_cols + c0 + c;
      out[k] = to_bf(bf(y[k]) + acc[i]);
    }
  }
}

// ---------------------------------------------------------------- token logprobs over the vocabulary

constexpr int kLogprobThreads = 512;

// (max, sum of exp, sum of z exp) of two parts of a row, merged.
__device__ __forceinline__ void lse_merge(float& m, float& s, float& u, float m2, float s2, float u2) {
  const float mm = fmaxf(m, m2);
  const float f1 = m == -INFINITY ? 0.f : __expf(m - mm), f2 = m2 == -INFINITY ? 0.f : __expf(m2 - mm);
  s = s * f1 + s2 * f2;
  u = u * f1 + u2 * f2;
  m = mm;
}

// One row per block: z = logits / T (float32 of the bf16 logits), lse = logsumexp(z),
// lp = z[target] - lse and H = lse - sum softmax(z) z, in one pass over the row.
__global__ void __launch_bounds__(kLogprobThreads)
    logprob_fwd_kernel(const bf16_t* logits, int V, const int64_t* targets, float temperature, float* lse, float* lp,
                       float* ent) {
  const int64_t row = blockIdx.x;
  const bf16_t* x = logits + row * V;
  float m = -INFINITY, s = 0, u = 0;
  for (int i = threadIdx.x; i < V; i += kLogprobThreads) {
    const float z = bf(x[i]) / temperature;
    if (z > m) {
      const float f = __expf(m - z);
      s = s * f + 1.f;
      u = u * f + z;
      m = z;
    } else {
      const float e = __expf(z - m);
      s += e;
      u += z * e;
    }
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1)
    lse_merge(m, s, u, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o),
              __shfl_xor_sync(0xffffffffu, u, o));
  __shared__ float pm[kLogprobThreads / 32], psum[kLogprobThreads / 32], pu[kLogprobThreads / 32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (lane == 0) {
    pm[warp] = m;
    psum[warp] = s;
    pu[warp] = u;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float M = -INFINITY, S = 0, U = 0;
    for (int w = 0; w < kLogprobThreads / 32; ++w) lse_merge(M, S, U, pm[w], psum[w], pu[w]);
    const float l = M + logf(S);
    lse[row] = l;
    lp[row] = bf(x[targets[row]]) / temperature - l;
    if (ent) ent[row] = l - U / S;
  }
}

// d/dz of g_lp * logp[target] + g_ent * H, divided by T (the gradient of the raw logits), rounded
// to bf16 as autograd rounds the gradient of a bf16 tensor cast to float32.
__global__ void logprob_bwd_kernel(const bf16_t* logits, int V, const int64_t* targets, float temperature,
                                   const float* lse, const float* ent, const float* g_lp, const float* g_ent,
                                   bf16_t* grad) {
  const int64_t row = blockIdx.y;
  const float l = lse[row], glp = g_lp ? g_lp[row] : 0.f, gent = g_ent ? g_ent[row] : 0.f;
  const float h = ent ? ent[row] : 0.f;
  const int64_t t = targets[row];
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < V; i += gridDim.x * blockDim.x) {
    const float logp = bf(logits[row * V + i]) / temperature - l;
    const float p = __expf(logp);
    float gz = -glp * p + (i == t ? glp : 0.f);
    if (g_ent) gz += -gent * p * (logp + h);
    grad[row * V + i] = to_bf(gz / temperature);
  }
}

template <int D, int REP>
void launch_attention(dim3 grid, const bf16_t* q, const bf16_t* kc, const bf16_t* vc, const int64_t* pos,
                      const int32_t* share, int nkv, int64_t cap, int klen, int span, float scale, float* work,
                      int* counters, bf16_t* out, float* out32, Stream s) {
  constexpr int bytes = attention_smem(D, REP);
  // More than the default 48 KB of shared memory: raised once per device (the attribute is a
  // device's; samplers on several GPUs share this process), at the device's first call, which is
  // the decoder's warm-up step before any graph capture.
  static std::array<std::atomic<bool>, 64> sized{};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= int(sized.size()))
    throw std::runtime_error("decode_attention: no current CUDA device below 64");
  if (!sized[dev].load()) {
    const cudaError_t e =
        cudaFuncSetAttribute(decode_attention_kernel<D, REP>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (e != cudaSuccess)
      throw std::runtime_error(std::string("decode_attention: cannot raise the shared memory limit: ") +
                               cudaGetErrorString(e));
    sized[dev] = true;
  }
  launch_k(decode_attention_kernel<D, REP>, grid, dim3(kAttnWarps * 32), bytes, s, q, kc, vc, pos, share, nkv, cap,
           klen, span, scale, work, counters, out, out32);
}

template <int D>
void attention_rep(int rep, dim3 grid, const bf16_t* q, const bf16_t* kc, const bf16_t* vc, const int64_t* pos,
                   const int32_t* share, int nkv, int64_t cap, int klen, int span, float scale, float* work,
                   int* counters, bf16_t* out, float* out32, Stream s) {
  switch (rep) {
#define KERNELRL_REP(N)                                                                                              \
  case N:                                                                                                            \
    launch_attention<D, N>(grid, q, kc, vc, pos, share, nkv, cap, klen, span, scale, work, counters, out, out32, s); \
    break;
    KERNELRL_REP(1)
    KERNELRL_REP(2)
    KERNELRL_REP(3)
    KERNELRL_REP(4)
    KERNELRL_REP(5)
    KERNELRL_REP(6)
    KERNELRL_REP(7)
    KERNELRL_REP(8)
#undef KERNELRL_REP
    default:
      throw std::invalid_argument("decode_attention: unsupported heads per kv head");
  }
}

template <int D>
void launch_attention_mma(dim3 grid, const bf16_t* q, const bf16_t* kc, const bf16_t* vc, const int64_t* pos,
                          const int32_t* share, int nkv, int rep, int64_t cap, int klen, int span, float scale,
                          float* work, int* counters, bf16_t* out, float* out32, Stream s) {
  constexpr int bytes = kMmaWarps * 8 * D * 4;  // 32 KB at D = 128: within the default limit
  static const int prefetch = [] {
    const char* v = std::getenv("KERNELRL_ATTN_PREFETCH");
    return v != nullptr && std::string(v) == "0" ? 0 : 1;
  }();
  launch_k(decode_attention_mma_kernel<D>, grid, dim3(kMmaWarps * 32), bytes, s, q, kc, vc, pos, share, nkv, rep, cap,
           klen, span, scale, work, counters, out, out32, prefetch);
}

// The tensor-core kernel unless KERNELRL_ATTN_MMA=0 or the head size is 32.
bool use_mma_attention(int D) {
  static const bool off = [] {
    const char* v = std::getenv("KERNELRL_ATTN_MMA");
    return v != nullptr && std::string(v) == "0";
  }();
  return !off && (D == 64 || D == 128);
}

}  // namespace

void add_rmsnorm(bf16_t* h, const bf16_t* delta, const float* delta_lora, const bf16_t* w, bf16_t* out, float* out32,
                 int R, int H, float eps, Stream s) {
  if (H % 2 != 0 || H > 2 * kNormThreads * 32) throw std::invalid_argument("add_rmsnorm: unsupported hidden size");
  const int pairs = (H / 2 + kNormThreads - 1) / kNormThreads;
  if (pairs <= 4)
    launch_k(add_rmsnorm_kernel<4>, dim3(R), dim3(kNormThreads), 0, s, h, delta, delta_lora, w, out, out32, H, eps);
  else if (pairs <= 8)
    launch_k(add_rmsnorm_kernel<8>, dim3(R), dim3(kNormThreads), 0, s, h, delta, delta_lora, w, out, out32, H, eps);
  else if (pairs <= 16)
    launch_k(add_rmsnorm_kernel<16>, dim3(R), dim3(kNormThreads), 0, s, h, delta, delta_lora, w, out, out32, H, eps);
  else
    launch_k(add_rmsnorm_kernel<32>, dim3(R), dim3(kNormThreads), 0, s, h, delta, delta_lora, w, out, out32, H, eps);
  check("add_rmsnorm");
}

void rope_qkv(const bf16_t* qkv, const float* lora, const int64_t* pos, const float* inv_freq, int R, int nh, int nkv,
              int D, bf16_t* q_out, bf16_t* k_cache, bf16_t* v_cache, int64_t cap, Stream s) {
  launch_k(rope_qkv_kernel, dim3(R), dim3(256), 0, s, qkv, lora, pos, inv_freq, nh, nkv, D, q_out, k_cache, v_cache,
           cap);
  check("rope_qkv");
}

bool decode_attention_supported(int nh, int nkv, int D) {
  return nkv > 0 && nh % nkv == 0 && nh / nkv <= 8 && (D == 32 || D == 64 || D == 128);
}

int decode_attention_splits(int R, int nkv, int D, int klen, int sms) {
  const int pairs = R * nkv;
  int splits, most;
  if (use_mma_attention(D)) {
    // One block an SM: as many splits as keep the grid to one wave, each of at least 256 keys
    // (bench/attention_probe.cu: a merge costs more than it saves below that).
    splits = sms / pairs;
    most = klen / 256;
  } else {
    splits = (2 * sms + pairs / 2) / pairs;       // about two blocks an SM (two of the scalar kernel's fit)
    most = (klen + 2 * kTile - 1) / (2 * kTile);  // at least two tiles a block
  }
  if (most > kMaxSplits) most = kMaxSplits;
  if (splits > most) splits = most;
  return splits < 1 ? 1 : splits;
}

void decode_attention(const bf16_t* q, const bf16_t* k_cache, const bf16_t* v_cache, const int64_t* pos,
                      const int32_t* share, int R, int nh, int nkv, int D, int64_t cap, int klen, float scale,
                      int splits, float* work, int* counters, bf16_t* out, float* out32, Stream s) {
  if (!decode_attention_supported(nh, nkv, D)) throw std::invalid_argument("decode_attention: unsupported shape");
  if (splits < 1 || splits > kMaxSplits) throw std::invalid_argument("decode_attention: splits out of range");
  dim3 grid(R * nkv, splits);
  const int rep = nh / nkv;
  if (use_mma_attention(D)) {  // spans of whole 16-key tiles
    const int span = ((klen + splits - 1) / splits + 15) / 16 * 16;
    if (D == 64)
      launch_attention_mma<64>(grid, q, k_cache, v_cache, pos, share, nkv, rep, cap, klen, span, scale, work, counters,
                               out, out32, s);
    else
      launch_attention_mma<128>(grid, q, k_cache, v_cache, pos, share, nkv, rep, cap, klen, span, scale, work, counters,
                                out, out32, s);
    check("decode_attention");
    return;
  }
  const int span = ((klen + splits - 1) / splits + kTile - 1) / kTile * kTile;
  if (D == 32)
    attention_rep<32>(rep, grid, q, k_cache, v_cache, pos, share, nkv, cap, klen, span, scale, work, counters, out,
                      out32, s);
  else if (D == 64)
    attention_rep<64>(rep, grid, q, k_cache, v_cache, pos, share, nkv, cap, klen, span, scale, work, counters, out,
                      out32, s);
  else
    attention_rep<128>(rep, grid, q, k_cache, v_cache, pos, share, nkv, cap, klen, span, scale, work, counters, out,
                       out32, s);
  check("decode_attention");
}

bool lora_decode_supported(int rs) { return rs >= 1 && rs <= kLoraMaxRank; }

int lora_decode_parts(int in) { return (in + kShrinkChunk - 1) / kShrinkChunk; }

void lora_decode(const float* x, const float* a, const float* bt, int R, int in, int rs, int N, float* part, float* out,
                 Stream s) {
  if (!lora_decode_supported(rs)) throw std::invalid_argument("lora_decode: stacked rank above 192");
  const int parts = lora_decode_parts(in);
  launch_k(lora_shrink_kernel, dim3((R + kShrinkRows - 1) / kShrinkRows, parts, (rs + kShrinkK - 1) / kShrinkK),
           dim3(256), 0, s, x, a, R, in, rs, part);
  check("lora_decode (A)");
  launch_k(lora_expand_kernel,
           dim3((N + kExpandTileCols - 1) / kExpandTileCols, (R + kExpandTileRows - 1) / kExpandTileRows), dim3(256), 0,
           s, part, parts, bt, R, rs, N, out);
  check("lora_decode (B)");
}

void silu_mul(const bf16_t* gu, const float* lora, int R, int I, bf16_t* out, float* out32, Stream s) {
  const int64_t n = int64_t(R) * I;
  int blocks = int((n + 255) / 256);
  if (blocks > 4096) blocks = 4096;
  launch_k(silu_mul_kernel, dim3(blocks), dim3(256), 0, s, gu, lora, n, I, out, out32);
  check("silu_mul");
}

int64_t sample_work_floats(int R, int chunks) { return int64_t(R) * chunks * 4 + 2; }

namespace {
float draw_inv_t(float temperature) { return temperature <= 0 ? 1.f : 1.f / temperature; }  // T = 0: greedy, T = 1

void sample_final(const bf16_t* logits, int R, int V, int chunks, int per, float temperature, uint64_t seed,
                  int64_t* step, const float* work, int64_t* ids, int64_t* pos, int64_t cap, int32_t* hist_tokens,
                  float* hist_logprobs, int64_t hist_steps, Stream s) {
  const bool greedy = temperature <= 0;
  const float inv_t = draw_inv_t(temperature);
  if (chunks < 1 || per < 1 || int64_t(chunks) * per < V || int64_t(chunks - 1) * per >= V)
    throw std::invalid_argument("sample_tokens: the partials' chunks do not cover the vocabulary");
  launch_k(sample_final_kernel, dim3(R), dim3(kSampleThreads), 0, s, logits, R, V, chunks, per, inv_t, greedy, seed,
           step, work, ids, pos, cap, hist_tokens, hist_logprobs, hist_steps);
  check("sample_tokens final");
}
}  // namespace

void sample_partials(const bf16_t* logits, int R, int V, int per, float temperature, const int64_t* step, float* work,
                     Stream s) {
  const float inv_t = draw_inv_t(temperature);
  if (per < 1) throw std::invalid_argument("sample_partials: chunk width below 1");
  launch_k(sample_partial_kernel, dim3((V + per - 1) / per, R), dim3(kSampleThreads), 0, s, logits, V, per, inv_t, step,
           work);
  check("sample_partials");
}

void sample_from_partials(const bf16_t* logits, int R, int V, int per, float temperature, uint64_t seed, int64_t* step,
                          const float* work, int64_t* ids, int64_t* pos, int64_t cap, int32_t* hist_tokens,
                          float* hist_logprobs, int64_t hist_steps, Stream s) {
  sample_final(logits, R, V, (V + per - 1) / per, per, temperature, seed, step, work, ids, pos, cap, hist_tokens,
               hist_logprobs, hist_steps, s);
}

void sample_tokens(const bf16_t* logits, int R, int V, float temperature, uint64_t seed, int64_t* step, float* work,
                   int64_t* ids, int64_t* pos, int64_t cap, int32_t* hist_tokens, float* hist_logprobs,
                   int64_t hist_steps, Stream s) {
  const int per = (V + kSampleChunks - 1) / kSampleChunks;
  sample_partials(logits, R, V, per, temperature, step, work, s);
  sample_from_partials(logits, R, V, per, temperature, seed, step, work, ids, pos, cap, hist_tokens, hist_logprobs,
                       hist_steps, s);
}

bool lora_expand_supported(int r) { return r >= 1 && r <= kExpandMaxRank; }

void lora_expand_add(const bf16_t* y, const float* t, const float* sbt, int64_t N, int out_cols, int r, bf16_t* out,
                     Stream s) {
  if (!lora_expand_supported(r)) throw std::invalid_argument("lora_expand_add: rank above 64");
  dim3 grid((out_cols + kExpandCols - 1) / kExpandCols, unsigned((N + kExpandRows - 1) / kExpandRows));
  lora_expand_add_kernel<<<grid, 256, 0, s>>>(y, t, sbt, N, out_cols, r, out);
  check("lora_expand_add");
}

void logprob_forward(const bf16_t* logits, int64_t rows, int V, const int64_t* targets, float temperature, float* lse,
                     float* lp, float* ent, Stream s) {
  logprob_fwd_kernel<<<unsigned(rows), kLogprobThreads, 0, s>>>(logits, V, targets, temperature, lse, lp, ent);
  check("logprob_forward");
}

void logprob_backward(const bf16_t* logits, int64_t rows, int V, const int64_t* targets, float temperature,
                      const float* lse, const float* ent, const float* g_lp, const float* g_ent, bf16_t* grad,
                      Stream s) {
  dim3 grid(unsigned((V + 1023) / 1024 < 16 ? (V + 1023) / 1024 : 16), unsigned(rows));
  logprob_bwd_kernel<<<grid, 256, 0, s>>>(logits, V, targets, temperature, lse, ent, g_lp, g_ent, grad);
  check("logprob_backward");
}

// ---------------------------------------------------------------- the products on Hopper

namespace {

namespace wg = wgmma_gemm;
static_assert(sizeof(CUtensorMap) == sizeof(GemmMap::raw) && alignof(CUtensorMap) <= alignof(GemmMap));

// Whether this binary's sm_90a code (the only code with the products' bodies) ran.
__global__ void wgmma_body_kernel(int* out) {
#ifdef KERNELRL_WGMMA_BODY
  *out = 1;
#else
  *out = 0;
#endif
}

// The kernel of each kind: tile width, ring depth and K-blocks a stage (measured on the H100 in the
// decode step at the 1.5B shape: docs/BENCHMARKS.md) and its fused steps (ROPE: q/k/v with the
// rotary embedding and the cache write). q/k/v's 6 x 24 KB ring leaves room on each SM for the
// attention's block that follows it, so that block starts (and requests its keys into L2) while
// q/k/v still runs; o and down keep 2 K-blocks a stage, whose depth they need.
// with_config calls f(Config<...>{}) with it: the one table the launch, the occupancy query and
// the maps' box all read.
template <int BN, int STAGES, int KB, int MODE>
struct Config {
  static constexpr int bn = BN, stages = STAGES, kb = KB, mode = MODE;
};
template <bool ROPE = false, bool DRAW = false, class F>
auto with_config(Fused kind, int K, F&& f) {
  const int nkb = K / 64;
  switch (kind) {
    case Fused::kQkvNorm:
      return f(Config<128, 6, 1, wg::kNorm | (ROPE ? wg::kRope : 0)>{});
    case Fused::kGateUpNormSilu:  // 72 gate + 72 up rows a tile: 125 tiles at 1.5B, one wave
      return f(Config<144, 6, 1, wg::kNorm | wg::kSilu>{});
    case Fused::kHeadNorm:  // a thousand tiles and more: two blocks an SM, no split
      return f(Config<128, 4, 1, wg::kNorm | (DRAW ? wg::kDraw : 0)>{});
    default:
      return nkb % 2 == 0 ? f(Config<64, 4, 2, wg::kResid>{}) : f(Config<64, 8, 1, wg::kResid>{});
  }
}

struct GemmShape {
  int bn, kb;
};
GemmShape shape_of(Fused kind, int K) {
  return with_config(kind, K, [](auto c) { return GemmShape{decltype(c)::bn, decltype(c)::kb}; });
}

const CUtensorMap& tmap(const GemmMap& m) { return *reinterpret_cast<const CUtensorMap*>(m.raw); }

// The clusters of `split` blocks the device holds at once for `kind`'s kernel at K.
int clusters_held(Fused kind, int K, int split) {
  return with_config(kind, K, [&](auto c) {
    using C = decltype(c);
    return wg::max_clusters<C::bn, C::stages, C::mode, C::kb>(K, split);
  });
}

// The K split of a product: the largest (at most 8, and at most the tiles' share of the
// multiprocessors) whose clusters all fit on the device at once, so that no cluster waits for a
// second wave (clusters are placed within a GPC: 5 blocks of a GPC of 16 leave 1 idle). Decided
// once a shape and device. KERNELRL_WGMMA_SPLIT=q,o,gu,down (four numbers) sets them instead.
int fused_gemm_split(Fused kind, int N, int K, int sms) {
  static const std::array<int, 5> forced = [] {
    std::array<int, 5> f{0, 0, 0, 0, 0};
    if (const char* v = std::getenv("KERNELRL_WGMMA_SPLIT")) std::sscanf(v, "%d,%d,%d,%d", &f[0], &f[1], &f[2], &f[3]);
    return f;
  }();
  const int units = K / 64 / shape_of(kind, K).kb;
  const int tiles = with_config(kind, K, [&](auto c) {  // as the launch counts them
    using C = decltype(c);
    return wg::tiles<C::bn, C::mode>(N);
  });
  if (forced[int(kind)] > 0) return std::min({forced[int(kind)], units, 16});
  static std::mutex mu;
  static std::map<std::tuple<int, int, int, int, int>, int> chosen;
  int dev = 0;
  cudaGetDevice(&dev);
  const auto key = std::make_tuple(dev, int(kind), N, K, sms);
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = chosen.find(key); it != chosen.end()) return it->second;
  int split = std::max(1, std::min({sms / tiles, units, 8}));
  while (split > 1 && clusters_held(kind, K, split) < tiles) --split;
  chosen[key] = split;
  return split;
}

}  // namespace

bool fused_gemm_available() {
  static const bool off = [] {
    const char* v = std::getenv("KERNELRL_WGMMA");
    return v != nullptr && std::string(v) == "0";
  }();
  if (off || !wg::encoder()) return false;
  static std::array<std::atomic<int>, 64> state{};  // per device: 0 unknown, 1 yes, -1 no
  return once_per_device(state, [](int dev) {
           int major = 0, minor = 0, body = 0;
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
           cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
           if (major == 9 && minor == 0) {
             // on a stream of its own (no implicit synchronisation with other threads' work)
             int* d = nullptr;
             cudaStream_t st = nullptr;
             if (cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking) == cudaSuccess) {
               if (cudaMallocAsync(&d, sizeof(int), st) == cudaSuccess) {
                 wgmma_body_kernel<<<1, 1, 0, st>>>(d);
                 // a binary without sm_90a code fails this launch ("no kernel image"): reported here
                 if (cudaGetLastError() != cudaSuccess ||
                     cudaMemcpyAsync(&body, d, sizeof(int), cudaMemcpyDeviceToHost, st) != cudaSuccess ||
                     cudaStreamSynchronize(st) != cudaSuccess)
                   body = 0;
                 cudaFreeAsync(d, st);
               }
               cudaStreamSynchronize(st);
               cudaStreamDestroy(st);
             }
           }
           return body == 1 ? 1 : -1;
         }) == 1;
}

bool fused_gemm_supported(Fused kind, int N, int K) {
  if (K <= 0 || K % 64 != 0 || N <= 0) return false;
  const GemmShape sh = shape_of(kind, K);
  return kind == Fused::kGateUpNormSilu ? N % 8 == 0 : N % sh.bn == 0;  // (gate/up: I a multiple of 4)
}

int weight_box(Fused kind, int K) {
  const int bn = shape_of(kind, K).bn;
  return kind == Fused::kGateUpNormSilu ? bn / 2 : bn;  // gate/up: each half its own box
}

bool fused_gemm_weight_map(Fused kind, const bf16_t* w, int N, int K, GemmMap* map) {
  if (!fused_gemm_supported(kind, N, K)) return false;
  const int box = weight_box(kind, K);
  if (!wg::make_map(reinterpret_cast<CUtensorMap*>(map->raw), w, uint64_t(N), uint64_t(K), uint32_t(box))) return false;
  map->rows = N, map->cols = K, map->box = box;
  return true;
}

bool fused_gemm_input_map(const bf16_t* x, int R, int K, GemmMap* map) {
  if (R < 1 || R > wg::kRows || K % 64 != 0) return false;
  if (!wg::make_map(reinterpret_cast<CUtensorMap*>(map->raw), x, uint64_t(R), uint64_t(K), 64)) return false;
  map->rows = R, map->cols = K, map->box = 64;
  return true;
}

namespace {
// The maps must be the ones made for this product (a box the kernel does not expect would leave its
// stage barrier waiting for bytes that never come).
void check_maps(const char* what, Fused kind, const GemmMap& x, const GemmMap& w, int R, int N, int K) {
  if (x.rows != R || x.cols != K || x.box != 64 || w.rows != N || w.cols != K || w.box != weight_box(kind, K))
    throw std::invalid_argument(std::string(what) + ": the maps were not made for this product's shape");
}
}  // namespace

void fused_gemm(Fused kind, const GemmMap& x, const GemmMap& w, const bf16_t* bias, const bf16_t* g, bf16_t* y, int R,
                int N, int K, float eps, int sms, Stream s) {
  if (!fused_gemm_supported(kind, N, K)) throw std::invalid_argument("fused_gemm: unsupported shape");
  check_maps("fused_gemm", kind, x, w, R, N, K);
  const int split = fused_gemm_split(kind, N, K, sms);
  const auto* b = reinterpret_cast<const __nv_bfloat16*>(bias);
  const auto* gw = reinterpret_cast<const __nv_bfloat16*>(g);
  auto* out = reinterpret_cast<__nv_bfloat16*>(y);
  const bool pdl = pdl_on();
  const cudaError_t e = with_config(kind, K, [&](auto c) {
    using C = decltype(c);
    constexpr bool silu = (C::mode & wg::kSilu) != 0, norm = (C::mode & wg::kNorm) != 0;
    return wg::gemm<C::bn, C::stages, C::mode, C::kb>(tmap(x), tmap(w), b, norm ? gw : nullptr, out, silu ? N / 2 : N,
                                                      R, N, K, split, eps, pdl, s);
  });
  if (e != cudaSuccess) throw std::runtime_error(std::string("fused_gemm: ") + cudaGetErrorString(e));
  check("fused_gemm");
}

int fused_head_draw_chunk() { return shape_of(Fused::kHeadNorm, 64).bn; }

void fused_head_draw(const GemmMap& x, const GemmMap& w, const bf16_t* g, bf16_t* logits, int R, int N, int K,
                     float eps, float temperature, const int64_t* step, float* work, Stream s) {
  if (!fused_gemm_supported(Fused::kHeadNorm, N, K)) throw std::invalid_argument("fused_head_draw: unsupported shape");
  check_maps("fused_head_draw", Fused::kHeadNorm, x, w, R, N, K);
  // never split over K: each tile's partials need its whole sums (a vocabulary's tiles fill the device)
  wg::Draw dr;
  dr.work = work, dr.step = step, dr.inv_t = draw_inv_t(temperature);
  const auto* gw = reinterpret_cast<const __nv_bfloat16*>(g);
  const cudaError_t e = with_config<false, true>(Fused::kHeadNorm, K, [&](auto c) {
    using C = decltype(c);
    return wg::gemm<C::bn, C::stages, C::mode, C::kb>(tmap(x), tmap(w), nullptr, gw,
                                                      reinterpret_cast<__nv_bfloat16*>(logits), N, R, N, K, 1, eps,
                                                      pdl_on(), s, wg::Rope{}, dr);
  });
  if (e != cudaSuccess) throw std::runtime_error(std::string("fused_head_draw: ") + cudaGetErrorString(e));
  check("fused_head_draw");
}

bool fused_qkv_rope_supported(int nh, int nkv, int D) { return nh > 0 && nkv > 0 && (D == 64 || D == 128); }

void fused_qkv_rope(const GemmMap& x, const GemmMap& w, const bf16_t* bias, const bf16_t* g, const int64_t* pos,
                    const float* inv_freq, int R, int nh, int nkv, int D, int K, float eps, bf16_t* q_out,
                    bf16_t* k_cache, bf16_t* v_cache, int64_t cap, int sms, Stream s) {
  const int N = (nh + 2 * nkv) * D;
  if (!fused_qkv_rope_supported(nh, nkv, D) || !fused_gemm_supported(Fused::kQkvNorm, N, K))
    throw std::invalid_argument("fused_qkv_rope: unsupported shape");
  check_maps("fused_qkv_rope", Fused::kQkvNorm, x, w, R, N, K);
  wg::Rope rp;
  rp.pos = pos, rp.inv_freq = inv_freq, rp.nh = nh, rp.nkv = nkv, rp.D = D, rp.cap = cap;
  rp.q = reinterpret_cast<__nv_bfloat16*>(q_out);
  rp.kc = reinterpret_cast<__nv_bfloat16*>(k_cache);
  rp.vc = reinterpret_cast<__nv_bfloat16*>(v_cache);
  const int split = fused_gemm_split(Fused::kQkvNorm, N, K, sms);
  const auto* b = reinterpret_cast<const __nv_bfloat16*>(bias);
  const auto* gw = reinterpret_cast<const __nv_bfloat16*>(g);
  const cudaError_t e = with_config<true>(Fused::kQkvNorm, K, [&](auto c) {
    using C = decltype(c);
    return wg::gemm<C::bn, C::stages, C::mode, C::kb>(tmap(x), tmap(w), b, gw, nullptr, N, R, N, K, split, eps,
                                                      pdl_on(), s, rp);
  });
  if (e != cudaSuccess) throw std::runtime_error(std::string("fused_qkv_rope: ") + cudaGetErrorString(e));
  check("fused_qkv_rope");
}

}  // namespace kernelrl::cuda
