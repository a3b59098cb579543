#include "core/settings.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

#include "core/log.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

// Function-local so that settings declared as globals in any translation unit register safely.
std::map<std::string, SettingBase*, std::less<>>& registry() {
  static std::map<std::string, SettingBase*, std::less<>> settings;
  return settings;
}

std::mutex& resolve_mutex() {
  static std::mutex mutex;
  return mutex;
}

std::string trim(std::string_view text) {
  std::size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return std::string(text.substr(begin, end - begin));
}

[[noreturn]] void bad_value(const SettingBase& setting, std::string_view text, const char* expected) {
  throw Error(ErrorCode::kInvalidArgument, "setting " + setting.name() + " (" + setting.environment_variable() +
                                               " / --" + setting.flag() + "): '" + std::string(text) +
                                               "' is not " + expected);
}

}  // namespace

SettingBase::SettingBase(const char* name, const char* doc) : name_(name), doc_(doc) {
  auto [it, inserted] = registry().emplace(name_, this);
  (void)it;
  if (!inserted) {
    // Two declarations of one name would make the flag ambiguous: a programming error.
    std::fprintf(stderr, "weightbridge: setting '%s' declared twice\n", name);
    std::abort();
  }
}

std::string SettingBase::environment_variable() const {
  std::string env = "WB_" + name_;
  for (char& c : env) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return env;
}

std::string SettingBase::flag() const {
  std::string flag = name_;
  std::replace(flag.begin(), flag.end(), '_', '-');
  return flag;
}

SettingSource SettingBase::source() const {
  resolve();
  return source_;
}

void SettingBase::resolve() const {
  if (resolved_.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(resolve_mutex());
  if (resolved_.load(std::memory_order_relaxed)) return;
  if (const char* value = std::getenv(environment_variable().c_str()); value != nullptr) {
    parse_into_value(value);
    source_ = SettingSource::kEnvironment;
  }
  resolved_.store(true, std::memory_order_release);
}

void SettingBase::override_from_text(std::string_view text) {
  std::lock_guard<std::mutex> lock(resolve_mutex());
  parse_into_value(text);
  source_ = SettingSource::kCommandLine;
  resolved_.store(true, std::memory_order_release);
}

// --- typed settings ---------------------------------------------------------------------------------

std::string type_label(const bool*) { return "bool"; }
std::string type_label(const std::int64_t*) { return "int"; }
std::string type_label(const double*) { return "float"; }
std::string type_label(const std::string*) { return "string"; }

std::string to_text(bool value) { return value ? "true" : "false"; }
std::string to_text(std::int64_t value) { return std::to_string(value); }
std::string to_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}
std::string to_text(const std::string& value) { return value; }

void parse_text(const SettingBase& setting, std::string_view raw, bool& value) {
  std::string text = trim(raw);
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  if (text == "1" || text == "true" || text == "yes" || text == "on") value = true;
  else if (text == "0" || text == "false" || text == "no" || text == "off") value = false;
  else bad_value(setting, raw, "a boolean (1/0, true/false, yes/no, on/off)");
}
// Decimal only: strtoll's base 0 would read 010 as 8 and 0x10 as 16. Leading zeros are decimal (010 is
// 10, as a user who pads numbers means); a hexadecimal or octal-looking prefix other than zeros is refused.
bool has_hex_prefix(const std::string& text) {
  const std::size_t digits = (!text.empty() && (text[0] == '+' || text[0] == '-')) ? 1 : 0;
  return text.size() > digits + 1 && text[digits] == '0' && (text[digits + 1] == 'x' || text[digits + 1] == 'X');
}
void parse_text(const SettingBase& setting, std::string_view raw, std::int64_t& value) {
  const std::string text = trim(raw);
  if (has_hex_prefix(text)) bad_value(setting, raw, "a decimal integer (hexadecimal is not read)");
  char* end = nullptr;
  errno = 0;
  const long long parsed = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0') bad_value(setting, raw, "a decimal integer");
  if (errno == ERANGE) bad_value(setting, raw, "in the range of a 64-bit integer");
  value = parsed;
}
void parse_text(const SettingBase& setting, std::string_view raw, double& value) {
  const std::string text = trim(raw);
  // strtod also reads hexadecimal floats and nan: neither is a number a user means by a setting.
  if (has_hex_prefix(text)) bad_value(setting, raw, "a decimal number (hexadecimal is not read)");
  char* end = nullptr;
  errno = 0;
  const double parsed = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || std::isnan(parsed)) bad_value(setting, raw, "a number");
  // ERANGE: overflow (1e400) or a value below the smallest normal double (1e-320), which is a number.
  if (errno == ERANGE) bad_value(setting, raw, "in the range of a double (about 2.2e-308 to 1.8e308 in magnitude)");
  value = parsed;
}
void parse_text(const SettingBase&, std::string_view raw, std::string& value) { value = trim(raw); }

template <class T>
std::string Setting<T>::type_name() const {
  return type_label(static_cast<const T*>(nullptr));
}
template <class T>
std::string Setting<T>::default_text() const {
  return to_text(default_);
}
template <class T>
std::string Setting<T>::value_text() const {
  return to_text(get());
}
template <class T>
std::string Setting<T>::range_text() const {
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    if (range_) return "[" + to_text(range_->first) + ", " + to_text(range_->second) + "]";
  }
  return {};
}
template <class T>
void Setting<T>::parse_into_value(std::string_view text) const {
  T parsed = default_;
  parse_text(*this, text, parsed);  // assign only once the whole text parsed
  if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
    if (range_ && !(parsed >= range_->first && parsed <= range_->second))
      bad_value(*this, text, ("in " + range_text()).c_str());
  }
  value_ = parsed;
}

template class Setting<bool>;
template class Setting<std::int64_t>;
template class Setting<double>;
template class Setting<std::string>;

// --- registry ---------------------------------------------------------------------------------------

std::vector<SettingBase*> all_settings() {
  std::vector<SettingBase*> settings;
  for (auto& [name, setting] : registry()) settings.push_back(setting);
  return settings;
}

SettingBase* find_setting(std::string_view name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second;
}

std::string describe_settings() {
  std::ostringstream out;
  bool first = true;
  for (SettingBase* setting : all_settings()) {
    if (!first) out << '\n';
    first = false;
    out << setting->name() << " = " << setting->value_text() << " (";
    switch (setting->source()) {
      case SettingSource::kDefault: out << "default"; break;
      case SettingSource::kEnvironment: out << setting->environment_variable(); break;
      case SettingSource::kCommandLine: out << "--" << setting->flag(); break;
    }
    out << ')';
  }
  return out.str();
}

void log_effective_settings() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (process_rank() > 0) return;
    WB_LOG(kInfo) << "effective settings:\n" << describe_settings();
    warn_unknown_environment();
  });
}

}  // namespace wb
