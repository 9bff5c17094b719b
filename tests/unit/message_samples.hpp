// One fully populated value of every message type (no field left at its default), so a
// round trip that drops or reorders a field fails the comparison.
#pragma once

#include "messages/messages.hpp"

namespace kernelrl::test {

inline Rollout sample_rollout() {
  Rollout r;
  r.sample_id = "01_diag_matmul#3.1";
  r.task_id = "01_diag_matmul";
  r.group_id = 3;
  r.sample_index = 1;
  r.step = 7;
  r.prompt = "Write the body of ModelNew.forward.\n";
  r.completion = "```python\nreturn A.unsqueeze(1) * B\n```\u00e9";
  r.token_ids = {151644, 872, -1, 0};
  r.logprobs = {-0.25f, -1.5f, -0.0f, -12.75f};
  r.policy_version = 42;
  r.sampler_id = "node-a/sampler-0";
  return r;
}

inline EvalRequest sample_request() {
  return {"01_diag_matmul#3.1", "01_diag_matmul", "/tasks/01_diag_matmul.py", "return A",
          "forward_body",       "full",           1234567890123ull,           2};
}

inline EvalResult sample_result() {
  EvalResult e;
  e.sample_id = "01_diag_matmul#3.1";
  e.task_id = "01_diag_matmul";
  e.status = EvalStatus::incorrect;
  e.error = "trial 2: values differ";
  e.assembled_code = "class ModelNew(nn.Module):\n    pass\n";
  e.compile_log = "warning: something\n";
  e.correctness = {
      6, 2, 0.5, 1e-3, 1e-4, 2e-4, "trial 2: values differ", 0.25, 1e-2, 3e-7, "signed: passed", "large", 42020002};
  e.runtime = {1.5, 1.625, 0.125, 1.25, 2.0, 50};
  e.ref_runtime = {3.0, 3.25, 0.5, 2.5, 4.0, 50};
  e.speedup = 2.0;
  e.evaluator_id = "node-b/cuda:1";
  e.device = "NVIDIA H100 80GB HBM3";
  e.wall_s = 3.75;
  e.kernel_coverage = 0.875;
  e.compile_s = 12.5;
  e.compile_cached = true;
  e.reverified = true;
  e.isolation_s = 0.25;
  e.ready_at = 1795000000.5;
  e.device_start = 1795000001.25;
  e.device_end = 1795000004.75;
  e.device_peak_bytes = 31ull << 30;
  e.review = "its 0.001 ms is less than writing its output takes";
  e.note = "the runtime is the fresh-values timing";
  e.output_bytes = 1ull << 33;
  e.bound_ms = 1.375;
  return e;
}

inline ScoredRollout sample_scored() { return {sample_rollout(), sample_result(), 1.875}; }

inline StepStats sample_step() {
  return {5, 64, 20, 0.125, 1.75, 0.5, 9, {{"ok", 20}, {"incorrect", 30}, {"timeout", 14}}};
}

inline Checkpoint sample_checkpoint() { return {5, 9, "/runs/x/checkpoints/step-5", 0.375}; }

inline WeightsUpdate sample_weights() {
  WeightsUpdate w;
  w.version = 10;
  w.tensors.push_back(
      {"base_model.model.layers.0.self_attn.q_proj.lora_A.weight", "bf16", {16, 896}, {0, 1, 2, 255, 128}});
  w.tensors.push_back({"base_model.model.layers.0.self_attn.q_proj.lora_B.weight", "f32", {896, 16}, {7, 7, 7}});
  w.checksum = weights_checksum(w.tensors);
  return w;
}

inline Telemetry sample_telemetry() {
  return {1795315123.5, "node-a/dispatcher", 3, {{"queue_depth", 12}, {"in_flight", 4.5}}};
}

}  // namespace kernelrl::test
