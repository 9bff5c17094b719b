#include "policy/model.hpp"

#include "core/files.hpp"
#include "core/log_line.hpp"

#include "policy/safetensors.hpp"
#ifdef KERNELRL_CUDA_KERNELS
#include "policy/cuda_kernels.hpp"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif
#include "messages/messages.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <regex>
#include <set>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::runtime_error(where + ": " + what);
}

nlohmann::json read_json(const std::string& file) {
  std::ifstream in(file);
  if (!in) fail(file, "cannot open");
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    fail(file, std::string("not valid JSON: ") + e.what());
  }
}

void add_eos(const nlohmann::json& v, std::vector<int32_t>& out) {
  auto add = [&](int32_t id) {
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  if (v.is_number_integer()) add(v.get<int32_t>());
  if (v.is_array())
    for (auto& x : v)
      if (x.is_number_integer()) add(x.get<int32_t>());
}

torch::ScalarType st_to_torch(StDtype d, const std::string& where) {
  switch (d) {
    case StDtype::F32:
      return torch::kFloat32;
    case StDtype::F16:
      return torch::kFloat16;
    case StDtype::BF16:
      return torch::kBFloat16;
    case StDtype::F64:
      return torch::kFloat64;
    default:
      fail(where, std::string("dtype ") + st_dtype_name(d) + " is not a floating-point weight");
  }
}

// A tensor from a mapped file, copied onto device/dtype.
torch::Tensor to_tensor(const StTensorView& v, const std::string& file, torch::Device dev, torch::ScalarType dt) {
  auto src = torch::from_blob(const_cast<uint8_t*>(v.data), v.shape,
                              torch::TensorOptions().dtype(st_to_torch(v.dtype, file + ": tensor " + v.name)));
  return src.to(dev, dt, /*non_blocking=*/false, /*copy=*/true);
}

}  // namespace

torch::ScalarType parse_dtype(const std::string& s) {
  if (s == "f32" || s == "float32" || s == "fp32") return torch::kFloat32;
  if (s == "f16" || s == "float16" || s == "fp16") return torch::kFloat16;
  if (s == "bf16" || s == "bfloat16") return torch::kBFloat16;
  throw std::runtime_error("dtype " + s + ": expected f32, f16 or bf16");
}

void save_tensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                  std::optional<torch::ScalarType> as, const std::map<std::string, std::string>& metadata) {
  std::vector<torch::Tensor> keep;  // the CPU copies the refs point into
  std::vector<StTensorRef> refs;
  for (auto& [name, t] : tensors) {
    auto c = t.detach().to(torch::kCPU, as.value_or(t.scalar_type())).contiguous();
    StDtype d;
    switch (c.scalar_type()) {
      case torch::kFloat64:
        d = StDtype::F64;
        break;
      case torch::kFloat32:
        d = StDtype::F32;
        break;
      case torch::kFloat16:
        d = StDtype::F16;
        break;
      case torch::kBFloat16:
        d = StDtype::BF16;
        break;
      case torch::kInt64:
        d = StDtype::I64;
        break;
      default:
        fail(path, "tensor " + name + ": dtype " + std::string(c10::toString(c.scalar_type())) + " cannot be saved");
    }
    refs.push_back({name, d, c.sizes().vec(), c.data_ptr(), size_t(c.numel()) * c.element_size()});
    keep.push_back(std::move(c));
  }
  write_safetensors(path, refs, metadata);
}

ModelConfig load_model_config(const std::string& dir) {
  std::string file = (fs::path(dir) / "config.json").string();
  auto j = read_json(file);
  ModelConfig c;
  try {
    c.model_type = j.value("model_type", "");
    if (c.model_type != "qwen2" && c.model_type != "qwen3" && c.model_type != "llama")
      fail(file, "model_type: \"" + c.model_type + "\" is not supported (qwen2, qwen3 or llama)");
    auto need = [&](const char* k) -> int64_t {
      if (!j.contains(k) || !j[k].is_number_integer()) fail(file, std::string(k) + ": expected an integer");
      int64_t v = j[k];
      if (v <= 0) fail(file, std::string(k) + ": must be positive");
      return v;
    };
    c.vocab_size = need("vocab_size");
    c.hidden_size = need("hidden_size");
    c.intermediate_size = need("intermediate_size");
    c.num_layers = need("num_hidden_layers");
    c.num_heads = need("num_attention_heads");
    c.num_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                         ? need("num_key_value_heads")
                         : c.num_heads;
    if (c.num_heads % c.num_kv_heads != 0) fail(file, "num_attention_heads is not a multiple of num_key_value_heads");
    c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? need("head_dim") : c.hidden_size / c.num_heads;
    c.max_position_embeddings = j.value("max_position_embeddings", int64_t(32768));
    c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
    c.tie_word_embeddings = j.value("tie_word_embeddings", false);
    std::string act = j.value("hidden_act", "silu");
    if (act != "silu") fail(file, "hidden_act: \"" + act + "\" is not supported (silu)");
    if (c.model_type == "qwen2") {
      c.qkv_bias = true;
      if (j.value("use_sliding_window", false))
        fail(file, "use_sliding_window: sliding-window attention is not supported");
    } else if (c.model_type == "qwen3") {  // no q/k/v bias unless attention_bias; q and k normed per head
      c.qkv_bias = c.o_bias = j.value("attention_bias", false);
      c.qk_norm = true;
      if (j.value("use_sliding_window", false))
        fail(file, "use_sliding_window: sliding-window attention is not supported");
    } else {
      c.qkv_bias = c.o_bias = j.value("attention_bias", false);
      c.mlp_bias = j.value("mlp_bias", false);
    }
    // transformers 5 writes rope_parameters; 4.x wrote rope_theta and rope_scaling.
    nlohmann::json rope = j.contains("rope_parameters") && j["rope_parameters"].is_object() ? j["rope_parameters"]
                          : j.contains("rope_scaling") && j["rope_scaling"].is_object()     ? j["rope_scaling"]
                                                                                            : nlohmann::json::object();
    c.rope_theta = rope.contains("rope_theta") ? rope["rope_theta"].get<double>() : j.value("rope_theta", 10000.0);
    c.rope_type = rope.value("rope_type", rope.value("type", std::string("default")));
    if (c.rope_type != "default" && c.rope_type != "linear" && c.rope_type != "llama3")
      fail(file, "rope type \"" + c.rope_type + "\" is not supported (default, linear, llama3)");
    c.rope_factor = rope.value("factor", 1.0);
    c.rope_low_freq_factor = rope.value("low_freq_factor", 1.0);
    c.rope_high_freq_factor = rope.value("high_freq_factor", 4.0);
    c.rope_original_max_positions = rope.value("original_max_position_embeddings", int64_t(8192));
    add_eos(j.value("eos_token_id", nlohmann::json()), c.eos_token_ids);
    c.dtype = j.value("dtype", j.value("torch_dtype", std::string("float32")));
  } catch (const nlohmann::json::exception& e) {
    fail(file, std::string("unexpected value: ") + e.what());
  }
  std::string gen = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen)) add_eos(read_json(gen).value("eos_token_id", nlohmann::json()), c.eos_token_ids);
  return c;
}

namespace {

// An on/off environment switch ("0": off), read once.
bool env_switch(const char* var, bool by_default) {
  const char* f = std::getenv(var);
  return f == nullptr ? by_default : std::string(f) != "0";
}

bool fast_bf16(const torch::Tensor& x) {
#ifdef KERNELRL_CUDA_KERNELS
  return x.is_cuda() && x.scalar_type() == torch::kBFloat16 && fused_kernels_enabled();
#else
  (void)x;
  return false;
#endif
}

// Each fused training path on its own: KERNELRL_FUSED_LOGPROB=0 turns the log-probability kernels
// off, KERNELRL_FUSED_LORA=0 the tensor-core LoRA path. The LoRA path's gradients agree with float64
// to about 1.5e-5 (policy_bench --lora-op-check); through a whole random bf16 model its gradients
// differ from PEFT's as much as PEFT's own differ when A moves by one part in a million (bf16
// rounding flips downstream), which bench/learner_step.py reports beside them.
bool fast_logprob(const torch::Tensor& h, const torch::Tensor& w) {
  static const bool on = env_switch("KERNELRL_FUSED_LOGPROB", true);
  return on && fast_bf16(h) && w.scalar_type() == torch::kBFloat16;
}

bool fast_lora_input(const torch::Tensor& x) {
  static const bool on = env_switch("KERNELRL_FUSED_LORA", true);
  return on && fast_bf16(x);
}

#ifdef KERNELRL_CUDA_KERNELS
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

cuda::bf16_t* bptr(const torch::Tensor& t) { return reinterpret_cast<cuda::bf16_t*>(t.data_ptr()); }
// The current stream of t's device. Our kernels launch on the calling thread's current device, so
// every path that launches one holds a device guard for its tensors' device first (OnDevice): a
// model on cuda:1 driven from a thread whose current device is cuda:0 (a learner's main thread, a
// second data-parallel rank) must not launch on cuda:0 against cuda:1's memory.
cuda::Stream stream_of(const torch::Tensor& t) { return at::cuda::getCurrentCUDAStream(t.device().index()).stream(); }
using OnDevice = c10::cuda::CUDAGuard;

// x (float32) as hi + lo in bf16, x - hi - lo within about 2^-17 |x|: products of bf16 activations
// with float32 adapter weights on the tensor cores, accumulated in float32, agree with PEFT's
// float32 products to the order of float32 rounding.
std::pair<torch::Tensor, torch::Tensor> split_bf16(const torch::Tensor& x) {
  auto hi = x.to(torch::kBFloat16);
  return {hi, (x - hi.to(torch::kFloat32)).to(torch::kBFloat16)};
}

// A LoRA adapter on a bf16 layer output y: out = bf16(f32(y) + s (x A^T) B^T), PEFT's arithmetic,
// without materialising x in float32 or the adapter's float32 output: x A^T is one tensor-core
// product with A split hi/lo (into float32), the expansion and the sum one kernel; the backward
// pass is four such products, each reading the bf16 activations or gradients once. (Large
// operands are passed untransposed; the small ones are made contiguous.)
struct FastLora : torch::autograd::Function<FastLora> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, const torch::Tensor& y,
                               const torch::Tensor& a, const torch::Tensor& bb, const Linear* l) {
    OnDevice on(x.device());
    const int64_t r = a.size(0), N = x.size(0), out_cols = y.size(1);
    const auto& f = l->fast_form();
    auto t2 = at::mm(x, f.a_t, torch::kFloat32);  // [N, 2r]
    auto t = t2.narrow(1, 0, r) + t2.narrow(1, r, r);
    auto yc = y.contiguous();
    auto out = torch::empty_like(yc);
    cuda::lora_expand_add(bptr(yc), t.data_ptr<float>(), f.sb_t.data_ptr<float>(), N, int(out_cols), int(r), bptr(out),
                          stream_of(out));
    ctx->save_for_backward({x, t});
    ctx->saved_data["l"] = int64_t(reinterpret_cast<intptr_t>(l));
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto s = ctx->get_saved_variables();
    const auto &x = s[0], &t = s[1];
    OnDevice on(x.device());
    const auto* l = reinterpret_cast<const Linear*>(intptr_t(ctx->saved_data["l"].toInt()));
    const auto& f = l->fast_form();
    const int64_t r = t.size(1);
    auto g = grad[0].contiguous();                        // [N, out] bf16
    auto gt2 = at::mm(g, f.b_2, torch::kFloat32);         // [N, 2r]
    auto gt = gt2.narrow(1, 0, r) + gt2.narrow(1, r, r);  // d/dt
    auto [th, tl] = split_bf16(t);
    auto gb2 = at::mm(torch::cat({th, tl}, 1).t().contiguous(), g, torch::kFloat32);  // [2r, out]
    auto gbb = ((gb2.narrow(0, 0, r) + gb2.narrow(0, r, r)) * l->scale).t();          // d/dB [out, r]
    auto [gh, gl] = split_bf16(gt);
    auto ga2 = at::mm(torch::cat({gh, gl}, 1).t().contiguous(), x, torch::kFloat32);  // [2r, in]
    auto ga = ga2.narrow(0, 0, r) + ga2.narrow(0, r, r);                              // d/dA
    torch::Tensor gx;
    if (ctx->needs_input_grad(0))                       // (not for the first layer's input)
      gx = at::mm(torch::cat({gh, gh, gl}, 1), f.a_3);  // d/dx, bf16 [N, in]
    return {gx, grad[0], ga, gbb, torch::Tensor()};
  }
};
#endif

// Whether a LoRA layer takes the fused path for input x.
bool fast_lora(const Linear& l, const torch::Tensor& x, bool training) {
#ifdef KERNELRL_CUDA_KERNELS
  return fast_lora_input(x) && l.w.scalar_type() == torch::kBFloat16 && (!training || l.dropout == 0) &&
         cuda::lora_expand_supported(int(l.a.size(0)));
#else
  (void)l, (void)x, (void)training;
  return false;
#endif
}

}  // namespace

const Linear::FastForm& Linear::fast_form() const {
  const int64_t key[4] = {int64_t(a._version()), int64_t(bb._version()), int64_t(intptr_t(a.data_ptr())),
                          int64_t(intptr_t(bb.data_ptr()))};
  if (std::equal(key, key + 4, fast.key)) return fast;
#ifdef KERNELRL_CUDA_KERNELS
  torch::NoGradGuard ng;
  auto [ah, al] = split_bf16(a.detach());
  auto [bh, bl] = split_bf16(bb.detach() * scale);
  fast.a_t = torch::cat({ah, al}).t().contiguous();
  fast.a_3 = torch::cat({ah, al, ah});
  fast.b_2 = torch::cat({bh, bl}, 1);
  fast.sb_t = (bb.detach() * scale).t().contiguous();
#endif
  std::copy(key, key + 4, fast.key);
  return fast;
}

torch::Tensor Linear::forward(const torch::Tensor& x, bool training, bool use_lora) const {
  return forward(x, torch::Tensor(), training, use_lora);
}

torch::Tensor Linear::forward(const torch::Tensor& x, const torch::Tensor& x32, bool training, bool use_lora) const {
  auto y = torch::nn::functional::linear(x, w, b.defined() ? b : torch::Tensor());
  if (!a.defined() || !use_lora) return y;
#ifdef KERNELRL_CUDA_KERNELS
  if (fast_lora(*this, x, training)) {
    const int64_t in = x.size(-1), out = y.size(-1);
    return FastLora::apply(x.reshape({-1, in}), y.reshape({-1, out}), a, bb, this).view(y.sizes());
  }
#endif
  auto xa = x32.defined() ? x32 : x.to(torch::kFloat32);
  if (training && dropout > 0) xa = torch::dropout(xa, dropout, true);
  // As PEFT: the float32 adapter output s * B(A x) is added to the output in float32, then cast
  // back; one addmm does the scale and the sum (y + s * (A x) B^T).
  auto t = torch::matmul(xa, a.t());
  auto y32 = y.to(torch::kFloat32);
  auto shape = y32.sizes().vec();
  auto out = torch::addmm(y32.reshape({-1, shape.back()}), t.reshape({-1, t.size(-1)}), bb.t(), 1.0, scale);
  return out.view(shape).to(y.scalar_type());
}

void CausalLM::Layer::slice_groups() {
  const int64_t QO = q.w.size(0), KV = k.w.size(0), I = gate.w.size(0);
  q.w = qkv_w.narrow(0, 0, QO);
  k.w = qkv_w.narrow(0, QO, KV);
  v.w = qkv_w.narrow(0, QO + KV, KV);
  gate.w = gu_w.narrow(0, 0, I);
  up.w = gu_w.narrow(0, I, I);
  if (qkv_b.defined()) {
    q.b = qkv_b.narrow(0, 0, QO);
    k.b = qkv_b.narrow(0, QO, KV);
    v.b = qkv_b.narrow(0, QO + KV, KV);
  }
  if (gu_b.defined()) {
    gate.b = gu_b.narrow(0, 0, I);
    up.b = gu_b.narrow(0, I, I);
  }
}

bool fused_kernels_enabled() {
  static const bool on = env_switch("KERNELRL_FUSED", true);
  return on;
}

CausalLM::CausalLM(const std::string& dir, torch::Device device, torch::ScalarType dtype)
    : cfg_(load_model_config(dir)), device_(device), dtype_(dtype) {
  torch::NoGradGuard ng;
  // Which file holds which tensor.
  std::map<std::string, std::string> where;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files;
  fs::path single = fs::path(dir) / "model.safetensors", index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    auto j = read_json(index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail(index.string(), "weight_map: expected an object");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it)
      where[it.key()] = (fs::path(dir) / it.value().get<std::string>()).string();
  } else if (!fs::exists(single)) {
    fail(dir, "no model.safetensors and no model.safetensors.index.json");
  }
  auto get = [&](const std::string& name, std::vector<int64_t> shape) -> torch::Tensor {
    std::string file = where.count(name) ? where[name] : single.string();
    if (!files.count(file)) files[file] = SafetensorsFile::open(file);
    const StTensorView* v = files[file]->find(name);
    if (!v) fail(file, "tensor " + name + " is missing");
    if (v->shape != shape) {
      std::string got, want;
      for (auto s : v->shape) got += (got.empty() ? "" : ",") + std::to_string(s);
      for (auto s : shape) want += (want.empty() ? "" : ",") + std::to_string(s);
      fail(file, "tensor " + name + " has shape [" + got + "], config.json implies [" + want + "]");
    }
    return to_tensor(*v, file, device_, dtype_);
  };
  const int64_t H = cfg_.hidden_size, I = cfg_.intermediate_size, D = cfg_.head_dim;
  const int64_t QO = cfg_.num_heads * D, KV = cfg_.num_kv_heads * D;
  embed_ = get("model.embed_tokens.weight", {cfg_.vocab_size, H});
  norm_ = get("model.norm.weight", {H});
  head_ = cfg_.tie_word_embeddings ? embed_ : get("lm_head.weight", {cfg_.vocab_size, H});
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    Layer L;
    L.in_norm = get(p + "input_layernorm.weight", {H});
    L.post_norm = get(p + "post_attention_layernorm.weight", {H});
    if (cfg_.qk_norm) {
      L.q_norm = get(p + "self_attn.q_norm.weight", {D});
      L.k_norm = get(p + "self_attn.k_norm.weight", {D});
    }
    auto lin = [&](const std::string& n, int64_t out, int64_t in, bool bias) {
      Linear l;
      l.w = get(p + n + ".weight", {out, in});
      if (bias) l.b = get(p + n + ".bias", {out});
      return l;
    };
    L.q = lin("self_attn.q_proj", QO, H, cfg_.qkv_bias);
    L.k = lin("self_attn.k_proj", KV, H, cfg_.qkv_bias);
    L.v = lin("self_attn.v_proj", KV, H, cfg_.qkv_bias);
    L.o = lin("self_attn.o_proj", H, QO, cfg_.o_bias);
    L.gate = lin("mlp.gate_proj", I, H, cfg_.mlp_bias);
    L.up = lin("mlp.up_proj", I, H, cfg_.mlp_bias);
    L.down = lin("mlp.down_proj", H, I, cfg_.mlp_bias);
    // One tensor per group, the projections' weights its row slices (no second copy).
    L.qkv_w = torch::cat({L.q.w, L.k.w, L.v.w});
    if (cfg_.qkv_bias) L.qkv_b = torch::cat({L.q.b, L.k.b, L.v.b});
    L.gu_w = torch::cat({L.gate.w, L.up.w});
    if (cfg_.mlp_bias) L.gu_b = torch::cat({L.gate.b, L.up.b});
    L.slice_groups();
    layers_.push_back(std::move(L));
  }
  // Rotary inverse frequencies (float32), with Llama 3's or linear scaling.
  auto inv = 1.0 / torch::pow(cfg_.rope_theta, torch::arange(0, D, 2, torch::kInt64).to(torch::kFloat32) / double(D));
  inv = inv.to(torch::kFloat32);
  if (cfg_.rope_type == "linear") inv = inv / cfg_.rope_factor;
  if (cfg_.rope_type == "llama3") {
    double old = double(cfg_.rope_original_max_positions);
    double low_wl = old / cfg_.rope_low_freq_factor, high_wl = old / cfg_.rope_high_freq_factor;
    auto wl = 2 * M_PI / inv;
    auto scaled = torch::where(wl > low_wl, inv / cfg_.rope_factor, inv);
    auto smooth = (old / wl - cfg_.rope_low_freq_factor) / (cfg_.rope_high_freq_factor - cfg_.rope_low_freq_factor);
    auto smoothed = (1 - smooth) * scaled / cfg_.rope_factor + smooth * scaled;
    auto medium = (wl >= high_wl).logical_and(wl <= low_wl);
    inv = torch::where(medium, smoothed, scaled);
  }
  inv_freq_ = inv.to(device_);
}

torch::Tensor CausalLM::rms(const torch::Tensor& x, const torch::Tensor& w) const {
  auto xf = x.to(torch::kFloat32);
  auto var = xf.pow(2).mean(-1, true);
  xf = xf * torch::rsqrt(var + cfg_.rms_norm_eps);
  return w * xf.to(x.scalar_type());
}

namespace {
torch::Tensor rotate_half(const torch::Tensor& x) {
  auto half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}
}  // namespace

torch::Tensor CausalLM::lora_input(const torch::Tensor& x) const {
  // (not needed where the adapters take the fused path, which reads x in bf16)
  return has_lora_ && lora_enabled_ && !fast_lora_input(x) ? x.to(torch::kFloat32) : torch::Tensor();
}

torch::Tensor CausalLM::layer_forward(size_t l, const torch::Tensor& h, const torch::Tensor& cos,
                                      const torch::Tensor& sin, bool training, const CacheView* cv) const {
  const Layer& L = layers_[l];
  const int64_t B = h.size(0), T = h.size(1), D = cfg_.head_dim;
  const int64_t nh = cfg_.num_heads, nkv = cfg_.num_kv_heads, rep = nh / nkv;
  auto x = rms(h, L.in_norm);
  auto x32 = lora_input(x);
  auto q = L.q.forward(x, x32, training, lora_enabled_).view({B, T, nh, D});
  auto k = L.k.forward(x, x32, training, lora_enabled_).view({B, T, nkv, D});
  if (cfg_.qk_norm) {  // Qwen3: each head of q and k normed before the rotary embedding
    q = rms(q, L.q_norm);
    k = rms(k, L.k_norm);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  auto v = L.v.forward(x, x32, training, lora_enabled_).view({B, T, nkv, D}).transpose(1, 2);
  q = q * cos + rotate_half(q) * sin;
  k = k * cos + rotate_half(k) * sin;
  KVCache* cache = cv ? cv->cache : nullptr;
  if (cache && cv->slot.defined()) {  // row r's key and value at its own slot[r]
    cache->k[l].index_put_({cv->rows, torch::indexing::Slice(), cv->slot}, k.squeeze(2));
    cache->v[l].index_put_({cv->rows, torch::indexing::Slice(), cv->slot}, v.squeeze(2));
    k = cache->k[l].narrow(2, 0, cv->klen);
    v = cache->v[l].narrow(2, 0, cv->klen);
  } else if (cache) {
    cache->k[l].narrow(2, cv->cache_pos, T).copy_(k);
    cache->v[l].narrow(2, cv->cache_pos, T).copy_(v);
    k = cache->k[l].narrow(2, 0, cv->cache_pos + T);
    v = cache->v[l].narrow(2, 0, cv->cache_pos + T);
  }
  torch::Tensor att;
  if (!cv || !cv->mask.defined())  // plain causal (training, scoring, a prefill): SDPA's own grouped-query support
    att = at::scaled_dot_product_attention(q, k, v, {}, 0.0, /*is_causal=*/T > 1, std::nullopt, rep > 1);
  else if (rep == 1)
    att = at::scaled_dot_product_attention(q, k, v, cv->mask, 0.0, false);
  else
    att = at::scaled_dot_product_attention(q.reshape({B, nkv, rep * T, D}), k, v, cv->gmask, 0.0, false)
              .reshape({B, nh, T, D});  // (its strides vary with the kernel SDPA picks)
  att = att.transpose(1, 2).reshape({B, T, nh * D});
  auto h2 = h + L.o.forward(att, training, lora_enabled_);
  x = rms(h2, L.post_norm);
  x32 = lora_input(x);
  return h2 + L.down.forward(torch::silu(L.gate.forward(x, x32, training, lora_enabled_)) *
                                 L.up.forward(x, x32, training, lora_enabled_),
                             training, lora_enabled_);
}

std::vector<torch::Tensor> CausalLM::layer_lora(size_t l) const {
  std::vector<torch::Tensor> out;
  const Layer& L = layers_[l];
  for (const Linear* x : {&L.q, &L.k, &L.v, &L.o, &L.gate, &L.up, &L.down})
    if (x->a.defined()) {
      out.push_back(x->a);
      out.push_back(x->bb);
    }
  return out;
}

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Activation checkpointing of one decoder layer: the forward keeps only the layer's input; the
// backward runs the layer again with gradients on (the same random numbers for adapter dropout)
// and differentiates it in the input and the layer's adapter weights.
struct LayerCheckpoint : torch::autograd::Function<LayerCheckpoint> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& h, torch::TensorList lora, const CausalLM* m,
                               int64_t layer, const torch::Tensor& cos, const torch::Tensor& sin) {
    ctx->saved_data["m"] = int64_t(reinterpret_cast<intptr_t>(m));
    ctx->saved_data["layer"] = layer;
    ctx->saved_data["n_lora"] = int64_t(lora.size());
    if (m->lora_dropout() > 0) {
      auto gen = at::globalContext().defaultGenerator(h.device());
      ctx->saved_data["rng"] = gen.get_state();
    }
    ctx->save_for_backward({h, cos, sin});
    return m->layer_forward(size_t(layer), h, cos, sin, true);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto saved = ctx->get_saved_variables();
    const auto* m = reinterpret_cast<const CausalLM*>(intptr_t(ctx->saved_data["m"].toInt()));
    const size_t layer = size_t(ctx->saved_data["layer"].toInt());
    const int64_t n_lora = ctx->saved_data["n_lora"].toInt();
    auto h = saved[0].detach().requires_grad_(true);
    std::optional<at::Tensor> rng_now;
    at::Generator gen;
    if (ctx->saved_data.count("rng")) {
      gen = at::globalContext().defaultGenerator(h.device());
      rng_now = gen.get_state();
      gen.set_state(ctx->saved_data["rng"].toTensor());
    }
    torch::Tensor y;
    {
      torch::AutoGradMode on(true);
      y = m->layer_forward(layer, h, saved[1], saved[2], true);
    }
    if (rng_now) gen.set_state(*rng_now);
    std::vector<torch::Tensor> inputs{h};
    for (auto& t : m->layer_lora(layer)) inputs.push_back(t);
    if (int64_t(inputs.size()) != n_lora + 1) throw std::logic_error("checkpoint: the layer's adapter changed");
    auto g = torch::autograd::grad({y}, inputs, {grad[0]}, /*retain_graph=*/false, /*create_graph=*/false,
                                   /*allow_unused=*/true);
    variable_list out(g.begin(), g.end());
    for (int i = 0; i < 4; ++i) out.emplace_back();  // m, layer, cos, sin
    return out;
  }
};

// log softmax(h W^T / T)[target] over the vocabulary, a chunk of positions at a time: the logits
// of one chunk exist at once (float32 [chunk, V]), in the forward and again in the backward,
// instead of [N, V] for the whole batch. Outputs: the logprob [N] and the entropy [N] of each
// position's distribution (when asked for; both float32). W (the lm_head) is frozen.
struct ChunkedLogprobs : torch::autograd::Function<ChunkedLogprobs> {
  static variable_list forward(AutogradContext* ctx, const torch::Tensor& h, const torch::Tensor& w,
                               const torch::Tensor& targets, double temperature, int64_t chunk, bool want_entropy) {
    const int64_t N = h.size(0);
    auto f32 = h.options().dtype(torch::kFloat32);
    auto lp = torch::empty({N}, f32), lse = torch::empty({N}, f32);
    auto ent = want_entropy ? torch::empty({N}, f32) : torch::zeros({N}, f32);
    ctx->saved_data["t"] = temperature;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["fused"] = fast_logprob(h, w);
#ifdef KERNELRL_CUDA_KERNELS
    if (ctx->saved_data["fused"].toBool()) {  // one pass over each chunk's bf16 logits
      OnDevice on(h.device());
      const int64_t V = w.size(0);
      auto tg = targets.contiguous();
      for (int64_t c0 = 0; c0 < N; c0 += chunk) {
        const int64_t n = std::min(chunk, N - c0);
        auto z = torch::mm(h.narrow(0, c0, n), w.t());
        cuda::logprob_forward(bptr(z), n, int(V), tg.data_ptr<int64_t>() + c0, float(temperature),
                              lse.data_ptr<float>() + c0, lp.data_ptr<float>() + c0,
                              want_entropy ? ent.data_ptr<float>() + c0 : nullptr, stream_of(z));
      }
      ctx->save_for_backward({h, w, tg, lse, ent});
      return {lp, ent};
    }
#endif
    for (int64_t c0 = 0; c0 < N; c0 += chunk) {
      const int64_t n = std::min(chunk, N - c0);
      auto z = torch::mm(h.narrow(0, c0, n), w.t()).to(torch::kFloat32);
      if (temperature != 1.0) z.div_(temperature);
      auto l = z.logsumexp(-1);
      lse.narrow(0, c0, n).copy_(l);
      lp.narrow(0, c0, n).copy_(z.gather(-1, targets.narrow(0, c0, n).unsqueeze(-1)).squeeze(-1) - l);
      if (want_entropy)  // H = lse - sum p z
        ent.narrow(0, c0, n).copy_(l - ((z - l.unsqueeze(-1)).exp_() * z).sum(-1));
    }
    ctx->save_for_backward({h, w, targets, lse, ent});
    return {lp, ent};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    auto s = ctx->get_saved_variables();
    const auto &h = s[0], &w = s[1], &targets = s[2], &lse = s[3], &ent = s[4];
    const double temperature = ctx->saved_data["t"].toDouble();
    const int64_t chunk = ctx->saved_data["chunk"].toInt(), N = h.size(0);
    const auto &g_lp = grad[0], &g_ent = grad[1];
    auto gh = torch::empty_like(h);
#ifdef KERNELRL_CUDA_KERNELS
    if (ctx->saved_data["fused"].toBool()) {
      OnDevice on(h.device());
      const int64_t V = w.size(0);
      auto glp = g_lp.defined() ? g_lp.contiguous() : torch::Tensor();
      auto gent = g_ent.defined() ? g_ent.contiguous() : torch::Tensor();
      for (int64_t c0 = 0; c0 < N; c0 += chunk) {
        const int64_t n = std::min(chunk, N - c0);
        auto z = torch::mm(h.narrow(0, c0, n), w.t());
        auto gz = torch::empty_like(z);
        cuda::logprob_backward(bptr(z), n, int(V), targets.data_ptr<int64_t>() + c0, float(temperature),
                               lse.data_ptr<float>() + c0, ent.data_ptr<float>() + c0,
                               glp.defined() ? glp.data_ptr<float>() + c0 : nullptr,
                               gent.defined() ? gent.data_ptr<float>() + c0 : nullptr, bptr(gz), stream_of(gz));
        auto dst = gh.narrow(0, c0, n);
        at::mm_out(dst, gz, w);
      }
      return {gh, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
    }
#endif
    for (int64_t c0 = 0; c0 < N; c0 += chunk) {
      const int64_t n = std::min(chunk, N - c0);
      auto z = torch::mm(h.narrow(0, c0, n), w.t()).to(torch::kFloat32);
      if (temperature != 1.0) z.div_(temperature);
      auto logp = z.sub_(lse.narrow(0, c0, n).unsqueeze(-1));  // log p (in place of z)
      auto p = logp.exp();
      torch::Tensor gz;
      if (g_lp.defined()) {  // d logp[t] / dz = onehot(t) - p
        auto g = g_lp.narrow(0, c0, n).unsqueeze(-1);
        gz = (p * g).neg_();
        gz.scatter_add_(-1, targets.narrow(0, c0, n).unsqueeze(-1), g);
      }
      if (g_ent.defined()) {  // dH / dz = -p (log p + H)
        auto ge = (logp.add_(ent.narrow(0, c0, n).unsqueeze(-1))).mul_(p).mul_(-g_ent.narrow(0, c0, n).unsqueeze(-1));
        gz = gz.defined() ? gz.add_(ge) : ge;
      }
      if (!gz.defined()) {
        gh.narrow(0, c0, n).zero_();
        continue;
      }
      if (temperature != 1.0) gz.div_(temperature);
      gh.narrow(0, c0, n).copy_(torch::mm(gz.to(h.scalar_type()), w));
    }
    return {gh, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor CausalLM::checkpointed_layer(size_t l, const torch::Tensor& h, const torch::Tensor& cos,
                                           const torch::Tensor& sin) const {
  auto lora = layer_lora(l);
  return LayerCheckpoint::apply(h, torch::TensorList(lora), this, int64_t(l), cos, sin);
}

torch::Tensor CausalLM::hidden(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& mask,
                               KVCache* cache, int64_t cache_pos, bool training) const {
  return run(ids, positions, mask, cache, cache_pos, torch::Tensor(), training);
}

torch::Tensor CausalLM::decode_static(const torch::Tensor& ids, const torch::Tensor& positions,
                                      const torch::Tensor& mask, KVCache& cache, const torch::Tensor& slot,
                                      int64_t klen) const {
  return run(ids, positions, mask, &cache, klen, slot, false);
}

torch::Tensor CausalLM::run(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& mask,
                            KVCache* cache, int64_t cache_pos, const torch::Tensor& slot, bool training) const {
  const int64_t B = ids.size(0), T = ids.size(1);
  const int64_t rep = cfg_.num_heads / cfg_.num_kv_heads;
  if (slot.defined() && T != 1) throw std::invalid_argument("CausalLM::decode_static: one token per row");
  if (cache && cache_pos > 0 && !slot.defined() && !mask.defined())
    throw std::invalid_argument("CausalLM::forward: a mask is needed to attend over cached keys");
  CacheView cv;
  cv.cache = cache;
  cv.cache_pos = cache_pos;
  cv.slot = slot;
  cv.klen = slot.defined() ? cache_pos : 0;  // the static step: attention over slots [0, klen)
  cv.mask = cv.gmask = mask;
  // Grouped-query attention under a mask without repeating k and v: the rep query heads that
  // share a kv head become rep x T query rows of that head (head h = g * rep + r, transformers'
  // repeat_kv order), so the mask's rows are repeated instead (not at all for one new token).
  if (mask.defined() && rep > 1 && T > 1)
    cv.gmask = mask.unsqueeze(2)
                   .expand({mask.size(0), 1, rep, T, mask.size(-1)})
                   .reshape({mask.size(0), 1, rep * T, mask.size(-1)});
  if (slot.defined()) cv.rows = torch::arange(B, torch::TensorOptions().dtype(torch::kInt64).device(ids.device()));
  auto h = torch::embedding(embed_, ids);
  auto freqs = positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq_;  // [B, T, D/2]
  auto emb = torch::cat({freqs, freqs}, -1);
  auto cos = emb.cos().to(dtype_).unsqueeze(1), sin = emb.sin().to(dtype_).unsqueeze(1);
  const bool checkpoint = training && checkpointing_ && !cache && !mask.defined() && torch::GradMode::is_enabled();
  for (size_t l = 0; l < layers_.size(); ++l)
    h = checkpoint ? checkpointed_layer(l, h, cos, sin) : layer_forward(l, h, cos, sin, training, &cv);
  return rms(h, norm_);
}

torch::Tensor CausalLM::lm_head(const torch::Tensor& h) const { return torch::matmul(h, head_.t()); }

torch::Tensor CausalLM::forward(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& mask,
                                KVCache* cache, int64_t cache_pos, bool training) const {
  return lm_head(hidden(ids, positions, mask, cache, cache_pos, training));
}

torch::Tensor CausalLM::sequence_logprobs(const torch::Tensor& ids_in, bool training, double temperature,
                                          torch::Tensor* entropy, bool entropy_grad) const {
  auto ids = ids_in.to(device_, torch::kInt64);
  const int64_t B = ids.size(0), L = ids.size(1);
  if (L < 2) throw std::invalid_argument("sequence_logprobs: sequences need at least 2 tokens");
  auto pos = torch::arange(L, torch::TensorOptions().dtype(torch::kInt64).device(device_)).unsqueeze(0).expand({B, L});
  auto h = hidden(ids, pos, torch::Tensor(), nullptr, 0, training);
  auto flat = h.narrow(1, 0, L - 1).reshape({B * (L - 1), cfg_.hidden_size});
  auto targets = ids.narrow(1, 1, L - 1).reshape({B * (L - 1)});
  // Positions per chunk: about 512 MB of float32 logits (KERNELRL_LOGPROB_CHUNK: another number,
  // for tests and tuning).
  int64_t chunk = std::max<int64_t>(64, (int64_t(1) << (fast_bf16(flat) ? 28 : 27)) / cfg_.vocab_size);
  if (const char* c = std::getenv("KERNELRL_LOGPROB_CHUNK")) chunk = std::max<int64_t>(1, std::atoll(c));
  const double t = temperature > 0 ? temperature : 1.0;
  auto out = ChunkedLogprobs::apply(flat, head_, targets, t, chunk, entropy != nullptr);
  if (entropy) *entropy = (entropy_grad ? out[1] : out[1].detach()).view({B, L - 1});
  return out[0].view({B, L - 1});
}

KVCache CausalLM::new_cache(int64_t batch, int64_t capacity) const {
  KVCache c;
  auto opt = torch::TensorOptions().dtype(dtype_).device(device_);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    c.k.push_back(torch::zeros({batch, cfg_.num_kv_heads, capacity, cfg_.head_dim}, opt));
    c.v.push_back(torch::zeros({batch, cfg_.num_kv_heads, capacity, cfg_.head_dim}, opt));
  }
  return c;
}

// ---------------------------------------------------------------- LoRA

namespace {
const std::vector<std::string> lora_modules = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                               "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                               "mlp.down_proj"};
std::string short_name(const std::string& m) { return m.substr(m.find('.') + 1); }
std::string peft_key(int64_t layer, const std::string& module, const char* ab) {
  return "base_model.model.model.layers." + std::to_string(layer) + "." + module + ".lora_" + ab + ".weight";
}
}  // namespace

Linear* CausalLM::find_linear(int64_t layer, const std::string& name) {
  Layer& L = layers_[layer];
  if (name == "self_attn.q_proj") return &L.q;
  if (name == "self_attn.k_proj") return &L.k;
  if (name == "self_attn.v_proj") return &L.v;
  if (name == "self_attn.o_proj") return &L.o;
  if (name == "mlp.gate_proj") return &L.gate;
  if (name == "mlp.up_proj") return &L.up;
  if (name == "mlp.down_proj") return &L.down;
  return nullptr;
}

void CausalLM::add_lora(const LoraSettings& s, uint64_t seed) {
  if (s.r <= 0) throw std::invalid_argument("LoRA rank must be positive");
  for (auto& t : s.targets)
    if (std::none_of(lora_modules.begin(), lora_modules.end(), [&](auto& m) { return short_name(m) == t; }))
      throw std::invalid_argument(
          "LoRA target " + t +
          " is not a linear layer of this model (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)");
  torch::NoGradGuard ng;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  lora_ = s;
  for (int64_t i = 0; i < cfg_.num_layers; ++i)
    for (auto& m : lora_modules) {
      if (std::find(s.targets.begin(), s.targets.end(), short_name(m)) == s.targets.end()) continue;
      Linear* l = find_linear(i, m);
      int64_t in = l->w.size(1), out = l->w.size(0);
      double bound = 1.0 / std::sqrt(double(in));  // kaiming_uniform_(a=sqrt(5))
      l->a = (torch::rand({s.r, in}, gen, torch::kFloat32) * 2 - 1).mul_(bound).to(device_);
      l->bb = torch::zeros({out, s.r}, torch::TensorOptions().dtype(torch::kFloat32).device(device_));
      l->scale = s.scale();
      l->dropout = s.dropout;
      l->fast = Linear::FastForm();  // (a cache of the old tensors)
    }
  has_lora_ = true;
}

void CausalLM::load_lora(const std::string& dir) {
  std::string cfile = (fs::path(dir) / "adapter_config.json").string();
  auto j = read_json(cfile);
  LoraSettings s;
  std::map<std::string, int64_t> rank_pattern;
  std::map<std::string, double> alpha_pattern;
  std::string target_regex;
  std::vector<std::string> target_list;
  try {
    if (j.value("peft_type", "LORA") != "LORA") fail(cfile, "peft_type: only LORA is supported");
    s.r = j.at("r").get<int64_t>();
    s.alpha = j.at("lora_alpha").get<double>();
    s.dropout = j.value("lora_dropout", 0.0);
    s.rslora = j.value("use_rslora", false);
    auto nonnull = [&](const char* k) {
      return j.contains(k) && !j[k].is_null() && !(j[k].is_array() && j[k].empty()) &&
             !(j[k].is_object() && j[k].empty());
    };
    if (j.value("use_dora", false)) fail(cfile, "use_dora: DoRA adapters are not supported");
    if (j.value("fan_in_fan_out", false)) fail(cfile, "fan_in_fan_out: not supported for Qwen2/Llama");
    if (j.value("bias", std::string("none")) != "none") fail(cfile, "bias: only \"none\" is supported");
    if (j.value("lora_bias", false)) fail(cfile, "lora_bias: not supported");
    for (const char* k : {"modules_to_save", "layers_to_transform", "layer_replication", "target_parameters",
                          "trainable_token_indices"})
      if (nonnull(k)) fail(cfile, std::string(k) + ": not supported");
    if (j.contains("rank_pattern") && j["rank_pattern"].is_object())
      for (auto it = j["rank_pattern"].begin(); it != j["rank_pattern"].end(); ++it)
        rank_pattern[it.key()] = it.value();
    if (j.contains("alpha_pattern") && j["alpha_pattern"].is_object())
      for (auto it = j["alpha_pattern"].begin(); it != j["alpha_pattern"].end(); ++it)
        alpha_pattern[it.key()] = it.value();
    const auto& t = j.at("target_modules");
    if (t.is_string())
      target_regex = t.get<std::string>();
    else
      target_list = t.get<std::vector<std::string>>();
  } catch (const nlohmann::json::exception& e) {
    fail(cfile, std::string("unexpected value: ") + e.what());
  }
  std::string wfile = (fs::path(dir) / "adapter_model.safetensors").string();
  auto f = SafetensorsFile::open(wfile);
  std::set<std::string> used;
  torch::NoGradGuard ng;
  s.targets.clear();
  for (int64_t i = 0; i < cfg_.num_layers; ++i)
    for (auto& m : lora_modules) {
      std::string key = "model.layers." + std::to_string(i) + "." + m;
      bool targeted = false;
      if (!target_regex.empty()) {
        targeted = std::regex_match(key, std::regex(target_regex));
      } else {
        for (auto& t : target_list)
          if (key == t || (key.size() > t.size() && key.compare(key.size() - t.size() - 1, t.size() + 1, "." + t) == 0))
            targeted = true;
      }
      if (!targeted) continue;
      if (std::find(s.targets.begin(), s.targets.end(), short_name(m)) == s.targets.end())
        s.targets.push_back(short_name(m));
      int64_t r = s.r;
      double alpha = s.alpha;
      for (auto& [p, v] : rank_pattern)
        if (std::regex_match(key, std::regex("(.*\\.)?" + p))) r = v;
      for (auto& [p, v] : alpha_pattern)
        if (std::regex_match(key, std::regex("(.*\\.)?" + p))) alpha = v;
      Linear* l = find_linear(i, m);
      auto ka = peft_key(i, m, "A"), kb = peft_key(i, m, "B");
      const StTensorView* va = f->find(ka);
      const StTensorView* vb = f->find(kb);
      if (!va || !vb) fail(wfile, "tensor " + (va ? kb : ka) + " is missing (adapter_config.json targets " + key + ")");
      std::vector<int64_t> sa{r, l->w.size(1)}, sb{l->w.size(0), r};
      if (va->shape != sa || vb->shape != sb)
        fail(wfile,
             "tensors of " + key + " do not have the shapes rank " + std::to_string(r) + " and the base model imply");
      l->a = to_tensor(*va, wfile, device_, torch::kFloat32);
      l->bb = to_tensor(*vb, wfile, device_, torch::kFloat32);
      l->scale = s.rslora ? alpha / std::sqrt(double(r)) : alpha / double(r);
      l->dropout = s.dropout;
      l->fast = Linear::FastForm();  // (a cache of the old tensors)
      used.insert(ka);
      used.insert(kb);
    }
  for (auto& t : f->tensors())
    if (!used.count(t.name))
      fail(wfile, "tensor " + t.name + " does not belong to any supported LoRA target of this model");
  if (used.empty()) fail(cfile, "target_modules matches no linear layer of this model");
  lora_ = s;
  has_lora_ = true;
}

std::vector<TensorBlob> lora_blobs(const CausalLM& m) {
  std::vector<TensorBlob> out;
  for (auto& [name, t] : m.lora_tensors()) {
    auto c = t.detach().to(torch::kCPU, torch::kFloat32).contiguous();
    TensorBlob b;
    b.name = name;
    b.dtype = "f32";
    b.shape = c.sizes().vec();
    auto* p = static_cast<const uint8_t*>(c.data_ptr());
    b.data.assign(p, p + c.numel() * 4);
    out.push_back(std::move(b));
  }
  return out;
}

std::map<std::string, torch::Tensor> CausalLM::lora_tensors() const {
  std::map<std::string, torch::Tensor> out;
  for (int64_t i = 0; i < cfg_.num_layers; ++i)
    for (auto& m : lora_modules) {
      Linear* l = const_cast<CausalLM*>(this)->find_linear(i, m);
      if (!l->a.defined()) continue;
      out[peft_key(i, m, "A")] = l->a;
      out[peft_key(i, m, "B")] = l->bb;
    }
  return out;
}

void CausalLM::save_lora(const std::string& dir, const std::string& base_model) const {
  if (!has_lora_) throw std::runtime_error("save_lora: the model has no adapter");
  fs::create_directories(dir);
  save_tensors((fs::path(dir) / "adapter_model.safetensors").string(), lora_tensors(), torch::kFloat32,
               {{"format", "pt"}});
  std::vector<std::string> targets = lora_.targets;
  std::sort(targets.begin(), targets.end());
  nlohmann::ordered_json c = {{"peft_type", "LORA"},
                              {"task_type", "CAUSAL_LM"},
                              {"base_model_name_or_path", base_model},
                              {"r", lora_.r},
                              {"lora_alpha", lora_.alpha},
                              {"lora_dropout", lora_.dropout},
                              {"target_modules", targets},
                              {"use_rslora", lora_.rslora},
                              {"use_dora", false},
                              {"bias", "none"},
                              {"fan_in_fan_out", false},
                              {"inference_mode", true},
                              {"init_lora_weights", true},
                              {"modules_to_save", nullptr},
                              {"layers_to_transform", nullptr},
                              {"layers_pattern", nullptr},
                              {"rank_pattern", nlohmann::json::object()},
                              {"alpha_pattern", nlohmann::json::object()},
                              {"revision", nullptr}};
  std::string tmp = (fs::path(dir) / "adapter_config.json.tmp").string();
  {
    std::ofstream out(tmp);
    out << c.dump(2) << "\n";
    if (!out.flush() || inject_enospc((fs::path(dir) / "adapter_config.json").string()))
      fail(tmp, "cannot write: No space left on device");
  }
  fs::rename(tmp, fs::path(dir) / "adapter_config.json");
}

void CausalLM::merge_lora() {
  torch::NoGradGuard ng;
  if (base_owner_) {  // the base is shared: merge into a copy of our own
    auto own = [](torch::Tensor& t) {
      if (t.defined()) t = t.clone();
    };
    for (auto& L : layers_) {
      for (auto* t : {&L.qkv_w, &L.qkv_b, &L.gu_w, &L.gu_b}) own(*t);
      L.slice_groups();
      own(L.o.w);
      own(L.down.w);
    }
    base_owner_.reset();
  }
  for (int64_t i = 0; i < cfg_.num_layers; ++i)
    for (auto& m : lora_modules) {
      Linear* l = find_linear(i, m);
      if (!l->a.defined()) continue;
      // In place: w may be a row slice of its group's fused weight.
      l->w.copy_((l->w.to(torch::kFloat32) + torch::matmul(l->bb, l->a) * l->scale).to(dtype_));
      l->a = torch::Tensor();
      l->bb = torch::Tensor();
      l->fast = Linear::FastForm();  // (a cache of the old tensors)
    }
  has_lora_ = false;
}

int64_t CausalLM::base_bytes() const {
  int64_t n = 0;
  for (auto& [name, t] : base_tensors()) n += t.numel() * t.element_size();
  return n;
}

std::unique_ptr<CausalLM> load_shared_model(const std::string& dir, torch::Device device, torch::ScalarType dtype,
                                            const std::string& component) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<const CausalLM>> loaded;
  std::error_code ec;
  auto canon = fs::weakly_canonical(dir, ec);
  const std::string key = (ec ? dir : canon.string()) + "|" + device.str() + "|" + c10::toString(dtype);
  std::lock_guard<std::mutex> lock(mu);
  std::shared_ptr<const CausalLM> base = loaded[key].lock();
  if (base) {
    char saved[64];
    std::snprintf(saved, sizeof saved, "%.1f MB saved", double(base->base_bytes()) / 1e6);
    log::info(component, "the base weights of " + dir + " on " + device.str() +
                             " are shared with another model of this process (" + saved + ")");
  } else {
    base = std::make_shared<const CausalLM>(dir, device, dtype);
    loaded[key] = base;
  }
  auto m = std::unique_ptr<CausalLM>(new CausalLM(*base));  // the tensors, not their data
  m->base_owner_ = base;
  return m;
}

std::map<std::string, torch::Tensor> CausalLM::base_tensors() const {
  std::map<std::string, torch::Tensor> out;
  out["model.embed_tokens.weight"] = embed_;
  out["model.norm.weight"] = norm_;
  if (!cfg_.tie_word_embeddings) out["lm_head.weight"] = head_;
  for (int64_t i = 0; i < cfg_.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    out[p + "input_layernorm.weight"] = layers_[i].in_norm;
    out[p + "post_attention_layernorm.weight"] = layers_[i].post_norm;
    if (cfg_.qk_norm) {
      out[p + "self_attn.q_norm.weight"] = layers_[i].q_norm;
      out[p + "self_attn.k_norm.weight"] = layers_[i].k_norm;
    }
    for (auto& m : lora_modules) {
      Linear* l = const_cast<CausalLM*>(this)->find_linear(i, m);
      out[p + m + ".weight"] = l->w;
      if (l->b.defined()) out[p + m + ".bias"] = l->b;
    }
  }
  return out;
}

}  // namespace kernelrl
