// What a language binding hands the adapters it constructs, inside a BindingChecks scope:
//   - what it found wrong with its caller's arguments (a Python object of the wrong type, say). The binding
//     still constructs the adapter, and the constructor puts the failure into its first exchange over the
//     world (the roles), so every rank throws it, whichever language constructed its adapter: a binding that
//     agreed on its own would wait for ranks of the other language, which never join it;
//   - a watch over parameters its framework may move after construction (a Python tensor's resize_(), a
//     rebinding `p.data = p.data.clone()`, which holding the tensor does not prevent). The adapter runs it
//     before every update, before any byte of it moves, follows the parameters it reports as rebound and
//     fails the update on every rank when it refuses (coord/adapter_common.hpp, follow_parameters).
#pragma once

#include <cstddef>
#include <functional>
#include <vector>

#include "weightbridge/status.hpp"

namespace wb::coord {

/// A parameter rebound to new memory of the same dtype, shape and strides: its index in the ParameterSet
/// and its new address.
struct MovedParameter {
  std::size_t index = 0;
  void* data = nullptr;
};

/// Fills `moved` with the parameters rebound since the last call and returns ok, or a failure naming the
/// parameter and what changed (anything the adapter cannot follow). Called on the update's calling thread.
using ParameterWatch = std::function<Status(std::vector<MovedParameter>& moved)>;

/// While it lives, the adapters this thread constructs take `found` as their caller's failure (ok: none)
/// and `watch` as the watch over their parameters (empty: none; a C++ caller's parameters stay in place,
/// adapter.hpp).
class BindingChecks {
 public:
  explicit BindingChecks(Status found, ParameterWatch watch = {});
  ~BindingChecks();
  BindingChecks(const BindingChecks&) = delete;
  BindingChecks& operator=(const BindingChecks&) = delete;

  /// The failure of the scope around this thread's construction; ok outside one (a C++ caller).
  static Status current();
  /// The watch of that scope; empty outside one.
  static ParameterWatch current_watch();

 private:
  Status found_;
  ParameterWatch watch_;
  const BindingChecks* outer_;
};

}  // namespace wb::coord
