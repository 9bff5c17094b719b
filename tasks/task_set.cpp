#include "tasks/task_set.hpp"

#include <algorithm>
#include <filesystem>

namespace fs = std::filesystem;

namespace kernelrl {

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
  std::sort(all.begin(), all.end(), [](const Task& a, const Task& b) { return a.id < b.id; });
  if (ids.empty()) {
    tasks_ = all;
  } else {
    for (auto& id : ids) {
      auto it = std::find_if(all.begin(), all.end(), [&](const Task& t) { return t.id == id; });
      if (it == all.end()) {
        err = "tasks.ids: no task file " + id + ".py in " + dir;
        return false;
      }
      tasks_.push_back(*it);
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
