// The tasks of an experiment (the files a config's [tasks] names; in core/ since the config reader
// checks that they exist): KernelBench-format Python files (class Model, get_inputs,
// get_init_inputs), one task per file, the task id being the file name without ".py". They come
// from the bundled folder or from a KernelBench checkout as it is (KernelBench/levelN/*.py), and
// are chosen by file stem, by problem number or range ("3", "1-10": the file name's leading
// number), or by a named split (tasks/splits.toml: [splits] train = [...], eval = [...]).
#pragma once

#include "core/config.hpp"

#include <map>
#include <string>
#include <vector>

namespace kernelrl {

struct Task {
  std::string id;    // file stem, e.g. "01_diag_matmul" or "1_Square_matrix_multiplication_"
  std::string path;  // absolute path of the .py file
};

class TaskSet {
 public:
  // The tasks `cfg` selects (its folder, ids or split), sorted by problem number then id, each
  // once. Returns false and sets `err` (naming the id, range, split or folder) when a selector
  // matches no file or nothing is found.
  bool load(const TasksConfig& cfg, std::string& err);
  // Every task in `dir`, or only `ids` (stems, numbers, ranges).
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

// The ids of split `name` in a splits file; false and `err` when the file or split is missing.
bool read_split(const std::string& split_file, const std::string& name, std::vector<std::string>& ids,
                std::string& err);

}  // namespace kernelrl
