#include "emu/options/setting_flags.hpp"

#include <string>

#include "core/settings.hpp"

namespace wb::emu {

void add_setting_options(boost::program_options::options_description& options) {
  namespace po = boost::program_options;
  for (SettingBase* setting : all_settings()) {
    const std::string range = setting->range_text();
    const std::string help = setting->doc() + " [" + setting->type_name() + (range.empty() ? "" : " in " + range) +
                             ", default " + setting->default_text() + ", env " + setting->environment_variable() + "]";
    options.add_options()(setting->flag().c_str(), po::value<std::string>(), help.c_str());
  }
}

void apply_setting_overrides(const boost::program_options::variables_map& variables) {
  for (SettingBase* setting : all_settings()) {
    if (auto it = variables.find(setting->flag()); it != variables.end() && !it->second.defaulted())
      setting->override_from_text(it->second.as<std::string>());
  }
}

}  // namespace wb::emu
