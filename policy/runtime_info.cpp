#include "policy/runtime_info.hpp"

#include <torch/torch.h>

namespace kernelrl {

TorchRuntimeInfo torch_runtime_info() {
  TorchRuntimeInfo info;
  info.version = TORCH_VERSION;
  info.cuda_available = torch::cuda::is_available();
  info.cuda_devices = info.cuda_available ? static_cast<int>(torch::cuda::device_count()) : 0;
  return info;
}

}  // namespace kernelrl
