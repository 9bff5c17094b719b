// The tasks of an experiment: KernelBench-format Python files (class Model, get_inputs,
// get_init_inputs), one task per file, the task id being the file name without ".py".
#pragma once

#include <map>
#include <string>
#include <vector>

namespace kernelrl {

struct Task {
  std::string id;    // file stem, e.g. "01_diag_matmul"
  std::string path;  // absolute path of the .py file
};

class TaskSet {
 public:
  // Every *.py file in `dir` (not starting with '_'), sorted by id; only `ids` when non-empty.
  // Returns false and sets `err` (naming the id or folder) when an id has no file or none is found.
  bool load(const std::string& dir, const std::vector<std::string>& ids, std::string& err);

  const std::vector<Task>& tasks() const { return tasks_; }
  const Task* find(const std::string& id) const;
  const std::string& dir() const { return dir_; }
  size_t size() const { return tasks_.size(); }

 private:
  std::string dir_;
  std::vector<Task> tasks_;
  std::map<std::string, size_t> index_;
};

}  // namespace kernelrl
