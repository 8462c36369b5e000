// LLTM_CHECK(condition, message parts...): throws std::runtime_error with
// the parts streamed together, which torch raises in Python as a
// RuntimeError with that text (the stable ABI has no c10::Error).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace lltm_cpu {

template <typename... Parts>
std::string message(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

}  // namespace lltm_cpu

#define LLTM_CHECK(condition, ...)                                   \
  do {                                                               \
    if (!(condition)) {                                              \
      throw std::runtime_error(::lltm_cpu::message(__VA_ARGS__));    \
    }                                                                \
  } while (false)
