// Policy: the language model the samplers sample from and the learner scores with, behind a
// torch-free interface (the model, its adapter and LibTorch stay inside policy.cpp).
//
// Log-probabilities. Every logprob this interface returns is log softmax(logits / T) of the token
// taken, where T is the sampling temperature (T = 0, greedy, uses T = 1): the distribution after
// temperature and BEFORE top-p truncation, so a learner that scores the same tokens at the same T
// gets the same numbers (vLLM's "processed" logprobs without its top-p renormalisation).
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kernelrl {

class Tokenizer;
struct TensorBlob;

struct PolicyError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A generation that cannot fit the device however often it is tried (one sequence's key-value
// cache and logits are larger than the memory there is).
struct CapacityError : PolicyError {
  using PolicyError::PolicyError;
};

struct PolicyOptions {
  std::string model_dir;       // Hugging Face directory: config.json, safetensors, tokenizer.json
  std::string adapter_dir;     // PEFT adapter to load ("": none)
  std::string device = "cpu";  // cpu or cuda[:N]
  std::string dtype = "f32";   // f32, f16 or bf16
  // A fresh adapter when adapter_dir is empty and lora_rank > 0 (B = 0: the base model's output),
  // so that WeightsUpdates from a learner have somewhere to go.
  int64_t lora_rank = 0;
  double lora_alpha = 32;
  std::vector<std::string> lora_targets{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  uint64_t seed = 0;  // initialisation of a fresh adapter's A
  // Sequences decoded at once (rows of the key-value cache; 0: every sequence of a call). A call
  // with more waits for rows: a finished sequence's row takes the next one (continuous batching).
  int64_t max_rows = 0;
};

struct SamplingParams {
  double temperature = 1.0;       // 0: greedy
  double top_p = 1.0;             // nucleus truncation (1: none)
  uint32_t max_tokens = 256;      // completion length limit
  uint32_t n = 1;                 // completions per prompt
  std::vector<std::string> stop;  // stop strings: the text ends before the first one
  uint64_t seed = 0;              // sampling seed: the same seed, prompts and params give the same tokens
  bool skip_special = true;       // leave special tokens out of the text
};

struct Completion {
  std::vector<int32_t> token_ids;  // generated tokens, including an end-of-sequence token or the
                                   // token that completed a stop string
  std::vector<float> logprobs;     // one per token_ids entry (see the header comment)
  std::string text;                // decoded, cut before a stop string, valid UTF-8
  std::string finish_reason;       // "stop" (eos or stop string) or "length"
  uint32_t prompt_tokens = 0;
};

struct Scored {
  std::vector<int32_t> prompt_ids, token_ids;
  std::vector<float> logprobs;  // of token_ids after prompt_ids
};

// What the last generate call did (policy/decoder.hpp).
struct GenerationStats {
  // the decode step: "fused-wgmma-graph", "fused-wgmma", "fused-graph", "fused", "graph", "static" or "eager"
  std::string path;
  int64_t steps = 0;           // decode steps (each over every row of the cache)
  int64_t rows = 0;            // rows of the cache
  int64_t prefill_tokens = 0;  // prompt tokens prefilled (each distinct prompt once per admission)
  int64_t graphs = 0;          // CUDA graphs captured
  // decode_seconds: the device's clock over the decode steps on CUDA (events around each window of
  // steps), the host's on the CPU
  double prefill_seconds = 0, decode_seconds = 0;
  // host time capturing graphs (warm-up step included), while the device waits: inside decode_seconds
  double capture_seconds = 0;
};

class Policy {
 public:
  // Loads model, tokenizer and adapter; throws PolicyError with the file and what is wrong.
  static std::unique_ptr<Policy> load(const PolicyOptions& o);
  ~Policy();

  // `n` completions of every prompt, in prompt order (prompt 0's n, then prompt 1's, ...),
  // sampled in one batch with a key-value cache.
  std::vector<Completion> generate(const std::vector<std::string>& prompts, const SamplingParams& p);
  std::vector<Completion> generate_ids(const std::vector<std::vector<int32_t>>& prompts, const SamplingParams& p);
  const GenerationStats& last_generation() const;
  // Logprobs of `completion` after `prompt` (each tokenized on its own, then joined).
  Scored score(const std::string& prompt, const std::string& completion, double temperature = 1.0);
  // Batched: logprobs of completions[i] after prompts[i].
  std::vector<std::vector<float>> score_ids(const std::vector<std::vector<int32_t>>& prompts,
                                            const std::vector<std::vector<int32_t>>& completions,
                                            double temperature = 1.0);
  // float32 logits [ids.size() x vocab], row-major (for parity checks).
  std::vector<float> logits(const std::vector<int32_t>& ids);

  const Tokenizer& tokenizer() const;
  int64_t vocab_size() const;
  std::vector<int32_t> eos_token_ids() const;

  // Adapter weights from the learner: every tensor must name one of this policy's LoRA tensors
  // with its shape; nothing is changed unless all are valid. Afterwards version() == version.
  void apply_weights(uint64_t version, const std::vector<TensorBlob>& tensors);
  uint64_t version() const;
  bool has_adapter() const;
  // The adapter as TensorBlobs (float32), as a learner publishes it.
  std::vector<TensorBlob> adapter_blobs() const;
  void save_adapter(const std::string& dir) const;
  // Folds the adapter into the base weights and writes a Hugging Face directory (config.json,
  // model.safetensors, tokenizer files) that transformers and vLLM load without PEFT.
  void export_merged(const std::string& dir);

  struct Impl;

 private:
  explicit Policy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kernelrl
