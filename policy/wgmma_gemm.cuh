// The decode step's matrix products on Hopper: y [M, N] = x [M, K] W [N, K]^T for M <= 64 rows
// (wgmma's M), bf16 in and out, float32 accumulation, with the step's elementwise neighbours fused
// in (MODE bits):
//  - kNorm: x is the residual stream h and the product is that of transformers' Qwen2RMSNorm
//    output, g * h / rms(h): each thread's A fragments of the x tile are multiplied by g in
//    registers (rounded to bf16; wgmma takes A from registers) while it sums h^2 of its rows, and
//    each output is scaled by rsqrt(mean h^2 + eps)
//    at the end (no normalised copy of x in device memory, no norm kernel). It rounds elsewhere
//    than transformers (bf16(h g), then the float32 sum times 1/rms, where transformers rounds
//    h / rms to bf16 first): closer to the float32 model, not bit-equal to transformers' bf16.
//  - kSilu: W is the fused gate|up weight [2I, K]; a tile holds BN / 2 gate rows and the same up
//    rows, and the output is silu(gate) * up [M, I] with transformers' roundings. I need not be a
//    multiple of BN / 2 (the last tile's outputs past I are not written): the half-width is chosen
//    so that the tiles fill the multiprocessors once.
//  - kResid: the output is added to y in place, y = bf16(y + bf16(x W^T)): the residual add.
//  - kRope (with a tile of whole heads): the q|k|v outputs get rope_qkv's rotary embedding and go to
//    q and the caches' slot (policy/cuda_kernels.cu's rope_qkv arithmetic: the same bits).
//  - kDraw (the head, no split): besides the logits, each tile leaves the sampler's partials of its
//    BN logits a row, x = bf16(logit) / T: the max, the sum of exp(x - max) and the lowest index of
//    the max (policy/cuda_kernels.cu's sample_partial_kernel computes the same from the logits), so
//    that the draw reads no logits but those of the chunk it lands in.
// bias (optional) is added before the roundings above. policy/cuda_kernels.cu runs it for the
// decoder (fused_gemm in policy/cuda_kernels.hpp); bench/gemm_probe.cu (mode `wgmma`) times it
// beside cuBLASLt (version 4 of the few-row products there).
//
// How: the copy engine (cp.async.bulk.tensor, one thread, completing on an mbarrier) brings each
// stage's KB K-blocks of 64 columns of x (64 rows; rows past M read as zeros) and of the block's
// BN rows of W into shared memory in the 128-byte swizzle that wgmma reads, STAGES deep; one
// warpgroup multiplies them from shared memory (wgmma m64nBNk16). K is split over the blocks of a
// thread-block cluster (rank = split index): each block leaves its float32 tile (and its rows'
// partial sums of squares) in its shared memory and every block finishes a slice of the tile
// from all of the cluster's (distributed shared memory, in rank order: deterministic). Under
// programmatic dependent launch the first weight stages are requested before griddepcontrol.wait
// (the weights do not depend on the kernel before); x's after it. The kernel body needs sm_90a
// (nvcc -gencode=arch=compute_90a,code=sm_90a); other targets compile it empty.
#pragma once

#include <cuda.h>  // CUtensorMap (types only: the encoder is fetched through the runtime)
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <mutex>

namespace kernelrl::cuda::wgmma_gemm {

constexpr int kBK = 64;    // K-columns a stage: 128 bytes, one swizzle row
constexpr int kRows = 64;  // wgmma's M
constexpr int kThreads = 128;
constexpr int kNorm = 1, kSilu = 2, kResid = 4, kRope = 8, kDraw = 16;

// kRope: the outputs are q|k|v [M, (nh + 2 nkv) D]; q rotated into q [M, nh, D], k rotated and v
// written into the caches [M, nkv, cap, D] at slot pos[row] (rows whose pos is outside [0, cap)
// write no k or v), as policy/cuda_kernels.cu's rope_qkv does; y is not written.
struct Rope {
  const int64_t* pos = nullptr;
  const float* inv_freq = nullptr;  // [D / 2]
  __nv_bfloat16 *q = nullptr, *kc = nullptr, *vc = nullptr;
  int nh = 0, nkv = 0, D = 0;
  int64_t cap = 0;
};

// kDraw: work [M][tiles][4] floats (max, sum, -, index as int bits) of row r and tile t at
// (r tiles + t) 4, then the step counter's copy (int64) at M tiles 4, which block 0 copies from *step
// (the draw's final kernel moves the counter on while its blocks read the copy).
struct Draw {
  float* work = nullptr;
  const int64_t* step = nullptr;
  float inv_t = 1.f;
};

// A stage: KB K-blocks of 64 columns, x's (64 rows) then W's (BN rows), each K-block its own tile.
template <int BN, int KB>
__host__ __device__ constexpr int stage_bytes() {
  return KB * (kRows + BN) * kBK * 2;
}
template <int BN, int STAGES, int KB>
__host__ __device__ constexpr int smem_bytes() {
  return STAGES * stage_bytes<BN, KB>() + 1024;  // + alignment slack (the swizzle wants 1024-byte tiles)
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KERNELRL_WGMMA_BODY 1

__device__ __forceinline__ uint32_t saddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// A shared-memory matrix descriptor: K-major rows of 128 bytes in the 128-byte swizzle, 8-row
// groups 1024 bytes apart.
__device__ __forceinline__ uint64_t desc(uint32_t a) {
  return uint64_t((a & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}
__device__ __forceinline__ void bar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void bar_expect(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void bar_wait(uint32_t bar, int phase) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}" ::"r"(bar),
      "r"(phase)
      : "memory");
}
// Rows [c1, c1 + box) and K-columns [c0, c0 + 64) of the matrix behind `map` into shared memory.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::
          "r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
__device__ __forceinline__ uint32_t remote(uint32_t a, int rank) {
  uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank));
  return r;
}
__device__ __forceinline__ float4 ld_cluster4(uint32_t a) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(a)
               : "memory");
  return v;
}
__device__ __forceinline__ float ld_cluster1(uint32_t a) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
  return v;
}

__device__ __forceinline__ void wgmma_n64(float (&d)[32], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, 1, 1, "
      "1, 0, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_n8(float* d, uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "l"(da), "l"(db));
}
// The same with A (the warp's 16 rows x 16 K-columns, mma's A fragment: 4 x bf16x2) from registers.
__device__ __forceinline__ void wgmma_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, "
      "%35}, %36, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]),
        "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void wgmma_n8(float* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, 1, 0;"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// 32 and 16 columns (A from shared memory or registers), for tiles that are not multiples of 64.
__device__ __forceinline__ void wgmma_n32(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15}, %16, %17, 1, 1, 1, 0, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_n32(float* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
      "%13, %14, %15}, {%16, %17, %18, %19}, %20, 1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]),
        "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void wgmma_n16(float* d, uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, 1, 1, 0, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db));
}
__device__ __forceinline__ void wgmma_n16(float* d, const uint32_t (&a)[4], uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, "
      "1, 1, 1, 0;"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
// D (+)= A B^T over N (a multiple of 8) rows of B: products of 64 columns, then of 32, 16 and 8 for
// the rest, each on the B rows after the last (a row is 128 bytes: +8 in the descriptor's 16-byte
// units); d's layout is that of one m64nNk16 product (columns 8j.. are d[4j..]).
// A: a shared-memory descriptor (uint64_t) or the fragment in registers (uint32_t[4]).
template <int N, class A>
__device__ __forceinline__ void wgmma_cols(float* d, const A& da, uint64_t db) {
  static_assert(N % 8 == 0, "wgmma: N is a multiple of 8");
#pragma unroll
  for (int t = 0; t < N / 64; ++t) wgmma_n64(*reinterpret_cast<float(*)[32]>(d + 32 * t), da, db + 512 * t);
  constexpr int c32 = N / 64 * 64, c16 = c32 + (N % 64 >= 32 ? 32 : 0), c8 = c16 + (N % 32 >= 16 ? 16 : 0);
  if constexpr (c16 > c32) wgmma_n32(d + c32 / 2, da, db + c32 * 8);
  if constexpr (c8 > c16) wgmma_n16(d + c16 / 2, da, db + c16 * 8);
  if constexpr (N > c8) wgmma_n8(d + c8 / 2, da, db + c8 * 8);
}
#endif

// The finished value of output (row, col) from its float32 sum `v` (and, for kSilu, the up sum
// `u`): the epilogue every path shares.
template <int MODE>
__device__ __forceinline__ float finish(float v, float u, float inv, float b, float bu, const __nv_bfloat16* y) {
  float o = v;
  if constexpr ((MODE & kNorm) != 0) o *= inv, u *= inv;
  o += b, u += bu;
  if constexpr ((MODE & kSilu) != 0) {
    const float g = __bfloat162float(__float2bfloat16(o)), up = __bfloat162float(__float2bfloat16(u));
    const float a = __bfloat162float(__float2bfloat16(g / (1.f + expf(-g))));
    return a * up;
  }
  if constexpr ((MODE & kResid) != 0) return __bfloat162float(*y) + __bfloat162float(__float2bfloat16(o));
  return o;
}

__device__ __forceinline__ float round_bf(float x) { return __bfloat162float(__float2bfloat16(x)); }

// The draw's partials (max m, sum s of exp(x - m), lowest index mi of the max) merged with lane ^ o's:
// kDraw's end and policy/cuda_kernels.cu's sample_partial_kernel share it.
__device__ __forceinline__ void merge_draw(float& m, float& s, int& mi, int o) {
  const float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
  const int i2 = __shfl_xor_sync(0xffffffffu, mi, o);
  const float mm = fmaxf(m, m2);
  s = (m == -INFINITY ? 0.f : s * __expf(m - mm)) + (m2 == -INFINITY ? 0.f : s2 * __expf(m2 - mm));
  if (m2 > m || (m2 == m && i2 < mi)) mi = i2;
  m = mm;
}

// The rotary embedding of one pair (x1, x2) = (q[i], q[i + D/2]) at position p with frequency f, as
// transformers computes it in bf16: cos and sin in float32 rounded to bf16, q * cos +
// rotate_half(q) * sin with rotate_half(q) = [-x2, x1], each product and the sum rounded. Shared by
// rope_qkv (policy/cuda_kernels.cu) and kRope, so that the two give the same bits.
__device__ __forceinline__ float2 rotate_pair(float x1, float x2, int64_t p, float f) {
  const float a = float(p) * f;
  const float c = round_bf(cosf(a)), s = round_bf(sinf(a));
  return make_float2(round_bf(round_bf(x1 * c) + round_bf(-x2 * s)), round_bf(round_bf(x2 * c) + round_bf(x1 * s)));
}

// kRope's end for the finished outputs (row, col) and (row, col + D / 2), col in the first half of
// its head: rope_qkv's arithmetic (the bf16 q|k|v values, cos and sin rounded to bf16, each product
// and the sum rounded).
__device__ __forceinline__ void rope_store(const Rope& rp, int row, int col, float x1, float x2) {
  const int half = rp.D / 2, hh = col / rp.D, i = col % rp.D;
  x1 = round_bf(x1), x2 = round_bf(x2);
  const int64_t p = rp.pos[row];
  const bool write = p >= 0 && p < rp.cap;
  if (hh < rp.nh + rp.nkv) {
    const float2 o = rotate_pair(x1, x2, p, rp.inv_freq[i]);
    const float o1 = o.x, o2 = o.y;
    if (hh < rp.nh) {
      __nv_bfloat16* q = rp.q + (int64_t(row) * rp.nh + hh) * rp.D;
      q[i] = __float2bfloat16(o1), q[i + half] = __float2bfloat16(o2);
    } else if (write) {
      __nv_bfloat16* k = rp.kc + ((int64_t(row) * rp.nkv + (hh - rp.nh)) * rp.cap + p) * rp.D;
      k[i] = __float2bfloat16(o1), k[i + half] = __float2bfloat16(o2);
    }
  } else if (write) {
    __nv_bfloat16* v = rp.vc + ((int64_t(row) * rp.nkv + (hh - rp.nh - rp.nkv)) * rp.cap + p) * rp.D;
    v[i] = __float2bfloat16(x1), v[i + half] = __float2bfloat16(x2);
  }
}

// kRope without a split: this thread's pairs of fragment columns, HALF = D / 2 apart.
template <int BN, int MODE, int HALF>
__device__ __forceinline__ void rope_direct(const float (&d)[BN / 2], const Rope& rp, int r0, int c0, int col0, int M,
                                            const float* inv_of, const __nv_bfloat16* bias) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + 8 * h;
    if (row >= M) continue;
    const float inv = inv_of[row];
#pragma unroll
    for (int j = 0; j < BN / 8; ++j) {
      if ((8 * j) % (2 * HALF) >= HALF) continue;
      constexpr int jp = HALF / 8;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int c = col0 + 8 * j + c0 + e;
        const float b1 = bias ? __bfloat162float(bias[c]) : 0.f, b2 = bias ? __bfloat162float(bias[c + HALF]) : 0.f;
        rope_store(rp, row, c, finish<MODE>(d[4 * j + 2 * h + e], 0.f, inv, b1, 0.f, nullptr),
                   finish<MODE>(d[4 * (j + jp) + 2 * h + e], 0.f, inv, b2, 0.f, nullptr));
      }
    }
  }
}

// kDraw's end (no split): for each of this thread's two rows, (max, sum of exp(x - max), lowest index
// of the max) over its 2 BN / 8 columns, x = bf16(logit) inv_t with the logit as stored (two passes:
// the max, then independent exponentials, no dependent chain), merged over the four lanes that hold
// the row's other columns; lane 0 of the four writes the tile's partial. Every lane takes part in the
// shuffles (rows past M: zeros in, not written).
template <int BN, int MODE>
__device__ __forceinline__ void draw_partials(const float (&d)[BN / 2], const Draw& dr, const float* ss, float inv_k,
                                              float eps, int r0, int c0, int col0, int M, int tile,
                                              const __nv_bfloat16* bias) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = r0 + 8 * h;
    const float inv = (MODE & kNorm) != 0 ? rsqrtf(ss[row] * inv_k + eps) : 1.f;
    float x[BN / 4];
    float m = -INFINITY;
    int mi = 0x7fffffff;
#pragma unroll
    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
      for (int e = 0; e < 2; ++e) {  // columns in increasing order: the first of equal maxima kept
        const int col = col0 + 8 * j + c0 + e;
        const float b = bias ? __bfloat162float(bias[col]) : 0.f;
        const float v = round_bf(finish<MODE>(d[4 * j + 2 * h + e], 0.f, inv, b, 0.f, nullptr)) * dr.inv_t;
        x[2 * j + e] = v;
        if (v > m) m = v, mi = col;
      }
    float s = 0.f;
    if (m != -INFINITY) {
#pragma unroll
      for (int i = 0; i < BN / 4; ++i) s += __expf(x[i] - m);
    }
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) merge_draw(m, s, mi, o);
    if ((lane & 3) == 0 && row < M) {
      float* wp = dr.work + (size_t(row) * gridDim.x + tile) * 4;
      wp[0] = m;
      wp[1] = s;
      wp[3] = __int_as_float(mi);
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *reinterpret_cast<int64_t*>(dr.work + size_t(M) * gridDim.x * 4) = *dr.step;
}

// grid (tiles * split), cluster (split), 128 threads, smem_bytes<BN, STAGES, KB>(). tiles = N / BN
// (kSilu: ceil(I / (BN / 2)), W rows t BN/2.. and I + t BN/2..); y [M, ldy]; g [K] (kNorm).
template <int BN, int STAGES, int MODE, int KB>
__global__ void __launch_bounds__(kThreads)
    kernel(const __grid_constant__ CUtensorMap tx, const __grid_constant__ CUtensorMap tw,
           const __nv_bfloat16* __restrict__ bias, const __nv_bfloat16* __restrict__ g, __nv_bfloat16* y, int ldy,
           int M, int nkb, int I, float eps, const Rope rp, const Draw dr) {
#ifdef KERNELRL_WGMMA_BODY
  static_assert(BN % 8 == 0 && ((MODE & kSilu) == 0 || BN % 16 == 0), "tiles of 8-row groups (kSilu: each half)");
  constexpr int H2 = BN / 2;  // kSilu: gate (and up) rows a tile
  static_assert((MODE & kRope) == 0 || BN == 128, "kRope tiles hold whole heads of 64 or 128");
  static_assert((MODE & kDraw) == 0 || (MODE & (kRope | kSilu)) == 0, "kDraw: plain outputs");
  extern __shared__ unsigned char smem_raw[];
  __shared__ __align__(8) uint64_t full[STAGES];
  __shared__ float ss_s[kRows];  // this block's partial sums of h^2 a row (kNorm)
  unsigned char* smem =
      reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint32_t rank, split;
  asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  asm("mov.u32 %0, %%cluster_nctarank;" : "=r"(split));
  const int tile = blockIdx.x / split;
  const int nu = nkb / KB;  // units of KB K-blocks
  const int u0 = int(rank * nu / split), n = int((rank + 1) * nu / split) - u0;
  const int kb0 = u0 * KB;
  const int tid = threadIdx.x;
  const uint32_t s0 = saddr(smem), b0 = saddr(full);
  auto xs = [&](int s, int j) { return s0 + uint32_t(s * stage_bytes<BN, KB>() + j * kRows * kBK * 2); };
  auto ws = [&](int s, int j) {
    return s0 + uint32_t(s * stage_bytes<BN, KB>() + KB * kRows * kBK * 2 + j * BN * kBK * 2);
  };
  auto load_w = [&](int s, int i) {  // unit i of this block's range
    for (int j = 0; j < KB; ++j) {
      const int kb = kb0 + i * KB + j;
      if constexpr ((MODE & kSilu) != 0) {
        tma_load(ws(s, j), &tw, kb * kBK, tile * H2, b0 + 8 * s);  // (past I: up rows, not written)
        tma_load(ws(s, j) + H2 * 128, &tw, kb * kBK, I + tile * H2, b0 + 8 * s);
      } else {
        tma_load(ws(s, j), &tw, kb * kBK, tile * BN, b0 + 8 * s);
      }
    }
  };
  auto load_x = [&](int s, int i) {
    for (int j = 0; j < KB; ++j) tma_load(xs(s, j), &tx, (kb0 + i * KB + j) * kBK, 0, b0 + 8 * s);
  };
  // kNorm: g (a weight: before griddepcontrol.wait) into shared memory after the stages.
  const __nv_bfloat16* gs = reinterpret_cast<const __nv_bfloat16*>(smem + STAGES * stage_bytes<BN, KB>());
  if constexpr ((MODE & kNorm) != 0)
    for (int c = tid; c < nkb * kBK / 8; c += kThreads)
      reinterpret_cast<uint4*>(smem + STAGES * stage_bytes<BN, KB>())[c] = __ldg(reinterpret_cast<const uint4*>(g) + c);
  if (tid == 0) {
    for (int s = 0; s < STAGES; ++s) bar_init(b0 + 8 * s, 1);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  __syncthreads();
  const int pre = n < STAGES ? n : STAGES;
  if (tid == 0)
    for (int i = 0; i < pre; ++i) {  // the weight does not depend on the kernel before
      bar_expect(b0 + 8 * i, stage_bytes<BN, KB>());
      load_w(i, i);
    }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (tid == 0)
    for (int i = 0; i < pre; ++i) load_x(i, i);
  float d[BN / 2];
#pragma unroll
  for (int j = 0; j < BN / 2; ++j) d[j] = 0.f;
  // kNorm: each thread loads its A fragments of the h tile (ldmatrix through the swizzle), multiplies
  // them by g (bf16: the float product rounded once) and sums h^2 of its rows; the products take A
  // from registers (no normalised copy in shared memory, no barrier between).
  const int warp = tid >> 5, lane = tid & 31;
  float ss_lo = 0.f, ss_hi = 0.f;  // rows warp * 16 + lane / 4 (+ 8)
  for (int i = 0; i < n; ++i) {
    const int s = i % STAGES;
    bar_wait(b0 + 8 * s, (i / STAGES) & 1);
    uint32_t a[(MODE & kNorm) != 0 ? KB * kBK / 16 : 1][4];  // kNorm: the stage's A fragments
    if constexpr ((MODE & kNorm) != 0) {
#pragma unroll
      for (int j = 0; j < KB; ++j)
#pragma unroll
        for (int kk = 0; kk < kBK / 16; ++kk) {
          // lane l gives the address of row l % 8 (+ 8 for l / 8 odd) of the warp's 16, 16-byte
          // chunk 2 kk (+ 1 for l / 16) of the 128-byte row, swizzled (chunk ^ row % 8).
          uint32_t(&f)[4] = a[j * (kBK / 16) + kk];
          const int r = warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), ch = 2 * kk + (lane >> 4);
          asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                       : "=r"(f[0]), "=r"(f[1]), "=r"(f[2]), "=r"(f[3])
                       : "r"(xs(s, j) + uint32_t(r * 128 + ((ch ^ (r & 7)) << 4))));
          const int col = (kb0 + i * KB + j) * kBK + kk * 16 + 2 * (lane & 3);
          const __nv_bfloat162 g0 = *reinterpret_cast<const __nv_bfloat162*>(gs + col),
                               g8 = *reinterpret_cast<const __nv_bfloat162*>(gs + col + 8);
#pragma unroll
          for (int q = 0; q < 4; ++q) {  // f[0]: row, cols c, c + 1; f[1]: row + 8; f[2], f[3]: cols c + 8..
            __nv_bfloat162 hv = *reinterpret_cast<__nv_bfloat162*>(&f[q]);
            const float2 h2 = __bfloat1622float2(hv);
            (q & 1 ? ss_hi : ss_lo) += h2.x * h2.x + h2.y * h2.y;
            hv = __hmul2(hv, q < 2 ? g0 : g8);
            f[q] = *reinterpret_cast<uint32_t*>(&hv);
          }
        }
    }
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int j = 0; j < KB; ++j)
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        const uint64_t db = desc(ws(s, j) + 32 * kk);
        auto mma = [&](const auto& A) {
          if constexpr ((MODE & kSilu) != 0) {  // the gate rows, then the up rows (H2 * 128 bytes on)
            wgmma_cols<H2>(d, A, db);
            wgmma_cols<H2>(d + H2 / 2, A, db + H2 * 8);
          } else {
            wgmma_cols<BN>(d, A, db);
          }
        };
        if constexpr ((MODE & kNorm) != 0)
          mma(a[j * (kBK / 16) + kk]);
        else
          mma(desc(xs(s, j) + 32 * kk));
      }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    if (i + STAGES < n) {
      __syncthreads();  // every warp's products have read stage s
      if (tid == 0) {
        bar_expect(b0 + 8 * s, stage_bytes<BN, KB>());
        load_w(s, i + STAGES);
        load_x(s, i + STAGES);
      }
    }
  }
  if constexpr ((MODE & kNorm) != 0) {
#pragma unroll
    for (int o = 1; o < 4; o <<= 1) {
      ss_lo += __shfl_xor_sync(0xffffffffu, ss_lo, o);
      ss_hi += __shfl_xor_sync(0xffffffffu, ss_hi, o);
    }
    if ((lane & 3) == 0) ss_s[warp * 16 + (lane >> 2)] = ss_lo, ss_s[warp * 16 + (lane >> 2) + 8] = ss_hi;
  }
  const float inv_k = 1.f / float(nkb * kBK);
  // The accumulator fragment: d[4j + 2h + e] is row warp * 16 + lane / 4 + 8h, column 8j + 2 (lane % 4) + e.
  const int r0 = warp * 16 + (lane >> 2), c0 = 2 * (lane & 3);
  constexpr int OUT = (MODE & kSilu) != 0 ? H2 : BN;  // output columns a tile
  const int col0 = tile * OUT;
  const int ncol = (MODE & kSilu) != 0 ? I : 1 << 30;  // kSilu: outputs past I not written
  auto bias_of = [&](int col) { return bias ? __bfloat162float(bias[col]) : 0.f; };
  if (split == 1) {
    __syncthreads();
    if constexpr ((MODE & kRope) != 0) {
      if (tid < M) ss_s[tid] = (MODE & kNorm) != 0 ? rsqrtf(ss_s[tid] * inv_k + eps) : 1.f;
      __syncthreads();
      if (rp.D == 128)
        rope_direct<BN, MODE, 64>(d, rp, r0, c0, col0, M, ss_s, bias);
      else
        rope_direct<BN, MODE, 32>(d, rp, r0, c0, col0, M, ss_s, bias);
    } else {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = r0 + 8 * h;
        if (row >= M) continue;
        const float inv = (MODE & kNorm) != 0 ? rsqrtf(ss_s[row] * inv_k + eps) : 1.f;
#pragma unroll
        for (int j = 0; j < OUT / 8; ++j) {
          const int c = 8 * j + c0;
          if (col0 + c >= ncol) continue;
          float o[2];
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const float v = d[4 * j + 2 * h + e];
            const float u = (MODE & kSilu) != 0 ? d[4 * (j + OUT / 8) + 2 * h + e] : 0.f;
            const float bu = (MODE & kSilu) != 0 ? bias_of(I + col0 + c + e) : 0.f;
            o[e] = finish<MODE>(v, u, inv, bias_of(col0 + c + e), bu, y + size_t(row) * ldy + col0 + c + e);
          }
          *reinterpret_cast<__nv_bfloat162*>(y + size_t(row) * ldy + col0 + c) = __floats2bfloat162_rn(o[0], o[1]);
        }
      }
      if constexpr ((MODE & kDraw) != 0) draw_partials<BN, MODE>(d, dr, ss_s, inv_k, eps, r0, c0, col0, M, tile, bias);
    }
    return;
  }
  constexpr int LD = BN + 8;  // floats a row of the partial tile
  __syncthreads();            // the stages are free: the partial tile goes over them
  float* part = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < BN / 8; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(part + (r0 + 8 * h) * LD + 8 * j + c0) =
          float2{d[4 * j + 2 * h], d[4 * j + 2 * h + 1]};
  cluster_sync();
  __shared__ float inv_s[kRows];
  if constexpr ((MODE & kNorm) != 0) {
    if (tid < M) {
      float t = 0.f;
      for (int r = 0; r < int(split); ++r) t += ld_cluster1(remote(saddr(ss_s + tid), r));
      inv_s[tid] = rsqrtf(t * inv_k + eps);
    }
    __syncthreads();
  }
  if constexpr ((MODE & kRope) != 0) {
    // pairs of 4-column chunks D / 2 apart, each chunk in the first half of its head
    const int half = rp.D / 2, pairs = M * (BN / 8);
    const int p_lo = int(rank * pairs / split), p_hi = int((rank + 1) * pairs / split);
    for (int q = p_lo + tid; q < p_hi; q += kThreads) {
      const int row = q / (BN / 8), k = q % (BN / 8);
      const int col4 = (k / (half / 4)) * rp.D + 4 * (k % (half / 4));
      const uint32_t a = saddr(part + row * LD + col4), b = a + uint32_t(half) * 4;
      float4 x = ld_cluster4(remote(a, 0)), z = ld_cluster4(remote(b, 0));
      for (int r = 1; r < int(split); ++r) {
        const float4 v = ld_cluster4(remote(a, r)), w = ld_cluster4(remote(b, r));
        x.x += v.x, x.y += v.y, x.z += v.z, x.w += v.w;
        z.x += w.x, z.y += w.y, z.z += w.z, z.w += w.w;
      }
      const float inv = (MODE & kNorm) != 0 ? inv_s[row] : 1.f;
      const float xv[4] = {x.x, x.y, x.z, x.w}, zv[4] = {z.x, z.y, z.z, z.w};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = col0 + col4 + e;
        rope_store(rp, row, c, finish<MODE>(xv[e], 0.f, inv, bias_of(c), 0.f, nullptr),
                   finish<MODE>(zv[e], 0.f, inv, bias_of(c + half), 0.f, nullptr));
      }
    }
    cluster_sync();
    return;
  }
  const int chunks = M * (OUT / 4);
  const int c_lo = int(rank * chunks / split), c_hi = int((rank + 1) * chunks / split);
  for (int c = c_lo + tid; c < c_hi; c += kThreads) {
    const int row = c / (OUT / 4), col4 = 4 * (c % (OUT / 4));
    if (col0 + col4 >= ncol) continue;
    const uint32_t a = saddr(part + row * LD + col4);
    float4 acc = ld_cluster4(remote(a, 0)), up{0.f, 0.f, 0.f, 0.f};
    if constexpr ((MODE & kSilu) != 0) up = ld_cluster4(remote(a + H2 * 4, 0));
    for (int r = 1; r < int(split); ++r) {
      const float4 v = ld_cluster4(remote(a, r));
      acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
      if constexpr ((MODE & kSilu) != 0) {
        const float4 w = ld_cluster4(remote(a + H2 * 4, r));
        up.x += w.x, up.y += w.y, up.z += w.z, up.w += w.w;
      }
    }
    const float inv = (MODE & kNorm) != 0 ? inv_s[row] : 1.f;
    const float av[4] = {acc.x, acc.y, acc.z, acc.w}, uv[4] = {up.x, up.y, up.z, up.w};
    __nv_bfloat16* yr = y + size_t(row) * ldy + col0 + col4;
    __nv_bfloat162 o[2];
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float p0 = finish<MODE>(av[2 * e], uv[2 * e], inv, bias_of(col0 + col4 + 2 * e),
                                    (MODE & kSilu) != 0 ? bias_of(I + col0 + col4 + 2 * e) : 0.f, yr + 2 * e);
      const float p1 = finish<MODE>(av[2 * e + 1], uv[2 * e + 1], inv, bias_of(col0 + col4 + 2 * e + 1),
                                    (MODE & kSilu) != 0 ? bias_of(I + col0 + col4 + 2 * e + 1) : 0.f, yr + 2 * e + 1);
      o[e] = __floats2bfloat162_rn(p0, p1);
    }
    *reinterpret_cast<uint2*>(yr) = *reinterpret_cast<const uint2*>(o);
  }
  cluster_sync();  // no block leaves while another still reads its tile
#else
  __trap();  // built without sm_90a's code: never silently leave y unwritten
#endif
}

// ---------------------------------------------------------------- host

// The driver's tensor-map encoder, through the runtime (no link against libcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A [rows, K] row-major bf16 matrix read in boxes of `box` rows x 64 K-columns (128-byte swizzle;
// rows past the end read as zeros). False when the driver refuses it.
inline bool make_map(CUtensorMap* map, const void* p, uint64_t rows, uint64_t K, uint32_t box) {
  auto enc = encoder();
  if (!enc) return false;
  const cuuint64_t dims[2] = {K, rows}, strides[1] = {K * 2};
  const cuuint32_t boxd[2] = {uint32_t(kBK), box}, es[2] = {1, 1};
  return enc(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p), dims, strides, boxd, es,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The dynamic shared memory a block of this kernel takes at K, and the most the current device
// lets it take: set once a device and kernel to the device's opt-in limit less the kernel's static
// shared memory, with clusters above 8 allowed (-1 if refused). Thread-safe.
template <int BN, int STAGES, int MODE, int KB>
int smem_at(int K) {
  return smem_bytes<BN, STAGES, KB>() + ((MODE & kNorm) != 0 ? K * 2 : 0);
}
template <int BN, int STAGES, int MODE, int KB>
int smem_limit() {
  static std::mutex mu;
  static int limit[64] = {};  // per device; 0: not set yet
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return -1;
  std::lock_guard<std::mutex> lock(mu);
  if (limit[dev] == 0) {
    auto* k = kernel<BN, STAGES, MODE, KB>;
    cudaFuncAttributes fa{};
    int optin = 0;
    if (cudaFuncGetAttributes(&fa, k) != cudaSuccess ||
        cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - int(fa.sharedSizeBytes)) !=
            cudaSuccess ||
        cudaFuncSetAttribute(k, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
      limit[dev] = -1;
    else
      limit[dev] = optin - int(fa.sharedSizeBytes);
  }
  return limit[dev];
}

// How many clusters of `split` blocks of this kernel the device holds at once (0 if none fit).
template <int BN, int STAGES, int MODE, int KB = 1>
int max_clusters(int K, int split) {
  auto* k = kernel<BN, STAGES, MODE, KB>;
  const int bytes = smem_at<BN, STAGES, MODE, KB>(K);
  if (smem_limit<BN, STAGES, MODE, KB>() < bytes) return 0;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(split), at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(split));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = bytes;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, k, &cfg) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

// Output tiles of a product with N rows of W (kSilu: ceil(I / (BN / 2)), I = N / 2).
template <int BN, int MODE>
constexpr int tiles(int N) {
  return (MODE & kSilu) != 0 ? (N / 2 + BN / 2 - 1) / (BN / 2) : N / BN;
}

// The product with maps from make_map (x: box 64; W: box BN, or BN / 2 for kSilu). N: W's rows
// (kSilu: 2I, I a multiple of 4); y [M, ldy] with ldy >= the output width (N, or I). Block r of a cluster takes K-stages
// [r nkb / split, (r + 1) nkb / split), nkb = K / 64.
template <int BN, int STAGES, int MODE, int KB = 1>
cudaError_t gemm(const CUtensorMap& tx, const CUtensorMap& tw, const __nv_bfloat16* bias, const __nv_bfloat16* g,
                 __nv_bfloat16* y, int ldy, int M, int N, int K, int split, float eps, bool pdl, cudaStream_t st,
                 const Rope& rope = Rope{}, const Draw& draw = Draw{}) {
  const bool silu = (MODE & kSilu) != 0;
  if (M < 1 || M > kRows || K % (kBK * KB) || split < 1 || split > 16 || split > K / (kBK * KB) ||
      (silu ? N % 8 : N % BN) != 0 || ((MODE & kNorm) != 0 && (!g || reinterpret_cast<uintptr_t>(g) % 16 != 0)) ||
      ((MODE & kRope) == 0 && (!y || ldy < (silu ? N / 2 : N))) ||
      ((MODE & kRope) != 0 && (!rope.pos || !rope.inv_freq || !rope.q || !rope.kc || !rope.vc || rope.cap < 1 ||
                               (rope.D != 64 && rope.D != 128) || N != (rope.nh + 2 * rope.nkv) * rope.D)) ||
      ((MODE & kDraw) != 0 && (split != 1 || !draw.work || !draw.step)))
    return cudaErrorInvalidValue;
  auto* k = kernel<BN, STAGES, MODE, KB>;
  const int bytes = smem_at<BN, STAGES, MODE, KB>(K);
  if (smem_limit<BN, STAGES, MODE, KB>() < bytes) return cudaErrorInvalidValue;
  cudaLaunchAttribute at[2];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = unsigned(split), at[0].val.clusterDim.y = 1, at[0].val.clusterDim.z = 1;
  at[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  at[1].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(tiles<BN, MODE>(N) * split));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = bytes;
  cfg.stream = st;
  cfg.attrs = at;
  cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, k, tx, tw, bias, g, y, ldy, M, K / kBK, N / 2, eps, rope, draw);
}

}  // namespace kernelrl::cuda::wgmma_gemm
