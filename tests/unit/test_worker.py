"""The evaluation worker's pure decisions (no processes): which GPU its processes see."""

import os
import sys
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "gpu"))

from worker import device_view  # noqa: E402


class DeviceViewTest(unittest.TestCase):
    def test_a_gpu_is_shown_alone_as_cuda_0(self):
        self.assertEqual(device_view("cuda:1", {}), ("cuda:0", {"CUDA_VISIBLE_DEVICES": "1"}))
        self.assertEqual(device_view("cuda:0", {}), ("cuda:0", {"CUDA_VISIBLE_DEVICES": "0"}))
        self.assertEqual(device_view("cuda", {}), ("cuda:0", {"CUDA_VISIBLE_DEVICES": "0"}))

    def test_the_users_list_is_narrowed_not_replaced(self):
        env = {"CUDA_VISIBLE_DEVICES": "4, 6,7"}
        self.assertEqual(device_view("cuda:1", env), ("cuda:0", {"CUDA_VISIBLE_DEVICES": "6"}))
        self.assertEqual(device_view("cuda:0", {"CUDA_VISIBLE_DEVICES": "GPU-8f1e,MIG-2a"}),
                         ("cuda:0", {"CUDA_VISIBLE_DEVICES": "GPU-8f1e"}))
        self.assertEqual(env, {"CUDA_VISIBLE_DEVICES": "4, 6,7"})  # the worker's own is left as it is

    def test_a_device_outside_the_list_is_left_for_torch_to_refuse(self):
        self.assertEqual(device_view("cuda:3", {"CUDA_VISIBLE_DEVICES": "0,1"}), ("cuda:3", {}))
        self.assertEqual(device_view("cuda:0", {"CUDA_VISIBLE_DEVICES": ""}), ("cuda:0", {}))

    def test_a_cpu_worker_shows_no_gpu(self):
        self.assertEqual(device_view("cpu", {"CUDA_VISIBLE_DEVICES": "0"}), ("cpu", {"CUDA_VISIBLE_DEVICES": ""}))
        self.assertEqual(device_view("cpu", {}), ("cpu", {"CUDA_VISIBLE_DEVICES": ""}))


if __name__ == "__main__":
    unittest.main()
