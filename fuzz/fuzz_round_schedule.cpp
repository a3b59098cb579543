// libFuzzer target: the round-schedule decoder (what every rank decodes from rank 0's MPI_Scatterv).
// Decoding either throws wb::Error or gives a schedule that serialization accepts and that decodes back
// equal from its own encoding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.hpp"
#include "plan/round_schedule.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wb::RoundSchedule schedule;
  try {
    schedule = wb::deserialize_round_schedule(wb::fuzz::as_bytes(data, size));
  } catch (const wb::Error&) {
    return 0;
  }
  // "Checks the same invariants as serialization": what decodes must encode.
  const std::vector<std::byte> bytes = wb::serialize_round_schedule(schedule);
  if (!(wb::deserialize_round_schedule(bytes) == schedule)) std::abort();
  return 0;
}
