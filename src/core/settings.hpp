// Settings: each declared once, next to the code that uses it, with a name, a default and a doc string.
//
//   static wb::Setting<double> timeout_seconds("timeout_seconds", 120.0, "Deadline of every wait, in seconds.");
//
// The value is resolved on first read: a command-line override (override_from_text; the apps' flags,
// apps/emu/options/setting_flags.hpp) wins over
// the environment variable WB_<NAME> (upper case), which wins over the default. Numbers are decimal
// (WB_BUFFER_MIB=010 is 10; 0x10 is refused). The flag of a setting is
// --<name> with '_' written as '-'. Rank 0 logs the effective settings once (log_effective_settings).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <type_traits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace wb {

enum class SettingSource { kDefault, kEnvironment, kCommandLine };

/// What the registry knows of every setting, independent of its C++ type.
class SettingBase {
 public:
  SettingBase(const char* name, const char* doc);
  virtual ~SettingBase() = default;
  SettingBase(const SettingBase&) = delete;
  SettingBase& operator=(const SettingBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& doc() const { return doc_; }
  std::string environment_variable() const;  // WB_<NAME>
  std::string flag() const;                  // <name> with '-' for '_'
  virtual std::string type_name() const = 0;
  virtual std::string default_text() const = 0;
  virtual std::string value_text() const = 0;
  /// "[min, max]" for a setting declared with a range, else empty.
  virtual std::string range_text() const { return {}; }
  SettingSource source() const;

  /// Sets the value from text as given on the command line; throws wb::Error naming the setting.
  void override_from_text(std::string_view text);

 protected:
  void resolve() const;  // environment or default, once
  virtual void parse_into_value(std::string_view text) const = 0;
  virtual void reset_to_default() const = 0;

 private:
  std::string name_;
  std::string doc_;
  mutable std::atomic<bool> resolved_{false};  // read without the lock by every get()
  mutable SettingSource source_ = SettingSource::kDefault;
};

template <class T>
class Setting final : public SettingBase {
 public:
  Setting(const char* name, T declared_default, const char* doc)
      : SettingBase(name, doc), default_(std::move(declared_default)), value_(default_) {}
  /// A numeric setting with its valid range: a value outside [min, max], from the environment or a flag,
  /// is one clear error naming the setting, the value and the range.
  Setting(const char* name, T declared_default, const char* doc, T min, T max)
    requires(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>)
      : SettingBase(name, doc), default_(std::move(declared_default)), value_(default_), range_(std::pair<T, T>{min, max}) {}

  const T& get() const {
    resolve();
    return value_;
  }
  const T& operator*() const { return get(); }
  /// The declared default, whatever the environment or a flag says: what option structs built in code
  /// default to, so that the declaration is the one place the number is written.
  const T& default_value() const { return default_; }

  std::string type_name() const override;
  std::string default_text() const override;
  std::string value_text() const override;
  std::string range_text() const override;

 private:
  void parse_into_value(std::string_view text) const override;
  void reset_to_default() const override { value_ = default_; }

  T default_;
  mutable T value_;
  std::optional<std::pair<T, T>> range_;
};

extern template class Setting<bool>;
extern template class Setting<std::int64_t>;
extern template class Setting<double>;
extern template class Setting<std::string>;

/// Every declared setting, sorted by name.
std::vector<SettingBase*> all_settings();
/// nullptr when no setting has this name.
SettingBase* find_setting(std::string_view name);

/// One line per setting: "name = value (default|WB_NAME|--flag)".
std::string describe_settings();
/// Logs describe_settings() at info level on world rank 0, once per process, and warns about each
/// unknown WB_* variable there (warn_unknown_environment).
void log_effective_settings();

/// One message per WB_* environment variable that is neither a setting's nor one of the project's script
/// variables, naming the closest setting (a typo such as WB_BUFER_MIB is otherwise ignored silently).
std::vector<std::string> unknown_environment_warnings();
/// Logs unknown_environment_warnings() at warning level, once per process (wb-replay and wb-bench at start
/// on rank 0; the adapters' construction on world rank 0, for library users).
void warn_unknown_environment();

}  // namespace wb
