// The second-difference codec's test on 2-byte codes (bf16, f16): whether a[k] - 2 b[k] + c[k] = 0 for a run
// of k, exactly, in 16-bit lanes. It is most of the probe's decoding: every element of every digit pass goes
// through it once. a + c = 2 b exactly when the rounded-up average (a + c + 1) >> 1, which the unsigned
// average instructions give without overflow, equals b and a + c is even, so no lane needs widening whatever
// the codes (the subtraction in 16-bit lanes cannot tell 0 from +-2^16 once codes have their top bit set:
// the negative half of the digits). Eight lanes per SSE2 vector, 16 per AVX2 and 32 per AVX-512BW one, the
// widest the CPU has chosen at run time (the build targets baseline x86-64).
#pragma once

#include <cstdint>

namespace wb::layout {

/// The widths there is code for; kBest is the widest this CPU runs.
enum class DifferenceLanes { kScalar, kSse2, kAvx2, kAvx512, kBest };

/// Whether a[k] + c[k] = 2 b[k] for every k < n (n >= 0; the three runs may overlap). `lanes` other than
/// kBest is for the tests (kScalar is the definition); a width the CPU lacks runs as kBest.
bool zero_second_differences16(const std::uint16_t* a, const std::uint16_t* b, const std::uint16_t* c, std::int64_t n,
                               DifferenceLanes lanes = DifferenceLanes::kBest);

/// Whether this CPU runs `lanes` (kScalar, kSse2 and kBest always).
bool difference_lanes_supported(DifferenceLanes lanes);

}  // namespace wb::layout
