#pragma once
// Errors: TRELLIS_CHECK throws trellis::Error with file:line; the CLI turns it into one line.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace trellis {

// kind tells the CLI which exit code to use: bad input/usage (2) or an internal failure (1).
enum class ErrorKind { Input, Internal };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string msg) : std::runtime_error(std::move(msg)), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line, const std::string& msg);
}

}  // namespace trellis

// Bad input from the user (files, config, flags): exit code 2.
#define TRELLIS_REQUIRE(cond, ...)                                            \
  do {                                                                        \
    if (!(cond))                                                              \
      ::trellis::detail::throw_error(::trellis::ErrorKind::Input, nullptr, 0, \
                                     fmt::format(__VA_ARGS__));               \
  } while (0)

// Internal invariant: exit code 1, message carries file:line.
#define TRELLIS_CHECK(cond, ...)                                                         \
  do {                                                                                   \
    if (!(cond))                                                                         \
      ::trellis::detail::throw_error(::trellis::ErrorKind::Internal, __FILE__, __LINE__, \
                                     fmt::format(__VA_ARGS__));                          \
  } while (0)
