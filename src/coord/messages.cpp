#include "coord/messages.hpp"

namespace wb::coord {

const char* request_name(RequestKind kind) {
  switch (kind) {
    case RequestKind::kNone: return "none";
    case RequestKind::kConnect: return "connect";
    case RequestKind::kUpdate: return "update";
    case RequestKind::kShutdown: return "shutdown";
    case RequestKind::kAbort: return "abort";
  }
  return "unknown";
}

}  // namespace wb::coord
