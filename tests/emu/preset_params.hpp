// The paper's deployments as test parameters, with test names gtest accepts.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace wb::emu::testing_support {

inline auto preset_names() {
  return ::testing::Values("moonlight-16b-a3b", "qwen3-30b-a3b", "qwen3-235b-a22b", "kimi-k2", "qwen3-32b");
}

inline std::string preset_test_name(const ::testing::TestParamInfo<std::string>& info) {
  std::string name = info.param;
  for (char& c : name)
    if (c == '-') c = '_';
  return name;
}

}  // namespace wb::emu::testing_support
