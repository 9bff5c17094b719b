#include "actors/service.hpp"

#include "core/log.hpp"
#include "messages/messages.hpp"
#include "store/store.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <deque>
#include <memory>
#include <set>
#include <utility>

namespace kernelrl {

namespace {

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// JSON text; bytes that are not UTF-8 (a client's, cut reasons) become U+FFFD instead of throwing.
std::string text(const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

std::string error_body(int status, const std::string& why) {
  return text(nlohmann::json{{"error", why}, {"status", status}});
}

// ---------------------------------------------------------------------------------------------
// recorder

struct recorder_state {
  std::shared_ptr<Store> store;
  service_front_actor front;
  uint64_t recorded = 0, failed = 0;
  static inline const char* name = "service-recorder";
};

service_recorder_actor::behavior_type recorder_behavior(service_recorder_actor::stateful_pointer<recorder_state> self,
                                                        std::shared_ptr<Store> store, std::string run_id) {
  self->state.store = std::move(store);
  auto lg = log::get("serve");
  return {
      [=](register_atom, caf::actor& front) { self->state.front = caf::actor_cast<service_front_actor>(front); },
      [=](record_atom, ScoredRollout& s) {
        auto& st = self->state;
        const std::string id = s.rollout.sample_id;
        int status = 200;
        std::string body, verdict = "error";
        double speedup = 0.0;
        const InsertResult ins = st.store->record_sample(run_id, s);
        if (ins == InsertResult::failed) {
          ++st.failed;
          lg->error("sample {}: not stored: {}", id, st.store->last_error());
          status = 500;
          body = error_body(500, "the verdict could not be stored: " + st.store->last_error());
        } else if (ins == InsertResult::duplicate) {  // never another candidate's record as this one's answer
          ++st.failed;
          lg->error("sample {}: the store already holds a sample with this id; this verdict is not kept", id);
          status = 500;
          body = error_body(500, "sample id " + id + " is already in the store; this verdict was not kept");
        } else if (auto row = st.store->sample(run_id, id)) {
          ++st.recorded;
          body = text(sample_json(*row));
          verdict = row->status;
          speedup = row->speedup;
        } else {
          status = 500;
          body = error_body(500, "the verdict was stored but cannot be read back: " + st.store->last_error());
        }
        if (st.front) self->send(st.front, record_atom::value, id, status, std::move(body), verdict, speedup);
      },
      [=](record_atom, Telemetry& t) { self->state.store->record_telemetry(run_id, t); },
      [=](finish_atom, std::string& summary) { return self->state.store->finish_run(run_id, "finished", summary); },
  };
}

// ---------------------------------------------------------------------------------------------
// front

struct Connection {
  HttpRequestParser parser;
  std::string peer;
  bool busy = false;      // a request of this connection is being evaluated (answers go in order)
  bool draining = false;  // refused: what still arrives is read and dropped until it closes (a close with
                          // unread bytes would reset the connection before the client reads why)
  double last_active = 0;
  uint64_t serial = 0;  // CAF 0.17's handle is the socket's descriptor, which a later connection reuses:
                        // an answer or a timer for this connection checks the serial too
  explicit Connection(HttpLimits l) : parser(l) {}
};

struct Waiting {
  caf::io::connection_handle hdl;
  uint64_t serial = 0;
  std::string request_id, peer, task_id;
  double since = 0;
  bool keep_alive = true;
};

struct front_state {
  std::map<caf::io::connection_handle, Connection> conns;
  std::map<std::string, Waiting> waiting;                // sample id -> the request that asked for it
  std::map<std::string, std::string> remote_evaluators;  // actor address -> id (joined nodes)
  uint64_t next_group = 0, next_serial = 0;
  caf::io::accept_handle acceptor;
  bool stopping = false;  // (finish_atom): no new evaluations, the listening socket closed
  uint64_t requests = 0, connections = 0;
  std::map<int, uint64_t> by_http_status;
  std::map<std::string, uint64_t> by_verdict;
  double wall_sum = 0;
  static inline const char* name = "service";
};

using front_ptr = service_front_actor::stateful_broker_pointer<front_state>;

// The connection `hdl` if it is still the one numbered `serial`, else null (closed, perhaps reused).
Connection* same(front_ptr self, caf::io::connection_handle hdl, uint64_t serial) {
  auto it = self->state.conns.find(hdl);
  return it != self->state.conns.end() && it->second.serial == serial ? &it->second : nullptr;
}

void send_response(front_ptr self, caf::io::connection_handle hdl, int status, const std::string& body, bool keep_alive,
                   const std::map<std::string, std::string>& extra = {}) {
  auto it = self->state.conns.find(hdl);
  if (it == self->state.conns.end()) return;  // the client went away; the record is kept anyway
  ++self->state.by_http_status[status];
  std::string out = http_response(status, body, keep_alive, "application/json", extra);
  self->write(hdl, out.size(), out.data());
  self->flush(hdl);
  it->second.last_active = now_s();
  if (!keep_alive) {
    self->close(hdl);  // after the answer is written
    self->state.conns.erase(it);
  }
}

void process(front_ptr self, const ServiceArgs& args, dispatcher_actor dispatcher, caf::io::connection_handle hdl);

// A request's JSON body to a Rollout; 0 and the rollout, or an HTTP status and `why`.
int parse_evaluate(front_ptr self, const ServiceArgs& args, const HttpServerRequest& req, const std::string& peer,
                   Rollout& ro, std::string& request_id, std::string& why) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(req.body);
  } catch (const nlohmann::json::parse_error& e) {
    why = std::string("the body is not JSON: ") + e.what();
    return 400;
  }
  if (!j.is_object()) {
    why = "the body must be a JSON object like {\"task\": \"TASK_ID\", \"action\": \"...\"}";
    return 400;
  }
  static const std::set<std::string> known = {"task", "task_id", "action", "code", "id", "prompt", "action_space"};
  for (auto& [k, v] : j.items())
    if (!known.count(k)) {
      why = "unknown field \"" + k + "\" (fields: task, action or code, id, prompt, action_space)";
      return 400;
    }
  auto text = [&](const char* key, std::string& out, bool& present) -> bool {
    present = false;
    if (!j.contains(key)) return true;
    if (!j[key].is_string()) {
      why = std::string("field \"") + key + "\" must be a string, not " + j[key].type_name();
      return false;
    }
    out = j[key].get<std::string>();
    present = true;
    return true;
  };
  std::string task, task2, action, code, prompt, space;
  bool has_task, has_task2, has_action, has_code, has_prompt, has_id, has_space;
  if (!text("task", task, has_task) || !text("task_id", task2, has_task2) || !text("action", action, has_action) ||
      !text("code", code, has_code) || !text("prompt", prompt, has_prompt) || !text("id", request_id, has_id) ||
      !text("action_space", space, has_space))
    return 400;
  if (has_task && has_task2) {
    why = "give the task as \"task\" or \"task_id\", not both";
    return 400;
  }
  if (has_task2) task = task2, has_task = true;
  if (!has_task || task.empty()) {
    why = "missing field \"task\" (a task id: GET /v1/tasks lists them)";
    return 400;
  }
  if (has_action == has_code) {
    why = has_action ? "give \"action\" (the policy's raw text) or \"code\" (the code itself), not both"
                     : "missing field \"action\" (the policy's raw text; or \"code\")";
    return 400;
  }
  if (request_id.size() > 256) {
    why = "field \"id\" is longer than 256 characters";
    return 400;
  }
  if (!args.task_paths.count(task)) {
    why = "no task \"" + task.substr(0, 200) + "\" in this service's task set (GET /v1/tasks lists them)";
    return 404;
  }
  if (has_space && space != args.action_space) {
    why = "action_space \"" + space + "\": this service evaluates \"" + args.action_space +
          "\" ([evaluator] action_space of its config)";
    return 422;
  }
  auto& st = self->state;
  const uint64_t group = ++st.next_group;  // from the store's largest: a reused run directory goes on
  ro.task_id = task;
  ro.group_id = group;
  ro.sample_index = 0;
  ro.sample_id = task + "#" + std::to_string(group) + ".0";
  ro.completion = has_action ? std::move(action) : std::move(code);
  ro.prompt = std::move(prompt);
  ro.sampler_id = "serve:" + peer;
  return 0;
}

nlohmann::json health_json(front_ptr self, const ServiceArgs& args) {
  auto& st = self->state;
  return {{"ok", true},
          {"run_id", args.run_id},
          {"tasks", args.task_paths.size()},
          {"action_space", args.action_space},
          {"mode", args.mode},
          {"evaluators", args.local_evaluators + st.remote_evaluators.size()},
          {"pending", st.waiting.size()},
          {"requests", st.requests}};
}

void handle(front_ptr self, const ServiceArgs& args, dispatcher_actor dispatcher, caf::io::connection_handle hdl,
            HttpServerRequest req) {
  auto& st = self->state;
  auto& conn = st.conns.at(hdl);
  ++st.requests;
  const std::string path = req.path();
  const bool keep = req.keep_alive;
  auto method_not_allowed = [&](const char* allow) {
    send_response(self, hdl, 405, error_body(405, req.method + " " + path + ": use " + allow), keep,
                  {{"Allow", allow}});
  };
  if (path == "/v1/health" || path == "/health") {
    if (req.method != "GET") return method_not_allowed("GET");
    return send_response(self, hdl, 200, text(health_json(self, args)), keep);
  }
  if (path == "/v1/tasks") {
    if (req.method != "GET") return method_not_allowed("GET");
    nlohmann::json tasks = nlohmann::json::array();
    for (auto& [id, p] : args.task_paths) {
      auto pr = args.task_prompts.find(id);
      tasks.push_back({{"id", id}, {"prompt", pr == args.task_prompts.end() ? "" : pr->second}});
    }
    return send_response(self, hdl, 200, text(nlohmann::json{{"tasks", tasks}}), keep);
  }
  if (path == "/v1/stats") {
    if (req.method != "GET") return method_not_allowed("GET");
    conn.busy = true;
    const uint64_t serial = conn.serial;
    auto answer = [=](nlohmann::json dispatcher_values) {
      auto& s = self->state;
      Connection* c = same(self, hdl, serial);
      if (!c) return;
      nlohmann::json by_status = nlohmann::json::object(), by_verdict = nlohmann::json::object();
      for (auto& [k, v] : s.by_http_status) by_status[std::to_string(k)] = v;
      for (auto& [k, v] : s.by_verdict) by_verdict[k] = v;
      uint64_t verdicts = 0;
      for (auto& [k, v] : s.by_verdict) verdicts += v;
      auto j = health_json(self, args);
      j.update({{"connections", s.conns.size()},
                {"connections_accepted", s.connections},
                {"responses_by_status", by_status},
                {"verdicts", by_verdict},
                {"mean_request_s", verdicts ? s.wall_sum / static_cast<double>(verdicts) : 0.0},
                {"dispatcher", dispatcher_values}});
      c->busy = false;
      send_response(self, hdl, 200, text(j), keep);
      process(self, args, dispatcher, hdl);
    };
    self->request(dispatcher, std::chrono::seconds(5), stats_atom::value)
        .then([=](Telemetry& t) { answer(nlohmann::json(t.values)); },
              [=](caf::error&) { answer(nlohmann::json(nullptr)); });
    return;
  }
  if (path == "/v1/evaluate") {
    if (req.method != "POST") return method_not_allowed("POST");
    Rollout ro;
    std::string request_id, why;
    if (int code = parse_evaluate(self, args, req, conn.peer, ro, request_id, why); code != 0)
      return send_response(self, hdl, code, error_body(code, why), keep);
    if (st.stopping) return send_response(self, hdl, 503, error_body(503, "the service is stopping"), false);
    if (args.local_evaluators + st.remote_evaluators.size() == 0)
      return send_response(self, hdl, 503,
                           error_body(503, "no evaluator is running (a cluster's evaluator nodes have not joined)"),
                           keep, {{"Retry-After", "5"}});
    if (st.waiting.size() >= args.max_pending)
      return send_response(self, hdl, 503,
                           error_body(503, std::to_string(st.waiting.size()) +
                                               " requests are waiting for evaluators; try again shortly"),
                           keep, {{"Retry-After", "1"}});
    Waiting w{hdl, conn.serial, request_id, conn.peer, ro.task_id, now_s(), keep};
    const std::string id = ro.sample_id;
    st.waiting.emplace(id, std::move(w));
    conn.busy = true;
    // The dispatcher's answer is its backpressure (queued; room for more): the bound above
    // already caps what one service keeps waiting.
    self->request(dispatcher, caf::infinite, std::move(ro))
        .then([](bool) {},
              [=](caf::error& e) {
                auto it = self->state.waiting.find(id);
                if (it == self->state.waiting.end()) return;
                auto h = it->second.hdl;
                bool k = it->second.keep_alive;
                Connection* c = same(self, h, it->second.serial);
                self->state.waiting.erase(it);
                if (!c) return;
                c->busy = false;
                send_response(self, h, 500, error_body(500, "the dispatcher refused it: " + self->system().render(e)),
                              k);
                process(self, args, dispatcher, h);
              });
    return;
  }
  send_response(self, hdl, 404,
                error_body(404, "no endpoint " + path.substr(0, 200) +
                                    " (POST /v1/evaluate, GET /v1/tasks, GET /v1/health, GET /v1/stats)"),
                keep);
}

// Answers every complete request buffered on `hdl`, one at a time (a request being evaluated
// holds the ones behind it: HTTP/1.1 answers in order).
void process(front_ptr self, const ServiceArgs& args, dispatcher_actor dispatcher, caf::io::connection_handle hdl) {
  while (true) {
    auto it = self->state.conns.find(hdl);
    if (it == self->state.conns.end() || it->second.busy) return;
    auto& conn = it->second;
    HttpServerRequest req;
    if (conn.parser.take(req)) {
      handle(self, args, dispatcher, hdl, std::move(req));
      continue;
    }
    if (conn.parser.take_continue()) {
      static const std::string cont = "HTTP/1.1 100 Continue\r\n\r\n";
      self->write(hdl, cont.size(), cont.data());
      self->flush(hdl);
    }
    if (conn.parser.failed() && !conn.draining) {
      const int status = conn.parser.status();
      log::get("serve")->warn("{}: {} {}; the connection is closed", conn.peer, status, conn.parser.reason());
      ++self->state.by_http_status[status];
      std::string out = http_response(status, error_body(status, conn.parser.reason()), false);
      self->write(hdl, out.size(), out.data());
      self->flush(hdl);
      conn.draining = true;
      self->delayed_send(self, std::chrono::seconds(1), linger_atom::value, hdl, conn.serial);
    }
    return;
  }
}

service_front_actor::behavior_type front_behavior(front_ptr self, ServiceArgs args, dispatcher_actor dispatcher) {
  auto lg = log::get("serve");
  self->state.next_group = args.first_group;
  self->set_down_handler([=](caf::down_msg& dm) {
    auto key = caf::to_string(dm.source);
    auto it = self->state.remote_evaluators.find(key);
    if (it == self->state.remote_evaluators.end()) return;
    lg->warn("evaluator {} left the service ({})", it->second, self->system().render(dm.reason));
    self->state.remote_evaluators.erase(it);
  });
  self->delayed_send(self, std::chrono::seconds(5), tick_atom::value);
  return {
      [=](listen_atom) -> caf::result<uint16_t> {
        auto bound = self->add_tcp_doorman(args.port, args.host.c_str(), true);
        if (!bound) return bound.error();
        self->state.acceptor = bound->first;
        return bound->second;
      },
      [=](const caf::io::new_connection_msg& m) {
        auto& st = self->state;
        ++st.connections;
        std::string peer = self->remote_addr(m.handle) + ":" + std::to_string(self->remote_port(m.handle));
        if (st.conns.size() >= args.max_connections) {
          lg->warn("{}: refused, {} connections are open", peer, st.conns.size());
          std::string out = http_response(
              503, error_body(503, std::to_string(st.conns.size()) + " connections are open; try again shortly"), false,
              "application/json", {{"Retry-After", "1"}});
          self->write(m.handle, out.size(), out.data());
          self->flush(m.handle);
          self->close(m.handle);
          return;
        }
        auto [it, fresh] = st.conns.insert_or_assign(m.handle, Connection(args.limits));
        it->second.peer = std::move(peer);
        it->second.serial = ++st.next_serial;
        it->second.last_active = now_s();
        self->configure_read(m.handle, caf::io::receive_policy::at_most(64 * 1024));
      },
      [=](const caf::io::new_data_msg& m) {
        auto it = self->state.conns.find(m.handle);
        if (it == self->state.conns.end() || it->second.draining) return;
        it->second.last_active = now_s();
        it->second.parser.feed(m.buf.data(), m.buf.size());
        // Requests pipelined behind one being evaluated wait in the parser; more than one request's
        // worth of bytes is not a client waiting its turn.
        if (it->second.parser.buffered() > args.limits.max_header_bytes + args.limits.max_body_bytes) {
          lg->warn("{}: {} bytes sent ahead of the answers; the connection is closed", it->second.peer,
                   it->second.parser.buffered());
          self->close(m.handle);
          self->state.conns.erase(it);
          return;
        }
        process(self, args, dispatcher, m.handle);
      },
      [=](const caf::io::connection_closed_msg& m) { self->state.conns.erase(m.handle); },
      [=](linger_atom, caf::io::connection_handle hdl, uint64_t serial) {
        if (!same(self, hdl, serial)) return;
        self->close(hdl);
        self->state.conns.erase(hdl);
      },
      [=](const caf::io::acceptor_closed_msg&) {
        if (!self->state.stopping) lg->error("the listening socket was closed");
      },
      [=](finish_atom) {  // the service is stopping: answer what is in flight, take nothing new
        self->state.stopping = true;
        self->close(self->state.acceptor);
      },
      [=](record_atom, std::string& sample_id, int status, std::string& body, std::string& verdict, double speedup) {
        auto& st = self->state;
        auto it = st.waiting.find(sample_id);
        if (it == st.waiting.end()) return;
        Waiting w = std::move(it->second);
        st.waiting.erase(it);
        const double wall = now_s() - w.since;
        if (status == 200) {
          // The record as the store gives it, with the client's id spliced in before its closing brace.
          if (!w.request_id.empty() && !body.empty() && body.back() == '}')
            body.insert(body.size() - 1, (body.size() > 2 ? ",\"request_id\":" : "\"request_id\":") +
                                             text(nlohmann::json(w.request_id)));
          lg->info("{}: task {} -> {} (speedup {:.3g}) in {:.2f} s", w.peer, w.task_id, verdict, speedup, wall);
        } else {
          verdict = "error";
        }
        ++st.by_verdict[verdict];
        st.wall_sum += wall;
        Connection* c = same(self, w.hdl, w.serial);
        if (!c) return;  // the client went away (its verdict is stored all the same)
        c->busy = false;
        send_response(self, w.hdl, status, body, w.keep_alive);
        process(self, args, dispatcher, w.hdl);
      },
      [=](register_atom, caf::actor& ev, std::string& id) {  // an evaluator of a joined node, via the gate
        self->monitor(ev);
        self->state.remote_evaluators[caf::to_string(ev.address())] = id;
        lg->info("evaluator {} joined the service ({} evaluators)", id,
                 args.local_evaluators + self->state.remote_evaluators.size());
      },
      [=](register_atom, sampler_atom, caf::actor&, std::string& id) {
        lg->warn("sampler {} joined, but a service samples nothing: ignored", id);
      },
      [=](register_atom, learner_atom, caf::actor&, caf::actor&, std::string& node) {
        lg->warn("the learner of node {} joined, but a service learns nothing: ignored", node);
      },
      [=](tick_atom) {  // close connections idle with nothing pending
        auto& st = self->state;
        const double t = now_s();
        std::vector<caf::io::connection_handle> idle;
        for (auto& [h, c] : st.conns)
          if (!c.busy && t - c.last_active > args.idle_timeout_s) idle.push_back(h);
        for (auto& h : idle) {
          self->close(h);
          st.conns.erase(h);
        }
        self->delayed_send(self, std::chrono::seconds(5), tick_atom::value);
      },
      [=](stats_atom) {
        auto& st = self->state;
        Telemetry t;
        t.ts = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
        t.source = "service";
        t.values = {{"requests", static_cast<double>(st.requests)},
                    {"pending", static_cast<double>(st.waiting.size())},
                    {"connections", static_cast<double>(st.conns.size())}};
        for (auto& [k, v] : st.by_verdict) t.values["verdict." + k] = static_cast<double>(v);
        return t;
      },
  };
}

}  // namespace

service_recorder_actor spawn_service_recorder(caf::actor_system& sys, const std::string& store_path,
                                              const std::string& synchronous, const std::string& run_id,
                                              const std::string& config_toml, uint64_t& last_group, std::string& err) {
  std::shared_ptr<Store> store = Store::open(store_path, synchronous, err);
  if (!store) return {};
  if (!store->begin_run(run_id, "serve", config_toml)) {
    err = store_path + ": " + store->last_error();
    return {};
  }
  last_group = store->max_group_id(run_id);
  return sys.spawn(recorder_behavior, std::move(store), run_id);
}

Service spawn_service_front(caf::actor_system& sys, ServiceArgs args, dispatcher_actor dispatcher,
                            service_recorder_actor recorder, std::string& err) {
  Service s;
  s.recorder = recorder;
  service_front_actor front = sys.middleman().spawn_broker(front_behavior, args, dispatcher);
  anon_send(recorder, register_atom::value, caf::actor_cast<caf::actor>(front));  // before any request is answered
  caf::scoped_actor self{sys};
  self->request(front, std::chrono::seconds(10), listen_atom::value)
      .receive([&](uint16_t port) { s.port = port; },
               [&](caf::error& e) {
                 err = "cannot listen on " + args.host + ":" + std::to_string(args.port) + ": " + sys.render(e);
               });
  if (!err.empty()) {
    anon_send_exit(front, caf::exit_reason::user_shutdown);
    return s;
  }
  s.front = front;
  return s;
}

}  // namespace kernelrl
