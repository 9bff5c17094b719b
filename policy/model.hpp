// Decoder-only transformers of the Qwen2 and Llama families in LibTorch, loaded from a Hugging
// Face directory, with LoRA adapters in PEFT's format. Includes <torch/torch.h>: only learner/
// sources include this header; actors and messages reach the model through policy/policy.hpp.
//
// The arithmetic follows transformers' modeling_llama / modeling_qwen2 step by step (RMSNorm in
// float32 then cast, rotary tables in float32 cast to the model dtype, SDPA attention, SwiGLU), so
// logits agree with transformers to rounding. LoRA follows PEFT: y = W x + b + s * B(A(drop(x)))
// with s = alpha / r (alpha / sqrt(r) with rslora), adapters kept and computed in float32.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kernelrl {

struct TensorBlob;

// config.json of a Qwen2 or Llama checkpoint.
struct ModelConfig {
  std::string model_type;  // "qwen2" or "llama"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool qkv_bias = false;  // q/k/v projections carry a bias (Qwen2; Llama's attention_bias)
  bool o_bias = false;    // o_proj carries a bias (Llama's attention_bias)
  bool mlp_bias = false;  // gate/up/down carry a bias (Llama's mlp_bias)
  double rope_theta = 10000;
  std::string rope_type = "default";  // default, linear or llama3
  double rope_factor = 1, rope_low_freq_factor = 1, rope_high_freq_factor = 4;
  int64_t rope_original_max_positions = 8192;
  std::vector<int32_t> eos_token_ids;  // from config.json and generation_config.json
  std::string dtype;                   // dtype the checkpoint was saved in ("float32", "bfloat16")
};

// Reads DIR/config.json (and DIR/generation_config.json for eos ids); throws std::runtime_error
// naming the file and field for anything missing or unsupported.
ModelConfig load_model_config(const std::string& dir);

struct LoraSettings {
  int64_t r = 16;       // rank
  double alpha = 32;    // scale numerator
  double dropout = 0;   // dropout on the adapter's input while training
  bool rslora = false;  // scale alpha / sqrt(r) instead of alpha / r
  std::vector<std::string> targets{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  double scale() const { return rslora ? alpha / std::sqrt(double(r)) : alpha / double(r); }
};

// A linear layer of the base model, optionally with a LoRA adapter.
struct Linear {
  torch::Tensor w, b;   // frozen base weight [out, in] and optional bias
  torch::Tensor a, bb;  // LoRA A [r, in] and B [out, r] (float32; undefined without an adapter)
  double scale = 0;
  double dropout = 0;
  // use_lora false: the base layer alone (the reference policy of a KL term).
  torch::Tensor forward(const torch::Tensor& x, bool training, bool use_lora = true) const;
};

struct KVCache {
  std::vector<torch::Tensor> k, v;  // per layer [batch, kv_heads, capacity, head_dim]
};

class CausalLM {
 public:
  // Loads config and weights from a Hugging Face directory (model.safetensors, or shards listed in
  // model.safetensors.index.json) onto `device` in `dtype`.
  CausalLM(const std::string& dir, torch::Device device, torch::ScalarType dtype);

  const ModelConfig& config() const { return cfg_; }
  torch::Device device() const { return device_; }
  torch::ScalarType dtype() const { return dtype_; }

  // Logits [batch, T, vocab] (model dtype) of `ids` [batch, T] at `positions` [batch, T].
  // `mask` is bool [batch, 1, T, S] (true: may attend) over the S = cache_pos + T keys, or
  // undefined for plain causal attention over ids alone. With a cache, the new keys and values
  // are written at slots [cache_pos, cache_pos + T) and attention covers slots [0, cache_pos + T).
  torch::Tensor forward(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& mask,
                        KVCache* cache = nullptr, int64_t cache_pos = 0, bool training = false) const;
  // Hidden states before lm_head, same arguments (for callers that only need some positions).
  torch::Tensor hidden(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& mask,
                       KVCache* cache, int64_t cache_pos, bool training) const;
  torch::Tensor lm_head(const torch::Tensor& h) const;
  // log p(ids[:, t] | ids[:, <t]) for t = 1 .. L-1: float32 [batch, L - 1] from one causal pass
  // over right-padded `ids` [batch, L] (int64, any device); differentiable in the adapter.
  // With temperature T (> 0) the distribution is softmax(logits / T), as the sampler's logprobs;
  // `entropy`, when given, receives that distribution's entropy per position (no gradient).
  // With `entropy_grad` the entropy is differentiable too (an entropy bonus in the loss).
  torch::Tensor sequence_logprobs(const torch::Tensor& ids, bool training, double temperature = 1.0,
                                  torch::Tensor* entropy = nullptr, bool entropy_grad = false) const;
  // One decode step in a form a CUDA graph can capture: every shape fixed by the cache. `slot`
  // (int64 [1], on the device) is where the new key and value go; attention covers the whole
  // cache under `mask` (bool [batch, 1, 1, capacity]). Returns hidden states [batch, 1, hidden].
  torch::Tensor decode_static(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& mask,
                              KVCache& cache, const torch::Tensor& slot) const;

  KVCache new_cache(int64_t batch, int64_t capacity) const;

  // LoRA. A fresh adapter has A ~ kaiming-uniform(a = sqrt(5)) and B = 0, as PEFT initialises it.
  bool has_lora() const { return has_lora_; }
  // Off: every forward uses the base weights alone (the reference policy for a KL term).
  void set_lora_enabled(bool on) { lora_enabled_ = on; }
  const LoraSettings& lora_settings() const { return lora_; }
  void add_lora(const LoraSettings& s, uint64_t seed);
  // DIR/adapter_config.json + DIR/adapter_model.safetensors in PEFT's format.
  void load_lora(const std::string& dir);
  void save_lora(const std::string& dir, const std::string& base_model) const;
  // The adapter's tensors by PEFT key name (base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight).
  std::map<std::string, torch::Tensor> lora_tensors() const;
  // Folds every adapter into its base weight (W += s * B A) and drops the adapters.
  void merge_lora();
  // Base weights by Hugging Face name (after a merge: the merged ones), for export.
  std::map<std::string, torch::Tensor> base_tensors() const;

 private:
  struct Layer {
    torch::Tensor in_norm, post_norm;
    Linear q, k, v, o, gate, up, down;
  };
  Linear* find_linear(int64_t layer, const std::string& name);
  torch::Tensor run(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& mask, KVCache* cache,
                    int64_t cache_pos, const torch::Tensor& slot, bool training) const;
  torch::Tensor rms(const torch::Tensor& x, const torch::Tensor& w) const;

  ModelConfig cfg_;
  torch::Device device_;
  torch::ScalarType dtype_;
  torch::Tensor embed_, norm_, head_;
  std::vector<Layer> layers_;
  torch::Tensor inv_freq_;  // float32 [head_dim / 2]
  bool has_lora_ = false;
  bool lora_enabled_ = true;
  LoraSettings lora_;
};

// The model's adapter as float32 TensorBlobs under PEFT key names (what a WeightsUpdate carries).
std::vector<TensorBlob> lora_blobs(const CausalLM& m);

torch::ScalarType parse_dtype(const std::string& s);  // f32/float32, f16/float16, bf16/bfloat16

// Writes `tensors` (copied to the CPU; converted to `as` when given) as a safetensors file.
// Dtypes: float64/32/16, bfloat16, int64.
void save_tensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                  std::optional<torch::ScalarType> as = std::nullopt,
                  const std::map<std::string, std::string>& metadata = {});

}  // namespace kernelrl
