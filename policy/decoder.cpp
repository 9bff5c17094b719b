#include "policy/decoder.hpp"

#ifdef KERNELRL_CUDA_KERNELS
#include "policy/cuda_kernels.hpp"
#endif

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <array>
#include <deque>
#include <fstream>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>

namespace kernelrl {

namespace {

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Bytes a row of the decode holds for `cap` tokens: its keys and values in every layer and its
// logits (the history and the draw's work are small beside them).
int64_t row_bytes(const ModelConfig& c, int64_t cap, torch::ScalarType dt) {
  return 2 * c.num_layers * c.num_kv_heads * c.head_dim * cap * int64_t(c10::elementSize(dt)) + 4 * c.vocab_size;
}

// Memory there is for a generation's rows on `dev`: on CUDA what the device has free and what the
// caching allocator holds unused, less a tenth and 2 GB (the prefill's and the step's temporaries);
// on CPU half of what the machine has available.
int64_t memory_for_rows(const torch::Device& dev) {
  if (dev.is_cuda()) {
    size_t free = 0, total = 0;
    c10::cuda::CUDAGuard guard(dev);  // (a device given as "cuda", without an index: the current one)
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) return INT64_MAX;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(c10::cuda::current_device());
    const auto agg = size_t(c10::CachingAllocator::StatType::AGGREGATE);
    const int64_t cached = std::max<int64_t>(0, stats.reserved_bytes[agg].current - stats.allocated_bytes[agg].current);
    const int64_t room = int64_t(free) + cached;
    return room - room / 10 - (int64_t(2) << 30);
  }
  std::ifstream f("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024 / 2;
  return INT64_MAX;
}

// The key-length bucket of the decode graphs: 128 keys, more for long sequences (at most about
// 32 graphs per generation).
int64_t decode_bucket(int64_t cap) { return std::max<int64_t>(128, round_up((cap + 31) / 32, 128)); }

// One token per row from softmax(logits / T) (T = 0: the argmax) and its logprob under that
// distribution (T = 0: under softmax(logits)), float32 logits [R, V]. The draw is an exponential
// race (argmax of x - log E, E ~ Exp(1): a Gumbel-max draw from softmax(x)), one pass with no
// sort and no host copy, so a CUDA graph can hold it.
std::pair<torch::Tensor, torch::Tensor> draw_tokens(const torch::Tensor& logits, double T) {
  if (T == 0) {
    auto next = logits.argmax(-1);
    return {next, logits.gather(-1, next.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)};
  }
  auto x = T == 1.0 ? logits : logits / T;
  auto e = torch::empty_like(x).exponential_(1.0).clamp_min_(1e-30);  // (CUDA's can return 0)
  auto next = (x - e.log()).argmax(-1);
  return {next, x.gather(-1, next.unsqueeze(-1)).squeeze(-1) - x.logsumexp(-1)};
}

// Nucleus sampling: the smallest head of the sorted distribution reaching top_p, renormalised;
// the logprob is under the untruncated softmax(logits / T) (policy.hpp's convention).
std::pair<torch::Tensor, torch::Tensor> draw_top_p(const torch::Tensor& logits, double T, double top_p) {
  auto logp = torch::log_softmax(logits / T, -1);
  auto [sp, si] = logp.exp().sort(-1, /*descending=*/true);
  auto drop = (sp.cumsum(-1) - sp) > top_p;  // keep the smallest head reaching top_p
  sp = sp.masked_fill(drop, 0);
  auto next = torch::multinomial(torch::zeros_like(sp).scatter(-1, si, sp), 1).squeeze(-1);
  return {next, logp.gather(-1, next.unsqueeze(-1)).squeeze(-1)};
}

// The draw SamplingParams asks for: nucleus when top_p < 1 (and sampling), else draw_tokens.
std::pair<torch::Tensor, torch::Tensor> draw(const torch::Tensor& logits, const SamplingParams& s) {
  return s.top_p < 1 && s.temperature > 0 ? draw_top_p(logits, s.temperature, s.top_p)
                                          : draw_tokens(logits, s.temperature);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The adapter of one projection group in the fused step's form: A of every member stacked
// [sum r, in], B block-diagonal [sum out, sum r] with each member's scale folded in, and B
// transposed (bt, contiguous, for cuda::lora_decode); float32.
struct LoraGroup {
  torch::Tensor a, b, bt;
};

LoraGroup lora_group(const std::vector<const Linear*>& ls) {
  int64_t rsum = 0, out = 0;
  for (auto* l : ls) {
    if (l->a.defined()) rsum += l->a.size(0);
    out += l->w.size(0);
  }
  if (rsum == 0) return {};
  auto opt = ls[0]->w.options().dtype(torch::kFloat32);
  LoraGroup g{torch::zeros({rsum, ls[0]->w.size(1)}, opt), torch::zeros({out, rsum}, opt)};
  int64_t ro = 0, oo = 0;
  for (auto* l : ls) {
    const int64_t o = l->w.size(0);
    if (l->a.defined()) {
      const int64_t r = l->a.size(0);
      g.a.narrow(0, ro, r).copy_(l->a);
      g.b.narrow(0, oo, o).narrow(1, ro, r).copy_(l->bb * l->scale);
      ro += r;
    }
    oo += o;
  }
  g.bt = g.b.t().contiguous();
  return g;
}

}  // namespace

struct Decoder::Run {
  CausalLM& m;
  const std::vector<std::vector<int32_t>>& prompts;
  const SamplingParams& s;
  const TokenSink& sink;
  DecodeStats& stats;
  const torch::Device dev;
  int64_t S = 0, R = 0, P = 0, cap = 0, V = 0, K = 1, H = 0;
  bool cuda = false, fused = false, graphs = false, bucketed = false, sample_inside = true, lora = false;
  int64_t bucket = 128;
  // The fused step's attention reads each row's own keys whatever the key length it is given; the
  // length only sets its split count. Where even the whole cache takes one split (64 rows of 2 kv
  // heads fill an H100 already), one graph at the cache's length serves every step.
  bool one_graph = false;
  KVCache cache;
  // Device state of the step: each row's input token and position, the step counter, the drawn
  // tokens of the last H steps (a ring), the logits when they are sampled outside the graph.
  torch::Tensor ids, pos, step, hist_tok, hist_lp, logits;
  torch::Tensor attn_counters;  // the fused attention's split counts (zero between calls)
  // The fused attention's shared prefixes (cuda::decode_attention's share): for each row a source
  // row and a count of leading keys read from it. The rows a prompt's samples take in one admission
  // hold copies of its keys and values from one prefill (the same bits); all but the first read the
  // first's, so that the group's attention reads one copy of the prompt (from L2 for the others).
  // When a row goes free, the rows reading from it go back to their own copies (one of them the
  // new source); the table goes to the device before the next window (KERNELRL_SHARED_PREFIX=0:
  // no sharing, share undefined).
  bool share_dirty = false;
  std::vector<int32_t> share_h;
  torch::Tensor share;
  std::vector<LoraGroup> lqkv, lo, lgu, ldown;
  // Host state: each row's sequence (-1: free), the first step whose tokens are its, its position.
  std::vector<int64_t> row_seq, row_since, pos_h, produced;
  std::deque<int64_t> pending;
  int64_t enqueued = 0;
  std::map<int64_t, std::unique_ptr<at::cuda::CUDAGraph>> graph_of;
  // Windows of decode steps in flight (on CUDA up to two: the next window runs while the host takes
  // the last one's tokens). Each has its first step, its steps, the host copy of the drawn tokens'
  // ring made after its last step (pinned, copied asynchronously; buffers alternate) and its events:
  // the device's clock over its steps, and the end that says its copy is there.
  struct Window {
    int64_t first = 0, w = 0;
    torch::Tensor tok, lp;
    std::optional<at::cuda::CUDAEvent> start, end;
    std::chrono::steady_clock::time_point t0;  // (CPU: the host's clock)
  };
  std::deque<Window> flight;
  std::array<torch::Tensor, 2> host_tok, host_lp;
  int64_t windows = 0;
  std::optional<at::cuda::MempoolId_t> pool;
  int sms = 0;
#ifdef KERNELRL_CUDA_KERNELS
  // The Hopper products with the layer's elementwise steps fused in (cuda::fused_gemm), without an
  // adapter and for at most 64 rows: each layer's weight maps (q/k/v, o, gate/up, down), built once
  // a generation (host-side encodes of fixed addresses).
  bool wgmma = false;
  std::vector<std::array<cuda::GemmMap, 4>> wmaps;
  cuda::GemmMap head_map;  // the head's, for the final norm and head as one product
  bool head_fused = false;
  bool head_draws = false;  // ... which also leaves the draw's partials (sample() then needs one pass)
#endif
  torch::Tensor draw_work;  // the fused draw's partials and step counter copy

  Run(CausalLM& model, const std::vector<std::vector<int32_t>>& prompts_in, const SamplingParams& settings,
      int64_t max_rows, const TokenSink& k, DecodeStats& st)
      : m(model), prompts(prompts_in), s(settings), sink(k), stats(st), dev(model.device()) {
    const auto& c = m.config();
    S = int64_t(prompts_in.size()) * s.n;
    R = max_rows > 0 ? std::min<int64_t>(max_rows, S) : S;
    for (auto& p : prompts_in) P = std::max<int64_t>(P, p.size());
    cap = P + s.max_tokens;
    // No more rows than the memory there is holds (the others wait for a free row); a generation
    // of which not one row fits cannot succeed however often it is tried.
    const int64_t per_row = row_bytes(c, cap, m.dtype()), room = memory_for_rows(dev);
    if (room < per_row)
      throw CapacityError("one sequence of up to " + std::to_string(cap) + " tokens needs " +
                          std::to_string(per_row >> 20) + " MB for its keys, values and logits, and " + dev.str() +
                          " has " + std::to_string(std::max<int64_t>(0, room) >> 20) +
                          " MB for the generation; lower [sampler] max_tokens or the prompts' length, or use a device "
                          "with more memory");
    R = std::min<int64_t>(R, room / per_row);
    V = c.vocab_size;
    cuda = dev.is_cuda();
    const char* g = std::getenv("KERNELRL_CUDA_GRAPHS");
    const std::string gm = g ? g : "";
    graphs = cuda && gm != "0" && gm != "static";
    bucketed = graphs || gm == "static";
#ifdef KERNELRL_CUDA_KERNELS
    // (Qwen3's per-head q/k norms are not in the fused step's kernels: its LibTorch ops in the graphs.)
    fused = cuda && m.dtype() == torch::kBFloat16 && fused_kernels_enabled() && !c.qk_norm &&
            cuda::decode_attention_supported(int(c.num_heads), int(c.num_kv_heads), int(c.head_dim)) &&
            c.hidden_size % 2 == 0 && c.hidden_size <= 16384;
    if (cuda) sms = at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
#endif
    sample_inside = s.top_p >= 1;
    lora = m.has_lora() && m.lora_enabled_;
#ifdef KERNELRL_CUDA_KERNELS
    // The Hopper products where they were measured faster than cuBLAS's path (docs/BENCHMARKS.md:
    // hidden 1,536, 0.29 ms a step less at 64 rows; hidden 3,584 0.17-0.24 ms more, so up to 2,048);
    // KERNELRL_WGMMA=1 takes them at any size, 0 never.
    const char* wv = std::getenv("KERNELRL_WGMMA");
    const std::string wset = wv ? wv : "";
    const bool wgmma_wanted = wset == "1" || (wset != "0" && c.hidden_size <= 2048);
    if (fused && !lora && R <= 64 && wgmma_wanted && cuda::fused_gemm_available() &&
        cuda::fused_qkv_rope_supported(int(c.num_heads), int(c.num_kv_heads), int(c.head_dim)))
      wgmma = weight_maps();
#endif
    stats.path = fused ? (graphs ? "fused-graph" : "fused") : graphs ? "graph" : bucketed ? "static" : "eager";
#ifdef KERNELRL_CUDA_KERNELS
    if (wgmma) stats.path = graphs ? "fused-wgmma-graph" : "fused-wgmma";
#endif
    stats.rows = R;
    bucket = decode_bucket(cap);
#ifdef KERNELRL_CUDA_KERNELS
    one_graph = fused && graphs &&
                cuda::decode_attention_splits(int(R), int(c.num_kv_heads), int(c.head_dim), int(cap), sms) == 1;
#endif
    K = cuda ? 16 : 1;
    H = K;
    cache = m.new_cache(R, cap);
    auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(dev);
    ids = torch::zeros({R}, i64);
    pos = torch::zeros({R}, i64);
    step = torch::zeros({1}, i64);
    hist_tok = torch::zeros({H, R}, torch::TensorOptions().dtype(torch::kInt32).device(dev));
    hist_lp = torch::zeros({H, R}, torch::TensorOptions().dtype(torch::kFloat32).device(dev));
    if (cuda)
      for (int b = 0; b < 2; ++b) {
        host_tok[b] = torch::empty({H, R}, torch::TensorOptions().dtype(torch::kInt32).pinned_memory(true));
        host_lp[b] = torch::empty({H, R}, torch::TensorOptions().dtype(torch::kFloat32).pinned_memory(true));
      }
    logits = torch::zeros({R, V}, torch::TensorOptions().dtype(fused ? torch::kBFloat16 : torch::kFloat32).device(dev));
    if (fused)
      attn_counters = torch::zeros({R * c.num_kv_heads}, torch::TensorOptions().dtype(torch::kInt32).device(dev));
    const char* sp = std::getenv("KERNELRL_SHARED_PREFIX");
    share_h.resize(2 * R);
    for (int64_t r = 0; r < R; ++r) share_h[2 * r] = int32_t(r), share_h[2 * r + 1] = 0;
    if (fused && cuda && !(sp != nullptr && std::string(sp) == "0"))
      share = torch::tensor(share_h, torch::kInt32).to(dev);
#ifdef KERNELRL_CUDA_KERNELS
    head_draws = wgmma && head_fused && sample_inside;
    if (fused) {
      const int head_chunks = head_draws ? int(V / cuda::fused_head_draw_chunk()) : 0;
      draw_work = torch::empty({cuda::sample_work_floats(int(R), std::max(64, head_chunks))},
                               torch::TensorOptions().dtype(torch::kFloat32).device(dev));
    }
#endif
    row_seq.assign(R, -1);
    row_since.assign(R, 0);
    pos_h.assign(R, 0);
    produced.assign(S, 0);
    for (int64_t q = 0; q < S; ++q) pending.push_back(q);
    if (fused && lora) {
      for (auto& L : m.layers_) {
        lqkv.push_back(lora_group({&L.q, &L.k, &L.v}));
        lo.push_back(lora_group({&L.o}));
        lgu.push_back(lora_group({&L.gate, &L.up}));
        ldown.push_back(lora_group({&L.down}));
      }
    }
  }

  // ---------------------------------------------------------------- admission and prefill

  // Fills free rows with waiting sequences: each distinct prompt prefilled once (right-padded
  // batches of at most ~16k tokens, plain causal attention), its keys and values copied into the
  // rows of its sequences, and each sequence's first token drawn from the prompt's last logits.
  void admit() {
    const auto t0 = std::chrono::steady_clock::now();
    while (!pending.empty()) {
      std::vector<int64_t> free_rows;
      for (int64_t r = 0; r < R; ++r)
        if (row_seq[r] < 0) free_rows.push_back(r);
      if (free_rows.empty()) break;
      // Sequences to admit, grouped by prompt; prompts taken while they fit a prefill batch.
      std::vector<int64_t> seqs, uniq;
      int64_t plen = 0;
      while (!pending.empty() && seqs.size() < free_rows.size()) {
        const int64_t q = pending.front(), u = q / s.n;
        if (uniq.empty() || uniq.back() != u) {
          const int64_t np = std::max<int64_t>(plen, prompts[u].size());
          if (!uniq.empty() && np * int64_t(uniq.size() + 1) > 16384) break;
          uniq.push_back(u);
          plen = np;
        }
        seqs.push_back(q);
        pending.pop_front();
      }
      const int64_t Bu = uniq.size();
      std::vector<int64_t> flat(Bu * plen, 0), last(Bu);
      for (int64_t j = 0; j < Bu; ++j) {
        const auto& pr = prompts[uniq[j]];
        std::copy(pr.begin(), pr.end(), flat.begin() + j * plen);
        last[j] = int64_t(pr.size()) - 1;
        stats.prefill_tokens += pr.size();
      }
      auto x = torch::tensor(flat, torch::kInt64).view({Bu, plen}).to(dev);
      auto p =
          torch::arange(plen, torch::TensorOptions().dtype(torch::kInt64).device(dev)).unsqueeze(0).expand({Bu, plen});
      auto tmp = m.new_cache(Bu, plen);
      auto h = m.hidden(x, p, torch::Tensor(), &tmp, 0, false);
      auto lastt = torch::tensor(last, torch::kInt64).to(dev);
      auto lg = m.lm_head(h.index({torch::arange(Bu, lastt.options()), lastt})).to(torch::kFloat32);  // [Bu, V]
      h = torch::Tensor();
      // Rows and sources.
      std::vector<int64_t> rows, src, lens;
      for (size_t i = 0; i < seqs.size(); ++i) {
        rows.push_back(free_rows[i]);
        src.push_back(std::find(uniq.begin(), uniq.end(), seqs[i] / s.n) - uniq.begin());
        lens.push_back(prompts[seqs[i] / s.n].size());
      }
      auto rows_t = torch::tensor(rows, torch::kInt64).to(dev), src_t = torch::tensor(src, torch::kInt64).to(dev);
      for (size_t l = 0; l < cache.k.size(); ++l) {
        cache.k[l].narrow(2, 0, plen).index_copy_(0, rows_t, tmp.k[l].index_select(0, src_t));
        cache.v[l].narrow(2, 0, plen).index_copy_(0, rows_t, tmp.v[l].index_select(0, src_t));
      }
      tmp = KVCache();
      auto first = lg.index_select(0, src_t);
      auto [next, lp] = draw(first, s);
      auto both = torch::stack({next.to(torch::kFloat64), lp.to(torch::kFloat64)}).to(torch::kCPU).contiguous();
      const double* bp = both.data_ptr<double>();
      const int64_t A = seqs.size();
      std::vector<int64_t> set_rows, set_ids, set_pos, lead(Bu, -1);  // (lead: each prompt's first live row)
      for (int64_t i = 0; i < A; ++i) {
        const int64_t q = seqs[i];
        produced[q] = 1;
        const bool done = sink(q, int32_t(bp[i]), float(bp[A + i])) || s.max_tokens <= 1;
        if (done) continue;  // its row stays free
        const int64_t r = rows[i];
        row_seq[r] = q;
        row_since[r] = enqueued;
        pos_h[r] = lens[i];
        set_rows.push_back(r);
        set_ids.push_back(int64_t(bp[i]));
        set_pos.push_back(lens[i]);
        if (share.defined()) {  // the first live row of each prompt the source of the others
          if (lead[src[i]] < 0) lead[src[i]] = r;
          share_h[2 * r] = int32_t(lead[src[i]]);
          share_h[2 * r + 1] = lead[src[i]] == r ? 0 : int32_t(lens[i]);
          share_dirty = true;
        }
      }
      if (!set_rows.empty()) {
        auto rt = torch::tensor(set_rows, torch::kInt64).to(dev);
        ids.index_put_({rt}, torch::tensor(set_ids, torch::kInt64).to(dev));
        pos.index_put_({rt}, torch::tensor(set_pos, torch::kInt64).to(dev));
      }
    }
    stats.prefill_seconds += seconds_since(t0);
  }

  // ---------------------------------------------------------------- one decode step

  // The next token of every row: forward, then (when sample_inside) the draw and the state update.
  void step_once(int64_t klen) {
    if (fused)
      fused_forward(klen);
    else
      torch_forward(klen);
    if (sample_inside) sample();
  }

  void torch_forward(int64_t klen) {
    auto slots = torch::arange(klen, pos.options());
    auto mask = (slots.view({1, klen}) <= pos.view({R, 1})).view({R, 1, 1, klen});
    auto h = m.decode_static(ids.view({R, 1}), pos.view({R, 1}), mask, cache, pos, klen);
    logits.copy_(m.lm_head(h).squeeze(1));
  }

  // The drawn tokens into the ring at the step counter, and the next step's inputs (torch ops;
  // the fused path does the same in cuda::sample_tokens).
  void record(const torch::Tensor& next, const torch::Tensor& lp) {
    auto slot = step.remainder(H);
    hist_tok.index_copy_(0, slot, next.to(torch::kInt32).view({1, R}));
    hist_lp.index_copy_(0, slot, lp.to(torch::kFloat32).view({1, R}));
    ids.copy_(next);
    pos.copy_(torch::where((pos > 0) & (pos + 1 < cap), pos + 1, pos));
    step.add_(1);
  }

  void sample() {
#ifdef KERNELRL_CUDA_KERNELS
    if (fused && s.top_p >= 1) {
      const auto* lg = reinterpret_cast<const cuda::bf16_t*>(logits.data_ptr());
      auto st = at::cuda::getCurrentCUDAStream().stream();
      if (head_draws)  // the head left the partials of its tiles
        cuda::sample_from_partials(lg, int(R), int(V), cuda::fused_head_draw_chunk(), float(s.temperature), s.seed,
                                   step.data_ptr<int64_t>(), draw_work.data_ptr<float>(), ids.data_ptr<int64_t>(),
                                   pos.data_ptr<int64_t>(), cap, hist_tok.data_ptr<int32_t>(),
                                   hist_lp.data_ptr<float>(), H, st);
      else
        cuda::sample_tokens(lg, int(R), int(V), float(s.temperature), s.seed, step.data_ptr<int64_t>(),
                            draw_work.data_ptr<float>(), ids.data_ptr<int64_t>(), pos.data_ptr<int64_t>(), cap,
                            hist_tok.data_ptr<int32_t>(), hist_lp.data_ptr<float>(), H, st);
      return;
    }
#endif
    auto [next, lp] = draw(logits.to(torch::kFloat32), s);
    record(next, lp);
  }

#ifdef KERNELRL_CUDA_KERNELS
  // The tensor maps of every layer's four weights, or false where a shape or weight does not fit
  // the Hopper products (then the step uses cuBLAS and the separate elementwise kernels).
  bool weight_maps() {
    const auto& c = m.config();
    const int Hd = int(c.hidden_size), I = int(c.intermediate_size), A = int(c.num_heads * c.head_dim);
    const int NQ = int((c.num_heads + 2 * c.num_kv_heads) * c.head_dim);
    auto bf = [](const torch::Tensor& t) {
      return t.defined() && t.scalar_type() == torch::kBFloat16 && t.is_contiguous() && t.is_cuda();
    };
    auto ptr = [](const torch::Tensor& t) { return reinterpret_cast<const cuda::bf16_t*>(t.data_ptr()); };
    for (const auto& L : m.layers_) {
      if (!bf(L.qkv_w) || !bf(L.o.w) || !bf(L.gu_w) || !bf(L.down.w) || !bf(L.in_norm) || !bf(L.post_norm)) {
        wmaps.clear();
        return false;
      }
      std::array<cuda::GemmMap, 4> mp;
      if (!cuda::fused_gemm_weight_map(cuda::Fused::kQkvNorm, ptr(L.qkv_w), NQ, Hd, &mp[0]) ||
          !cuda::fused_gemm_weight_map(cuda::Fused::kOResid, ptr(L.o.w), Hd, A, &mp[1]) ||
          !cuda::fused_gemm_weight_map(cuda::Fused::kGateUpNormSilu, ptr(L.gu_w), 2 * I, Hd, &mp[2]) ||
          !cuda::fused_gemm_weight_map(cuda::Fused::kDownResid, ptr(L.down.w), Hd, I, &mp[3])) {
        wmaps.clear();
        return false;
      }
      wmaps.push_back(mp);
    }
    // The final norm and the head as one product where the head's shape fits (vocabularies of a
    // multiple of 128); otherwise the norm kernel and cuBLAS's product.
    head_fused = bf(m.head_) && bf(m.norm_) &&
                 cuda::fused_gemm_weight_map(cuda::Fused::kHeadNorm, ptr(m.head_), int(m.head_.size(0)), Hd, &head_map);
    return true;
  }
#endif

  void fused_forward(int64_t klen) {
#ifdef KERNELRL_CUDA_KERNELS
    using cuda::bf16_t;
    const auto& c = m.config();
    const int64_t Hd = c.hidden_size, I = c.intermediate_size, nh = c.num_heads, nkv = c.num_kv_heads, D = c.head_dim;
    auto stream = at::cuda::getCurrentCUDAStream().stream();
    auto bfo = torch::TensorOptions().dtype(torch::kBFloat16).device(dev);
    auto f32o = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
    auto bp = [](const torch::Tensor& t) { return t.defined() ? reinterpret_cast<bf16_t*>(t.data_ptr()) : nullptr; };
    auto fp = [](const torch::Tensor& t) { return t.defined() ? t.data_ptr<float>() : nullptr; };
    auto lora_out = [&](const LoraGroup& g, const torch::Tensor& x32) {
      if (!g.a.defined()) return torch::Tensor();
      const int64_t rs = g.a.size(0), in = g.a.size(1), N = g.bt.size(1);
      if (!cuda::lora_decode_supported(int(rs))) return torch::mm(torch::mm(x32, g.a.t()), g.b.t());
      auto part = torch::empty({cuda::lora_decode_parts(int(in)) * R * rs}, f32o);
      auto out = torch::empty({R, N}, f32o);
      cuda::lora_decode(fp(x32), fp(g.a), fp(g.bt), int(R), int(in), int(rs), int(N), fp(part), fp(out), stream);
      return out;
    };
    const int splits = cuda::decode_attention_splits(int(R), int(nkv), int(D), int(klen), sms);
    auto h = torch::embedding(m.embed_, ids);  // [R, H], the residual stream (updated in place)
    torch::Tensor delta, dl;
    const float eps = float(c.rms_norm_eps);
    // The attention of layer l over the cache (out32: its float32 copy for an adapter, or none).
    auto attend = [&](size_t l, const torch::Tensor& q, const torch::Tensor& out, const torch::Tensor& out32) {
      auto work = splits > 1 ? torch::empty({R * nh * splits * (D + 2)}, f32o) : torch::Tensor();
      cuda::decode_attention(bp(q), bp(cache.k[l]), bp(cache.v[l]), pos.data_ptr<int64_t>(),
                             share.defined() ? share.data_ptr<int32_t>() : nullptr, int(R), int(nh), int(nkv), int(D),
                             cap, int(klen), float(1.0 / std::sqrt(double(D))), splits, fp(work),
                             attn_counters.data_ptr<int>(), bp(out), fp(out32), stream);
    };
    cuda::GemmMap hx;  // the residual stream's map (the Hopper path: its layers and its head)
    if (wgmma) {
      // Four kernels a layer: q/k/v of rmsnorm(h) with the rotary embedding and the cache write,
      // attention, h += o, silu(gate) * up of rmsnorm(h), h += down. The activations' maps hold their
      // addresses (fixed within a captured graph).
      auto q = torch::empty({R, nh, D}, bfo);
      auto att = torch::empty({R, nh * D}, bfo), a = torch::empty({R, I}, bfo);
      cuda::GemmMap attx, ax;
      if (!cuda::fused_gemm_input_map(bp(h), int(R), int(Hd), &hx) ||
          !cuda::fused_gemm_input_map(bp(att), int(R), int(nh * D), &attx) ||
          !cuda::fused_gemm_input_map(bp(a), int(R), int(I), &ax))
        throw std::runtime_error("decoder: the copy engine's maps of the step's activations were refused");
      for (size_t l = 0; l < m.layers_.size(); ++l) {
        const auto& L = m.layers_[l];
        const auto& mp = wmaps[l];
        cuda::fused_qkv_rope(hx, mp[0], bp(L.qkv_b), bp(L.in_norm), pos.data_ptr<int64_t>(),
                             m.inv_freq_.data_ptr<float>(), int(R), int(nh), int(nkv), int(D), int(Hd), eps, bp(q),
                             bp(cache.k[l]), bp(cache.v[l]), cap, sms, stream);
        attend(l, q, att, torch::Tensor());
        cuda::fused_gemm(cuda::Fused::kOResid, attx, mp[1], bp(L.o.b), nullptr, bp(h), int(R), int(Hd), int(nh * D),
                         eps, sms, stream);
        cuda::fused_gemm(cuda::Fused::kGateUpNormSilu, hx, mp[2], bp(L.gu_b), bp(L.post_norm), bp(a), int(R),
                         int(2 * I), int(Hd), eps, sms, stream);
        cuda::fused_gemm(cuda::Fused::kDownResid, ax, mp[3], bp(L.down.b), nullptr, bp(h), int(R), int(Hd), int(I), eps,
                         sms, stream);
      }
    } else {
      for (size_t l = 0; l < m.layers_.size(); ++l) {
        const auto& L = m.layers_[l];
        auto x = torch::empty({R, Hd}, bfo);
        auto x32 = lora ? torch::empty({R, Hd}, f32o) : torch::Tensor();
        cuda::add_rmsnorm(bp(h), bp(delta), fp(dl), bp(L.in_norm), bp(x), fp(x32), int(R), int(Hd), eps, stream);
        auto qkv = at::linear(x, L.qkv_w, L.qkv_b);
        auto lq = lora ? lora_out(lqkv[l], x32) : torch::Tensor();
        auto q = torch::empty({R, nh, D}, bfo);
        cuda::rope_qkv(bp(qkv), fp(lq), pos.data_ptr<int64_t>(), m.inv_freq_.data_ptr<float>(), int(R), int(nh),
                       int(nkv), int(D), bp(q), bp(cache.k[l]), bp(cache.v[l]), cap, stream);
        auto att = torch::empty({R, nh * D}, bfo);
        auto att32 = lora && lo[l].a.defined() ? torch::empty({R, nh * D}, f32o) : torch::Tensor();
        attend(l, q, att, att32);
        auto o = at::linear(att, L.o.w, L.o.b);
        auto lov = lora ? lora_out(lo[l], att32) : torch::Tensor();
        cuda::add_rmsnorm(bp(h), bp(o), fp(lov), bp(L.post_norm), bp(x), fp(x32), int(R), int(Hd), eps, stream);
        auto gu = at::linear(x, L.gu_w, L.gu_b);
        auto lg = lora ? lora_out(lgu[l], x32) : torch::Tensor();
        auto a = torch::empty({R, I}, bfo);
        auto a32 = lora && ldown[l].a.defined() ? torch::empty({R, I}, f32o) : torch::Tensor();
        cuda::silu_mul(bp(gu), fp(lg), int(R), int(I), bp(a), fp(a32), stream);
        delta = at::linear(a, L.down.w, L.down.b);
        dl = lora ? lora_out(ldown[l], a32) : torch::Tensor();
      }
    }
    // The last norm (adding the last layer's delta on the cuBLAS path; the Hopper path's h has it)
    // and the head.
    if (wgmma && head_fused) {
      if (head_draws)
        cuda::fused_head_draw(hx, head_map, bp(m.norm_), bp(logits), int(R), int(logits.size(1)), int(Hd), eps,
                              float(s.temperature), step.data_ptr<int64_t>(), draw_work.data_ptr<float>(), stream);
      else
        cuda::fused_gemm(cuda::Fused::kHeadNorm, hx, head_map, nullptr, bp(m.norm_), bp(logits), int(R),
                         int(logits.size(1)), int(Hd), eps, sms, stream);
      return;
    }
    auto x = torch::empty({R, Hd}, bfo);
    cuda::add_rmsnorm(bp(h), bp(delta), fp(dl), bp(m.norm_), bp(x), nullptr, int(R), int(Hd), eps, stream);
    at::mm_out(logits, x, m.head_.t());
#else
    (void)klen;
    throw std::logic_error("decoder: built without the CUDA kernels");
#endif
  }

  // One step over every row at key length klen: a graph replay (captured the first time this
  // klen is seen; the generation's first capture after one warm-up step, whose effect on the small
  // state is undone, so that cuBLAS's handles, the kernels' shared-memory grants and the like are
  // set up outside any capture; a later bucket changes only the attention's key range and split
  // count, which need none), or the step itself.
  void run_step(int64_t klen) {
    if (!graphs) {
      step_once(klen);
    } else {
      auto it = graph_of.find(klen);
      if (it == graph_of.end()) {
        const auto t0 = std::chrono::steady_clock::now();
        if (!pool) pool = at::cuda::graph_pool_handle();
        if (graph_of.empty()) {  // the first capture: everything lazily set up is set up here
          auto ids0 = ids.clone(), pos0 = pos.clone(), step0 = step.clone();
          step_once(klen);  // warm-up: writes only what the real step rewrites, and the state below
          ids.copy_(ids0);
          pos.copy_(pos0);
          step.copy_(step0);
        }
        auto g = std::make_unique<at::cuda::CUDAGraph>();
        // Thread-local capture: another sampler or a colocated learner on another thread may
        // allocate or synchronise while this step is captured.
        g->capture_begin(*pool, cudaStreamCaptureModeThreadLocal);
        step_once(klen);
        g->capture_end();
        it = graph_of.emplace(klen, std::move(g)).first;
        ++stats.graphs;
        stats.capture_seconds += seconds_since(t0);
      }
      it->second->replay();
    }
    if (!sample_inside) sample();
    ++enqueued;
    for (int64_t r = 0; r < R; ++r)
      if (pos_h[r] > 0 && pos_h[r] + 1 < cap) ++pos_h[r];
  }

  // ---------------------------------------------------------------- the loop

  // Steps the longest-remaining row still needs beyond those enqueued for it and not yet taken.
  int64_t steps_needed() const {
    const int64_t untaken_from = flight.empty() ? enqueued : flight.front().first;
    int64_t need = 0;
    for (int64_t r = 0; r < R; ++r) {
      const int64_t q = row_seq[r];
      if (q < 0) continue;
      const int64_t queued = enqueued - std::max(row_since[r], untaken_from);
      need = std::max<int64_t>(need, int64_t(s.max_tokens) - produced[q] - queued);
    }
    return need;
  }

  // w steps, then the copy of the drawn tokens' ring to the host (asynchronous on CUDA).
  void launch_window(int64_t w) {
    push_share();
    Window win;
    win.first = enqueued;
    win.w = w;
    if (cuda) {
      win.start.emplace(cudaEventDefault);
      win.start->record();
    } else {
      win.t0 = std::chrono::steady_clock::now();
    }
    for (int64_t i = 0; i < w; ++i) {
      int64_t longest = 0;
      for (int64_t r = 0; r < R; ++r) longest = std::max(longest, pos_h[r] + 1);
      const int64_t klen = one_graph ? cap : std::min(cap, bucketed ? round_up(longest, bucket) : longest);
      run_step(klen);
    }
    stats.steps += w;
    if (cuda) {
      const int b = int(windows % 2);
      host_tok[b].copy_(hist_tok, /*non_blocking=*/true);
      host_lp[b].copy_(hist_lp, /*non_blocking=*/true);
      win.tok = host_tok[b];
      win.lp = host_lp[b];
      win.end.emplace(cudaEventDefault);
      win.end->record();
    } else {
      win.tok = hist_tok.clone();
      win.lp = hist_lp.clone();
    }
    ++windows;
    flight.push_back(std::move(win));
  }

  // Row r goes free (its cache will be parked or overwritten): the rows reading its copy of their
  // prompt read their own again, the first of them the new source for the rest.
  void release(int64_t r) {
    if (!share.defined()) return;
    int64_t lead = -1;
    for (int64_t q = 0; q < R; ++q)
      if (q != r && share_h[2 * q] == r && share_h[2 * q + 1] > 0) {
        if (lead < 0) {
          lead = q;
          share_h[2 * q] = int32_t(q), share_h[2 * q + 1] = 0;
        } else {
          share_h[2 * q] = int32_t(lead);
        }
      }
    share_h[2 * r] = int32_t(r), share_h[2 * r + 1] = 0;
    share_dirty = true;
  }

  // The share table to the device, ordered before the next window's steps (from pinned memory: a
  // pageable copy would wait for the window in flight).
  void push_share() {
    if (!share_dirty) return;
    share.copy_(torch::tensor(share_h, torch::kInt32).pin_memory(), /*non_blocking=*/true);
    share_dirty = false;
  }

  // The oldest window's tokens to their sequences (waiting for its copy), then admission of waiting
  // sequences into freed rows and the parking of rows left free.
  void take_window() {
    Window win = std::move(flight.front());
    flight.pop_front();
    if (cuda) {
      win.end->synchronize();
      stats.decode_seconds += double(win.start->elapsed_time(*win.end)) / 1e3;  // the device's clock
    } else {
      stats.decode_seconds += seconds_since(win.t0);
    }
    const int32_t* tp = win.tok.data_ptr<int32_t>();
    const float* lp = win.lp.data_ptr<float>();
    for (int64_t t = win.first; t < win.first + win.w; ++t) {
      const int64_t slot = t % H;
      for (int64_t r = 0; r < R; ++r) {
        const int64_t q = row_seq[r];
        if (q < 0 || t < row_since[r]) continue;
        ++produced[q];
        bool done = sink(q, tp[slot * R + r], lp[slot * R + r]);
        if (produced[q] >= int64_t(s.max_tokens)) done = true;
        if (done) {
          row_seq[r] = -1;
          release(r);
        }
      }
    }
    if (!pending.empty()) admit();  // (no window is in flight while sequences wait: go())
    // Rows left free stop growing: position 0, one key (their outputs are not read).
    std::vector<int64_t> park;
    for (int64_t r = 0; r < R; ++r)
      if (row_seq[r] < 0 && pos_h[r] > 0) {
        park.push_back(r);
        pos_h[r] = 0;
      }
    if (!park.empty()) {  // (from pinned memory: a pageable copy would wait for the window in flight)
      auto idx = torch::tensor(park, torch::kInt64);
      if (cuda) idx = idx.pin_memory();
      pos.index_fill_(0, idx.to(dev, /*non_blocking=*/true), 0);
    }
  }

  // Windows of up to K steps; on CUDA, once no sequence waits for a row, the next window is
  // enqueued before the last one's tokens are taken, so that the device is not idle while the host
  // hands them out (a window may then run for rows that ended in the one before: their tokens are
  // not read). While sequences wait, one window at a time, so that a freed row is refilled at once.
  void go() {
    admit();
    while (true) {
      const size_t depth = cuda && pending.empty() ? 2 : 1;
      if (flight.size() < depth) {
        const int64_t need = steps_needed();
        if (need > 0) {
          launch_window(std::min(K, need));
          if (flight.size() < depth) continue;
        }
      }
      if (flight.empty()) {
        if (pending.empty()) break;
        admit();
        continue;
      }
      take_window();
    }
  }
};

Decoder::Decoder(CausalLM& model) : m_(model) {}
Decoder::~Decoder() = default;

void Decoder::generate(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& s, int64_t max_rows,
                       const TokenSink& sink) {
  stats_ = DecodeStats();
  if (prompts.empty() || s.n == 0 || s.max_tokens == 0) return;
  torch::NoGradGuard ng;
  // On CUDA the whole generation runs on a side stream (graphs cannot capture the default one).
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (m_.device().is_cuda()) guard.emplace(c10::cuda::getStreamFromPool(false, m_.device().index()));
  torch::manual_seed(s.seed);
  Run run(m_, prompts, s, max_rows, sink, stats_);
  run.go();
}

}  // namespace kernelrl
