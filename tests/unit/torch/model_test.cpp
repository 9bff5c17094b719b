// The policy's model and decoder on the embedded policy (policies/local, a 4-layer Qwen2), on the
// CPU: the model's shapes, its key-value cache against one full pass, and the decoder's bookkeeping
// (rows reused by continuous batching, each token's logprob) against the model's own scoring, with
// PyTorch's log_softmax as the reference for the math.
#include "core/paths.hpp"
#include "policy/decoder.hpp"
#include "policy/model.hpp"

#include <catch2/catch.hpp>
#include <torch/torch.h>

#include <map>

using namespace kernelrl;

namespace {
CausalLM& model() {
  static CausalLM m(source_dir() + "/policies/local", torch::kCPU, torch::kFloat32);
  return m;
}

torch::Tensor ids_of(const std::vector<std::vector<int64_t>>& rows) {
  auto t = torch::zeros({int64_t(rows.size()), int64_t(rows[0].size())}, torch::kInt64);
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t j = 0; j < rows[i].size(); ++j) t[int64_t(i)][int64_t(j)] = rows[i][j];
  return t;
}

torch::Tensor positions(int64_t batch, int64_t from, int64_t n) {
  return torch::arange(from, from + n, torch::kInt64).unsqueeze(0).expand({batch, n}).contiguous();
}
}  // namespace

TEST_CASE("the model's logits and sequence logprobs have their shapes and PyTorch's values", "[model]") {
  torch::NoGradGuard ng;
  auto& m = model();
  const auto& cfg = m.config();
  CHECK(cfg.vocab_size == 1559);
  auto ids = ids_of({{5, 17, 300, 42, 9}, {1, 2, 3, 4, 5}});
  auto logits = m.forward(ids, positions(2, 0, 5), torch::Tensor());
  REQUIRE(logits.sizes() == torch::IntArrayRef({2, 5, 1559}));
  CHECK(m.hidden(ids, positions(2, 0, 5), torch::Tensor(), nullptr, 0, false).sizes() ==
        torch::IntArrayRef({2, 5, 128}));
  auto lp = m.sequence_logprobs(ids, false);
  REQUIRE(lp.sizes() == torch::IntArrayRef({2, 4}));
  auto want = torch::log_softmax(logits.to(torch::kFloat32), -1)
                  .slice(1, 0, 4)
                  .gather(2, ids.slice(1, 1, 5).unsqueeze(-1))
                  .squeeze(-1);
  CHECK(torch::allclose(lp, want, 1e-5, 1e-5));
  // At temperature 2 the distribution is softmax(logits / 2).
  auto lp2 = m.sequence_logprobs(ids, false, 2.0);
  auto want2 = torch::log_softmax(logits.to(torch::kFloat32) / 2.0, -1)
                   .slice(1, 0, 4)
                   .gather(2, ids.slice(1, 1, 5).unsqueeze(-1))
                   .squeeze(-1);
  CHECK(torch::allclose(lp2, want2, 1e-5, 1e-5));
}

TEST_CASE("a prefill and steps through the key-value cache give the full pass's logits", "[model]") {
  torch::NoGradGuard ng;
  auto& m = model();
  auto ids = ids_of({{5, 17, 300, 42, 9, 77}, {8, 6, 4, 2, 1, 3}});
  auto full = m.forward(ids, positions(2, 0, 6), torch::Tensor());
  auto cache = m.new_cache(2, 16);
  REQUIRE(cache.k.size() == 4);
  CHECK(cache.k[0].sizes() == torch::IntArrayRef({2, 2, 16, 32}));  // [batch, kv heads, capacity, head dim]
  // bool [batch, 1, T, S]: query i of the T new ones may attend to slots [0, cache_pos + i].
  auto causal = [](int64_t pos, int64_t T) {
    auto q = torch::arange(pos, pos + T).view({T, 1});
    auto k = torch::arange(0, pos + T).view({1, pos + T});
    return (k <= q).view({1, 1, T, pos + T}).expand({2, 1, T, pos + T});
  };
  auto pre = m.forward(ids.slice(1, 0, 3), positions(2, 0, 3), causal(0, 3), &cache, 0);
  CHECK(torch::allclose(pre, full.slice(1, 0, 3), 1e-4, 1e-4));
  for (int64_t t = 3; t < 6; ++t) {
    auto step = m.forward(ids.slice(1, t, t + 1), positions(2, t, 1), causal(t, 1), &cache, t);
    CHECK(torch::allclose(step, full.slice(1, t, t + 1), 1e-4, 1e-4));
  }
}

TEST_CASE("the decoder's sequences and logprobs: every row reused, each token scored as the model scores it",
          "[decoder]") {
  auto& m = model();
  const std::vector<std::vector<int32_t>> prompts{{5, 17, 300, 42}, {9, 8, 7}};
  SamplingParams s;
  s.n = 3;
  s.max_tokens = 6;
  s.seed = 11;
  const int32_t eos = 2;
  auto run = [&](int64_t max_rows) {
    std::map<int64_t, std::pair<std::vector<int32_t>, std::vector<float>>> got;
    Decoder d(m);
    d.generate(prompts, s, max_rows, [&](int64_t seq, int32_t token, float logprob) {
      auto& g = got[seq];
      g.first.push_back(token);
      g.second.push_back(logprob);
      return token == eos || g.first.size() >= s.max_tokens;
    });
    return got;
  };
  for (int64_t rows : {0, 2}) {  // every sequence at once; two rows for six sequences
    auto got = run(rows);
    REQUIRE(got.size() == 6);
    for (auto& [seq, g] : got) {
      REQUIRE(seq < 6);
      CHECK((g.first.size() == s.max_tokens || g.first.back() == eos));
      const auto& prompt = prompts[size_t(seq / s.n)];
      std::vector<int64_t> row(prompt.begin(), prompt.end());
      row.insert(row.end(), g.first.begin(), g.first.end());
      torch::NoGradGuard ng;
      auto lp = m.sequence_logprobs(ids_of({row}), false, s.temperature);
      for (size_t j = 0; j < g.first.size(); ++j)
        CHECK(g.second[j] == Approx(lp[0][int64_t(prompt.size() - 1 + j)].item<float>()).margin(1e-3));
    }
    if (rows == 2) CHECK(run(2) == got);  // the same seed, the same tokens
  }
}
