// The union of a checkpoint's own form and its FP8 form, for mixed fleets (layout/form_union.hpp).
#include "layout/form_union.hpp"

namespace wb::layout {

FormUnion unite_forms(const Fp8Form& form) {
  FormUnion united;
  united.tensors = form.source_tensors;
  united.of_form.resize(form.tensors.size());
  for (std::size_t t = 0; t < form.tensors.size(); ++t) {
    if (form.sources[t].role == FormRole::kCopied) {
      united.of_form[t] = form.sources[t].source;
      continue;
    }
    united.of_form[t] = static_cast<std::uint32_t>(united.tensors.size());
    TensorInfo tensor = form.tensors[t];
    if (form.sources[t].role == FormRole::kQuantized) tensor.name += " (fp8)";
    united.tensors.push_back(std::move(tensor));
  }
  return united;
}

SourceMap fp8_map_in_union(SourceMap map, const FormUnion& united) {
  for (SliceCopy& copy : map.copies) copy.tensor = united.of_form.at(copy.tensor);
  validate_source_map(map, united.tensors);
  return map;
}

SourceMap trainer_map_in_union(const SourceMap& trainer_map, const SourceMap& form_map, const Fp8Form& form,
                               const FormUnion& united) {
  SourceMap map;
  map.parameters = form_map.parameters;
  map.copies = trainer_map.copies;
  for (SliceCopy copy : form_map.copies) {
    if (form.sources.at(copy.tensor).role == FormRole::kCopied) continue;  // in trainer_map already
    copy.tensor = united.of_form[copy.tensor];
    map.copies.push_back(copy);
  }
  validate_source_map(map, united.tensors);
  return map;
}

}  // namespace wb::layout
