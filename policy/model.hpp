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
  std::string model_type;  // "qwen2", "qwen3" or "llama"
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
  bool qk_norm = false;   // RMSNorm over each head of q and k before the rotary embedding (Qwen3)
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
  // The same with x already in float32 (x32, the adapter's input; shared by layers that read
  // the same x), or undefined.
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& x32, bool training, bool use_lora) const;

  // The adapter in the form the fused CUDA path multiplies (bf16 hi/lo parts of A and of s B, s B
  // transposed), rebuilt when a or bb changed (their version counters or storage); policy/model.cpp.
  struct FastForm {
    torch::Tensor a_t;   // [in, 2r]: [A_hi; A_lo] transposed
    torch::Tensor a_3;   // [3r, in]: [A_hi; A_lo; A_hi]
    torch::Tensor b_2;   // [out, 2r]: [sB_hi, sB_lo]
    torch::Tensor sb_t;  // [r, out]: (s B) transposed, float32
    int64_t key[4] = {-1, -1, -1, -1};
  };
  mutable FastForm fast;
  const FastForm& fast_form() const;
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
  // One decode step (one new token per row) in a form a CUDA graph can capture: every shape fixed
  // by `klen`. Row r's token sits at position slot[r] (int64 [R], on the device), where its key and
  // value are written; attention covers the cache's slots [0, klen) under `mask` (bool
  // [R, 1, 1, klen]: slot <= slot[r]). ids and positions are [R, 1]. Returns hidden states [R, 1, hidden].
  torch::Tensor decode_static(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& mask,
                              KVCache& cache, const torch::Tensor& slot, int64_t klen) const;

  KVCache new_cache(int64_t batch, int64_t capacity) const;

  // Activation checkpointing of training passes: each decoder layer keeps only its input and is
  // run again in the backward pass (about a third more compute, a layer's activations at a time).
  void set_checkpointing(bool on) { checkpointing_ = on; }
  bool checkpointing() const { return checkpointing_; }
  // How a layer's attention meets the cache (forward()'s cache arguments; decode_static's slot and
  // key length; the mask, and its rows repeated for grouped-query attention).
  struct CacheView {
    KVCache* cache = nullptr;
    int64_t cache_pos = 0, klen = 0;
    torch::Tensor slot, rows, mask, gmask;
  };
  // One decoder layer over h [B, T, hidden]: causal attention over h alone without `cv` (training
  // and scoring); and the adapter tensors it reads (A and B of each adapted projection, in order).
  torch::Tensor layer_forward(size_t l, const torch::Tensor& h, const torch::Tensor& cos, const torch::Tensor& sin,
                              bool training, const CacheView* cv = nullptr) const;
  std::vector<torch::Tensor> layer_lora(size_t l) const;
  double lora_dropout() const { return has_lora_ ? lora_.dropout : 0.0; }

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
  // Bytes of the base weights (on the device).
  int64_t base_bytes() const;

 private:
  friend class Decoder;
  friend std::unique_ptr<CausalLM> load_shared_model(const std::string&, torch::Device, torch::ScalarType,
                                                     const std::string&);
  CausalLM(const CausalLM&) = default;  // shares the tensors (load_shared_model)
  // The model whose base weights this one shares (kept alive while any sharer lives), if any.
  std::shared_ptr<const CausalLM> base_owner_;
  struct Layer {
    torch::Tensor in_norm, post_norm;
    torch::Tensor q_norm, k_norm;  // qk_norm: [head_dim] each
    Linear q, k, v, o, gate, up, down;
    // q|k|v and gate|up weights (and biases) in one tensor each: q.w, k.w, v.w, gate.w and up.w
    // are row slices of them, so the decoder's fused step runs one GEMM for each group.
    torch::Tensor qkv_w, qkv_b, gu_w, gu_b;
    // Points the projections' weights and biases at their rows of the group tensors.
    void slice_groups();
  };
  Linear* find_linear(int64_t layer, const std::string& name);
  // x in float32 when an adapter reads it, else undefined.
  torch::Tensor lora_input(const torch::Tensor& x) const;
  torch::Tensor checkpointed_layer(size_t l, const torch::Tensor& h, const torch::Tensor& cos,
                                   const torch::Tensor& sin) const;
  torch::Tensor run(const torch::Tensor& ids, const torch::Tensor& positions, const torch::Tensor& mask, KVCache* cache,
                    int64_t cache_pos, const torch::Tensor& slot, bool training) const;
  torch::Tensor rms(const torch::Tensor& x, const torch::Tensor& w) const;

  ModelConfig cfg_;
  torch::Device device_{torch::kCPU};
  torch::ScalarType dtype_ = torch::kFloat32;
  torch::Tensor embed_, norm_, head_;
  std::vector<Layer> layers_;
  torch::Tensor inv_freq_;  // float32 [head_dim / 2]
  bool has_lora_ = false;
  bool lora_enabled_ = true;
  bool checkpointing_ = false;
  LoraSettings lora_;
};

// A model of DIR on `device` in `dtype`, without an adapter. Within one process, models of the
// same directory, device and dtype share one copy of the base weights (a colocated sampler and
// learner: each has its own adapter, the base is read by both and written by neither); one that
// finds another to share with says so in `component`'s log, with the memory saved.
std::unique_ptr<CausalLM> load_shared_model(const std::string& dir, torch::Device device, torch::ScalarType dtype,
                                            const std::string& component);

// The model's adapter as float32 TensorBlobs under PEFT key names (what a WeightsUpdate carries).
std::vector<TensorBlob> lora_blobs(const CausalLM& m);

torch::ScalarType parse_dtype(const std::string& s);

// Whether the fused CUDA kernels may run (bf16 on CUDA, where the build has them): the decoder's
// step and the learner's log-probabilities. KERNELRL_FUSED=0 turns them all off.
bool fused_kernels_enabled();  // f32/float32, f16/float16, bf16/bfloat16

// Writes `tensors` (copied to the CPU; converted to `as` when given) as a safetensors file.
// Dtypes: float64/32/16, bfloat16, int64.
void save_tensors(const std::string& path, const std::map<std::string, torch::Tensor>& tensors,
                  std::optional<torch::ScalarType> as = std::nullopt,
                  const std::map<std::string, std::string>& metadata = {});

}  // namespace kernelrl
