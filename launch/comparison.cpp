// Comparison configs: one file that runs several strategies on the same base settings.
//
//   [comparison]
//   arms = ["rl", "best_of_n", "ttt"]  # run in this order, each in RUN_DIR/ARM
//   compare = ["best_of_n", "ttt"]     # the arms put side by side (default: all)
//   allow_mismatch = false             # compare even when the arms' budgets differ
//   seeds = [0, 1, 2]                  # each arm once per seed, in RUN_DIR/ARM/seed-S (default: once)
//   [arm.best_of_n.experiment]         # overrides merged into the rest of the file
//   mode = "best_of_n"
//   k = 64
//   [arm.best_of_n.policy]
//   adapter = "arm:rl"                 # start from what an earlier arm learned
//
// `adapter = "arm:NAME"` names an earlier train/ttt/sdpo arm: when this arm starts, it becomes that
// arm's best checkpoint (its best held-out version, else its Best-of-Adaptation step, else its
// newest checkpoint).
//
// Every arm is the rest of the file with its [arm.NAME] tables merged in, validated like any
// config before anything runs. Each arm runs as its own `launch ARM.toml --run-dir RUN_DIR/ARM`
// process (an arm that already finished, i.e. has compute.json, is not run again); then
// `launch compare` puts the arms side by side (refusing unequal budgets unless allowed) and its
// JSON goes to RUN_DIR/comparison.json.
#include "launch/commands.hpp"
#include "wiring/child.hpp"
#include "launch/setup.hpp"

#include "core/config.hpp"
#include "core/config_toml.hpp"
#include "core/log.hpp"
#include "core/machine.hpp"
#include "core/paths.hpp"
#include "store/store.hpp"

#include <nlohmann/json.hpp>
#include <toml++/toml.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

struct Arm {
  std::string name;
  Config cfg;
  std::string adapter_from;  // "arm:NAME": the arm whose best checkpoint this one starts from
};

std::string fmt_where(const std::string& file, uint32_t line, uint32_t column) {
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

// `over` moved into `base`, tables recursively, anything else replaced. Moving keeps each node's
// place in the file (its errors' FILE:LINE:COL); a copy would lose it.
void merge(toml::table& base, toml::table&& over) {
  for (auto& [k, v] : over) {
    auto* bt = base.get(k) ? base.get(k)->as_table() : nullptr;
    if (bt && v.is_table())
      merge(*bt, std::move(*v.as_table()));
    else
      base.insert_or_assign(k, std::move(v));
  }
}

std::string where_in(const std::string& path, const toml::node& n) {
  return fmt_where(path, n.source().begin.line, n.source().begin.column);
}

// [comparison]'s keys: arms, compare, seeds, allow_mismatch; false after printing what is wrong.
bool read_comparison(const std::string& path, const toml::table& cmp, std::vector<std::string>& names,
                     std::vector<std::string>& compare, std::vector<uint64_t>& seeds, bool& allow_mismatch) {
  // comparison.arms and comparison.compare: arrays of arm names.
  auto read_names = [&](const toml::node& v, const std::string& key, std::vector<std::string>& out) {
    auto* a = v.as_array();
    if (!a) {
      std::fprintf(stderr, "%s: comparison.%s: expected an array of arm names\n", where_in(path, v).c_str(),
                   key.c_str());
      return false;
    }
    bool good = true;
    for (auto& x : *a) {
      if (!x.is_string()) {
        std::fprintf(stderr, "%s: comparison.%s: expected arm names (strings)\n", where_in(path, x).c_str(),
                     key.c_str());
        good = false;
      } else {
        out.push_back(x.as_string()->get());
      }
    }
    return good;
  };
  bool ok = true;
  for (auto& [k, v] : cmp) {
    std::string key(k.str());
    if (key == "arms" || key == "compare") {
      ok = read_names(v, key, key == "arms" ? names : compare) && ok;
    } else if (key == "seeds") {
      auto* a = v.as_array();
      std::set<int64_t> distinct;
      bool good = a && !a->empty();
      if (a)
        for (auto& x : *a) {
          auto i = x.value<int64_t>();
          if (!x.is_integer() || !i || *i < 0 || !distinct.insert(*i).second)
            good = false;
          else
            seeds.push_back(uint64_t(*i));
        }
      if (!good) {
        std::fprintf(stderr,
                     "%s: comparison.seeds: expected a non-empty array of distinct seeds (integers >= 0), e.g. "
                     "[0, 1, 2]\n",
                     where_in(path, v).c_str());
        ok = false;
      }
    } else if (key == "allow_mismatch") {
      if (!v.is_boolean()) {
        std::fprintf(stderr, "%s: comparison.allow_mismatch: expected true or false\n", where_in(path, v).c_str());
        ok = false;
      } else {
        allow_mismatch = v.as_boolean()->get();
      }
    } else {
      std::fprintf(stderr, "%s: comparison.%s: unknown key (expected arms, compare, allow_mismatch, seeds)\n",
                   where_in(path, v).c_str(), key.c_str());
      ok = false;
    }
  }
  return ok;
}

// The arms' names against their [arm.NAME] tables and comparison.compare; false after printing
// what is wrong (`ok`: whether [comparison] read well; a short compare list is reported only then).
bool check_arm_names(const std::string& path, const toml::table& cmp, const toml::table* arm_tables,
                     const std::vector<std::string>& names, const std::vector<std::string>& compare, bool ok) {
  const std::string where = where_in(path, cmp);
  std::set<std::string> seen;
  if (names.size() < 2) {
    std::fprintf(stderr, "%s: comparison.arms: expected at least two arms, got %zu\n", where.c_str(), names.size());
    ok = false;
  }
  for (auto& n : names) {
    if (!seen.insert(n).second) {
      std::fprintf(stderr, "%s: comparison.arms: \"%s\" is listed twice\n", where.c_str(), n.c_str());
      ok = false;
    }
    if (n.empty() ||
        n.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos) {
      std::fprintf(stderr,
                   "%s: comparison.arms: \"%s\": arm names use letters, digits, - and _ (each names a folder)\n",
                   where.c_str(), n.c_str());
      ok = false;
    }
    if (!arm_tables || !arm_tables->get(n) || !arm_tables->get(n)->is_table()) {
      std::fprintf(stderr, "%s: comparison.arms: \"%s\" has no [arm.%s] table\n", where.c_str(), n.c_str(), n.c_str());
      ok = false;
    }
  }
  if (arm_tables)
    for (auto& [k, v] : *arm_tables)
      if (!seen.count(std::string(k.str()))) {
        std::fprintf(stderr, "%s: arm.%s: not listed in comparison.arms\n", where_in(path, v).c_str(),
                     std::string(k.str()).c_str());
        ok = false;
      }
  std::set<std::string> compared;
  for (auto& c : compare) {
    if (!seen.count(c)) {
      std::fprintf(stderr, "%s: comparison.compare: \"%s\" is not one of comparison.arms\n", where.c_str(), c.c_str());
      ok = false;
    } else if (!compared.insert(c).second) {
      std::fprintf(stderr, "%s: comparison.compare: \"%s\" is listed twice\n", where.c_str(), c.c_str());
      ok = false;
    }
  }
  if (cmp.get("compare") && compare.size() < 2 && ok) {
    std::fprintf(stderr, "%s: comparison.compare: expected at least two arms, got %zu\n", where.c_str(),
                 compare.size());
    ok = false;
  }
  return ok;
}

// Arm `n`'s policy.adapter = "arm:NAME" (an earlier learning arm's best checkpoint, known once that
// arm has run): `from` = NAME and the key erased (set when the arm starts). False when it names no
// earlier learning arm of one checkpoint (printed, unless that arm was itself invalid: then `n` is
// marked invalid too).
bool adapter_from_arm(const std::string& path, const std::string& n, toml::table& t, const std::vector<Arm>& arms,
                      std::set<std::string>& invalid, std::string& from) {
  auto* pol = t["policy"].as_table();
  if (!pol || !pol->get("adapter") || !pol->get("adapter")->is_string()) return true;
  std::string ad = pol->get("adapter")->as_string()->get();
  if (ad.rfind("arm:", 0) != 0) return true;
  from = ad.substr(4);
  const Arm* earlier = nullptr;
  for (auto& a : arms)
    if (a.name == from) earlier = &a;
  if (!earlier && invalid.count(from)) {  // its own errors are reported
    invalid.insert(n);
    return false;
  }
  if (!earlier) {
    std::fprintf(stderr,
                 "%s: arm %s: policy.adapter = \"%s\": expected an arm listed before \"%s\" in comparison.arms\n",
                 path.c_str(), n.c_str(), ad.c_str(), n.c_str());
    return false;
  }
  const char* m = name(earlier->cfg.experiment.mode);
  if (!traits(earlier->cfg.experiment.mode).learns) {
    std::fprintf(stderr,
                 "%s: arm %s: policy.adapter = \"%s\": arm %s (mode %s) learns nothing (expected a train, "
                 "ttt or sdpo arm)\n",
                 path.c_str(), n.c_str(), ad.c_str(), from.c_str(), m);
    return false;
  }
  if (earlier->cfg.experiment.per_task) {
    std::fprintf(stderr,
                 "%s: arm %s: policy.adapter = \"%s\": arm %s adapts one adapter per task (per_task = true): "
                 "there is no one checkpoint to start from\n",
                 path.c_str(), n.c_str(), ad.c_str(), from.c_str());
    return false;
  }
  pol->erase("adapter");  // validated without it; set when the arm starts
  return true;
}

// The arms of a comparison config, validated; false after printing every problem.
bool load_arms(const std::string& path, std::vector<Arm>& arms, bool& allow_mismatch, std::vector<std::string>& compare,
               std::vector<uint64_t>& seeds) {
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    std::fprintf(stderr, "%s:%u:%u: (syntax): %s\n", path.c_str(), e.source().begin.line, e.source().begin.column,
                 std::string(e.description()).c_str());
    return false;
  }
  if (!root["comparison"].is_table()) {
    std::fprintf(stderr, "%s: comparison: expected a table ([comparison])\n", path.c_str());
    return false;
  }
  const toml::table& cmp = *root["comparison"].as_table();
  std::vector<std::string> names;
  bool ok = read_comparison(path, cmp, names, compare, seeds, allow_mismatch);
  ok = check_arm_names(path, cmp, root["arm"].as_table(), names, compare, ok);
  if (!ok) return false;
  if (compare.empty()) compare = names;
  std::set<std::string> invalid;  // arms already reported: what refers to them adds nothing
  for (auto& n : names) {
    // The file read again for each arm, its [arm.NAME] moved into the rest: every node keeps its place.
    toml::table t = toml::parse_file(path);
    toml::table over = std::move(*t["arm"][n].as_table());
    t.erase("comparison");
    t.erase("arm");
    merge(t, std::move(over));
    std::string from;
    if (!adapter_from_arm(path, n, t, arms, invalid, from)) {
      ok = false;
      continue;
    }
    std::vector<ConfigError> set_errs;
    if (!apply_overrides(t, config_overrides(), set_errs)) {
      for (auto& e : set_errs) std::fprintf(stderr, "%s\n", e.format().c_str());
      return false;
    }
    auto r = read_config(t, path);
    if (auto* errs = std::get_if<std::vector<ConfigError>>(&r)) {
      blame_overrides(*errs, config_overrides());
      std::fprintf(stderr, "%s: arm %s (the file's settings with [arm.%s] merged in) is not a valid config:\n",
                   path.c_str(), n.c_str(), n.c_str());
      for (auto& e : *errs) std::fprintf(stderr, "  %s\n", e.format().c_str());
      invalid.insert(n);
      ok = false;
      continue;
    }
    arms.push_back({n, std::get<Config>(std::move(r)), from});
  }
  return ok;
}

}  // namespace

bool is_comparison_config(const std::string& path) {
  try {
    auto root = toml::parse_file(path);
    return root["comparison"].is_table();
  } catch (const std::exception&) {
    return false;  // load_config reports what is wrong with it
  }
}

// Whether what each arm holds at once fits this machine (core/machine.hpp plan_step); else says
// which arm does not and why.
static bool arms_fit(const std::string& path, const std::vector<Arm>& arms, const char* prefix) {
  for (auto& a : arms)
    if (std::string why = plan_step(a.cfg, machine_memory_mb()).problem(); !why.empty()) {
      std::fprintf(stderr, "%s%s: arm %s: %s\n", prefix, path.c_str(), a.name.c_str(), why.c_str());
      return false;
    }
  return true;
}

int cmd_check_comparison(const std::string& path) {
  std::vector<Arm> arms;
  std::vector<std::string> compare;
  std::vector<uint64_t> seeds;
  bool allow = false;
  if (!load_arms(path, arms, allow, compare, seeds)) return 2;
  if (!arms_fit(path, arms, "launch check: ")) return 2;
  std::string list;
  for (auto& c : compare) list += (list.empty() ? "" : ", ") + c;
  std::string seed_list;
  for (auto s : seeds) seed_list += (seed_list.empty() ? "" : ", ") + std::to_string(s);
  std::printf("# %s: a comparison of %zu arms, each valid (budgets %s)%s; compared: %s\n", path.c_str(), arms.size(),
              allow ? "may differ: allow_mismatch = true" : "must match",
              seeds.empty() ? "" : (", each run with seeds " + seed_list).c_str(), list.c_str());
  for (auto& a : arms)
    std::printf(
        "\n# arm %s%s\n%s\n", a.name.c_str(),
        a.adapter_from.empty() ? "" : (" (policy.adapter: arm " + a.adapter_from + "'s best checkpoint)").c_str(),
        a.cfg.resolved_toml.c_str());
  return 0;
}

namespace {
// The checkpoint an arm that learned hands on: its best held-out version, else its
// Best-of-Adaptation step, else its newest checkpoint; "" and `err` when there is none.
std::string best_checkpoint(const std::string& run_dir, std::string& err) {
  auto store = Store::open_readonly((fs::path(run_dir) / "store.sqlite").string(), err);
  if (store) {
    for (auto& id : store->runs()) {
      auto j = nlohmann::json::parse(store->summary(id), nullptr, false);
      if (!j.is_object()) continue;
      for (const char* k : {"eval_best", "boa"})
        if (j.contains(k) && j[k].contains("checkpoint") && fs::is_directory(j[k]["checkpoint"].get<std::string>()))
          return j[k]["checkpoint"].get<std::string>();
    }
  }
  auto all = list_checkpoints((fs::path(run_dir) / "checkpoints").string());
  if (all.empty()) err = run_dir + ": no checkpoints/step-N";
  return all.empty() ? std::string() : all.back().second;
}
// An arm's name in an experiment tracker: ARM, or ARM-seed-S.
std::string label_of(const std::string& arm, const std::optional<uint64_t>& seed) {
  return seed ? arm + "-seed-" + std::to_string(*seed) : arm;
}

}  // namespace

int cmd_run_comparison(const std::string& path, const std::string& run_dir_arg, const std::string& log_level) {
  std::vector<Arm> arms;
  std::vector<std::string> compare;
  std::vector<uint64_t> seeds;
  bool allow = false;
  if (!load_arms(path, arms, allow, compare, seeds)) return 2;
  if (!arms_fit(path, arms, "launch: ")) return 2;
  const auto& first = arms.front().cfg;
  std::string root = run_dir_arg.empty() ? make_run_dir(first.experiment.run_root, first.experiment.name)
                                         : fs::absolute(run_dir_arg).lexically_normal().string();
  std::error_code ec;
  fs::create_directories(root, ec);
  if (ec) {
    std::fprintf(stderr, "launch: %s: cannot create the comparison's directory: %s\n", root.c_str(),
                 ec.message().c_str());
    return 2;
  }
  std::printf("comparison of %zu arms in %s%s\n", arms.size(), root.c_str(),
              seeds.empty() ? "" : (", each with " + std::to_string(seeds.size()) + " seeds").c_str());
  std::fflush(stdout);
  const std::string exe = self_exe();
  std::vector<std::string> dirs;
  // Each arm once, or once per seed ([experiment] seed and [sampler] seed set to it) in ARM/seed-S.
  const std::vector<std::optional<uint64_t>> runs_of = [&] {
    std::vector<std::optional<uint64_t>> v;
    for (auto s : seeds) v.push_back(s);
    if (v.empty()) v.push_back(std::nullopt);
    return v;
  }();
  for (auto& a : arms) {
    const fs::path arm_dir = fs::path(root) / a.name;
    if (std::find(compare.begin(), compare.end(), a.name) != compare.end()) dirs.push_back(arm_dir.string());
    for (auto& seed : runs_of) {
      const std::string sub = seed ? "seed-" + std::to_string(*seed) : std::string();
      const std::string label = a.name + (seed ? " (seed " + std::to_string(*seed) + ")" : std::string());
      const std::string dir = (seed ? arm_dir / sub : arm_dir).string();
      if (fs::exists(fs::path(dir) / "compute.json")) {
        std::printf("arm %s: already done in %s\n", label.c_str(), dir.c_str());
        continue;
      }
      if (clear_unfinished(dir))
        std::printf("arm %s: its unfinished run in %s starts again\n", label.c_str(), dir.c_str());
      std::string cfg = (fs::path(root) / (a.name + (seed ? "." + sub : std::string()) + ".toml")).string();
      auto t = toml::parse(a.cfg.resolved_toml);
      if (seed) {
        t["experiment"].as_table()->insert_or_assign("seed", int64_t(*seed));
        t["sampler"].as_table()->insert_or_assign("seed", int64_t(*seed));
      }
      if (!a.adapter_from.empty()) {  // the earlier arm's best checkpoint (of the same seed)
        std::string err;
        const fs::path from = fs::path(root) / a.adapter_from;
        std::string ck = best_checkpoint((seed ? from / sub : from).string(), err);
        if (ck.empty()) {
          std::fprintf(stderr, "launch: arm %s starts from arm %s's best checkpoint, but %s\n", label.c_str(),
                       a.adapter_from.c_str(), err.c_str());
          return 2;
        }
        if (!t["policy"].is_table()) t.insert("policy", toml::table{});
        t["policy"].as_table()->insert_or_assign("adapter", ck);
        std::printf("arm %s starts from arm %s's best checkpoint: %s\n", label.c_str(), a.adapter_from.c_str(),
                    ck.c_str());
      }
      if (a.cfg.tracking.backend != "none") {  // every arm and the comparison's table in one place
        auto* tr = t["tracking"].as_table();
        if (a.cfg.tracking.name.empty()) tr->insert_or_assign("name", label_of(a.name, seed));
        if (a.cfg.tracking.dir.empty()) tr->insert_or_assign("dir", (fs::path(root) / "tracking").string());
      }
      std::ostringstream text;
      text << t;
      std::ofstream(cfg) << text.str();
      std::printf("arm %s (%s): launch %s --run-dir %s\n", label.c_str(), name(a.cfg.experiment.mode), cfg.c_str(),
                  dir.c_str());
      std::fflush(stdout);
      std::vector<std::string> argv = {exe, cfg, "--run-dir", dir};
      if (!log_level.empty()) argv.insert(argv.end(), {"--log-level", log_level});
      int rc = run_child(argv);
      if (rc != 0) {
        std::fprintf(stderr,
                     "launch: arm %s failed (exit %d); the runs before it are kept; run the same command with "
                     "--run-dir %s to go on\n",
                     label.c_str(), rc, root.c_str());
        return rc < 0 ? 1 : rc;
      }
    }
  }
  std::vector<std::string> cmp = {exe, "compare"};
  cmp.insert(cmp.end(), dirs.begin(), dirs.end());
  if (allow) cmp.push_back("--allow-mismatch");
  std::vector<std::string> cmp_json = cmp;
  cmp_json.push_back("--json");
  int jrc = run_child(cmp_json, (fs::path(root) / "comparison.json").string());
  if (jrc != 0) fs::remove(fs::path(root) / "comparison.json", ec);
  std::printf("\n");
  std::fflush(stdout);
  int rc = run_child(cmp);
  if (rc == 0) {
    std::printf("\ncomparison: %s\nreport: ", (fs::path(root) / "comparison.json").string().c_str());
    std::fflush(stdout);
    run_child({exe, "report", root});  // prints the page's path
    const auto& tr = first.tracking;
    if (tr.backend != "none" && fs::exists(fs::path(root) / "comparison.json")) {  // the comparison's table
      std::vector<std::string> argv = {tr.python,      source_dir() + "/tracking/tracker.py",
                                       "--comparison", (fs::path(root) / "comparison.json").string(),
                                       "--backend",    tr.backend,
                                       "--project",    tr.project,
                                       "--dir",        tr.dir.empty() ? (fs::path(root) / "tracking").string() : tr.dir,
                                       "--name",       tr.name.empty() ? fs::path(root).filename().string() : tr.name};
      const int pid = start_child(argv, (fs::path(root) / "tracking.log").string());
      if (pid < 0 || !finish_child(pid, 120))
        std::fprintf(stderr, "launch: [tracking] %s: the comparison's table was not logged (see %s/tracking.log)\n",
                     tr.backend.c_str(), root.c_str());
    }
  }
  return rc < 0 ? 1 : rc;
}

}  // namespace kernelrl
