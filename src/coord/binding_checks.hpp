// What a language binding found wrong with its caller's arguments (a Python object of the wrong type, say)
// before it constructs an adapter. The binding still constructs the adapter, inside a BindingChecks scope,
// and the constructor puts the failure into its first exchange over the world (the roles), so every rank
// throws it, whichever language constructed its adapter: a binding that agreed on its own would wait for
// ranks of the other language, which never join it.
#pragma once

#include "weightbridge/status.hpp"

namespace wb::coord {

/// While it lives, the adapters this thread constructs take `found` as their caller's failure (ok: none).
class BindingChecks {
 public:
  explicit BindingChecks(Status found);
  ~BindingChecks();
  BindingChecks(const BindingChecks&) = delete;
  BindingChecks& operator=(const BindingChecks&) = delete;

  /// The failure of the scope around this thread's construction; ok outside one (a C++ caller).
  static Status current();

 private:
  Status found_;
  const BindingChecks* outer_;
};

}  // namespace wb::coord
