// policy_bench: sampling throughput of the built-in policy (policy/policy.hpp) on fixed-length
// work, for bench/policy_throughput.py. Prompts are random token ids; nothing stops a sequence
// early unless the model's config names an eos token.
//   policy_bench --model DIR --device cuda:0 --dtype bf16 --batch B --prompt-len P --new-tokens N
//                [--repeats R] [--temperature T] [--top-p P] [--lora-rank R] [--n N]
// Prints one JSON object: tokens generated, seconds of each timed repeat, tokens/s (best and mean),
// the prefill's seconds and the decode step's milliseconds (the decoder's own clocks, each ending
// in a synchronisation), the decode path, and the device's peak memory. --n N: N samples of each
// of BATCH / N prompts (a GRPO group shares its prompt's prefill). --lora-rank R samples through a
// fresh rank-R adapter on all seven projections (as the RL sampler does). --profile FILE (both
// modes): a Chrome trace of one more generation or step (bench/profile_summary.py reads it).
//
// With --train BATCH.safetensors (ids, mask, old_logp, adv: bench/learner_step.py writes it): LoRA
// GRPO steps of the learner's trainer (learner/trainer.hpp) on that batch instead: a fresh adapter
// (--rank R --alpha A on all seven projections), --minibatch M sequences per forward/backward,
// AdamW at --lr, --checkpoint 1 for activation checkpointing; one warm-up step, then R timed steps.
// Prints each step's seconds, loss and tokens/s (tokens: B x L of the batch) and the device's
// peak memory. --adapter DIR starts from a
// PEFT adapter instead; --dump-grads FILE writes the LoRA gradients (sums over the batch's tokens)
// of one pass over the batch and stops.
//
// --lora-op-check N,IN,OUT[;...]: one LoRA layer against float64 (lora_op_check, below).
// --attention-check 1: the fused decode attention against LibTorch (attention_check, below).
// --lora-decode-check 1: the decode step's float32 LoRA (lora_decode_check, below).
// --sample-check 1: the decode step's draw against float64 softmax (sample_check, below).
// --gemm-check 1: the decode step's Hopper products with their fused steps (gemm_check, below).
// --colocated 1 --model DIR: a sampler's and a learner's models sharing the base weights against
// two separate loads, device memory of each (colocated, below).
// --share-check 1 --model DIR: groups decoding with their prompt's keys read from one row, against
// each row reading its own copy (share_check, below).
#include "policy/decoder.hpp"
#include "policy/model.hpp"
#include "policy/policy.hpp"
#include "policy/safetensors.hpp"
#include "learner/trainer.hpp"
#ifdef KERNELRL_CUDA_KERNELS
#include "policy/cuda_kernels.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <cuda_runtime_api.h>
#endif

#include <nlohmann/json.hpp>

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <chrono>
#include <functional>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>

namespace {

// Peak bytes the caching allocator held on `dev` since the last reset (0 off CUDA).
// With --profile FILE: a Chrome trace (Kineto, CPU and CUDA activity) of `work`, for
// bench/profile_summary.py.
void profile(const std::string& file, const std::function<void()>& work) {
  namespace pr = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const std::set<ActivityType> acts{ActivityType::CPU, ActivityType::CUDA};
  torch::profiler::impl::ProfilerConfig cfg(torch::profiler::impl::ProfilerState::KINETO);
  pr::prepareProfiler(cfg, acts);
  pr::enableProfiler(cfg, acts);
  work();
  pr::disableProfiler()->save(file);
}

int64_t peak_bytes(const torch::Device& dev) {
  if (!dev.is_cuda()) return 0;
  auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index());
  return st.allocated_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)].peak;
}

void reset_peak(const torch::Device& dev) {
  if (dev.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(dev.index());
}

torch::Tensor read_tensor(const kernelrl::SafetensorsFile& f, const std::string& name) {
  for (auto& v : f.tensors())
    if (v.name == name) {
      auto dt = v.dtype == kernelrl::StDtype::I64   ? torch::kInt64
                : v.dtype == kernelrl::StDtype::F64 ? torch::kFloat64
                                                    : torch::kFloat32;
      return torch::from_blob(const_cast<uint8_t*>(v.data), v.shape, torch::TensorOptions().dtype(dt)).clone();
    }
  throw std::runtime_error("no tensor " + name);
}

int train_bench(const std::function<std::string(const char*, const char*)>& get) {
  torch::Device dev(get("--device", "cuda:0"));
  kernelrl::CausalLM m(get("--model", ""), dev, kernelrl::parse_dtype(get("--dtype", "bf16")));
  if (!get("--adapter", "").empty()) {
    m.load_lora(get("--adapter", ""));
  } else {
    kernelrl::LoraSettings ls;
    ls.r = std::stoll(get("--rank", "16"));
    ls.alpha = std::stod(get("--alpha", "32"));
    m.add_lora(ls, 0);
  }
  kernelrl::TrainOptions o;
  o.learning_rate = std::stod(get("--lr", "1e-5"));
  o.activation_checkpointing = get("--checkpoint", "0") == "1";
  kernelrl::LoraTrainer tr(m, o);
  reset_peak(dev);
  auto f = kernelrl::SafetensorsFile::open(get("--train", ""));
  auto ids = read_tensor(*f, "ids").to(dev), mask = read_tensor(*f, "mask").to(dev);
  auto old = read_tensor(*f, "old_logp").to(dev), adv = read_tensor(*f, "adv").to(dev);
  const int64_t B = ids.size(0), L = ids.size(1), M = std::stoll(get("--minibatch", "8"));
  const int R = std::stoi(get("--repeats", "3"));
  auto accumulate_batch = [&] {  // forward and backward of every minibatch of the batch
    for (int64_t b0 = 0; b0 < B; b0 += M) {
      int64_t n = std::min(M, B - b0);
      tr.accumulate({ids.narrow(0, b0, n), mask.narrow(0, b0, n), old.narrow(0, b0, n), adv.narrow(0, b0, n), {}});
    }
  };
  if (!get("--dump-grads", "").empty()) {  // the LoRA gradients of one pass over the batch, no step
    accumulate_batch();
    std::map<std::string, torch::Tensor> g;
    for (auto& [name, t] : m.lora_tensors()) g[name] = t.grad().to(torch::kFloat32);
    kernelrl::save_tensors(get("--dump-grads", ""), g);
    std::printf("{}\n");
    return 0;
  }
  nlohmann::json runs = nlohmann::json::array();
  double best = 0, sum = 0, warmup_loss = 0;
  for (int r = 0; r <= R; ++r) {  // r = 0: warm-up
    if (dev.is_cuda()) torch::cuda::synchronize();
    auto t0 = std::chrono::steady_clock::now();
    accumulate_batch();
    auto rep = tr.step();
    if (dev.is_cuda()) torch::cuda::synchronize();
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r == 0) {
      warmup_loss = rep.loss;
      continue;
    }
    double tps = double(B * L) / s;
    best = std::max(best, tps);
    sum += tps;
    runs.push_back({{"seconds", s}, {"loss", rep.loss}, {"grad_norm", rep.grad_norm}, {"tokens_per_s", tps}});
  }
  if (!get("--profile", "").empty())
    profile(get("--profile", ""), [&] {
      accumulate_batch();
      tr.step();
      if (dev.is_cuda()) torch::cuda::synchronize();
    });
  nlohmann::json j = {{"batch", B},
                      {"seq_len", L},
                      {"minibatch", M},
                      {"runs", runs},
                      {"tokens_per_s_best", best},
                      {"tokens_per_s_mean", sum / R},
                      {"warmup_loss", warmup_loss},
                      {"peak_bytes", peak_bytes(dev)}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

// --lora-op-check N,IN,OUT[;N,IN,OUT...]: one LoRA layer's forward and backward through
// Linear::forward in training (random bf16 x, weight and upstream gradient; float32 A and B, rank
// 16, scale 2), against float64 arithmetic on the same values. Prints, per shape, the relative L2
// errors of dA and dB (float32 results: the products' own accuracy) and of the output and dx (bf16
// results: bf16 rounding). KERNELRL_FUSED_LORA=0 or 1 picks the path checked.
int lora_op_check(const std::function<std::string(const char*, const char*)>& get) {
  torch::Device dev(get("--device", "cuda:0"));
  nlohmann::json rows = nlohmann::json::array();
  std::string spec = get("--lora-op-check", "");
  for (size_t p0 = 0; p0 < spec.size();) {
    size_t p1 = spec.find(';', p0);
    if (p1 == std::string::npos) p1 = spec.size();
    int64_t N = 0, in = 0, out = 0;
    if (std::sscanf(spec.substr(p0, p1 - p0).c_str(), "%ld,%ld,%ld", &N, &in, &out) != 3)
      throw std::runtime_error("--lora-op-check: expected N,IN,OUT[;...], got " + spec);
    p0 = p1 + 1;
    torch::manual_seed(0);
    const int64_t r = 16;
    auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
    kernelrl::Linear l;
    l.w = (torch::randn({out, in}, f32) * 0.02).to(torch::kBFloat16);
    l.a = (torch::randn({r, in}, f32) / std::sqrt(double(in))).requires_grad_();
    l.bb = (torch::randn({out, r}, f32) * 0.05).requires_grad_();
    l.scale = 2.0;
    auto x = torch::randn({N, in}, f32).to(torch::kBFloat16).requires_grad_();
    auto g = torch::randn({N, out}, f32).to(torch::kBFloat16);
    auto y = l.forward(x, true, true);
    y.backward(g);
    torch::NoGradGuard ng;
    auto X = x.detach().to(torch::kFloat64), W = l.w.to(torch::kFloat64), G = g.to(torch::kFloat64);
    auto A = l.a.detach().to(torch::kFloat64), B = l.bb.detach().to(torch::kFloat64);
    auto T = X.mm(A.t());
    auto GT = G.mm(B) * l.scale;
    auto rel = [](const torch::Tensor& got, const torch::Tensor& ref) {
      return ((got.to(torch::kFloat64) - ref).norm() / ref.norm()).item<double>();
    };
    rows.push_back({{"n", N},
                    {"in", in},
                    {"out", out},
                    {"d_a", rel(l.a.grad(), GT.t().mm(X))},
                    {"d_b", rel(l.bb.grad(), G.t().mm(T) * l.scale)},
                    {"out_bf16", rel(y, X.mm(W.t()) + T.mm(B.t()) * l.scale)},
                    {"d_x_bf16", rel(x.grad(), G.mm(W) + GT.mm(A))}});
  }
  std::printf("%s\n", nlohmann::json{{"rows", rows}}.dump().c_str());
  return 0;
}

// --attention-check 1: the decode step's fused attention (cuda::decode_attention: the tensor-core
// kernel, or the scalar one with KERNELRL_ATTN_MMA=0) against LibTorch float32 arithmetic on the
// same bf16 values: the models' head shapes (12/2 and 28/4 heads of 128, 16/4 of 64, 8/8), rows of
// random lengths (one of a single key, one of the whole bucket), one split, three and the decoder's count,
// soft and sharp score distributions. Prints each case's largest |difference| over the largest
// |reference| (bf16 output and its float32 copy), whether a second call gives the same bits (the
// split counters left at zero), and whether rows reading a shared prefix from their group's first
// row (decode_attention's share; their own copies overwritten by NaN, which changes the output of
// the same call without share) give the same bits.
int attention_check(const std::function<std::string(const char*, const char*)>& get) {
#ifdef KERNELRL_CUDA_KERNELS
  torch::Device dev(get("--device", "cuda:0"));
  struct Case {
    int R, nh, nkv, D;
    int64_t cap;
    int klen;
    double sharp;
  };
  const std::vector<Case> cases = {{64, 12, 2, 128, 520, 512, 1}, {64, 12, 2, 128, 520, 512, 6},
                                   {7, 28, 4, 128, 300, 256, 1},  {5, 16, 4, 64, 200, 192, 1},
                                   {3, 8, 8, 128, 100, 64, 1},    {4, 12, 2, 128, 2304, 2304, 1},
                                   {6, 16, 4, 32, 150, 128, 1}};
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev.index());
  nlohmann::json rows = nlohmann::json::array();
  bool ok = true;
  for (const auto& c : cases)
    for (int splits : {1, 3, kernelrl::cuda::decode_attention_splits(c.R, c.nkv, c.D, c.klen, sms)}) {
      torch::manual_seed(1);
      auto bf = torch::TensorOptions().dtype(torch::kBFloat16).device(dev);
      auto q = (torch::randn({c.R, c.nh, c.D}, bf.dtype(torch::kFloat32)) * c.sharp).to(torch::kBFloat16);
      auto kc = torch::randn({c.R, c.nkv, c.cap, c.D}, bf);
      auto vc = torch::randn({c.R, c.nkv, c.cap, c.D}, bf);
      auto pos = torch::randint(0, c.klen + 4, {c.R}, torch::TensorOptions().dtype(torch::kInt64).device(dev));
      pos[0] = 0;
      pos[c.R - 1] = c.klen - 1;
      auto posc = pos.cpu();
      // Groups of up to 4 rows whose first two thirds of keys are the group's first row's (copied
      // there, as the decoder's prefill copies a prompt's): the same bits when read from that row
      // (share) with the followers' own copies overwritten by NaN.
      const int G = std::min(4, c.R);
      std::vector<int32_t> hs(2 * c.R);
      bool any_shared = false;
      for (int r = 0; r < c.R; ++r) {
        const int lead = r / G * G;
        const int64_t n = std::min<int64_t>({posc[r].item<int64_t>() + 1, c.klen, c.cap});
        hs[2 * r] = lead;
        hs[2 * r + 1] = r == lead ? 0 : int32_t(2 * n / 3);
        any_shared = any_shared || hs[2 * r + 1] > 0;
        if (hs[2 * r + 1] > 0) {
          kc[r].narrow(1, 0, hs[2 * r + 1]).copy_(kc[lead].narrow(1, 0, hs[2 * r + 1]));
          vc[r].narrow(1, 0, hs[2 * r + 1]).copy_(vc[lead].narrow(1, 0, hs[2 * r + 1]));
        }
      }
      auto share = torch::tensor(hs, torch::kInt32).to(dev);
      auto kp = kc.clone(), vp = vc.clone();
      for (int r = 0; r < c.R; ++r)
        if (hs[2 * r + 1] > 0) {
          kp[r].narrow(1, 0, hs[2 * r + 1]).fill_(NAN);
          vp[r].narrow(1, 0, hs[2 * r + 1]).fill_(NAN);
        }
      auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
      auto work = torch::empty({int64_t(c.R) * c.nh * splits * (c.D + 2)}, f32);
      auto counters = torch::zeros({c.R * c.nkv}, torch::TensorOptions().dtype(torch::kInt32).device(dev));
      const float scale = float(1.0 / std::sqrt(double(c.D)));
      auto run = [&](const torch::Tensor& k, const torch::Tensor& v, const int32_t* sh) {
        auto out = torch::empty({c.R, c.nh * c.D}, bf);
        auto out32 = torch::empty({c.R, c.nh * c.D}, f32);
        auto b = [](const torch::Tensor& t) { return reinterpret_cast<kernelrl::cuda::bf16_t*>(t.data_ptr()); };
        kernelrl::cuda::decode_attention(b(q), b(k), b(v), pos.data_ptr<int64_t>(), sh, c.R, c.nh, c.nkv, c.D, c.cap,
                                         c.klen, scale, splits, work.data_ptr<float>(), counters.data_ptr<int>(),
                                         b(out), out32.data_ptr<float>(),
                                         at::cuda::getCurrentCUDAStream(dev.index()).stream());
        return std::make_pair(out, out32);
      };
      auto [out, out32] = run(kc, vc, nullptr);
      auto [again, again32] = run(kc, vc, nullptr);
      auto [shared, shared32] = run(kp, vp, share.data_ptr<int32_t>());
      auto [poisoned, poisoned32] = run(kp, vp, nullptr);  // (must differ: the check can fail)
      const bool share_same = torch::equal(out, shared) && torch::equal(out32, shared32);
      const bool poison_seen = !any_shared || !torch::equal(poisoned32, out32);
      auto ref = torch::empty({c.R, c.nh, c.D}, f32);
      for (int r = 0; r < c.R; ++r) {
        int64_t n = std::min<int64_t>({posc[r].item<int64_t>() + 1, c.klen, c.cap});
        auto K = kc[r].narrow(1, 0, n).to(torch::kFloat32).repeat_interleave(c.nh / c.nkv, 0);  // [nh, n, D]
        auto V = vc[r].narrow(1, 0, n).to(torch::kFloat32).repeat_interleave(c.nh / c.nkv, 0);
        auto s = torch::bmm(q[r].to(torch::kFloat32).unsqueeze(1), K.transpose(1, 2)) * scale;  // [nh, 1, n]
        ref[r] = torch::bmm(torch::softmax(s, -1), V).squeeze(1);
      }
      ref = ref.view({c.R, c.nh * c.D});
      const double top = ref.abs().max().item<double>();
      const double err = (out.to(torch::kFloat32) - ref).abs().max().item<double>() / top;
      const double err32 = (out32 - ref).abs().max().item<double>() / top;
      const bool same = torch::equal(out, again) && torch::equal(out32, again32);
      ok = ok && err < 2e-2 && err32 < 2e-2 && same && share_same && poison_seen;
      rows.push_back({{"rows", c.R},
                      {"heads", c.nh},
                      {"kv_heads", c.nkv},
                      {"head_dim", c.D},
                      {"klen", c.klen},
                      {"sharp", c.sharp},
                      {"splits", splits},
                      {"err", err},
                      {"err32", err32},
                      {"repeat_same", same},
                      {"shared_prefix", any_shared},
                      {"shared_prefix_same", share_same},
                      {"shared_prefix_poison_seen", poison_seen}});
    }
  std::printf("%s\n", nlohmann::json{{"ok", ok}, {"rows", rows}}.dump().c_str());
  return ok ? 0 : 1;
#else
  (void)get;
  throw std::runtime_error("--attention-check: built without the CUDA kernels");
#endif
}

// --lora-decode-check 1: cuda::lora_decode, the decode step's adapter of a projection group in
// float32 ((x A^T) B^T), against float64 at the groups' shapes of the 1.5B and 7B models (q|k|v, o,
// gate|up, down; rank 16 a member), at batch 64, 5 and 1, and a stacked rank of 192 (three rank-64
// adapters). Prints each case's largest |difference| over the largest |reference| and whether a
// second call gives the same bits; ok when every case is within 1e-5.
int lora_decode_check(const std::function<std::string(const char*, const char*)>& get) {
#ifdef KERNELRL_CUDA_KERNELS
  torch::Device dev(get("--device", "cuda:0"));
  struct Case {
    int R, in, rs, N;
  };
  const std::vector<Case> cases = {{64, 1536, 48, 2048}, {64, 1536, 16, 1536}, {64, 1536, 32, 17920},
                                   {64, 8960, 16, 1536}, {5, 3584, 48, 4608},  {1, 18944, 16, 3584},
                                   {64, 3584, 192, 4608}};
  nlohmann::json rows = nlohmann::json::array();
  bool ok = true;
  for (const auto& c : cases) {
    torch::manual_seed(2);
    auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
    auto x = torch::randn({c.R, c.in}, f32).to(torch::kBFloat16).to(torch::kFloat32);  // bf16 activations
    auto a = torch::randn({c.rs, c.in}, f32) * 0.02;
    auto bt = torch::randn({c.rs, c.N}, f32) * 0.02;
    auto part = torch::empty({int64_t(kernelrl::cuda::lora_decode_parts(c.in)) * c.R * c.rs}, f32);
    auto run = [&] {
      auto out = torch::empty({c.R, c.N}, f32);
      kernelrl::cuda::lora_decode(x.data_ptr<float>(), a.data_ptr<float>(), bt.data_ptr<float>(), c.R, c.in, c.rs, c.N,
                                  part.data_ptr<float>(), out.data_ptr<float>(),
                                  at::cuda::getCurrentCUDAStream(dev.index()).stream());
      return out;
    };
    auto out = run(), again = run();
    auto ref = torch::mm(torch::mm(x.to(torch::kFloat64), a.to(torch::kFloat64).t()), bt.to(torch::kFloat64));
    const double err = (out.to(torch::kFloat64) - ref).abs().max().item<double>() / ref.abs().max().item<double>();
    const bool same = torch::equal(out, again);
    ok = ok && err < 1e-5 && same;
    rows.push_back({{"rows", c.R}, {"in", c.in}, {"rank", c.rs}, {"out", c.N}, {"err", err}, {"repeat_same", same}});
  }
  std::printf("%s\n", nlohmann::json{{"ok", ok}, {"rows", rows}}.dump().c_str());
  return ok ? 0 : 1;
#else
  (void)get;
  throw std::runtime_error("--lora-decode-check: built without the CUDA kernels");
#endif
}

// --sample-check 1: cuda::sample_tokens (the fused decode step's draw) against float64 softmax on
// 64 rows of a 151,936-token vocabulary (flat, moderately sharp, one dominant token, very sharp
// rows), at temperatures 1 and 0.6, over --steps draws (default 2,000) of every row: the largest
// |difference| of the reported logprob from float64 log_softmax; the randomized probability
// integral transform of each draw (F(k-1) + v p(k), uniform exactly when the draws follow p) by a
// Kolmogorov-Smirnov statistic over all draws and over each kind of row, against the 1e-4 critical
// value; the draws' bias (log p + H summed, in standard errors); and at T = 0 the argmax. Also the
// microseconds a call (both kernels) over the timed draws. Each with the partials over 64 chunks a row
// (sample_tokens) and over the Hopper head's 128-logit tiles (sample_partials and
// sample_from_partials at fused_head_draw_chunk(): the draw the head's step takes).
int sample_check(const std::function<std::string(const char*, const char*)>& get) {
#ifdef KERNELRL_CUDA_KERNELS
  torch::Device dev(get("--device", "cuda:0"));
  const int R = 64, V = 151936, steps = std::stoi(get("--steps", "2000"));
  torch::manual_seed(3);
  auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
  auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(dev);
  auto kind = torch::arange(R, i64).remainder(4);
  auto scale = torch::tensor({1.0, 4.0, 1.0, 8.0}, f32).index({kind}).view({R, 1});
  auto logits = torch::randn({R, V}, f32) * scale;
  for (int r = 2; r < R; r += 4) logits.index_put_({r, (r * 7919) % V}, 12.0);
  logits = logits.to(torch::kBFloat16);
  auto stream = at::cuda::getCurrentCUDAStream(dev.index()).stream();
  namespace kc = kernelrl::cuda;
  const int tile = kc::fused_head_draw_chunk();
  auto work = torch::empty({kc::sample_work_floats(R, std::max(64, (V + tile - 1) / tile))}, f32);
  int per = 0;  // 0: sample_tokens; else the two passes at this chunk width
  auto draw = [&](double T, int n, float* us) {
    auto step = torch::zeros({1}, i64), ids = torch::zeros({R}, i64), pos = torch::zeros({R}, i64);
    auto tok = torch::full({n, R}, -1, i64.dtype(torch::kInt32));
    auto lp = torch::zeros({n, R}, f32);
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    cudaEventRecord(a, stream);
    const auto* lg = reinterpret_cast<const kc::bf16_t*>(logits.data_ptr());
    for (int i = 0; i < n; ++i) {
      if (per == 0) {
        kc::sample_tokens(lg, R, V, float(T), 1234, step.data_ptr<int64_t>(), work.data_ptr<float>(),
                          ids.data_ptr<int64_t>(), pos.data_ptr<int64_t>(), 1 << 20, tok.data_ptr<int32_t>(),
                          lp.data_ptr<float>(), n, stream);
      } else {
        kc::sample_partials(lg, R, V, per, float(T), step.data_ptr<int64_t>(), work.data_ptr<float>(), stream);
        kc::sample_from_partials(lg, R, V, per, float(T), 1234, step.data_ptr<int64_t>(), work.data_ptr<float>(),
                                 ids.data_ptr<int64_t>(), pos.data_ptr<int64_t>(), 1 << 20, tok.data_ptr<int32_t>(),
                                 lp.data_ptr<float>(), n, stream);
      }
    }
    cudaEventRecord(b, stream);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (us) *us = ms * 1e3f / float(n);
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    const bool counted = step.item<int64_t>() == n && torch::equal(ids, tok[n - 1].to(torch::kInt64));
    return std::make_tuple(tok.to(torch::kInt64), lp, counted);
  };
  nlohmann::json rows = nlohmann::json::array();
  bool ok = true;
  const double crit = 2.226;       // sqrt(-ln(1e-4 / 2) / 2): the one-sample KS critical value, times sqrt(n)
  auto ks = [](torch::Tensor u) {  // the KS statistic of u (1-D, float64) against uniform(0, 1)
    u = std::get<0>(u.sort());
    const auto n = u.size(0);
    auto i = torch::arange(1, n + 1, u.options());
    return std::max((i / double(n) - u).max().item<double>(), (u - (i - 1) / double(n)).max().item<double>());
  };
  for (const int mode_per : {0, tile}) {
    per = mode_per;
    const std::string pname = per == 0 ? "64 chunks" : "head tiles of " + std::to_string(per);
    for (double T : {1.0, 0.6}) {
      float us = 0;
      auto [tok, lp, counted] = draw(T, steps, &us);
      auto logp = torch::log_softmax(logits.to(torch::kFloat64) / T, 1);  // [R, V]
      auto p = logp.exp();
      auto cdf = p.cumsum(1);
      auto rows_i = torch::arange(R, i64).view({1, R}).expand({steps, R});
      auto pk = p.index({rows_i, tok}), ref_lp = logp.index({rows_i, tok});
      const double lp_err = (lp.to(torch::kFloat64) - ref_lp).abs().max().item<double>();
      auto u = cdf.index({rows_i, tok}) - pk + torch::rand({steps, R}, pk.options()) * pk;  // randomized PIT
      const int64_t n_all = int64_t(steps) * R;
      const double d_all = ks(u.reshape({-1}));
      bool ks_ok = d_all * std::sqrt(double(n_all)) < crit;
      nlohmann::json kinds = nlohmann::json::array();
      for (int k = 0; k < 4; ++k) {
        auto sel = u.index({torch::indexing::Slice(), torch::indexing::Slice(k, R, 4)}).reshape({-1});
        const double d = ks(sel);
        ks_ok = ks_ok && d * std::sqrt(double(sel.size(0))) < crit;
        kinds.push_back({{"kind", k}, {"ks", d}, {"ks_bound", crit / std::sqrt(double(sel.size(0)))}});
      }
      auto H = -(p * logp).sum(1);                  // [R]
      auto var = (p * logp * logp).sum(1) - H * H;  // Var[log p] a row
      const double z = ((ref_lp + H.view({1, R})).sum() / (var.sum() * steps).sqrt()).item<double>();
      const bool row_ok = counted && lp_err < 2e-3 && ks_ok && std::abs(z) < 4;
      ok = ok && row_ok;
      rows.push_back({{"partials", pname},
                      {"temperature", T},
                      {"draws", n_all},
                      {"us_per_call", us},
                      {"logprob_max_abs_diff", lp_err},
                      {"ks", d_all},
                      {"ks_bound", crit / std::sqrt(double(n_all))},
                      {"kinds", kinds},
                      {"bias_z", z},
                      {"counter_ok", counted},
                      {"ok", row_ok}});
    }
    {  // T = 0: the argmax, with its logprob under softmax(logits)
      auto [tok, lp, counted] = draw(0.0, 2, nullptr);
      auto lf = logits.to(torch::kFloat64);
      auto am = lf.argmax(1);
      const bool same = torch::equal(tok[0], am) && torch::equal(tok[1], am);
      const double lp_err = (lp[0].to(torch::kFloat64) - torch::log_softmax(lf, 1).gather(1, am.view({R, 1})).view({R}))
                                .abs()
                                .max()
                                .item<double>();
      const bool row_ok = counted && same && lp_err < 2e-3;
      ok = ok && row_ok;
      rows.push_back({{"partials", pname},
                      {"temperature", 0},
                      {"argmax_equal", same},
                      {"logprob_max_abs_diff", lp_err},
                      {"ok", row_ok}});
    }
  }
  std::printf("%s\n", nlohmann::json{{"ok", ok}, {"rows", rows}}.dump().c_str());
  return ok ? 0 : 1;
#else
  (void)get;
  throw std::runtime_error("--sample-check: built without the CUDA kernels");
#endif
}

// --gemm-check 1: cuda::fused_gemm (the decode step's products on Hopper, each with its fused
// elementwise steps) against float64 at the 1.5B and 7B shapes and 64, 16 and 1 rows: q/k/v of
// the RMSNorm of h (+ bias), h += att W_o^T, silu(gate) * up of the RMSNorm of h, h += a W_down^T,
// the head's logits of the RMSNorm of h (the models' vocabularies; and with the draw's partials at
// its end against sample_partials on its logits), beside the bf16 path transformers takes (the norm rounded to bf16, LibTorch's bf16 products, the
// SwiGLU and the residual add in bf16) against the same float64; and q/k/v with the rotary
// embedding and cache write fused in against the q/k/v product and rope_qkv (the same bits, one
// row's slot outside the cache). ok when each case's largest
// |difference| over the largest |reference| is within twice the bf16 path's plus 1e-3 and a second
// call gives the same bits. Where the products cannot run: ok unless the device is a compute
// capability 9.0 one (whose build should have them).
int gemm_check(const std::function<std::string(const char*, const char*)>& get) {
#ifdef KERNELRL_CUDA_KERNELS
  namespace kc = kernelrl::cuda;
  torch::Device dev(get("--device", "cuda:0"));
  c10::cuda::CUDAGuard guard(dev.index());
  const auto* prop = at::cuda::getCurrentDeviceProperties();
  if (!kc::fused_gemm_available()) {
    const char* off = std::getenv("KERNELRL_WGMMA");
    const bool ok = !(prop->major == 9 && prop->minor == 0) || (off && std::string(off) == "0");
    std::printf("%s\n", nlohmann::json{{"ok", ok}, {"available", false}}.dump().c_str());
    return ok ? 0 : 1;
  }
  const int sms = prop->multiProcessorCount;
  auto stream = at::cuda::getCurrentCUDAStream(dev.index()).stream();
  auto bf = torch::TensorOptions().dtype(torch::kBFloat16).device(dev);
  auto p16 = [](const torch::Tensor& t) { return reinterpret_cast<kc::bf16_t*>(t.data_ptr()); };
  struct Shape {
    const char* model;
    int H, I, NQ, A, V;
  };
  const std::vector<Shape> shapes = {{"1.5b", 1536, 8960, 2048, 1536, 151936}, {"7b", 3584, 18944, 4608, 3584, 152064}};
  const float eps = 1e-6f;
  nlohmann::json rows = nlohmann::json::array();
  bool ok = true;
  for (const auto& sh : shapes)
    for (int R : {64, 16, 1}) {
      torch::manual_seed(3);
      auto h = (torch::randn({R, sh.H}, bf) * 2).contiguous();
      auto g = (torch::rand({sh.H}, bf) + 0.5).contiguous();
      auto h64 = h.to(torch::kFloat64);
      auto inv = torch::rsqrt(h64.pow(2).mean(-1, true) + eps);
      auto xn64 = h64 * inv * g.to(torch::kFloat64);
      // transformers' rounded norm: bf16(g * bf16(h * inv)) with inv in float32
      auto xn16 = (g.to(torch::kFloat32) *
                   (h.to(torch::kFloat32) * torch::rsqrt(h.to(torch::kFloat32).pow(2).mean(-1, true) + eps))
                       .to(torch::kBFloat16)
                       .to(torch::kFloat32))
                      .to(torch::kBFloat16);
      auto rel = [](const torch::Tensor& a, const torch::Tensor& ref) {
        return (a.to(torch::kFloat64) - ref).abs().max().item<double>() / ref.abs().max().item<double>();
      };
      auto record = [&](const char* kind, const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& ref,
                        const torch::Tensor& lib) {
        const double e = rel(a, ref), el = rel(lib, ref);
        const bool same = torch::equal(a, b), good = e <= 2 * el + 1e-3 && same;
        ok = ok && good;
        rows.push_back({{"model", sh.model},
                        {"rows", R},
                        {"kind", kind},
                        {"err", e},
                        {"bf16_path_err", el},
                        {"repeat_same", same},
                        {"ok", good}});
      };
      kc::GemmMap hx;
      if (!kc::fused_gemm_input_map(p16(h), R, sh.H, &hx)) throw std::runtime_error("--gemm-check: input map");
      auto weight = [&](kc::Fused kind, int N, int K, kc::GemmMap* m) {
        auto w = (torch::randn({N, K}, bf) * 0.03).contiguous();
        if (!kc::fused_gemm_weight_map(kind, p16(w), N, K, m)) throw std::runtime_error("--gemm-check: weight map");
        return w;
      };
      {  // q/k/v of the norm, with a bias
        kc::GemmMap wm;
        auto w = weight(kc::Fused::kQkvNorm, sh.NQ, sh.H, &wm);
        auto b = (torch::randn({sh.NQ}, bf) * 0.1).contiguous();
        auto run = [&] {
          auto y = torch::empty({R, sh.NQ}, bf);
          kc::fused_gemm(kc::Fused::kQkvNorm, hx, wm, p16(b), p16(g), p16(y), R, sh.NQ, sh.H, eps, sms, stream);
          return y;
        };
        auto y = run(), y2 = run();
        auto ref = torch::matmul(xn64, w.to(torch::kFloat64).t()) + b.to(torch::kFloat64);
        record("q/k/v kNorm", y, y2, ref, torch::nn::functional::linear(xn16, w, b));
      }
      // q/k/v of the norm with the rotary embedding and cache write fused in: the same bits as the
      // q/k/v product followed by rope_qkv; heads of 128 with a bias, and of 64 without one
      for (const int D : {128, 64}) {
        const int nkv = D == 128 ? (sh.NQ == 2048 ? 2 : 4) : 2, nh = sh.NQ / D - 2 * nkv;
        const int64_t cap = 8;
        kc::GemmMap wm;
        auto w = weight(kc::Fused::kQkvNorm, sh.NQ, sh.H, &wm);
        auto b = D == 128 ? (torch::randn({sh.NQ}, bf) * 0.1).contiguous() : torch::Tensor();
        auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(dev);
        auto pos = torch::randint(0, cap, {R}, i64);
        if (R > 1) pos[R - 1] = cap;  // a row whose slot is outside the cache: no k or v written
        auto inv_freq = torch::pow(1e6, -torch::arange(0, D, 2, torch::TensorOptions().dtype(torch::kFloat64)) / D)
                            .to(torch::kFloat32)
                            .to(dev);
        auto bptr = b.defined() ? p16(b) : nullptr;
        auto q1 = torch::zeros({R, nh, D}, bf), k1 = torch::zeros({R, nkv, cap, D}, bf), v1 = torch::zeros_like(k1);
        auto q2 = torch::zeros_like(q1), k2 = torch::zeros_like(k1), v2 = torch::zeros_like(k1);
        kc::fused_qkv_rope(hx, wm, bptr, p16(g), pos.data_ptr<int64_t>(), inv_freq.data_ptr<float>(), R, nh, nkv, D,
                           sh.H, eps, p16(q1), p16(k1), p16(v1), cap, sms, stream);
        auto qkv = torch::empty({R, sh.NQ}, bf);
        kc::fused_gemm(kc::Fused::kQkvNorm, hx, wm, bptr, p16(g), p16(qkv), R, sh.NQ, sh.H, eps, sms, stream);
        kc::rope_qkv(p16(qkv), nullptr, pos.data_ptr<int64_t>(), inv_freq.data_ptr<float>(), R, nh, nkv, D, p16(q2),
                     p16(k2), p16(v2), cap, stream);
        const bool same = torch::equal(q1, q2) && torch::equal(k1, k2) && torch::equal(v1, v2);
        ok = ok && same;
        rows.push_back({{"model", sh.model},
                        {"rows", R},
                        {"kind", "q/k/v kNorm + rotary"},
                        {"head_dim", D},
                        {"bias", b.defined()},
                        {"same_as_unfused", same}});
      }
      {  // silu(gate) * up of the norm
        kc::GemmMap wm;
        auto w = weight(kc::Fused::kGateUpNormSilu, 2 * sh.I, sh.H, &wm);
        auto run = [&] {
          auto y = torch::empty({R, sh.I}, bf);
          kc::fused_gemm(kc::Fused::kGateUpNormSilu, hx, wm, nullptr, p16(g), p16(y), R, 2 * sh.I, sh.H, eps, sms,
                         stream);
          return y;
        };
        auto y = run(), y2 = run();
        auto gu = torch::matmul(xn64, w.to(torch::kFloat64).t());
        auto ref = torch::silu(gu.narrow(1, 0, sh.I)) * gu.narrow(1, sh.I, sh.I);
        auto gl = torch::nn::functional::linear(xn16, w);
        record("gate/up kNorm+kSilu", y, y2, ref, torch::silu(gl.narrow(1, 0, sh.I)) * gl.narrow(1, sh.I, sh.I));
      }
      {  // the final norm and the head (logits [R, V])
        kc::GemmMap wm;
        auto w = weight(kc::Fused::kHeadNorm, sh.V, sh.H, &wm);
        auto run = [&] {
          auto y = torch::empty({R, sh.V}, bf);
          kc::fused_gemm(kc::Fused::kHeadNorm, hx, wm, nullptr, p16(g), p16(y), R, sh.V, sh.H, eps, sms, stream);
          return y;
        };
        auto y = run(), y2 = run();
        record("head kNorm", y, y2, torch::matmul(xn64, w.to(torch::kFloat64).t()),
               torch::nn::functional::linear(xn16, w));
        // ... with the draw's partials of its tiles at its end (fused_head_draw): the same logits, and
        // the partials sample_partials computes from them at the same chunk width (max and index
        // equal, the sums within 1e-5), the step counter copied; at T = 1 and 0.7.
        const int per = kc::fused_head_draw_chunk(), C = sh.V / per;
        auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(dev);
        auto step = torch::full({1}, 12345, torch::TensorOptions().dtype(torch::kInt64).device(dev));
        for (const float T : {1.0f, 0.7f}) {
          auto yd = torch::empty({R, sh.V}, bf);
          auto wd = torch::zeros({kc::sample_work_floats(R, C)}, f32), wr = torch::zeros_like(wd);
          kc::fused_head_draw(hx, wm, p16(g), p16(yd), R, sh.V, sh.H, eps, T, step.data_ptr<int64_t>(),
                              wd.data_ptr<float>(), stream);
          kc::sample_partials(p16(yd), R, sh.V, per, T, step.data_ptr<int64_t>(), wr.data_ptr<float>(), stream);
          auto parts = [&](const torch::Tensor& wk) { return wk.narrow(0, 0, int64_t(R) * C * 4).view({R, C, 4}); };
          auto pd = parts(wd), pr = parts(wr);
          auto idx = [](const torch::Tensor& p) { return p.select(2, 3).contiguous().view(torch::kInt32); };
          const bool same_logits = torch::equal(yd, y);
          const bool max_eq = torch::equal(pd.select(2, 0), pr.select(2, 0)), idx_eq = torch::equal(idx(pd), idx(pr));
          const double sum_err = ((pd.select(2, 1) - pr.select(2, 1)).abs() / pr.select(2, 1)).max().item<double>();
          const bool step_eq = torch::equal(wd.narrow(0, int64_t(R) * C * 4, 2), wr.narrow(0, int64_t(R) * C * 4, 2));
          const bool good = same_logits && max_eq && idx_eq && sum_err < 1e-5 && step_eq;
          ok = ok && good;
          rows.push_back({{"model", sh.model},
                          {"rows", R},
                          {"kind", "head kNorm + draw partials"},
                          {"temperature", T},
                          {"same_logits", same_logits},
                          {"max_equal", max_eq},
                          {"index_equal", idx_eq},
                          {"sum_rel_err", sum_err},
                          {"step_copied", step_eq},
                          {"ok", good}});
        }
      }
      for (auto [kind, name, K] :
           {std::tuple{kc::Fused::kOResid, "o kResid", sh.A}, std::tuple{kc::Fused::kDownResid, "down kResid", sh.I}}) {
        kc::GemmMap wm, xm;
        auto w = weight(kind, sh.H, K, &wm);
        auto x = torch::randn({R, K}, bf).contiguous();
        if (!kc::fused_gemm_input_map(p16(x), R, K, &xm)) throw std::runtime_error("--gemm-check: input map");
        auto run = [&] {
          auto y = h.clone();  // the residual stream, updated in place
          kc::fused_gemm(kind, xm, wm, nullptr, nullptr, p16(y), R, sh.H, K, eps, sms, stream);
          return y;
        };
        auto y = run(), y2 = run();
        auto ref = h64 + torch::matmul(x.to(torch::kFloat64), w.to(torch::kFloat64).t());
        record(name, y, y2, ref, h + torch::nn::functional::linear(x, w));
      }
    }
  std::printf("%s\n", nlohmann::json{{"ok", ok}, {"available", true}, {"rows", rows}}.dump().c_str());
  return ok ? 0 : 1;
#else
  (void)get;
  throw std::runtime_error("--gemm-check: built without the CUDA kernels");
#endif
}

// --share-check 1 --model DIR: the decoder with a GRPO group's rows reading their common prompt's
// keys and values from one row (decode_attention's share) against KERNELRL_SHARED_PREFIX=0 (each
// row its own copy): 6 prompts of 40-220 tokens, 4 samples each, in 10 rows, each sequence ended
// by the sink after its own count of tokens (17-128), so that rows go free while others of their
// group still read from them, and the 24 sequences are admitted as rows go free (two windows in
// flight once none waits). Every token and logprob must be the same bits.
int share_check(const std::function<std::string(const char*, const char*)>& get) {
  torch::Device dev(get("--device", "cuda:0"));
  kernelrl::CausalLM m(get("--model", ""), dev, kernelrl::parse_dtype(get("--dtype", "bf16")));
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts(6);
  for (size_t i = 0; i < prompts.size(); ++i) {
    prompts[i].resize(40 + 36 * i);
    for (auto& t : prompts[i]) t = int32_t(10 + rng() % uint32_t(m.config().vocab_size - 10));
  }
  kernelrl::SamplingParams sp;
  sp.temperature = 1.0;
  sp.max_tokens = 128;
  sp.n = 4;
  sp.seed = 11;
  const int64_t S = int64_t(prompts.size()) * sp.n;
  auto length = [](int64_t q) { return 17 + (q * 37) % 112; };
  nlohmann::json runs = nlohmann::json::object();
  std::map<std::string, std::vector<std::vector<std::pair<int32_t, float>>>> out;
  for (const char* mode : {"1", "0"}) {
    setenv("KERNELRL_SHARED_PREFIX", mode, 1);
    std::vector<std::vector<std::pair<int32_t, float>>> seqs(S);
    kernelrl::Decoder d(m);
    d.generate(prompts, sp, 10, [&](int64_t q, int32_t tok, float lp) {
      seqs[q].emplace_back(tok, lp);
      return int64_t(seqs[q].size()) >= length(q);
    });
    runs[mode] = {{"path", d.stats().path}, {"steps", d.stats().steps}, {"rows", d.stats().rows}};
    out[mode] = std::move(seqs);
  }
  unsetenv("KERNELRL_SHARED_PREFIX");
  bool lengths = true;
  int64_t tokens = 0, differ = 0;
  for (int64_t q = 0; q < S; ++q) {
    lengths = lengths && int64_t(out["1"][q].size()) == length(q) && out["0"][q].size() == out["1"][q].size();
    for (size_t i = 0; i < std::min(out["0"][q].size(), out["1"][q].size()); ++i, ++tokens)
      if (out["0"][q][i].first != out["1"][q][i].first ||
          std::memcmp(&out["0"][q][i].second, &out["1"][q][i].second, sizeof(float)) != 0)
        ++differ;
  }
  const bool fused = runs["1"]["path"].get<std::string>().rfind("fused", 0) == 0;
  const bool ok = lengths && differ == 0 && fused;
  std::printf("%s\n", nlohmann::json{{"ok", ok},
                                     {"sequences", S},
                                     {"tokens", tokens},
                                     {"tokens_differing", differ},
                                     {"lengths_as_ended", lengths},
                                     {"runs", runs}}
                          .dump()
                          .c_str());
  return ok ? 0 : 1;
}

// --colocated 1: the device memory that a sampler and a learner of one process hold for their
// models (each with a rank-16 adapter), loaded as they load them (load_shared_model: one copy of
// the base weights) against two separate loads. Prints the bytes allocated after each.
int colocated(const std::function<std::string(const char*, const char*)>& get) {
  torch::Device dev(get("--device", "cuda:0"));
  if (!dev.is_cuda()) throw std::runtime_error("--colocated: needs a CUDA device");
  const auto dtype = kernelrl::parse_dtype(get("--dtype", "bf16"));
  const std::string dir = get("--model", "");
  auto allocated = [&] {
    torch::cuda::synchronize();
    auto st = c10::cuda::CUDACachingAllocator::getDeviceStats(dev.index());
    return st.allocated_bytes[size_t(c10::CachingAllocator::StatType::AGGREGATE)].current;
  };
  auto warm = torch::zeros({1}, torch::TensorOptions().device(dev));  // the allocator's first use
  const int64_t before = allocated();
  kernelrl::LoraSettings ls;
  int64_t shared = 0, separate = 0;
  {
    auto sampler = kernelrl::load_shared_model(dir, dev, dtype, "sampler");
    auto learner = kernelrl::load_shared_model(dir, dev, dtype, "learner");
    sampler->add_lora(ls, 0);
    learner->add_lora(ls, 1);
    shared = allocated() - before;
  }
  {
    kernelrl::CausalLM sampler(dir, dev, dtype), learner(dir, dev, dtype);
    sampler.add_lora(ls, 0);
    learner.add_lora(ls, 1);
    separate = allocated() - before;
  }
  std::printf("%s\n",
              nlohmann::json{{"shared_bytes", shared}, {"separate_bytes", separate}, {"saved_bytes", separate - shared}}
                  .dump()
                  .c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  auto get = [&](const char* k, const char* d) { return a.count(k) ? a[k] : std::string(d); };
  try {
    if (a.count("--train")) return train_bench(get);
    if (a.count("--lora-op-check")) return lora_op_check(get);
    if (a.count("--attention-check")) return attention_check(get);
    if (a.count("--lora-decode-check")) return lora_decode_check(get);
    if (a.count("--sample-check")) return sample_check(get);
    if (a.count("--gemm-check")) return gemm_check(get);
    if (a.count("--colocated")) return colocated(get);
    if (a.count("--share-check")) return share_check(get);
    kernelrl::PolicyOptions o;
    o.model_dir = get("--model", "");
    o.device = get("--device", "cuda:0");
    o.dtype = get("--dtype", "bf16");
    o.lora_rank = std::stoi(get("--lora-rank", "0"));
    auto policy = kernelrl::Policy::load(o);
    int B = std::stoi(get("--batch", "16")), P = std::stoi(get("--prompt-len", "64"));
    int N = std::stoi(get("--new-tokens", "128")), R = std::stoi(get("--repeats", "3"));
    int n = std::stoi(get("--n", "1"));  // samples per prompt: B / n distinct prompts
    if (n < 1 || B % n != 0) throw std::runtime_error("--n must divide --batch");
    std::mt19937 rng(1);
    std::uniform_int_distribution<int32_t> tok(10, int32_t(policy->vocab_size()) - 1);
    std::vector<std::vector<int32_t>> prompts(B / n, std::vector<int32_t>(P));
    for (auto& p : prompts)
      for (auto& t : p) t = tok(rng);
    kernelrl::SamplingParams sp;
    sp.temperature = std::stod(get("--temperature", "1.0"));
    sp.top_p = std::stod(get("--top-p", "1.0"));
    sp.max_tokens = N;
    sp.n = n;
    sp.skip_special = true;
    const torch::Device dev(o.device);
    policy->generate_ids(prompts, sp);           // warm-up: CUDA context, cuBLAS handles, allocator
    const int64_t peak_total = peak_bytes(dev);  // weights, cache, graphs
    nlohmann::json runs = nlohmann::json::array();
    double best = 0, sum = 0, prefill = 0, step_ms = 0;
    size_t tokens = 0;
    for (int r = 0; r < R; ++r) {
      sp.seed = r + 1;
      auto t0 = std::chrono::steady_clock::now();
      auto out = policy->generate_ids(prompts, sp);  // ends with a device-to-host copy: synchronised
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      tokens = 0;
      for (auto& c : out) tokens += c.token_ids.size();
      double tps = tokens / s;
      best = std::max(best, tps);
      sum += tps;
      const auto& st = policy->last_generation();
      prefill += st.prefill_seconds / R;
      step_ms += st.steps ? st.decode_seconds / st.steps * 1e3 / R : 0.0;
      runs.push_back({{"seconds", s},
                      {"tokens", tokens},
                      {"tokens_per_s", tps},
                      {"prefill_seconds", st.prefill_seconds},
                      {"decode_seconds", st.decode_seconds},
                      {"capture_seconds", st.capture_seconds},
                      {"steps", st.steps}});
    }
    if (!get("--profile", "").empty()) profile(get("--profile", ""), [&] { policy->generate_ids(prompts, sp); });
    const auto& st = policy->last_generation();
    nlohmann::json j = {{"batch", B},
                        {"prompt_len", P},
                        {"new_tokens", N},
                        {"n", n},
                        {"lora_rank", o.lora_rank},
                        {"path", st.path},
                        {"graphs", st.graphs},
                        {"prefill_tokens", st.prefill_tokens},
                        {"runs", runs},
                        {"tokens_per_s_best", best},
                        {"tokens_per_s_mean", sum / R},
                        {"prefill_seconds", prefill},
                        {"decode_step_ms", step_ms},
                        {"peak_bytes", peak_total}};
    std::printf("%s\n", j.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "policy_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
