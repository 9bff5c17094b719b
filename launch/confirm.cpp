// launch confirm RUN_DIR [SAMPLE_ID...] [--reject] [--note TEXT]: a reviewer's decision on
// unconfirmed verdicts (speedups above the review threshold or beyond the device bound,
// docs/EVALUATION.md). Without sample ids it lists the run's unconfirmed samples.
#include "launch/cli.hpp"
#include "launch/commands.hpp"
#include "store/store.hpp"

#include <cstdio>
#include <filesystem>
#include <memory>

namespace fs = std::filesystem;

namespace kernelrl {

int cmd_confirm(const std::string& run_dir, const std::vector<std::string>& samples, bool reject,
                const std::string& note) {
  fs::path p = run_dir;
  if (fs::is_directory(p)) p /= "store.sqlite";
  if (!fs::exists(p)) {
    std::fprintf(stderr, "launch confirm: %s: no run store here\n", p.string().c_str());
    return 2;
  }
  std::string err;
  auto store = samples.empty() ? Store::open_readonly(p.string(), err) : Store::open(p.string(), "full", err);
  if (!store) {
    std::fprintf(stderr, "launch confirm: %s\n", err.c_str());
    return 1;
  }
  if (samples.empty()) {
    size_t n = 0;
    for (auto& r : store->samples()) {
      if (r.status != "unconfirmed") continue;
      std::printf("%s  %s  %.2fx  %s\n", r.sample_id.c_str(), r.task_id.c_str(), r.speedup,
                  r.record.result.review.c_str());
      ++n;
    }
    std::printf("%zu unconfirmed sample%s\n", n, n == 1 ? "" : "s");
    return 0;
  }
  int rc = 0;
  for (auto& id : samples) {
    std::string run;
    for (auto& r : store->runs())
      if (store->sample(r, id)) {
        if (!run.empty()) {
          std::fprintf(stderr, "launch confirm: sample %s is in runs %s and %s of %s\n", id.c_str(), run.c_str(),
                       r.c_str(), p.string().c_str());
          return 2;
        }
        run = r;
      }
    if (run.empty()) {
      std::fprintf(stderr, "launch confirm: no sample %s in %s\n", id.c_str(), p.string().c_str());
      rc = 2;
      continue;
    }
    std::string why = store->review_sample(run, id, !reject, note);
    if (!why.empty()) {
      std::fprintf(stderr, "launch confirm: %s\n", why.c_str());
      rc = std::max(rc, 1);
      continue;
    }
    std::printf("%s: %s\n", id.c_str(), reject ? "rejected (now hacked)" : "confirmed (now ok)");
  }
  return rc;
}

void add_confirm(CLI::App& app, cli::Action& action) {
  struct Args {
    std::string run_dir, note;
    std::vector<std::string> samples;
    bool reject = false;
  };
  auto a = std::make_shared<Args>();
  auto* sub = cli::subcommand(
      app, "confirm",
      "launch confirm RUN_DIR [SAMPLE_ID...] [--reject] [--note TEXT]\n"
      "  decide unconfirmed verdicts (a speedup above the review threshold or beyond the device bound):\n"
      "  confirmed ones become ok, rejected ones hacked; with no sample ids, list the run's unconfirmed samples");
  sub->add_option("RUN_DIR", a->run_dir, "the run (or its store file)")->required()->type_name("");
  sub->add_option("SAMPLE_ID", a->samples, "samples to decide")->type_name("");
  sub->add_flag("--reject", a->reject, "reject them (hacked) instead of confirming them");
  sub->add_option("--note", a->note, "why, kept with the decision")->type_name("TEXT");
  sub->callback([&action, a] {
    action = [a] {
      if (a->samples.empty() && (a->reject || !a->note.empty()))
        return cli::bad("confirm", "--reject and --note need the SAMPLE_IDs they decide");
      return cmd_confirm(a->run_dir, a->samples, a->reject, a->note);
    };
  });
}

}  // namespace kernelrl
