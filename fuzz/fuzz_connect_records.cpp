// libFuzzer target: the records ranks swap at connect. The first byte picks the decoder:
//   0  the round executor's connect record
//   1  the same-machine transports' endpoint record (shm mailbox; the target appends the checksum, so
//      the parser is reached)
//   2  an ibverbs endpoint record, 3  an ibverbs memory key
//   4  a libfabric endpoint record, 5  a libfabric memory key (when the build has libfabric)
//   6  a worker's configuration, 7  the plan's summary (coord/connect_records), 8  a status as bytes
//      (comm/status_message: every failure a collective delivers)
// Each either throws wb::Error (a status: decodes to kCorruptData) or decodes into something that encodes
// back to an equal value.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "comm/status_message.hpp"
#include "coord/connect_records.hpp"
#include "exec/connect_record.hpp"
#include "fuzz_util.hpp"
#include "transport/ibverbs/ibverbs_wire.hpp"
#include "transport/shm/mailbox.hpp"
#include "transport/transport.hpp"
#if WB_HAVE_LIBFABRIC
#include "transport/libfabric/fabric_records.hpp"
#endif

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::span<const std::byte> body = wb::fuzz::as_bytes(data + 1, size - 1);
  try {
    switch (data[0] % 9) {
      case 0: {
        const wb::exec::ConnectRecord record = wb::exec::decode_connect_record(body, 3, 64);
        if (!(wb::exec::decode_connect_record(wb::exec::encode_connect_record(record), 3, 64) == record)) std::abort();
        break;
      }
      case 1: {
        std::vector<std::byte> record(body.begin(), body.end());
        wb::shm::append_checksum(record);
        wb::shm::ProcessAddress mine;
        mine.rank = 1;
        mine.machine = "fuzz-host";
        const wb::shm::ProcessAddress theirs =
            wb::shm::decode_endpoint(wb::TransportKind::kCma, 1, 0, record, mine);
        const auto again = wb::shm::decode_endpoint(wb::TransportKind::kCma, 1, 0,
                                                          wb::shm::encode_endpoint(wb::TransportKind::kCma, 1, theirs), mine);
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
#if WB_HAVE_LIBFABRIC
      case 4: {
        wb::fabric::EndpointRecord mine;
        mine.rank = 1;
        mine.provider = "tcp;ofi_rxm";
        mine.address_format = 2;
        const wb::fabric::EndpointRecord theirs = wb::fabric::decode_endpoint(body, 1, 0, mine);
        const auto again = wb::fabric::decode_endpoint(wb::fabric::encode_endpoint(theirs), 1, 0, mine);
        if (again.address != theirs.address || again.provider != theirs.provider) std::abort();
        break;
      }
      case 5: {
        const wb::fabric::MemoryKey key = wb::fabric::decode_memory_key(body, 1, 0);
        const auto again = wb::fabric::decode_memory_key(wb::fabric::encode_memory_key(key), 1, 0);
        if (again.address != key.address || again.bytes != key.bytes || again.key != key.key || again.raw_key != key.raw_key)
          std::abort();
        break;
      }
#endif
      case 6: {
        const wb::coord::WorkerConfig config = wb::coord::decode_worker_config(body);
        if (!(wb::coord::decode_worker_config(wb::coord::encode_worker_config(config)) == config)) std::abort();
        break;
      }
      case 7: {
        const wb::TransferSummary summary = wb::coord::decode_summary(body);
        const std::vector<std::byte> again = wb::coord::encode_summary(summary);
        if (wb::coord::encode_summary(wb::coord::decode_summary(again)) != again) std::abort();
        break;
      }
      case 8: {
        std::int64_t a = 0, b = 0;
        std::vector<int> ranks;
        const wb::Status status = wb::comm::decode_status(body, &a, &b, &ranks);
        if (status.code() == wb::ErrorCode::kCorruptData) break;
        std::int64_t a2 = 0, b2 = 0;
        std::vector<int> ranks2;
        const wb::Status again = wb::comm::decode_status(wb::comm::encode_status(status, a, b, ranks), &a2, &b2, &ranks2);
        if (again.code() != status.code() || again.message() != status.message() || a2 != a || b2 != b || ranks2 != ranks)
          std::abort();
        break;
      }
    }
  } catch (const wb::Error&) {
  }
  return 0;
}
