#include "messages/messages.hpp"

#include <caf/actor_system.hpp>
#include <caf/error.hpp>
#include <caf/message.hpp>

#include <openssl/evp.h>

#include <array>

namespace kernelrl {

namespace {
constexpr std::array<const char*, 9> status_names = {"ok",           "format_error", "compile_error", "runtime_error",
                                                     "timeout",      "incorrect",    "hacked",        "skipped",
                                                     "out_of_memory"};
}

std::string to_string(EvalStatus s) {
  auto i = static_cast<size_t>(s);
  return i < status_names.size() ? status_names[i] : "unknown(" + std::to_string(i) + ")";
}

bool from_string(const std::string& name, EvalStatus& out) {
  for (size_t i = 0; i < status_names.size(); ++i) {
    if (name == status_names[i]) {
      out = static_cast<EvalStatus>(i);
      return true;
    }
  }
  return false;
}

bool is_verdict(EvalStatus s) { return s != EvalStatus::skipped && s != EvalStatus::out_of_memory; }

void add_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_type<Rollout>("kernelrl.Rollout");
  cfg.add_message_type<EvalRequest>("kernelrl.EvalRequest");
  cfg.add_message_type<RuntimeStats>("kernelrl.RuntimeStats");
  cfg.add_message_type<Correctness>("kernelrl.Correctness");
  cfg.add_message_type<EvalResult>("kernelrl.EvalResult");
  cfg.add_message_type<ScoredRollout>("kernelrl.ScoredRollout");
  cfg.add_message_type<StepStats>("kernelrl.StepStats");
  cfg.add_message_type<Checkpoint>("kernelrl.Checkpoint");
  cfg.add_message_type<TensorBlob>("kernelrl.TensorBlob");
  cfg.add_message_type<SamplePlan>("kernelrl.SamplePlan");
  cfg.add_message_type<StepUpdate>("kernelrl.StepUpdate");
  cfg.add_message_type<WeightsUpdate>("kernelrl.WeightsUpdate");
  cfg.add_message_type<Telemetry>("kernelrl.Telemetry");
  cfg.add_message_type<std::vector<Rollout>>("kernelrl.RolloutBatch");
}

std::string error_text(caf::actor_system& sys, const caf::error& e) {
  const auto& ctx = e.context();
  if (ctx.size() >= 1 && ctx.match_element<std::string>(ctx.size() - 1)) {
    // sec errors carry (sec name..., user text) : the user's text is last
    const auto& text = ctx.get_as<std::string>(ctx.size() - 1);
    if (!text.empty()) return text;
  }
  return sys.render(e);
}

std::string make_sample_id(const std::string& task_id, uint64_t group_id, uint32_t sample_index) {
  return task_id + "#" + std::to_string(group_id) + "." + std::to_string(sample_index);
}

std::string weights_checksum(const std::vector<TensorBlob>& tensors) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  auto u64 = [&](uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));  // little-endian
    EVP_DigestUpdate(ctx, b, 8);
  };
  u64(tensors.size());
  for (auto& t : tensors) {
    for (auto* s : {&t.name, &t.dtype}) {
      u64(s->size());
      EVP_DigestUpdate(ctx, s->data(), s->size());
    }
    u64(t.shape.size());
    for (auto d : t.shape) u64(static_cast<uint64_t>(d));
    u64(t.data.size());
    EVP_DigestUpdate(ctx, t.data.data(), t.data.size());
  }
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, md, &len);
  EVP_MD_CTX_free(ctx);
  static const char* hex = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < len; ++i) {
    out += hex[md[i] >> 4];
    out += hex[md[i] & 15];
  }
  return out;
}

WeightsUpdate make_weights_update(uint64_t version, std::vector<TensorBlob> tensors) {
  WeightsUpdate u;
  u.version = version;
  u.tensors = std::move(tensors);
  u.checksum = weights_checksum(u.tensors);
  return u;
}

}  // namespace kernelrl
