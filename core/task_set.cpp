#include "core/task_set.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <set>

namespace fs = std::filesystem;

namespace kernelrl {

namespace {

// The leading problem number of a file stem ("12_conv" -> 12); -1 when it has none.
long problem_number(const std::string& id) {
  size_t i = 0;
  while (i < id.size() && std::isdigit(static_cast<unsigned char>(id[i]))) ++i;
  if (i == 0 || i > 9) return -1;
  return std::stol(id.substr(0, i));
}

// "7" -> [7, 7]; "1-10" -> [1, 10]; false for anything else.
bool parse_range(const std::string& s, long& lo, long& hi) {
  auto digits = [](const std::string& x) {
    return !x.empty() && x.size() <= 9 &&
           std::all_of(x.begin(), x.end(), [](unsigned char ch) { return std::isdigit(ch); });
  };
  auto dash = s.find('-');
  if (dash == std::string::npos) {
    if (!digits(s)) return false;
    lo = hi = std::stol(s);
    return true;
  }
  std::string a = s.substr(0, dash), b = s.substr(dash + 1);
  if (!digits(a) || !digits(b)) return false;
  lo = std::stol(a);
  hi = std::stol(b);
  return lo <= hi;
}

}  // namespace

bool read_split(const std::string& split_file, const std::string& name, std::vector<std::string>& ids,
                std::string& err) {
  toml::table t;
  try {
    t = toml::parse_file(split_file);
  } catch (const toml::parse_error& e) {
    err = split_file + ": " + std::string(e.description());
    return false;
  }
  auto* arr = t["splits"][name].as_array();
  if (!arr) {
    err = split_file + ": no split \"" + name + "\" (expected [splits] " + name + " = [ids...])";
    return false;
  }
  ids.clear();
  for (auto& e : *arr) {
    auto v = e.value<std::string>();
    if (!v) {
      err = split_file + ": splits." + name + ": expected an array of strings";
      return false;
    }
    ids.push_back(*v);
  }
  return true;
}

bool TaskSet::load(const TasksConfig& cfg, std::string& err) {
  std::vector<std::string> ids = cfg.ids;
  if (!cfg.split.empty() && !read_split(cfg.split_file, cfg.split, ids, err)) return false;
  if (!cfg.split.empty() && ids.empty()) {
    err = cfg.split_file + ": split \"" + cfg.split + "\" is empty";
    return false;
  }
  return load(cfg.folder(), ids, err);
}

bool TaskSet::load(const std::string& dir, const std::vector<std::string>& ids, std::string& err) {
  dir_ = dir;
  tasks_.clear();
  index_.clear();
  std::error_code ec;
  std::vector<Task> all;
  for (auto& e : fs::directory_iterator(dir, ec)) {
    auto p = e.path();
    if (e.is_regular_file() && p.extension() == ".py" && p.filename().string()[0] != '_')
      all.push_back({p.stem().string(), fs::absolute(p).lexically_normal().string()});
  }
  if (ec) {
    err = dir + ": cannot list task folder: " + ec.message();
    return false;
  }
  std::sort(all.begin(), all.end(), [](const Task& a, const Task& b) {
    long na = problem_number(a.id), nb = problem_number(b.id);
    return na != nb ? na < nb : a.id < b.id;
  });
  if (ids.empty()) {
    tasks_ = all;
  } else {
    std::set<std::string> taken;
    for (auto& sel : ids) {
      long lo = 0, hi = 0;
      bool range = parse_range(sel, lo, hi);
      bool matched = false;
      for (auto& t : all) {
        long n = problem_number(t.id);
        bool hit = range ? (n >= lo && n <= hi) : t.id == sel;
        matched = matched || hit;
        if (hit && taken.insert(t.id).second) tasks_.push_back(t);
      }
      if (!matched) {
        err = range ? "no task numbered " + sel + " in " + dir : "no task file " + sel + ".py in " + dir;
        return false;
      }
    }
  }
  if (tasks_.empty()) {
    err = dir + ": no task files (*.py) found";
    return false;
  }
  for (size_t i = 0; i < tasks_.size(); ++i) index_[tasks_[i].id] = i;
  return true;
}

const Task* TaskSet::find(const std::string& id) const {
  auto it = index_.find(id);
  return it == index_.end() ? nullptr : &tasks_[it->second];
}

}  // namespace kernelrl
