// Token thresholds of the GEMM bindings' dispatch (kernel below, dequantize + dense matmul from
// it on), each with a per-call override from the environment.
#pragma once

#include <cstdint>
#include <cstdlib>

namespace w4k {

// The non-negative integer in environment variable `name`, else `dflt` (unset, empty, negative
// or not a number: the default).
inline int64_t dispatch_threshold(const char* name, int64_t dflt) {
  if (const char* v = std::getenv(name)) {
    char* end = nullptr;
    const long long t = std::strtoll(v, &end, 10);
    if (end != v && *end == '\0' && t >= 0) return t;
  }
  return dflt;
}

}  // namespace w4k
