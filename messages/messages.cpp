#include "messages/messages.hpp"

#include "core/files.hpp"

#include <caf/actor_system.hpp>
#include <caf/error.hpp>
#include <caf/message.hpp>

#include <array>

namespace kernelrl {

namespace {
constexpr std::array<const char*, 10> status_names = {
    "ok",        "format_error", "compile_error", "runtime_error", "timeout",
    "incorrect", "hacked",       "skipped",       "out_of_memory", "unconfirmed"};
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
  cfg.add_message_type<Attempt>("kernelrl.Attempt");
  cfg.add_message_type<std::vector<Attempt>>("kernelrl.AttemptList");
  cfg.add_message_type<std::vector<std::vector<Attempt>>>("kernelrl.AttemptLists");
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
  Sha256 h;
  h.add_u64(tensors.size());
  for (auto& t : tensors) {
    h.add_sized(t.name).add_sized(t.dtype).add_u64(t.shape.size());
    for (auto d : t.shape) h.add_u64(static_cast<uint64_t>(d));
    h.add_u64(t.data.size()).add(t.data.data(), t.data.size());
  }
  return h.hex();
}

WeightsUpdate make_weights_update(uint64_t version, std::vector<TensorBlob> tensors) {
  WeightsUpdate u;
  u.version = version;
  u.tensors = std::move(tensors);
  u.checksum = weights_checksum(u.tensors);
  return u;
}

}  // namespace kernelrl
