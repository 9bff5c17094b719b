"""The actors' typed interfaces (messages/interfaces.hpp) as the compiler holds them: a program that
sends an actor a message its interface lists compiles; one that sends it a message its interface
does not list, or asks it for an answer of the wrong type, does not, and the compiler says why (CAF's
static assertion). Each program is checked with the product's compiler and C++ standard (CXX and
CXX_FLAGS, given by tests/CMakeLists.txt; CAF and msgpack from the system's include path), syntax
only."""

import concurrent.futures
import os
import shlex
import shutil
import subprocess
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PRE = """#include "messages/interfaces.hpp"
#include <caf/all.hpp>
"""

HEAD = """#include "pre.hpp"
using namespace kernelrl;
void f(caf::event_based_actor* self, reward_actor reward, selector_actor selector, evaluator_actor evaluator,
       dispatcher_actor dispatcher, rollout_sink sink, sampler_actor sampler, learner_actor learner,
       monitor_actor monitor, gate_actor gate, supervisor_actor supervisor, service_recorder_actor service,
       service_front_actor front) {
"""

RIGHT = """  self->send(reward, score_atom::value, Rollout{}, EvalResult{});
  self->send(selector, Checkpoint{});
  self->send(selector, record_atom::value, StepStats{});
  self->send(selector, keep_atom::value, uint32_t(3));
  self->request(selector, caf::infinite, best_atom::value).then([](Checkpoint&) {});
  self->request(evaluator, caf::infinite, eval_atom::value, EvalRequest{}).then([](EvalResult&) {});
  self->send(evaluator, withdraw_atom::value, std::string("s1"));
  self->request(dispatcher, caf::infinite, Rollout{}).then([](bool) {});
  self->send(dispatcher, skip_atom::value, Rollout{}, std::string("left out"));
  self->send(dispatcher, register_atom::value, caf::actor{}, std::string("n1/cuda:0"));
  self->request(dispatcher, caf::infinite, stats_atom::value).then([](Telemetry&) {});
  sink = dispatcher;  // a sampler's rollouts may go to the dispatcher itself
  self->request(sink, caf::infinite, Rollout{}).then([](bool) {});
  self->send(sink, skip_atom::value, Rollout{}, std::string("left out"));
  self->request(sampler, caf::infinite, plan_atom::value, uint32_t(0)).then([](uint64_t) {});
  self->request(sampler, caf::infinite, SamplePlan{}).then([](uint64_t) {});
  self->request(sampler, caf::infinite, WeightsUpdate{}).then([](uint64_t) {});
  self->request(sampler, caf::infinite, stats_atom::value).then([](Telemetry&) {});
  std::vector<sampler_actor> samplers = as_typed<sampler_actor>(as_actors(std::vector<sampler_actor>{sampler}));
  self->request(learner, caf::infinite, sync_atom::value, as_actors(samplers)).then([](uint64_t) {});
  self->request(learner, caf::infinite, sync_atom::value, caf::actor{}, std::string("sampler-b-0"))
      .then([](uint64_t) {});
  self->request(learner, caf::infinite, plan_atom::value, uint32_t(1), uint64_t(4)).then([](StepUpdate&) {});
  self->send(learner, train_atom::value, ScoredRollout{}, true);
  self->request(learner, caf::infinite, stats_atom::value).then([](Telemetry&) {});
  self->send(monitor, register_atom::value, caf::actor{}, std::string("sampler-b-0"));
  self->request(monitor, caf::infinite, stats_atom::value).then([](Telemetry&) {});
  self->request(monitor, caf::infinite, finish_atom::value).then([](bool) {});
  self->request(gate, caf::infinite, hello_atom::value).then([](std::vector<std::string>&) {});
  self->request(gate, caf::infinite, join_atom::value, std::string("n1"), std::string("c"), uint32_t(1),
                std::string("proof")).then([](bool) {});
  self->request(gate, caf::infinite, learner_atom::value).then([](std::string&, bool) {});
  self->request(gate, caf::infinite, monitor_atom::value).then([](std::string&, caf::actor&) {});
  self->request(gate, caf::infinite, register_atom::value, monitor_atom::value, caf::actor{}).then([](bool) {});
  self->request(gate, caf::infinite, register_atom::value, sampler_atom::value, caf::actor{}, std::string("s"),
                std::string("digest")).then([](bool) {});
  sink = gate;  // a sampler node's rollouts go to the head's gate
  self->request(supervisor, caf::infinite, plan_atom::value, std::vector<caf::actor>{}, std::vector<caf::actor>{})
      .then([](std::string&) {});
  self->send(supervisor, record_atom::value, ScoredRollout{});
  self->send(supervisor, record_atom::value, Telemetry{});
  self->send(supervisor, register_atom::value, sampler_atom::value, caf::actor{}, std::string("sampler-b-0"));
  self->send(supervisor, register_atom::value, learner_atom::value, caf::actor{}, caf::actor{}, std::string("b"));
  self->send(supervisor, register_atom::value, caf::actor{}, std::string("n1/cuda:0"));
  self->send(supervisor, interrupt_atom::value, std::string("SIGINT"));
  // the shared parts: what the monitor asks, where the reward and the monitor record, what ends a run
  std::vector<telemetry_source> sources{supervisor, dispatcher, sampler, learner};
  score_recorder scores = supervisor;
  telemetry_recorder snapshots = supervisor;
  scores = service;  // under `launch serve`, its recorder
  self->send(service, register_atom::value, caf::actor{});
  self->request(service, caf::infinite, finish_atom::value, std::string("{}")).then([](bool) {});
  self->request(front, caf::infinite, listen_atom::value).then([](uint16_t) {});
  self->send(front, record_atom::value, std::string("t#1.0"), 200, std::string("{}"), std::string("ok"), 1.5);
  self->send(front, finish_atom::value);
  self->send(front, linger_atom::value, caf::io::connection_handle{}, uint64_t(7));
  sources.push_back(front);
  join_listener joined = supervisor;  // where the gate tells of joined peers: the supervisor, or the front
  joined = front;
  self->send(joined, register_atom::value, learner_atom::value, caf::actor{}, caf::actor{}, std::string("b"));
  final_snapshot last = monitor;
  last = gate;
  self->request(last, caf::infinite, finish_atom::value).then([](bool) {});
}
"""

WRONG = {
    "a message the reward does not take": "  self->send(reward, record_atom::value, StepStats{});\n}\n",
    "the selector's record without its stats": "  self->send(selector, record_atom::value);\n}\n",
    "an answer of the wrong type": "  self->request(selector, caf::infinite, best_atom::value).then([](StepStats&) {});\n}\n",
    "a question the evaluator does not answer": "  self->send(evaluator, stats_atom::value, true);\n}\n",
    "a rollout sent to the evaluator (it takes requests)":
        "  self->send(evaluator, eval_atom::value, Rollout{});\n}\n",
    "a verdict sent to the dispatcher": "  self->send(dispatcher, score_atom::value, Rollout{}, EvalResult{});\n}\n",
    "a skipped rollout without why": "  self->send(dispatcher, skip_atom::value, Rollout{});\n}\n",
    "the dispatcher's answer read as a verdict": "  self->request(dispatcher, caf::infinite, Rollout{})"
                                                 ".then([](EvalResult&) {});\n}\n",
    "an evaluator registering with a rollout sink": "  self->send(sink, register_atom::value, caf::actor{}, "
                                                    "std::string(\"n1/cpu-0\"));\n}\n",
    "a rollout sent to a sampler": "  self->send(sampler, Rollout{});\n}\n",
    "a plan's step not a uint32_t": "  self->send(sampler, plan_atom::value, uint64_t(0));\n}\n",
    "an evaluator registering with a sampler": "  self->send(sampler, register_atom::value, caf::actor{}, "
                                               "std::string(\"n1/cpu-0\"));\n}\n",
    "the learner given typed samplers (they travel as caf::actor)":
        "  self->send(learner, sync_atom::value, std::vector<sampler_actor>{sampler});\n}\n",
    "a sample without whether its group is complete": "  self->send(learner, train_atom::value, ScoredRollout{});\n}\n",
    "a step's update read as a version": "  self->request(learner, caf::infinite, plan_atom::value, uint32_t(1), "
                                         "uint64_t(4)).then([](uint64_t) {});\n}\n",
    "a stray string to the monitor": "  self->send(monitor, std::string(\"a stray request\"));\n}\n",
    "the monitor given a typed sampler (it travels as caf::actor)":
        "  self->send(monitor, register_atom::value, sampler, std::string(\"sampler-b-0\"));\n}\n",
    "the monitor's last snapshot read as telemetry": "  self->request(monitor, caf::infinite, finish_atom::value)"
                                                     ".then([](Telemetry&) {});\n}\n",
    "a join without its protocol version": "  self->send(gate, join_atom::value, std::string(\"n1\"), "
                                          "std::string(\"c\"), std::string(\"proof\"));\n}\n",
    "the gate's learner answer read as a bool alone": "  self->request(gate, caf::infinite, learner_atom::value)"
                                                       ".then([](bool) {});\n}\n",
    "a typed monitor registered with the gate (it travels as caf::actor)":
        "  self->send(gate, register_atom::value, monitor_atom::value, monitor);\n}\n",
    "the run's summary read as a bool": "  self->request(supervisor, caf::infinite, plan_atom::value, "
                                        "std::vector<caf::actor>{}, std::vector<caf::actor>{}).then([](bool) {});\n}\n",
    "a verdict sent to the supervisor unscored": "  self->send(supervisor, record_atom::value, EvalResult{});\n}\n",
    "an interrupt without why": "  self->send(supervisor, interrupt_atom::value);\n}\n",
    "the service's end without its summary": "  self->send(service, finish_atom::value);\n}\n",
    "a verdict to the front without its speedup": "  self->send(front, record_atom::value, std::string(\"t#1.0\"), 200, "
                                                   "std::string(\"{}\"), std::string(\"ok\"));\n}\n",
    "a typed recorder registered with the gate's listener": "  join_listener j = front;\n"
                                                            "  self->send(j, register_atom::value, service);\n}\n",
    "a verdict read as a rollout": "  self->request(evaluator, caf::infinite, eval_atom::value, EvalRequest{})"
                                   ".then([](Rollout&) {});\n}\n",
}


class Compiler:
    """The product's compiler (CXX, CXX_FLAGS) on snippets after HEAD, syntax only; the headers
    every snippet includes (PRE) compiled once into a precompiled header beside them, which the
    compiler takes in their place (where it cannot, it reads the headers: the same verdicts)."""

    def __init__(self):
        self.cxx = os.environ.get("CXX", "c++")
        self.flags = shlex.split(os.environ.get("CXX_FLAGS", f"-std=c++20 -I{ROOT}"))
        self.dir = tempfile.mkdtemp(prefix="kernelrl-interfaces-")
        pre = os.path.join(self.dir, "pre.hpp")
        with open(pre, "w") as f:
            f.write(PRE)
        subprocess.run([self.cxx, *self.flags, "-x", "c++-header", pre, "-o", pre + ".gch"],
                       capture_output=True, text=True, timeout=300)

    def __call__(self, body):
        fd, path = tempfile.mkstemp(suffix=".cpp", dir=self.dir)
        with os.fdopen(fd, "w") as f:
            f.write(HEAD + body)
        try:
            return subprocess.run([self.cxx, f"-I{self.dir}", *self.flags, "-fsyntax-only", path],
                                  capture_output=True, text=True, timeout=300)
        finally:
            os.unlink(path)

    def close(self):
        shutil.rmtree(self.dir, ignore_errors=True)


class TypedInterfacesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.compile = Compiler()

    @classmethod
    def tearDownClass(cls):
        cls.compile.close()

    def test_messages_the_interfaces_list_compile(self):
        p = self.compile(RIGHT)
        self.assertEqual(p.returncode, 0, p.stderr[-3000:])

    def test_messages_they_do_not_list_are_refused_by_the_compiler(self):
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
            results = dict(zip(WRONG, pool.map(self.compile, WRONG.values())))
        for what, p in results.items():
            with self.subTest(what):
                self.assertNotEqual(p.returncode, 0, f"{what}: compiled")
                self.assertRegex(p.stderr, r"static.assert(ion)? failed", f"{what}: failed for another reason")


if __name__ == "__main__":
    unittest.main()
