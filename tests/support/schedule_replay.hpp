// Test support: plays every rank's round schedule in one process on host memory, stage by stage, and
// checks what the data plane will rely on: every write lands inside a region its receiver expects from
// that peer in that stage, every region is filled exactly once, buffers stay inside their slots, and a
// relay (a lag 1 write) forwards only bytes that arrived in the round before. Receive buffers are a ring
// of pipeline_depth slots, refilled with garbage when a round reuses one, so a relay that read a slot
// after its reuse would forward garbage. The result is every rollout worker's parameters, to compare bit
// for bit with what its load_weights gives.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "plan/round_schedule.hpp"
#include "weightbridge/correspondence.hpp"

namespace wb::testing_support {

using Bytes = std::vector<std::byte>;

inline std::int64_t element_position(const SliceCopy& copy, std::span<const std::int64_t> index) {
  std::int64_t at = copy.offset;
  for (std::size_t a = 0; a < index.size(); ++a) at += index[a] * copy.strides[a];
  return at;
}

/// Calls fn(box-relative index, row-major ordinal) for every element of the box.
template <class Fn>
void for_each_element(const Box& box, Fn&& fn) {
  const std::size_t ndim = box.extent.size();
  if (box.numel() == 0) return;
  std::vector<std::int64_t> index(ndim, 0);
  for (std::int64_t ordinal = 0;; ++ordinal) {
    fn(std::span<const std::int64_t>(index), ordinal);
    std::size_t a = ndim;
    while (a-- > 0) {
      if (++index[a] < box.extent[a]) break;
      index[a] = 0;
    }
    if (a == static_cast<std::size_t>(-1)) return;
  }
}

/// Every tensor's bytes (random, deterministic).
inline std::vector<Bytes> random_checkpoint(const std::vector<TensorInfo>& tensors, unsigned seed) {
  std::vector<Bytes> data;
  std::uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (const TensorInfo& t : tensors) {
    Bytes bytes(t.nbytes());
    for (auto& b : bytes) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      b = static_cast<std::byte>(state);
    }
    data.push_back(std::move(bytes));
  }
  return data;
}

/// Parameters of one worker: `fill` everywhere, then the map's copies applied from the checkpoint.
inline std::vector<Bytes> load_parameters(const SourceMap& map, const std::vector<TensorInfo>& tensors,
                                          const std::vector<Bytes>& checkpoint, std::byte fill) {
  std::vector<Bytes> params;
  for (const TensorInfo& p : map.parameters) params.emplace_back(p.nbytes(), fill);
  for (const SliceCopy& copy : map.copies) {
    const TensorInfo& tensor = tensors[copy.tensor];
    const std::size_t es = dtype_size(tensor.dtype);
    const Shape strides = contiguous_strides(tensor.shape);
    for_each_element(copy.box, [&](std::span<const std::int64_t> i, std::int64_t) {
      std::int64_t source = 0;
      for (std::size_t a = 0; a < i.size(); ++a) source += (copy.box.offset[a] + i[a]) * strides[a];
      std::memcpy(params[copy.parameter].data() + element_position(copy, i) * static_cast<std::int64_t>(es),
                  checkpoint[copy.tensor].data() + source * static_cast<std::int64_t>(es), es);
    });
  }
  return params;
}

/// What replay_schedules counted.
struct ReplayCounts {
  std::int64_t relay_bytes = 0;  // written by lag 1 writes
};

/// Plays the schedules (one per worker, in worker order). Trainers' parameters are read, rollouts' written.
inline ReplayCounts replay_schedules(const std::vector<RoundSchedule>& schedules, std::vector<std::vector<Bytes>>& params) {
  ReplayCounts counts;
  const std::size_t workers = schedules.size();
  const std::size_t rounds = schedules.empty() ? 0 : schedules[0].rounds.size();
  // Per worker, its receive slots (ring of pipeline_depth) and per byte of each, the times it was written.
  std::vector<std::vector<Bytes>> slots(workers);
  std::vector<std::vector<std::vector<int>>> slot_filled(workers);
  for (std::size_t w = 0; w < workers; ++w) {
    const auto depth = static_cast<std::size_t>(std::max(1, schedules[w].pipeline_depth));
    slots[w].assign(depth, Bytes(static_cast<std::size_t>(schedules[w].receive_slot_bytes), std::byte{0xCD}));
    slot_filled[w].assign(depth, std::vector<int>(static_cast<std::size_t>(schedules[w].receive_slot_bytes), 0));
  }
  for (std::size_t r = 0; r < rounds; ++r) {
    std::vector<Bytes> send(workers);
    std::vector<Bytes*> receive(workers);
    std::vector<std::vector<int>*> filled(workers);  // per receive-buffer byte: times written
    for (std::size_t w = 0; w < workers; ++w) {
      [&] { ASSERT_EQ(schedules[w].rounds.size(), rounds); }();
      if (::testing::Test::HasFatalFailure()) return counts;
      const std::size_t slot = r % slots[w].size();
      send[w].assign(static_cast<std::size_t>(schedules[w].send_slot_bytes), std::byte{0xCD});
      // The slot this round reuses: whatever it held is gone.
      std::fill(slots[w][slot].begin(), slots[w][slot].end(), std::byte{0xCD});
      std::fill(slot_filled[w][slot].begin(), slot_filled[w][slot].end(), 0);
      receive[w] = &slots[w][slot];
      filled[w] = &slot_filled[w][slot];
      // Pack.
      for (const BufferCopy& pack : schedules[w].rounds[r].pack) {
        [&] { ASSERT_LE(pack.buffer_offset + pack.bytes(), schedules[w].send_slot_bytes) << "worker " << w << " round " << r; }();
        if (::testing::Test::HasFatalFailure()) return counts;
        for_each_element(pack.copy.box, [&](std::span<const std::int64_t> i, std::int64_t ordinal) {
          std::memcpy(send[w].data() + pack.buffer_offset + ordinal * pack.element_bytes,
                      params[w][pack.copy.parameter].data() + element_position(pack.copy, i) * pack.element_bytes,
                      pack.element_bytes);
        });
      }
    }
    for (Stage stage : {Stage::kReceive, Stage::kExternalExchange, Stage::kInternalExchange}) {
      for (std::size_t w = 0; w < workers; ++w)
        for (const Write& write : schedules[w].rounds[r].writes) {
          if (write.stage != stage) continue;
          const auto peer = static_cast<std::size_t>(write.peer);
          [&] {
            ASSERT_LT(peer, workers);
            ASSERT_LE(write.lag, 1);
            // A relay reads the slot of the round before; it must be one the ring still holds.
            const std::size_t depth = slots[w].size();
            ASSERT_TRUE(write.lag == 0 || (r >= 1 && depth >= 2)) << "relay of worker " << w << " in round " << r;
            const std::size_t source_slot = (r - write.lag) % depth;
            const Bytes& from = stage == Stage::kReceive ? send[w] : slots[w][source_slot];
            ASSERT_LE(write.local_offset + write.bytes, static_cast<std::int64_t>(from.size())) << "worker " << w;
            ASSERT_LE(write.remote_offset + write.bytes, static_cast<std::int64_t>(receive[peer]->size())) << "worker " << w;
            if (stage != Stage::kReceive) {  // it forwards only what has arrived (and is still there)
              for (std::int64_t b = 0; b < write.bytes; ++b) {
                ASSERT_EQ(slot_filled[w][source_slot][static_cast<std::size_t>(write.local_offset + b)], 1)
                    << "worker " << w << " forwards byte " << write.local_offset + b << " of round " << r - write.lag
                    << " in round " << r << ", which it does not hold";
              }
            }
            bool inside = false;
            for (const Arrival& a : schedules[peer].rounds[r].arrivals)
              inside = inside || (a.peer == static_cast<int>(w) && a.stage == stage && write.remote_offset >= a.offset &&
                                  write.remote_offset + write.bytes <= a.offset + a.bytes);
            ASSERT_TRUE(inside) << "write from " << w << " to " << peer << " in round " << r << " lands outside every region";
            std::memcpy(receive[peer]->data() + write.remote_offset, from.data() + write.local_offset,
                        static_cast<std::size_t>(write.bytes));
            for (std::int64_t b = 0; b < write.bytes; ++b) ++(*filled[peer])[static_cast<std::size_t>(write.remote_offset + b)];
            if (write.lag == 1) counts.relay_bytes += write.bytes;
          }();
          if (::testing::Test::HasFatalFailure()) return counts;
        }
    }
    for (std::size_t w = 0; w < workers; ++w) {
      [&] {
        for (const Arrival& a : schedules[w].rounds[r].arrivals)
          for (std::int64_t b = 0; b < a.bytes; ++b)
            ASSERT_EQ((*filled[w])[static_cast<std::size_t>(a.offset + b)], 1) << "worker " << w << " round " << r << " byte " << a.offset + b;
        for (const BufferCopy& assemble : schedules[w].rounds[r].assemble) {
          ASSERT_LE(assemble.buffer_offset + assemble.bytes(), schedules[w].receive_slot_bytes);
          for_each_element(assemble.copy.box, [&](std::span<const std::int64_t> i, std::int64_t ordinal) {
            std::memcpy(params[w][assemble.copy.parameter].data() + element_position(assemble.copy, i) * assemble.element_bytes,
                        receive[w]->data() + assemble.buffer_offset + ordinal * assemble.element_bytes, assemble.element_bytes);
          });
        }
      }();
      if (::testing::Test::HasFatalFailure()) return counts;
    }
  }
  return counts;
}

}  // namespace wb::testing_support
