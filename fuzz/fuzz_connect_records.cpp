// libFuzzer target: the records ranks swap at connect. The first byte picks the decoder:
//   0  the round executor's connect record
//   1  the cma / cuda_ipc endpoint record (the target appends the checksum, so the parser is reached)
//   2  an ibverbs endpoint record, 3  an ibverbs memory key
// Each either throws wb::Error or decodes into something that encodes back to an equal value.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "exec/connect_record.hpp"
#include "fuzz_util.hpp"
#include "transport/cma/mailbox.hpp"
#include "transport/ibverbs/ibverbs_logic.hpp"
#include "weightbridge/transport.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> body = wb::fuzz::as_bytes(data + 1, size - 1);
  try {
    switch (data[0] % 4) {
      case 0: {
        const wb::exec::ConnectRecord record = wb::exec::decode_connect_record(body, 3);
        if (!(wb::exec::decode_connect_record(wb::exec::encode_connect_record(record), 3) == record)) std::abort();
        break;
      }
      case 1: {
        std::vector<std::byte> record(body.begin(), body.end());
        wb::cma::append_checksum(record);
        wb::cma::ProcessAddress mine;
        mine.rank = 1;
        mine.machine = "fuzz-host";
        const wb::cma::ProcessAddress theirs =
            wb::cma::decode_endpoint(wb::TransportKind::kCma, 1, 0, record, mine);
        const auto again = wb::cma::decode_endpoint(wb::TransportKind::kCma, 1, 0,
                                                          wb::cma::encode_endpoint(wb::TransportKind::kCma, 1, theirs), mine);
        if (again.pid != theirs.pid || again.mailbox != theirs.mailbox || again.nonce != theirs.nonce) std::abort();
        break;
      }
      case 2: {
        const wb::ibv::EndpointRecord record = wb::ibv::parse_endpoint(body, 2);
        if (!(wb::ibv::parse_endpoint(wb::ibv::serialize_endpoint(record), 2) == record)) std::abort();
        break;
      }
      case 3: {
        const wb::ibv::MemoryKey key = wb::ibv::parse_memory_key(body, 2);
        if (!(wb::ibv::parse_memory_key(wb::ibv::serialize_memory_key(key), 2) == key)) std::abort();
        break;
      }
    }
  } catch (const wb::Error&) {
  }
  return 0;
}
