// The records connect sends besides source maps and schedules, in the byte codec (core/byte_codec.hpp):
// what each worker tells the others about itself, and what rank 0's plan says (the TransferSummary every
// rank returns). Decoding checks every field against the bytes it has (fuzz/fuzz_connect_records.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "weightbridge/adapter.hpp"

namespace wb::coord {

/// What each worker tells rank 0 (and the others, which check that the job runs one mode).
struct WorkerConfig {
  bool trainer = false;
  int engine = -1;
  std::int64_t node_key = 0;  // the worker's node for the planner: WB_NODE, or a hash of its machine
  bool sender_staging = false, receiver_staging = false, verify = false;
  std::int64_t buffer_bytes = 0;
  int pipeline_depth = 0;
  bool operator==(const WorkerConfig&) const = default;
};

std::vector<std::byte> encode_worker_config(const WorkerConfig& config);
/// Throws kCorruptData on bytes that are not one.
WorkerConfig decode_worker_config(std::span<const std::byte> bytes);

/// Every field of the summary but connect_seconds (measured at the end, on rank 0).
std::vector<std::byte> encode_summary(const TransferSummary& summary);
/// Throws kCorruptData on bytes that are not one (per-node lists of another length than `nodes` included).
TransferSummary decode_summary(std::span<const std::byte> bytes);

}  // namespace wb::coord
