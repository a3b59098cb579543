// The endpoint record and its insertion into the address vector: connectionless endpoints need nothing
// more; the provider connects on first use (tcp;ofi_rxm) or not at all (efa, cxi).
#include "core/checks.hpp"
#include "transport/libfabric/fabric_internal.hpp"

namespace wb::fabric {

std::vector<std::byte> FabricTransport::endpoint(int /*peer*/) {
  EndpointRecord record;
  record.rank = rank_;
  record.provider = provider_;
  record.address_format = info_->addr_format;
  record.rank_in_cq_data = rank_in_cq_data_;
  record.address = my_address_;
  return encode_endpoint(record);
}

void FabricTransport::connect(int peer, std::span<const std::byte> peer_endpoint) {
  if (peers_.contains(peer))
    throw Error(ErrorCode::kInvalidArgument, "libfabric: rank " + std::to_string(rank_) + " is already connected to rank " +
                                                 std::to_string(peer));
  EndpointRecord mine;
  mine.provider = provider_;
  mine.address_format = info_->addr_format;
  mine.rank_in_cq_data = rank_in_cq_data_;
  const EndpointRecord theirs = decode_endpoint(peer_endpoint, rank_, peer, mine);
  fi_addr_t address = FI_ADDR_UNSPEC;
  const int inserted = WB_CHECK_FI(fi_av_insert(av_.get(), theirs.address.data(), 1, &address, 0, nullptr));
  if (inserted != 1 || address == FI_ADDR_NOTAVAIL)
    throw Error(ErrorCode::kLibfabric, "fi_av_insert of rank " + std::to_string(peer) + "'s address on rank " +
                                           std::to_string(rank_) + " (provider " + provider_ + ") inserted " +
                                           std::to_string(inserted) + " addresses");
  peers_[peer].address = address;
  rank_of_address_[address] = peer;
}

}  // namespace wb::fabric
