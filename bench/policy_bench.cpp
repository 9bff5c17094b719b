// policy_bench: sampling throughput of the built-in policy (learner/policy.hpp) on fixed-length
// work, for bench/policy_throughput.py. Prompts are random token ids; nothing stops a sequence
// early unless the model's config names an eos token.
//   policy_bench --model DIR --device cuda:0 --dtype bf16 --batch B --prompt-len P --new-tokens N
//                [--repeats R] [--temperature T] [--top-p P]
// Prints one JSON object: tokens generated, seconds of each timed repeat, tokens/s (best and mean).
#include "learner/policy.hpp"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <map>
#include <random>
#include <string>

int main(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i + 1 < argc; i += 2) a[argv[i]] = argv[i + 1];
  auto get = [&](const char* k, const char* d) { return a.count(k) ? a[k] : std::string(d); };
  try {
    kernelrl::PolicyOptions o;
    o.model_dir = get("--model", "");
    o.device = get("--device", "cuda:0");
    o.dtype = get("--dtype", "bf16");
    auto policy = kernelrl::Policy::load(o);
    int B = std::stoi(get("--batch", "16")), P = std::stoi(get("--prompt-len", "64"));
    int N = std::stoi(get("--new-tokens", "128")), R = std::stoi(get("--repeats", "3"));
    std::mt19937 rng(1);
    std::uniform_int_distribution<int32_t> tok(10, int32_t(policy->vocab_size()) - 1);
    std::vector<std::vector<int32_t>> prompts(B, std::vector<int32_t>(P));
    for (auto& p : prompts)
      for (auto& t : p) t = tok(rng);
    kernelrl::SamplingParams sp;
    sp.temperature = std::stod(get("--temperature", "1.0"));
    sp.top_p = std::stod(get("--top-p", "1.0"));
    sp.max_tokens = N;
    sp.skip_special = true;
    policy->generate_ids(prompts, sp);  // warm-up: CUDA context, cuBLAS handles, allocator
    nlohmann::json runs = nlohmann::json::array();
    double best = 0, sum = 0;
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
      runs.push_back({{"seconds", s}, {"tokens", tokens}, {"tokens_per_s", tps}});
    }
    nlohmann::json j = {{"batch", B}, {"prompt_len", P}, {"new_tokens", N}, {"runs", runs},
                        {"tokens_per_s_best", best}, {"tokens_per_s_mean", sum / R}};
    std::printf("%s\n", j.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "policy_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
