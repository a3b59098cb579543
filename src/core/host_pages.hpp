// Host memory the library maps in bulk for the transfer (staging, transfer buffers): anonymous mappings
// that start on a 2 MiB boundary, so that the kernel may back their whole 2 MiB blocks with transparent
// huge pages where they are asked for. A first touch otherwise costs a page fault per 4 KiB, at connect
// and at every re-link: measured on the development machine (a VM, 2 cores), 104 MB first copied into
// fresh memory 290-300 ms with 4 KiB pages, 9-15 ms with huge pages (54-180 ms where the machine's memory
// was never touched before, which the host backs on first touch). The probe's copy of the parameters does
// not use it (measured there without a clear gain: README).
#pragma once

#include <cstddef>

namespace wb {

inline constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

/// Maps `bytes` rounded up to the page, private and anonymous, MAP_NORESERVE (nothing is touched or
/// charged until used); starting on a kHugePageBytes boundary when it is at least that large. Sets
/// `mapped` to the length munmap takes. Null (errno set) when the mapping fails.
std::byte* map_host_pages(std::size_t bytes, std::size_t& mapped);

/// Asks for huge pages over the whole 2 MiB blocks inside [first, last) (none of the pages around it, so
/// that no page outside the range is touched because of it). Only advice: ignored where the kernel's
/// transparent huge pages are off.
void advise_huge_pages(std::byte* first, std::byte* last);

/// Faults [data, data + bytes) in for writing now (MADV_POPULATE_WRITE, or a store per page on kernels
/// before 5.14): what MAP_POPULATE does, after advise_huge_pages so that the blocks come as huge pages.
/// False (errno set) when the kernel cannot (out of memory).
bool populate_host_pages(std::byte* data, std::size_t bytes);

}  // namespace wb
