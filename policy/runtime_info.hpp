// What the linked LibTorch is and can see. The only learner/ header in this build; it keeps
// <torch/torch.h> out of everything that includes it.
#pragma once

#include <string>

namespace kernelrl {

struct TorchRuntimeInfo {
  std::string version;  // LibTorch version, e.g. "2.11.0"
  bool cuda_available = false;
  int cuda_devices = 0;
};

TorchRuntimeInfo torch_runtime_info();

}  // namespace kernelrl
