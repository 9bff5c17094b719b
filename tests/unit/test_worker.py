"""The evaluation worker's pure decisions (no processes): which GPU its processes see, when an
evaluation ran out of memory, and the device's memory shared among workers (gpu/devlock.py)."""

import os
import sys
import tempfile
import threading
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # for the gpu package

from gpu import devlock  # noqa: E402
from gpu.worker import device_view, ran_out_of_memory  # noqa: E402


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


class OutOfMemoryTest(unittest.TestCase):
    def test_what_counts_as_running_out_of_memory(self):
        self.assertTrue(ran_out_of_memory({"status": "out_of_memory", "error": "the evaluation needs more memory"}))
        self.assertTrue(ran_out_of_memory({"status": "runtime_error",
                                           "error": "ModelNew() raised OutOfMemoryError: CUDA out of memory."}))
        self.assertFalse(ran_out_of_memory({"status": "runtime_error", "error": "RuntimeError: shape mismatch"}))
        self.assertFalse(ran_out_of_memory({"status": "incorrect", "error": "out of memory in the message"}))
        self.assertFalse(ran_out_of_memory({"status": "ok"}))

    def test_pytorchs_failed_nvml_report_is_an_allocation_failure(self):
        # What PyTorch 2.11's caching allocator raises, out of memory, where NVML cannot start
        # (seen on the lent H100 with four evaluators on the GPU): not a runtime error of the code.
        from gpu import harness
        e = RuntimeError('NVML_SUCCESS == DriverAPI::get()->nvmlInit_v2_() INTERNAL ASSERT FAILED at '
                         '"/pytorch/c10/cuda/CUDACachingAllocator.cpp":1135, please report a bug to PyTorch.')
        self.assertTrue(harness._is_oom(e))
        self.assertIn("out of memory", harness._short_exc(e))
        self.assertFalse(harness._is_oom(RuntimeError("INTERNAL ASSERT FAILED at c10/core/TensorImpl.cpp")))


class MemoryShareTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.shares = []

    def tearDown(self):
        for m in self.shares:
            m.close()
        self.tmp.cleanup()

    def share(self, key="GPU-test"):
        m = devlock.MemoryShare(key, self.tmp.name)
        self.shares.append(m)
        return m

    def test_a_worker_knows_whether_another_evaluates_on_its_device(self):
        a = self.share()
        self.assertFalse(a.others())
        b = self.share()
        other_gpu = self.share("GPU-other")
        self.assertTrue(a.others())
        self.assertTrue(b.others())
        self.assertFalse(other_gpu.others())
        self.shares.remove(b)
        b.close()
        self.assertFalse(a.others())

    def test_a_retry_waits_for_every_evaluation_and_keeps_new_ones_out(self):
        a, b, c = self.share(), self.share(), self.share()
        self.assertTrue(a.hold("shared", 1))
        self.assertTrue(b.hold("shared", 1))  # evaluations side by side
        self.assertFalse(c.hold("exclusive", 0.1))  # not while they run; gives up in time
        self.assertIsNone(c.lock.state)
        granted = []
        waiter = threading.Thread(target=lambda: granted.append(c.hold("exclusive", 10)))
        waiter.start()
        time.sleep(0.2)
        a.release()
        self.assertFalse(a.hold("shared", 0.2))  # a new evaluation waits behind the retry
        b.release()
        waiter.join()
        self.assertEqual(granted, [True])
        self.assertFalse(b.hold("shared", 0.1))  # nor starts while the retry runs
        c.release()
        self.assertTrue(b.hold("shared", 1))
        self.assertEqual(b.lock.state, "shared")


if __name__ == "__main__":
    unittest.main()
