// kConfigOptions: the rows of options.def as ConfigOption values, in order
// (config.cc indexes them by its Id enum, made from the same file).
#ifndef PS_POSTOFFICE_OPTIONS_H_
#define PS_POSTOFFICE_OPTIONS_H_

#include <cstddef>
#include <iterator>

#include "ps/config.h"

namespace ps {

inline constexpr ConfigOption kConfigOptions[] = {
#define PS_OPTION(var, flag, type, lo, hi, values, def, doc, store) \
  {#var, #flag, nullptr, ConfigOption::k##type, lo, hi, values, def, doc},
#define PS_ENV_OPTION(var, type, lo, hi, values, def, doc, store) \
  {#var, nullptr, nullptr, ConfigOption::k##type, lo, hi, values, def, doc},
#define PS_ALIAS(var, main, type, lo, hi, values, doc, store) \
  {#var, nullptr, #main, ConfigOption::k##type, lo, hi, values, "unset", doc},
#include "postoffice/options.def"
};

inline constexpr size_t kNumConfigOptions = std::size(kConfigOptions);

}  // namespace ps

#endif  // PS_POSTOFFICE_OPTIONS_H_
