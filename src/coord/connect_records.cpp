#include "coord/connect_records.hpp"

#include <climits>

#include "core/byte_codec.hpp"

namespace wb::coord {
namespace {

constexpr std::uint8_t kWorkerConfigVersion = 1, kSummaryVersion = 1;

void version(codec::ByteReader& in, std::uint8_t expected, const char* what) {
  const std::uint8_t got = in.byte();
  if (got != expected) in.fail(std::string(what) + " version " + std::to_string(got) + ", expected " + std::to_string(expected));
}

void write_list(codec::ByteWriter& out, const std::vector<std::int64_t>& values) {
  out.varint(values.size());
  for (std::int64_t v : values) out.signed_varint(v);
}

std::vector<std::int64_t> read_list(codec::ByteReader& in, const char* what) {
  std::vector<std::int64_t> values(in.count(1, what));
  for (std::int64_t& v : values) v = in.signed_varint();
  return values;
}

int read_int(codec::ByteReader& in, std::int64_t low, const char* what) {
  return static_cast<int>(in.bounded_signed(low, INT_MAX, what));
}

}  // namespace

std::vector<std::byte> encode_worker_config(const WorkerConfig& c) {
  codec::ByteWriter out;
  out.byte(kWorkerConfigVersion);
  out.byte(static_cast<std::uint8_t>((c.trainer ? 1 : 0) | (c.sender_staging ? 2 : 0) | (c.receiver_staging ? 4 : 0) |
                                     (c.verify ? 8 : 0)));
  out.signed_varint(c.engine);
  out.signed_varint(c.node_key);
  out.signed_varint(c.buffer_bytes);
  out.signed_varint(c.pipeline_depth);
  return out.take();
}

WorkerConfig decode_worker_config(std::span<const std::byte> bytes) {
  codec::ByteReader in(bytes, "worker configuration");
  version(in, kWorkerConfigVersion, "worker configuration");
  const std::uint8_t flags = in.byte();
  if (flags > 15) in.fail("flags " + std::to_string(flags) + " out of range");
  WorkerConfig c;
  c.trainer = flags & 1;
  c.sender_staging = flags & 2;
  c.receiver_staging = flags & 4;
  c.verify = flags & 8;
  c.engine = read_int(in, -1, "engine");
  c.node_key = in.signed_varint();
  c.buffer_bytes = in.bounded_signed(0, INT64_MAX, "buffer bytes");
  c.pipeline_depth = read_int(in, 1, "pipeline depth");
  in.expect_done();
  return c;
}

std::vector<std::byte> encode_summary(const TransferSummary& s) {
  codec::ByteWriter out;
  out.byte(kSummaryVersion);
  for (int v : {s.workers, s.trainer_nodes, s.rollout_nodes, s.rounds}) out.varint(static_cast<std::uint64_t>(v));
  for (std::int64_t v : {s.model_bytes, s.max_node_need_bytes, s.bytes_per_update, s.inter_node_bytes})
    out.varint(static_cast<std::uint64_t>(v));
  out.float64(s.t_min_seconds);
  out.float64(s.simulated_seconds);
  write_list(out, std::vector<std::int64_t>(s.node_of_worker.begin(), s.node_of_worker.end()));
  write_list(out, s.node_ingress_bytes);
  write_list(out, s.node_egress_bytes);
  write_list(out, s.node_need_bytes);
  return out.take();
}

TransferSummary decode_summary(std::span<const std::byte> bytes) {
  codec::ByteReader in(bytes, "transfer summary");
  version(in, kSummaryVersion, "transfer summary");
  TransferSummary s;
  for (int* v : {&s.workers, &s.trainer_nodes, &s.rollout_nodes, &s.rounds})
    *v = static_cast<int>(in.bounded(INT_MAX, "count"));
  for (std::int64_t* v : {&s.model_bytes, &s.max_node_need_bytes, &s.bytes_per_update, &s.inter_node_bytes})
    *v = static_cast<std::int64_t>(in.bounded(INT64_MAX, "bytes"));
  s.t_min_seconds = in.float64();
  s.simulated_seconds = in.float64();
  const std::vector<std::int64_t> nodes = read_list(in, "workers' nodes");
  s.node_ingress_bytes = read_list(in, "nodes' ingress bytes");
  s.node_egress_bytes = read_list(in, "nodes' egress bytes");
  s.node_need_bytes = read_list(in, "nodes' needs");
  in.expect_done();
  if (nodes.size() != static_cast<std::size_t>(s.workers))
    in.fail(std::to_string(nodes.size()) + " workers' nodes for " + std::to_string(s.workers) + " workers");
  const std::size_t node_count = s.node_ingress_bytes.size();
  if (s.node_egress_bytes.size() != node_count || s.node_need_bytes.size() != node_count)
    in.fail("per-node lists of different lengths");
  for (std::int64_t node : nodes) {
    if (node < 0 || static_cast<std::size_t>(node) >= node_count) in.fail("a worker on node " + std::to_string(node));
    s.node_of_worker.push_back(static_cast<int>(node));
  }
  return s;
}

}  // namespace wb::coord
