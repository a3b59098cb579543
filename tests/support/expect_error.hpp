// The one way the tests check an error: a wb::Error with the expected code whose message holds the given
// words. The message is returned, for the checks a test makes beyond that.
#pragma once

#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>

#include "weightbridge/status.hpp"

namespace wb::testing {

/// Runs `action`; expects a wb::Error with `code` whose message contains every one of `parts`. Returns
/// the message ("" when nothing was thrown, which fails the test).
inline std::string expect_error(const std::function<void()>& action, ErrorCode code,
                                std::initializer_list<std::string> parts = {}) {
  try {
    action();
  } catch (const Error& error) {
    const std::string message = error.what();
    EXPECT_EQ(error.code(), code) << message;
    for (const std::string& part : parts)
      EXPECT_NE(message.find(part), std::string::npos) << "message lacks \"" << part << "\": " << message;
    return message;
  }
  ADD_FAILURE() << "expected wb::Error (" << error_code_name(code) << ") but nothing was thrown";
  return {};
}

}  // namespace wb::testing
