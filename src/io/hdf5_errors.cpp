#include "io/hdf5_errors.hpp"

#include "core/checks.hpp"

namespace wb::detail {

Hdf5Failure innermost_hdf5_failure() {
  // Walking upward starts at the function that detected the error: its text says what is wrong
  // ("truncated file: eof = ..."), where the API-level entry only says "unable to open file".
  Hdf5Failure failure;
  const auto visit = [](unsigned, const H5E_error2_t* entry, void* data) -> herr_t {
    auto* out = static_cast<Hdf5Failure*>(data);
    if (out->found) return 0;
    out->found = true;
    out->minor = entry->min_num;
    out->text = entry->desc != nullptr && entry->desc[0] != '\0' ? entry->desc : "no description";
    if (entry->func_name != nullptr) out->text.append(" (in ").append(entry->func_name).append(")");
    return 0;
  };
  if (H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, visit, &failure) < 0 || !failure.found) {
    failure.found = false;
    failure.text = "HDF5 reported no details";
  }
  return failure;
}

std::string hdf5_error_string() { return innermost_hdf5_failure().text; }

}  // namespace wb::detail
