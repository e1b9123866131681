// Minimal test harness for the SIMT emulator self-tests (no gtest, no torch: g++ only).
// TEST(name) registers a case; the binary runs the cases named on its command line, each
// printing "PASS name" or "FAIL name: why" (exit status 1 on any failure); --list prints them.
#pragma once

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/ptx.cuh"

namespace harness {

struct Case {
  const char* name;
  void (*fn)();
};
inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}
struct Register {
  Register(const char* name, void (*fn)()) { registry().push_back({name, fn}); }
};
struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
  std::ostringstream os;
  os << file << ":" << line << ": " << what;
  throw Failure(os.str());
}

// Runs f, which must throw simt::Error; returns its message.
template <class F>
std::string simt_error_of(F&& f) {
  try {
    f();
  } catch (const simt::Error& e) {
    if (std::getenv("SIMT_TEST_VERBOSE")) std::printf("  simt::Error: %s\n", e.what());
    return e.what();
  }
  throw Failure("expected a simt::Error, none was thrown");
}

// Every emulator fault names block, thread, warp and lane.
inline void check_names_location(const std::string& msg) {
  for (const char* key : {"block (", "thread (", "warp ", "lane "})
    if (msg.find(key) == std::string::npos)
      throw Failure("error message lacks \"" + std::string(key) + "\": " + msg);
}

}  // namespace harness

#define TEST(name)                                        \
  static void name();                                     \
  static harness::Register register_##name(#name, &name); \
  static void name()

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) harness::fail(__FILE__, __LINE__, "CHECK(" #cond ") failed"); \
  } while (0)

#define CHECK_EQ(a, b)                                                      \
  do {                                                                      \
    auto va_ = (a);                                                         \
    auto vb_ = (b);                                                         \
    if (!(va_ == vb_)) {                                                    \
      std::ostringstream os_;                                               \
      os_ << "CHECK_EQ(" #a ", " #b ") failed: " << +va_ << " != " << +vb_; \
      harness::fail(__FILE__, __LINE__, os_.str());                         \
    }                                                                       \
  } while (0)

#define CHECK_CONTAINS(msg, needle)                                                                \
  do {                                                                                             \
    const std::string m_ = (msg);                                                                  \
    if (m_.find(needle) == std::string::npos)                                                      \
      harness::fail(__FILE__, __LINE__, std::string("message lacks \"") + (needle) + "\": " + m_); \
  } while (0)
