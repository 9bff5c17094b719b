// Fused CUDA kernels of the sampler's decode step (one new token per row), bf16 activations.
// Torch-free: raw device pointers, sizes and a stream, so this header and cuda_kernels.cu build
// with nvcc alone; policy/decoder.cpp is the only caller. Every kernel rounds to bf16 where the
// eager LibTorch step (transformers' arithmetic) rounds, so the two agree to the order of
// reductions. Row-major contiguous tensors throughout; `R` is the number of rows (sequences).
// On Hopper the decode-step kernels are launched with programmatic dependent launch (each waits
// for the kernel before it at its first instruction; KERNELRL_PDL=0 launches them plainly).
#pragma once

#include <cstdint>

struct CUstream_st;

namespace kernelrl::cuda {

using Stream = CUstream_st*;
using bf16_t = uint16_t;  // raw bfloat16 bits

// h += delta (+ delta_lora, added in float32 to delta then rounded, as PEFT adds an adapter's
// output) when delta is given; then out = w * rmsnorm(h) as transformers' Qwen2RMSNorm computes it
// (float32 statistics, the normalised value rounded to bf16 before the weight). out32 (optional):
// float32 copy of out (the input of LoRA adapters). h, delta, out: [R, H]; w: [H].
void add_rmsnorm(bf16_t* h, const bf16_t* delta, const float* delta_lora, const bf16_t* w, bf16_t* out, float* out32,
                 int R, int H, float eps, Stream s);

// Rotary embedding of the fused q|k|v projection output (qkv [R, (nh + 2 nkv) D], + lora, f32,
// added as PEFT does) at each row's position pos[R] (its cache slot too), with cos/sin computed in
// float32 from inv_freq [D/2] and rounded to bf16 as transformers does. q goes to q_out [R, nh, D];
// k and v are written into the layer's cache ([R, nkv, cap, D] each) at slot pos[r] (rows whose
// pos is outside [0, cap) write nothing).
void rope_qkv(const bf16_t* qkv, const float* lora, const int64_t* pos, const float* inv_freq, int R, int nh, int nkv,
              int D, bf16_t* q_out, bf16_t* k_cache, bf16_t* v_cache, int64_t cap, Stream s);

// Grouped-query attention of one query per row over its cache slots [0, pos[r]] (at most klen):
// q [R, nh, D], caches [R, nkv, cap, D]; out [R, nh * D] (and out32, optional, its float32 copy).
// The keys are split over `splits` blocks per (row, kv head), the last of which to finish combines
// the partials (work: R * nh * splits * (D + 2) floats; counters: R * nkv ints, zero before the
// first call, left zero by each; splits <= 64, as decode_attention_splits() picks them for the
// kernel that runs: a block a key range whose keys lie past its row's length leaves an empty
// partial). Supports D in {32, 64, 128} and nh / nkv <= 8; decode_attention_supported() says
// whether a shape is. D 64 and 128 run on the tensor cores (KERNELRL_ATTN_MMA=0: the scalar
// kernel, which D 32 always takes); on Hopper that kernel requests its keys and values before this
// step's into L2 before waiting for the kernel before it (KERNELRL_ATTN_PREFETCH=0: not).
// share: null, or a pair (source row, count) a row [R, 2]: row r's first count keys and values are
// read from the source row's cache, which must hold the same values there (a GRPO group's rows each
// hold a copy of their prompt's; reading one copy, the group's rows share it in L2). The same bits
// as reading the row's own copy.
bool decode_attention_supported(int nh, int nkv, int D);
int decode_attention_splits(int R, int nkv, int D, int klen, int sms);
void decode_attention(const bf16_t* q, const bf16_t* k_cache, const bf16_t* v_cache, const int64_t* pos,
                      const int32_t* share, int R, int nh, int nkv, int D, int64_t cap, int klen, float scale,
                      int splits, float* work, int* counters, bf16_t* out, float* out32, Stream s);

// The adapter of one projection group in the decode step, in float32 as PEFT computes it:
// out [R, N] = (x [R, in] a^T) bt for a [rs, in] (the members' A stacked) and bt [rs, N] (their
// scaled B, block-diagonal, transposed). Two kernels, no split-K reduction pass: the A product by
// blocks of two rows, 2,048 inputs and 8 outputs into part (lora_decode_parts(in) * R * rs floats
// of work), the B product by tiles of 16 rows and 32 columns, summing the input chunks' partials.
// Deterministic (fixed summation order).
// rs <= 192 (lora_decode_supported).
bool lora_decode_supported(int rs);
int lora_decode_parts(int in);
void lora_decode(const float* x, const float* a, const float* bt, int R, int in, int rs, int N, float* part, float* out,
                 Stream s);

// SwiGLU of the fused gate|up output gu [R, 2I] (+ lora, f32): out = silu(gate) * up with
// transformers' bf16 rounding (silu rounded, then the product). out [R, I]; out32 optional.
void silu_mul(const bf16_t* gu, const float* lora, int R, int I, bf16_t* out, float* out32, Stream s);

// ---- the decode step's products on Hopper (policy/wgmma_gemm.cuh: the copy engine and wgmma),
// with the layer's elementwise steps fused into them, so that a layer is four kernels: q/k/v (its
// RMSNorm inside, the rotary embedding and cache write at its end: fused_qkv_rope) ->
// decode_attention -> o (the residual add inside) -> gate/up (the RMSNorm and SwiGLU inside) ->
// down (the residual add inside).
// How the copy engine reads a bf16 matrix: a driver tensor map, opaque here (128 bytes, 128-aligned).
struct GemmMap {
  alignas(128) unsigned char raw[128];
  int rows = 0, cols = 0, box = 0;  // what it was made for (checked by fused_gemm)
};
enum class Fused : int {
  kQkvNorm,         // y = (g * rmsnorm(h)) W^T + bias; x is the residual stream h
  kOResid,          // h += x W^T (+ bias)
  kGateUpNormSilu,  // y = silu(gate) * up of (g * rmsnorm(h)) W^T (+ bias): W = gate|up [2I, K], y [R, I]
  kDownResid,       // h += x W^T (+ bias)
  kHeadNorm,        // logits = (g * rmsnorm(h)) W^T: the final norm and the head
};
// Whether they run on the current device: compute capability 9.0 with these kernels built for
// sm_90a (checked by running one), the driver's tensor-map encoder found, KERNELRL_WGMMA not 0.
bool fused_gemm_available();
// Whether `kind` takes a weight W [N, K] (N and K multiples of its tiles), and W's map for it.
bool fused_gemm_supported(Fused kind, int N, int K);
bool fused_gemm_weight_map(Fused kind, const bf16_t* w, int N, int K, GemmMap* map);
// The map of an activation x [R, K], R <= 64 (the rows up to 64 read as zeros).
bool fused_gemm_input_map(const bf16_t* x, int R, int K, GemmMap* map);
// One product: maps as above, g [K] the norm weight of the Norm kinds (16-byte aligned), y [R, N]
// (kGateUpNormSilu: [R, N / 2]; the Resid kinds: h [R, N], updated in place). K is split over the
// blocks of a cluster: the largest split (at most 8, and at most the multiprocessors' share of each
// output tile) whose clusters all fit on the device at once (KERNELRL_WGMMA_SPLIT=q,o,gu,down sets
// them, up to 16). The same bits on every call with the same split (fixed summation order); the
// split, and so the last bits, depend on the device.
void fused_gemm(Fused kind, const GemmMap& x, const GemmMap& w, const bf16_t* bias, const bf16_t* g, bf16_t* y, int R,
                int N, int K, float eps, int sms, Stream s);
// kHeadNorm (logits [R, N] bf16) with sample_partials' partials of each 128-logit tile (chunk
// width fused_head_draw_chunk()) at its end, from the logits as stored, at temperature T: the draw's
// first pass inside the head. work: sample_work_floats(R, N / 128); step: the draw's counter (copied).
int fused_head_draw_chunk();
void fused_head_draw(const GemmMap& x, const GemmMap& w, const bf16_t* g, bf16_t* logits, int R, int N, int K,
                     float eps, float temperature, const int64_t* step, float* work, Stream s);
// kQkvNorm with rope_qkv fused into its end (the same arithmetic, the same bits): q [R, nh, D] and
// the caches' slot pos[r] written, the q|k|v product itself not. D 64 or 128.
bool fused_qkv_rope_supported(int nh, int nkv, int D);
void fused_qkv_rope(const GemmMap& x, const GemmMap& w, const bf16_t* bias, const bf16_t* g, const int64_t* pos,
                    const float* inv_freq, int R, int nh, int nkv, int D, int K, float eps, bf16_t* q_out,
                    bf16_t* k_cache, bf16_t* v_cache, int64_t cap, int sms, Stream s);
// One token per row from softmax(logits / T) by inverse transform sampling: one uniform a row
// (Philox 4x32-10 keyed by seed, counter (row, step)) placed on the row's cumulative probabilities in
// index order; T = 0: the argmax (its lowest index). logits [R, V] bf16; writes the token and its
// logprob under softmax(logits / max(T, 1 if T = 0)) to hist_tokens / hist_logprobs[(step %
// hist_steps) * R + r] (int32 / float32), then sets the next step's inputs: ids[r] = token, pos[r] + 1
// (unless pos[r] is 0, a parked row, or the cache is full), and ++*step. work: sample_work_floats(R)
// floats (64 chunks a row).
int64_t sample_work_floats(int R, int chunks = 64);
void sample_tokens(const bf16_t* logits, int R, int V, float temperature, uint64_t seed, int64_t* step, float* work,
                   int64_t* ids, int64_t* pos, int64_t cap, int32_t* hist_tokens, float* hist_logprobs,
                   int64_t hist_steps, Stream s);
// sample_tokens in its two passes: each chunk of `per` logits' partials (max, sum of exp, index of the
// max; and the step counter's copy) into work (sample_work_floats(R, ceil(V / per))), then the draw
// from them. fused_head_draw leaves the same partials of its tiles, so that the head's step needs
// only the second pass.
void sample_partials(const bf16_t* logits, int R, int V, int per, float temperature, const int64_t* step, float* work,
                     Stream s);
void sample_from_partials(const bf16_t* logits, int R, int V, int per, float temperature, uint64_t seed, int64_t* step,
                          const float* work, int64_t* ids, int64_t* pos, int64_t cap, int32_t* hist_tokens,
                          float* hist_logprobs, int64_t hist_steps, Stream s);

// ---- training (policy/model.cpp, bf16 on CUDA)

// A LoRA adapter's output added to its layer's: out = bf16(f32(y) + t sBt) for y, out [N, out_cols]
// (bf16), t [N, r] (the adapter's rank-r activations) and sBt [r, out_cols] (scale * B, transposed;
// both float32), as PEFT adds its float32 adapter output to the layer's. r <= 64.
bool lora_expand_supported(int r);
void lora_expand_add(const bf16_t* y, const float* t, const float* sbt, int64_t N, int out_cols, int r, bf16_t* out,
                     Stream s);

// Token logprobs from bf16 logits [rows, V]: z = logits / T, lse[row] = logsumexp(z),
// lp[row] = z[targets[row]] - lse, ent[row] (optional) = the entropy of softmax(z); one pass a row.
void logprob_forward(const bf16_t* logits, int64_t rows, int V, const int64_t* targets, float temperature, float* lse,
                     float* lp, float* ent, Stream s);
// Their gradient in the logits for upstream gradients g_lp[rows] and g_ent[rows] (either null):
// grad = (g_lp (onehot - p) - g_ent p (log p + H)) / T, rounded to bf16 [rows, V].
void logprob_backward(const bf16_t* logits, int64_t rows, int V, const int64_t* targets, float temperature,
                      const float* lse, const float* ent, const float* g_lp, const float* g_ent, bf16_t* grad,
                      Stream s);

}  // namespace kernelrl::cuda
