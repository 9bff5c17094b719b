#include "actors/evaluator.hpp"

#include "core/log.hpp"

#include <caf/all.hpp>

namespace kernelrl {

namespace {

struct evaluator_state {
  std::unique_ptr<WorkerClient> worker;
  uint64_t evaluated = 0;
  static inline const char* name = "evaluator";
};

caf::behavior evaluator_actor(caf::stateful_actor<evaluator_state>* self, EvaluatorArgs args,
                              caf::actor dispatcher) {
  auto lg = log::get("evaluator");
  self->state.worker = std::make_unique<WorkerClient>(args.worker);
  std::string err;
  if (!self->state.worker->ensure_started(err)) {
    lg->error("evaluator {}: {}", args.id, err);
    self->quit(caf::make_error(caf::sec::runtime_error, "evaluator " + args.id + ": " + err));
    return {};
  }
  lg->info("evaluator {} ready: worker pid {}, torch {}, device {}", args.id,
           self->state.worker->pid(), self->state.worker->torch_version(),
           self->state.worker->device_name());
  self->send(dispatcher, register_atom::value, caf::actor_cast<caf::actor>(self), args.id);
  return {
      [=](eval_atom, EvalRequest& req) -> EvalResult {
        auto& w = *self->state.worker;
        EvalResult r = w.evaluate(req, args.settings, args.settings.timeout_s);
        r.evaluator_id = args.id;
        ++self->state.evaluated;
        lg->debug("{} {} -> {}{}{} ({:.2f} s)", args.id, req.sample_id, to_string(r.status),
                  r.error.empty() ? "" : ": ", r.error, r.wall_s);
        return r;
      },
  };
}

}  // namespace

caf::actor spawn_evaluator(caf::actor_system& sys, EvaluatorArgs args, caf::actor dispatcher) {
  return sys.spawn<caf::detached>(evaluator_actor, std::move(args), std::move(dispatcher));
}

}  // namespace kernelrl
