// The `openai` sampler backend: batched /v1/completions against vLLM, SGLang or any
// OpenAI-compatible server, with retries and LoRA hot-loading through /v1/load_lora_adapter.
#include "policy/sampler_backend.hpp"

#include "core/http.hpp"
#include "core/log.hpp"
#include "policy/safetensors.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

namespace fs = std::filesystem;

namespace kernelrl {

void write_peft_adapter(const std::string& dir, const std::vector<TensorBlob>& tensors, double lora_alpha,
                        const std::string& base_model) {
  fs::create_directories(dir);
  std::vector<StTensorRef> refs;
  std::set<std::string> targets;
  int64_t rank = 0;
  for (const auto& t : tensors) {
    StDtype d =
        t.dtype == "f32"    ? StDtype::F32
        : t.dtype == "bf16" ? StDtype::BF16
        : t.dtype == "f16"
            ? StDtype::F16
            : throw BackendError("adapter tensor " + t.name + ": dtype " + t.dtype + " (expected f32, f16 or bf16)");
    refs.push_back({t.name, d, t.shape, t.data.data(), t.data.size()});
    auto a = t.name.find(".lora_A.");
    if (a != std::string::npos) {
      auto dot = t.name.rfind('.', a - 1);
      targets.insert(t.name.substr(dot + 1, a - dot - 1));
      if (t.shape.size() != 2) throw BackendError("adapter tensor " + t.name + ": expected 2 dimensions");
      rank = t.shape[0];
    } else if (t.name.find(".lora_B.") == std::string::npos) {
      throw BackendError("adapter tensor " + t.name + " is not a LoRA A or B matrix");
    }
  }
  if (rank == 0) throw BackendError("adapter: no lora_A tensors");
  try {
    write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), refs, {{"format", "pt"}});
  } catch (const SafetensorsError& e) {
    throw BackendError(e.what());
  }
  nlohmann::ordered_json c = {{"peft_type", "LORA"},
                              {"task_type", "CAUSAL_LM"},
                              {"base_model_name_or_path", base_model},
                              {"r", rank},
                              {"lora_alpha", lora_alpha},
                              {"lora_dropout", 0.0},
                              {"target_modules", std::vector<std::string>(targets.begin(), targets.end())},
                              {"bias", "none"},
                              {"use_rslora", false},
                              {"use_dora", false},
                              {"fan_in_fan_out", false},
                              {"inference_mode", true},
                              {"modules_to_save", nullptr}};
  std::ofstream out(fs::path(dir) / "adapter_config.json");
  out << c.dump(2) << "\n";
  if (!out) throw BackendError(dir + "/adapter_config.json: cannot write");
}

namespace {

class OpenAIBackend final : public SamplerBackend {
 public:
  explicit OpenAIBackend(OpenAIOptions o) : o_(std::move(o)), served_(o_.model) {
    std::string host, base, err;
    uint16_t port = 0;
    if (!parse_http_url(o_.url, host, port, base, err)) throw BackendError("openai: " + err);
    if (o_.model.empty()) throw BackendError("openai: no served model name");
  }
  std::string name() const override { return "openai"; }
  uint64_t version() const override { return version_; }

  std::vector<GenSample> generate(const std::vector<std::string>& prompts, const SamplingParams& p) override {
    if (prompts.empty()) return {};
    nlohmann::json req = {{"model", served_},
                          {"prompt", prompts},
                          {"n", p.n},
                          {"temperature", p.temperature},
                          {"top_p", p.top_p},
                          {"max_tokens", p.max_tokens},
                          {"seed", p.seed},
                          {"logprobs", 0},
                          {"return_tokens_as_token_ids", true},
                          {"skip_special_tokens", p.skip_special}};
    if (!p.stop.empty()) req["stop"] = p.stop;
    auto j = call("/v1/completions", req);
    const size_t want = prompts.size() * p.n;
    if (!j.contains("choices") || !j["choices"].is_array())
      throw BackendError("openai: " + o_.url + "/v1/completions: the answer has no choices array");
    std::vector<GenSample> out(want);
    std::vector<char> seen(want, 0);
    for (const auto& c : j["choices"]) {
      size_t idx = c.value("index", size_t(0));
      if (idx >= want || seen[idx])
        throw BackendError("openai: /v1/completions: choice index " + std::to_string(idx) +
                           " is out of range or repeated (" + std::to_string(want) + " asked for)");
      seen[idx] = 1;
      GenSample& s = out[idx];
      s.text = c.value("text", "");
      s.finish_reason =
          c.contains("finish_reason") && c["finish_reason"].is_string() ? c["finish_reason"].get<std::string>() : "";
      s.policy_version = version_;
      const auto& lp = c.contains("logprobs") ? c["logprobs"] : nlohmann::json();
      if (!lp.is_object() || !lp.contains("token_logprobs") || !lp["token_logprobs"].is_array())
        throw BackendError("openai: " + o_.url + "/v1/completions returned no logprobs for choice " +
                           std::to_string(idx) + "; the learner needs them (does the server support \"logprobs\"?)");
      for (const auto& x : lp["token_logprobs"]) s.logprobs.push_back(x.is_number() ? x.get<float>() : 0.0f);
      if (lp.contains("tokens") && lp["tokens"].is_array()) {
        for (const auto& t : lp["tokens"]) {
          std::string tok = t.is_string() ? t.get<std::string>() : "";
          if (tok.rfind("token_id:", 0) != 0) {  // the server ignored return_tokens_as_token_ids
            s.token_ids.clear();
            break;
          }
          s.token_ids.push_back(std::stoi(tok.substr(9)));
        }
      }
    }
    for (size_t i = 0; i < want; ++i)
      if (!seen[i]) throw BackendError("openai: /v1/completions: choice " + std::to_string(i) + " is missing");
    return out;
  }

  void apply_weights(const WeightsUpdate& u) override {
    if (o_.adapter_root.empty())
      throw BackendError("openai: no adapter directory to write weights update " + std::to_string(u.version) + " to");
    std::string name = "kernelrl-v" + std::to_string(u.version);
    std::string dir = (fs::path(o_.adapter_root) / name).string();
    write_peft_adapter(dir, u.tensors, o_.lora_alpha, o_.model);
    call("/v1/load_lora_adapter", {{"lora_name", name}, {"lora_path", fs::absolute(dir).string()}},
         /*json_answer=*/false);
    std::string old = served_;
    served_ = name;
    version_ = u.version;
    if (old != o_.model) {
      try {  // the previous version is no longer needed; failing to unload it is harmless
        call("/v1/unload_lora_adapter", {{"lora_name", old}}, false);
      } catch (const BackendError& e) {
        log::get("sampler")->warn("{}", e.what());
      }
    }
  }

 private:
  nlohmann::json call(const std::string& path, const nlohmann::json& body, bool json_answer = true) {
    std::map<std::string, std::string> headers;
    if (!o_.api_key.empty()) headers["Authorization"] = "Bearer " + o_.api_key;
    std::string url = o_.url;
    while (!url.empty() && url.back() == '/') url.pop_back();
    url += path;
    double wait = o_.backoff_s;
    std::string last;
    for (uint32_t attempt = 0; attempt <= o_.max_retries; ++attempt) {
      if (attempt > 0) {
        log::get("sampler")->warn("{}: {}; attempt {} of {} in {:.1f} s", url, last, attempt + 1, o_.max_retries + 1,
                                  wait);
        std::this_thread::sleep_for(std::chrono::duration<double>(wait));
        wait *= 2;
      }
      auto r = http_request("POST", url, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), headers,
                            o_.timeout_s);
      if (r.status == 0) {
        last = r.error;
        continue;
      }
      std::string snippet = r.body.substr(0, 300);
      if (r.status == 429 || r.status >= 500) {
        last = "HTTP " + std::to_string(r.status) + ": " + snippet;
        continue;
      }
      if (r.status != 200) throw BackendError("openai: " + url + ": HTTP " + std::to_string(r.status) + ": " + snippet);
      if (!json_answer) return {};
      try {
        return nlohmann::json::parse(r.body);
      } catch (const nlohmann::json::exception&) {
        throw BackendError("openai: " + url + ": the answer is not JSON: " + snippet);
      }
    }
    throw BackendError("openai: " + url + ": gave up after " + std::to_string(o_.max_retries + 1) +
                       " attempts: " + last);
  }

  OpenAIOptions o_;
  std::string served_;  // the base model's name, or the loaded adapter's
  uint64_t version_ = 0;
};

}  // namespace

std::unique_ptr<SamplerBackend> make_openai_backend(const OpenAIOptions& o) {
  return std::make_unique<OpenAIBackend>(o);
}

}  // namespace kernelrl
