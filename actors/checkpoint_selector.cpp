#include "actors/checkpoint_selector.hpp"

#include "core/files.hpp"
#include "core/log.hpp"
#include "core/paths.hpp"
#include "messages/messages.hpp"
#include "store/store.hpp"

#include <caf/all.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

struct Entry {
  Checkpoint c;
  bool scored = false;
  StepStats stats;
};

struct selector_state {
  std::map<uint32_t, Entry> entries;    // by step
  std::map<uint32_t, StepStats> early;  // scores that arrived before their checkpoint
  std::set<uint32_t> pinned;            // steps never deleted (versions a held-out evaluation scored)
  static inline const char* name = "checkpoint_selector";
};

using self_ptr = selector_actor::stateful_pointer<selector_state>;

const Entry* best_of(const selector_state& st) {
  const Entry* best = nullptr;
  for (auto& [step, e] : st.entries)  // ascending steps: the earliest wins a tie
    if (e.scored && (!best || e.c.score > best->c.score)) best = &e;
  return best;
}

void prune(self_ptr self, const SelectorArgs& args) {
  auto& st = self->state;
  if (args.dir.empty()) return;
  const Entry* best = best_of(st);
  std::vector<uint32_t> steps;
  for (auto& [s, e] : st.entries) steps.push_back(s);
  size_t n = steps.size();
  for (size_t i = 0; i < n; ++i) {
    uint32_t s = steps[i];
    auto& e = st.entries[s];
    bool keep = s == 0 || args.keep_last == 0 || i + args.keep_last >= n || !e.scored || (best && best->c.step == s) ||
                st.pinned.count(s);
    if (keep) continue;
    std::string err;
    if (!remove_tree(e.c.path, err)) log::get("checkpoint_selector")->warn("cannot delete {}: {}", e.c.path, err);
    st.entries.erase(s);
  }
}

void score(self_ptr self, const SelectorArgs& args, Entry& e, const StepStats& s) {
  e.scored = true;
  e.stats = s;
  e.c.score = s.fast_1;
  if (!e.c.path.empty()) {
    std::string err;
    if (!write_file_durably((fs::path(e.c.path) / "stats.json").string(), step_stats_json(s).dump(2) + "\n", err))
      log::get("checkpoint_selector")->error("{} (its score is kept in the store)", err);
  }
  prune(self, args);
}

selector_actor::behavior_type selector_behavior(self_ptr self, SelectorArgs args) {
  // What an earlier run (being resumed) left: step-N folders, scored where stats.json exists.
  if (!args.dir.empty()) {
    for (auto& [n, path] : list_checkpoints(args.dir)) {
      try {
        const uint32_t step = uint32_t(n);
        Entry e;
        e.c = Checkpoint{step, step, path, -1.0};
        std::ifstream in(fs::path(path) / "stats.json");
        if (in) {
          auto j = nlohmann::json::parse(in);
          e.scored = true;
          e.c.score = j.at("fast_1").get<double>();
          e.stats.step = step;
          e.stats.fast_1 = e.c.score;
        }
        self->state.entries[step] = e;
      } catch (const std::exception& ex) {
        log::get("checkpoint_selector")->warn("{}: ignored: {}", path, ex.what());
      }
    }
  }
  return {
      [=](Checkpoint& c) {
        auto& st = self->state;
        Entry& e = st.entries[c.step];
        e.c = std::move(c);
        e.scored = false;
        auto it = st.early.find(e.c.step);
        if (it != st.early.end()) {
          score(self, args, e, it->second);
          st.early.erase(it);
        }
      },
      [=](record_atom, StepStats& s) {
        auto& st = self->state;
        auto it = st.entries.find(s.step);
        if (it == st.entries.end()) {
          st.early[s.step] = s;
          return;
        }
        score(self, args, it->second, s);
      },
      [=](keep_atom, uint32_t step) { self->state.pinned.insert(step); },
      [=](best_atom) -> caf::result<Checkpoint> {
        const Entry* best = best_of(self->state);
        if (!best) return caf::make_error(caf::sec::runtime_error, "checkpoint_selector: no scored checkpoint yet");
        return best->c;
      },
  };
}

}  // namespace

selector_actor spawn_checkpoint_selector(caf::actor_system& sys, SelectorArgs args) {
  return sys.spawn(selector_behavior, std::move(args));
}

}  // namespace kernelrl
