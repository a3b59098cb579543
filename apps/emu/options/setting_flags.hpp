// The library's settings as command-line flags of the apps (Boost.Program_options): the library itself
// knows no option parser; each setting is also its WB_<NAME> environment variable.
#pragma once

#include <boost/program_options.hpp>

namespace wb::emu {

/// Adds a --<flag> string option for every setting (the doc string and default as help text).
void add_setting_options(boost::program_options::options_description& options);
/// Applies the flags of add_setting_options that were given on the command line (throws wb::Error naming
/// the setting on a bad value).
void apply_setting_overrides(const boost::program_options::variables_map& variables);

}  // namespace wb::emu
