// Settings changed for one test and put back after it, as the apps' flags change them (override_from_text).
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "core/settings.hpp"

namespace wb::testing {

/// Sets settings for one test and puts the previous values back, last first.
class SettingScope {
 public:
  SettingScope() = default;
  SettingScope(const SettingScope&) = delete;
  SettingScope& operator=(const SettingScope&) = delete;
  ~SettingScope() {
    for (auto it = saved_.rbegin(); it != saved_.rend(); ++it) it->first->override_from_text(it->second);
  }
  /// Throws as override_from_text does on a value the setting refuses (the setting keeps its value).
  void set(const char* name, const std::string& value) {
    SettingBase* setting = find_setting(name);
    ASSERT_NE(setting, nullptr) << name;
    saved_.emplace_back(setting, setting->value_text());
    setting->override_from_text(value);
  }

 private:
  std::vector<std::pair<SettingBase*, std::string>> saved_;
};

}  // namespace wb::testing
