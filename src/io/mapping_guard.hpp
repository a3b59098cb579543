// Reads from a mapped file that may shrink under the process (another job truncates or rewrites a
// checkpoint): a read past the file's new end raises SIGBUS, which the guard turns into a result instead
// of killing the process.
#pragma once

#include <functional>

namespace wb::io {

/// Runs `copy` (reads from mapped files only, nothing to unwind) on this thread; false when one of its
/// reads raised SIGBUS. A SIGBUS outside a guarded copy goes to the handler that was installed before
/// (the default: the process ends with it).
bool guarded_copy(const std::function<void()>& copy);

}  // namespace wb::io
