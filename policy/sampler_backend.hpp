// The sampler's backends behind one interface: `libtorch` (the in-process Policy, learner/
// policy.hpp), `openai` (an OpenAI-compatible /v1/completions server such as vLLM or SGLang) and
// replay (recorded actions; actors/sampler.cpp, no backend object). Calls block: the sampler
// runs a backend in a detached actor. Failures are BackendError with a message naming the
// server or file and what went wrong.
#pragma once

#include "policy/policy.hpp"
#include "messages/messages.hpp"

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace kernelrl {

struct BackendError : std::runtime_error {
  using std::runtime_error::runtime_error;
  BackendError(const std::string& what, bool never_fits) : std::runtime_error(what), permanent(never_fits) {}
  // The request cannot succeed however often it is retried (it does not fit the device).
  bool permanent = false;
};

struct GenSample {
  std::string text;
  std::vector<int32_t> token_ids;  // empty when the server does not return ids
  std::vector<float> logprobs;     // one per generated token
  std::string finish_reason;
  uint64_t policy_version = 0;  // the weights version that produced it
};

class SamplerBackend {
 public:
  virtual ~SamplerBackend() = default;
  virtual std::string name() const = 0;
  // p.n samples of every prompt, prompt-major: result[i * n + j] is sample j of prompt i.
  virtual std::vector<GenSample> generate(const std::vector<std::string>& prompts, const SamplingParams& p) = 0;
  // Serve the adapter in `u` from now on; afterwards version() == u.version.
  virtual void apply_weights(const WeightsUpdate& u) = 0;
  virtual uint64_t version() const = 0;
  // The decode step the last generate call ran (GenerationStats::path for the in-process model;
  // "" where the backend cannot tell).
  virtual std::string decode_path() const { return ""; }
};

// In-process model (LibTorch); see policy/policy.hpp for the logprobs' distribution.
std::unique_ptr<SamplerBackend> make_libtorch_backend(const PolicyOptions& o);

struct OpenAIOptions {
  std::string url;           // server root, e.g. http://10.0.0.5:8000 (the /v1/... paths are added)
  std::string model;         // served model name for /v1/completions
  std::string api_key;       // sent as "Authorization: Bearer KEY" when not empty
  double timeout_s = 600;    // one HTTP exchange
  uint32_t max_retries = 4;  // extra attempts after a connect failure, a timeout, 429 or 5xx
  double backoff_s = 0.5;    // first wait between attempts; doubles each time
  std::string adapter_root;  // where WeightsUpdates are written as PEFT adapters for
                             // /v1/load_lora_adapter (a path the server can read)
  double lora_alpha = 32;    // alpha written into those adapters' adapter_config.json
};

// vLLM's logprobs are its "raw" ones by default (before temperature); start vLLM with
// --logprobs-mode processed_logprobs to get log softmax(logits / T), as the libtorch backend.
std::unique_ptr<SamplerBackend> make_openai_backend(const OpenAIOptions& o);

// Writes `tensors` (PEFT key names) as a PEFT LoRA adapter directory: adapter_model.safetensors
// and an adapter_config.json whose rank and target modules are read off the tensors.
void write_peft_adapter(const std::string& dir, const std::vector<TensorBlob>& tensors, double lora_alpha,
                        const std::string& base_model);

}  // namespace kernelrl
