// service: `launch serve`, the evaluator as an HTTP/JSON service for other RL frameworks. Two actors:
//   front    a typed CAF broker on a TCP port: parses HTTP/1.1 (core/http_server.hpp), validates each
//            request, turns `POST /v1/evaluate {"task", "action"}` into a Rollout for the dispatcher
//            (the same queue, evaluators, local or joined from other nodes, and reward as a run) and
//            answers with the stored record once it is in. A bad request is answered 4xx with its
//            reason and never reaches an evaluator; a connection that sends garbage is answered and
//            closed; nothing a client sends stops the server.
//   recorder the store's one writer: every verdict is kept (RUN_DIR/store.sqlite) whether or not its
//            client is still connected, and the answer is the record as `launch export` prints it.
// Endpoints: POST /v1/evaluate, GET /v1/tasks, GET /v1/health, GET /v1/stats.
// Messages in: their typed interfaces, messages/interfaces.hpp service_front_actor (the network's
// events, the recorder's verdicts, the gate's joined peers) and service_recorder_actor.
#pragma once

#include "core/http_server.hpp"
#include "messages/interfaces.hpp"

#include <caf/actor.hpp>

#include <cstdint>
#include <map>
#include <string>

namespace kernelrl {

struct ServiceArgs {
  std::string host = "127.0.0.1";
  uint16_t port = 0;                                // 0: a free port, chosen by the system
  std::map<std::string, std::string> task_paths;    // the tasks requests may name: id -> file
  std::map<std::string, std::string> task_prompts;  // id -> its user message (GET /v1/tasks)
  std::string action_space = "forward_body";        // [evaluator] action_space (one per service)
  std::string mode = "fast";                        // [evaluator] mode, reported by /v1/health
  uint32_t local_evaluators = 0;                    // this process's evaluators
  uint32_t max_pending = 1024;                      // requests waiting for verdicts; beyond: 503
  uint32_t max_connections = 512;                   // open connections; beyond: 503 and close
  double idle_timeout_s = 120;                      // an idle connection (no request pending) is closed
  HttpLimits limits;
  std::string run_id;        // Rollout ids and the store's run
  uint64_t first_group = 0;  // group ids continue from here (the store's largest, for a reused run directory)
};

struct Service {
  service_front_actor front;
  service_recorder_actor recorder;
  uint16_t port = 0;
};

// The recorder first (reward needs it), then the front once the dispatcher exists.
// `last_group`: the largest group id the run already holds (a service restarted in its run directory).
service_recorder_actor spawn_service_recorder(caf::actor_system& sys, const std::string& store_path,
                                              const std::string& synchronous, const std::string& run_id,
                                              const std::string& config_toml, uint64_t& last_group, std::string& err);

// Binds host:port and starts answering; an invalid actor and `err` when it cannot listen.
Service spawn_service_front(caf::actor_system& sys, ServiceArgs args, dispatcher_actor dispatcher,
                            service_recorder_actor recorder, std::string& err);

}  // namespace kernelrl
