// Every message survives CAF serialization between two actor systems (through the io middleman
// on loopback, as between nodes) and a msgpack round trip, field for field.
#include "message_samples.hpp"

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <catch2/catch.hpp>

using namespace kernelrl;
using namespace kernelrl::test;

namespace {

using echo_atom = caf::atom_constant<caf::atom("echo")>;

caf::behavior echo(caf::event_based_actor*) {
  return {[](echo_atom, caf::message& m) { return m; }};
}

struct TwoSystems {
  static caf::actor_system_config& with_types(caf::actor_system_config& cfg) {
    add_message_types(cfg);
    cfg.load<caf::io::middleman>();
    cfg.set("logger.verbosity", caf::atom("quiet"));
    return cfg;
  }
  caf::actor_system_config cfg_a, cfg_b;
  caf::actor_system a{with_types(cfg_a)};
  caf::actor_system b{with_types(cfg_b)};
  caf::actor server, remote;

  TwoSystems() {
    server = a.spawn(echo);
    auto port = a.middleman().publish(server, 0, "127.0.0.1");
    REQUIRE(port);
    auto r = b.middleman().remote_actor("127.0.0.1", *port);
    REQUIRE(r);
    remote = *r;
  }
  ~TwoSystems() {  // an actor system waits for its actors: end the echo server first
    caf::anon_send_exit(server, caf::exit_reason::user_shutdown);
    remote = nullptr;
  }

  // Sends `x` from system b to system a and back; returns what came back.
  template <class T>
  T round_trip(const T& x) {
    caf::scoped_actor self{b};
    T out{};
    bool got = false;
    self->request(remote, std::chrono::seconds(10), echo_atom::value, caf::make_message(x))
        .receive(
            [&](T& x) {
              out = std::move(x);
              got = true;
            },
            [&](caf::error& e) { WARN("round trip failed: " << b.render(e)); });
    REQUIRE(got);
    return out;
  }
};

template <class T>
T msgpack_round_trip(const T& x) {
  msgpack::sbuffer buf;
  msgpack::pack(buf, x);
  auto h = msgpack::unpack(buf.data(), buf.size());
  T out{};
  h.get().convert(out);
  return out;
}

}  // namespace

TEST_CASE("every message round-trips through CAF serialization between two actor systems", "[messages]") {
  TwoSystems ts;
  CHECK(ts.round_trip(sample_rollout()) == sample_rollout());
  CHECK(ts.round_trip(sample_request()) == sample_request());
  CHECK(ts.round_trip(sample_result()) == sample_result());
  CHECK(ts.round_trip(sample_scored()) == sample_scored());
  CHECK(ts.round_trip(sample_step()) == sample_step());
  CHECK(ts.round_trip(sample_checkpoint()) == sample_checkpoint());
  CHECK(ts.round_trip(sample_weights()) == sample_weights());
  CHECK(ts.round_trip(sample_telemetry()) == sample_telemetry());
  // A round trip that changes a field is noticed (the comparison is not vacuous).
  auto changed = sample_rollout();
  changed.logprobs[2] = -0.5f;
  CHECK_FALSE(ts.round_trip(changed) == sample_rollout());
}

TEST_CASE("every message round-trips through msgpack", "[messages]") {
  CHECK(msgpack_round_trip(sample_rollout()) == sample_rollout());
  CHECK(msgpack_round_trip(sample_request()) == sample_request());
  CHECK(msgpack_round_trip(sample_result()) == sample_result());
  CHECK(msgpack_round_trip(sample_scored()) == sample_scored());
  CHECK(msgpack_round_trip(sample_step()) == sample_step());
  CHECK(msgpack_round_trip(sample_checkpoint()) == sample_checkpoint());
  CHECK(msgpack_round_trip(sample_weights()) == sample_weights());
  CHECK(msgpack_round_trip(sample_telemetry()) == sample_telemetry());
}

TEST_CASE("msgpack form is a map keyed by field name, tolerant of added and missing keys", "[messages]") {
  // A peer with a newer message adds a key and omits another: known fields still arrive.
  msgpack::sbuffer buf;
  msgpack::packer<msgpack::sbuffer> pk(buf);
  pk.pack_map(3);
  pk.pack("median_ms");
  pk.pack(2.5);
  pk.pack("trials");
  pk.pack(9);
  pk.pack("p99_ms");
  pk.pack(7.0);
  auto h = msgpack::unpack(buf.data(), buf.size());
  RuntimeStats s;
  h.get().convert(s);
  CHECK(s.median_ms == 2.5);
  CHECK(s.trials == 9);
  CHECK(s.mean_ms == 0);
}

TEST_CASE("status names round-trip and unknown names are rejected", "[messages]") {
  for (int i = 0; i <= 8; ++i) {
    auto s = static_cast<EvalStatus>(i);
    EvalStatus back = EvalStatus::ok;
    REQUIRE(from_string(to_string(s), back));
    CHECK(back == s);
  }
  EvalStatus out = EvalStatus::ok;
  CHECK_FALSE(from_string("crashed", out));
  CHECK(make_sample_id("t", 3, 1) == "t#3.1");
}

TEST_CASE("a weights update's checksum covers every tensor's name, dtype, shape and bytes", "[messages]") {
  const std::vector<TensorBlob> t = {{"a.lora_A.weight", "f32", {2, 1}, {0, 0, 128, 63, 0, 0, 0, 64}},
                                     {"a.lora_B.weight", "f32", {1, 1}, {0, 0, 0, 0}}};
  const auto u = make_weights_update(4, t);
  CHECK(u.version == 4);
  CHECK(u.checksum.size() == 64);
  CHECK(u.checksum == weights_checksum(t));
  auto changed = [&](auto edit) {
    auto c = t;
    edit(c);
    return weights_checksum(c) != u.checksum;
  };
  CHECK(changed([](auto& c) { c[0].data[7] ^= 1; }));
  CHECK(changed([](auto& c) { c[0].shape = {1, 2}; }));
  CHECK(changed([](auto& c) { c[1].name = "b.lora_B.weight"; }));
  CHECK(changed([](auto& c) { c[1].dtype = "bf16"; }));
  CHECK(changed([](auto& c) { std::swap(c[0], c[1]); }));
  CHECK(changed([](auto& c) { c.pop_back(); }));
  // Boundaries are part of it: moving a byte from one tensor's name to its dtype changes it.
  CHECK(changed([](auto& c) {
    c[0].name = "a.lora_A.weigh";
    c[0].dtype = "tf32";
  }));
  // Through msgpack and back (CAF: sample_weights in the round trips above), the update still verifies.
  CHECK(weights_checksum(msgpack_round_trip(u).tensors) == msgpack_round_trip(u).checksum);
}
