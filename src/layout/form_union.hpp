// A mixed fleet: BF16 engines load the checkpoint's own tensors, FP8 engines its FP8 form (fp8_form.hpp),
// both from one trainer job in one plan. The plan is made in the union of the two forms: the checkpoint's
// tensors, then the FP8 form's fp8 weights and scales (a tensor the form copies unchanged is one tensor of
// both), so that each rollout node receives what its own form needs, once, and a relay forwards only what
// its node holds of that form. The trainers hold both: their BF16 parameters and their quantizing pack's
// fp8 shadows and scales.
#pragma once

#include <cstdint>
#include <vector>

#include "layout/fp8_form.hpp"
#include "weightbridge/source_map.hpp"

namespace wb::layout {

struct FormUnion {
  std::vector<TensorInfo> tensors;      // the checkpoint's, then the form's fp8 weights and scales
  std::vector<std::uint32_t> of_form;   // per tensor of the FP8 form: its index in `tensors`
};

/// The union of the checkpoint's tensors (form.source_tensors) and `form`. An fp8 weight is named as in the
/// form with " (fp8)" after it, to keep names unique (its BF16 tensor keeps the name).
FormUnion unite_forms(const Fp8Form& form);

/// An FP8 engine's map (in the form's tensors) in the union's.
SourceMap fp8_map_in_union(SourceMap map, const FormUnion& united);

/// A trainer's map in the union's tensors: its own map (`trainer_map`, in the checkpoint's tensors) for
/// the BF16 engines, and the fp8 and scale copies of its quantizing pack's map (`form_map`, in the form's
/// tensors, its parameters the trainer's then the pack's buffers) for the FP8 ones.
SourceMap trainer_map_in_union(const SourceMap& trainer_map, const SourceMap& form_map, const Fp8Form& form,
                               const FormUnion& united);

}  // namespace wb::layout
