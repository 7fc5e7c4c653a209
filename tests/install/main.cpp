// A program outside the gcz tree, built against the installed package: find_package(gcz) and
// gcz::gcz must be enough to open a .gcz file.
#include <cstdio>

#include "gcz/container.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  auto r = gcz::GczReader::open(argv[1]);
  if (!r) {
    std::fprintf(stderr, "%s\n", r.status().message().c_str());
    return 1;
  }
  std::printf("%zu tensors\n", (*r)->index().tensors.size());
  return 0;
}
