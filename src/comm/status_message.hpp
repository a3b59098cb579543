// A status as bytes, the form every control message that carries a failure takes (notices, answers,
// acknowledgements, the failure a collective delivers to every rank): the status, two numbers and a list
// of ranks. Decoding checks every length against the bytes it has.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "weightbridge/status.hpp"

namespace wb::comm {

std::vector<std::byte> encode_status(const Status& status, std::int64_t a = 0, std::int64_t b = 0,
                                     const std::vector<int>& ranks = {});
/// kCorruptData (as the status returned) when the bytes are not one.
Status decode_status(std::span<const std::byte> bytes, std::int64_t* a = nullptr, std::int64_t* b = nullptr,
                     std::vector<int>* ranks = nullptr);

}  // namespace wb::comm
