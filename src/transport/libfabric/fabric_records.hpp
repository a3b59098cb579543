// Private to src/transport/libfabric/: what the libfabric transport decides without a fabric, so that it
// is unit-tested here (tests/unit/test_libfabric.cpp) whatever providers the machine has.
//
//   EndpointRecord   what a rank sends each peer at connect: its provider, address format and address
//   MemoryKey        what a peer imports to write into a registered region: address, size, key (or raw key)
//   rank_candidates  the order in which (provider, domain) pairs from fi_getinfo are tried
//   BatchCompletion  how a batch's last write knows the earlier ones landed (the provider's ordering)
//   cq data          the 64 bits of remote CQ data a batch's last write carries: the writer's rank and the
//                    executor's 32-bit immediate, or the immediate alone where the provider carries 4 bytes
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace wb::fabric {

/// A rank's connection record, the same for every peer (FI_EP_RDM endpoints are connectionless).
struct EndpointRecord {
  int rank = -1;
  std::string provider;              // fi_info's prov_name, e.g. "tcp;ofi_rxm"
  std::uint32_t address_format = 0;  // fi_info's addr_format
  bool rank_in_cq_data = true;       // false: arrivals name their writer through FI_SOURCE
  std::vector<std::byte> address;    // fi_getname
};
std::vector<std::byte> encode_endpoint(const EndpointRecord& record);
/// Decodes rank `peer`'s record on rank `self`. Throws kCorruptData for a malformed record, and
/// kInvalidArgument when it was made by another rank or does not match `mine` (provider, address format,
/// CQ data mode), naming both ranks and what to set.
EndpointRecord decode_endpoint(std::span<const std::byte> bytes, int self, int peer, const EndpointRecord& mine);

/// Registered memory as a peer imports it. `address` is the region's virtual address; writes target
/// address + offset when the provider uses virtual addresses (FI_MR_VIRT_ADDR), else offset alone.
struct MemoryKey {
  int rank = -1;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
  std::uint64_t key = 0;             // fi_mr_key (keys of up to 8 bytes)
  std::vector<std::byte> raw_key;    // fi_mr_raw_attr (FI_MR_RAW: longer keys), mapped by the importer
  std::uint64_t raw_base = 0;        // the base address fi_mr_raw_attr returned with it
};
std::vector<std::byte> encode_memory_key(const MemoryKey& key);
/// Throws kCorruptData for a malformed key and kInvalidArgument for a key registered by another rank
/// than `peer` (keys given to the wrong peer).
MemoryKey decode_memory_key(std::span<const std::byte> bytes, int self, int peer);

/// One (provider, domain) pair fi_getinfo offered.
struct Candidate {
  std::string provider;  // "tcp;ofi_rxm", "efa", "cxi", "verbs;ofi_rxm"
  std::string domain;    // "eth0", "lo", "cxi0", "mlx5_0"
  std::string fabric;    // "192.0.2.0/24", "127.0.0.1/32"
  bool ipv6 = false;     // the address format is IPv6 (link-local IPv6 does not route between hosts)
};
/// Providers in the order the transport prefers them when WB_FI_PROVIDER is empty: the HPC fabrics'
/// native providers first, TCP last.
std::span<const std::string_view> preferred_providers();
/// Indices of `candidates` in the order to try them: only those of `provider` when it is not empty (else
/// by preferred_providers(), unknown providers last), only those of `domain` when it is not empty (else
/// loopback domains last), IPv4 before IPv6; ties keep fi_getinfo's order. Empty when nothing matches.
std::vector<std::size_t> rank_candidates(std::span<const Candidate> candidates, std::string_view provider,
                                         std::string_view domain);
bool is_loopback(const Candidate& candidate);

/// How a batch's last write (the one with remote CQ data) is ordered after the others.
enum class BatchCompletion : std::uint8_t {
  kOrdered,   // the provider applies writes to one peer in order (FI_ORDER_WAW) and reports delivery
              // (FI_DELIVERY_COMPLETE): the whole batch is posted at once, one completion per batch
  kTwoPhase,  // otherwise: every write but the last reports delivery; the last goes once they all have
};
const char* batch_completion_name(BatchCompletion mode);
/// The mode for a provider that does or does not order writes and report delivery, and the setting
/// ("auto", "ordered", "two_phase"). Throws kInvalidArgument for an unknown setting, and kUnsupported when
/// "ordered" is asked of a provider that cannot honour it.
BatchCompletion choose_batch_completion(std::string_view setting, bool orders_writes, bool delivery_complete,
                                        const std::string& provider);

/// Remote CQ data of a batch's last write, and its decoding at the receiver.
std::uint64_t encode_cq_data(int writer, std::uint32_t immediate, bool rank_in_cq_data);
struct Arrival {
  int writer = -1;  // -1 when the data does not carry it (FI_SOURCE names the writer)
  std::uint32_t immediate = 0;
};
Arrival decode_cq_data(std::uint64_t data, bool rank_in_cq_data);

}  // namespace wb::fabric
