#include "coord/binding_checks.hpp"

#include <utility>

namespace wb::coord {
namespace {

thread_local const BindingChecks* current_scope = nullptr;

}  // namespace

BindingChecks::BindingChecks(Status found) : found_(std::move(found)), outer_(current_scope) { current_scope = this; }

BindingChecks::~BindingChecks() { current_scope = outer_; }

Status BindingChecks::current() { return current_scope != nullptr ? current_scope->found_ : Status::ok(); }

}  // namespace wb::coord
