#include "coord/binding_checks.hpp"

#include <utility>

namespace wb::coord {
namespace {

thread_local const BindingChecks* current_scope = nullptr;

}  // namespace

BindingChecks::BindingChecks(Status found, ParameterWatch watch)
    : found_(std::move(found)), watch_(std::move(watch)), outer_(current_scope) {
  current_scope = this;
}

BindingChecks::~BindingChecks() { current_scope = outer_; }

Status BindingChecks::current() { return current_scope != nullptr ? current_scope->found_ : Status::ok(); }

ParameterWatch BindingChecks::current_watch() { return current_scope != nullptr ? current_scope->watch_ : ParameterWatch(); }

}  // namespace wb::coord
