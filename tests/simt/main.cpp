// Runs the SIMT emulator self-tests named on the command line (see harness.h).
#include "harness.h"

int main(int argc, char** argv) {
  auto& cases = harness::registry();
  if (argc == 2 && std::strcmp(argv[1], "--list") == 0) {
    for (const auto& c : cases) std::printf("%s\n", c.name);
    return 0;
  }
  int failed = 0;
  for (int i = 1; i < argc; ++i) {
    const harness::Case* found = nullptr;
    for (const auto& c : cases)
      if (std::strcmp(c.name, argv[i]) == 0) found = &c;
    if (!found) {
      std::printf("FAIL %s: no such test\n", argv[i]);
      ++failed;
      continue;
    }
    try {
      found->fn();
      std::printf("PASS %s\n", found->name);
    } catch (const std::exception& e) {
      std::printf("FAIL %s: %s\n", found->name, e.what());
      ++failed;
    }
    std::fflush(stdout);
  }
  return failed ? 1 : 0;
}
