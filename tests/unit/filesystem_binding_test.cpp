// A LibTorch-linked binary's std::filesystem calls reach libstdc++ (issue 36): a pip wheel's libtorch.so
// exports a copy of std::filesystem whose remove_all(path, error_code&) jumps to address 0, and an executable
// that lists libtorch.so before libstdc++.so.6 binds to it (cmake/LongwaveTorch.cmake puts libstdc++ first).
#include <ATen/ATen.h>
#include <dlfcn.h>
#include <link.h>
#include <unistd.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace fs = std::filesystem;

namespace {

/// The shared objects of this process, in the dynamic linker's search order.
std::vector<std::string> loaded_objects() {
  std::vector<std::string> out;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) {
        static_cast<std::vector<std::string>*>(data)->push_back(info->dlpi_name ? info->dlpi_name : "");
        return 0;
      },
      &out);
  return out;
}

/// Index of the first loaded object whose path contains `part` (the object count when none does).
size_t position_of(const std::vector<std::string>& objects, const std::string& part) {
  for (size_t i = 0; i < objects.size(); ++i)
    if (objects[i].find(part) != std::string::npos) return i;
  return objects.size();
}

}  // namespace

CATCH_TEST_CASE("a LibTorch-linked binary removes a tree with remove_all(path, ec) through libstdc++",
                "[filesystem]") {
  // LibTorch is really linked and loaded (a linker with --as-needed drops a library nothing uses).
  CATCH_REQUIRE(at::ones({3}).sum().item<float>() == 3.0f);
  const auto objects = loaded_objects();
  const size_t torch = position_of(objects, "libtorch"), stdcxx = position_of(objects, "libstdc++");
  CATCH_INFO("loaded objects: " << objects.size());
  CATCH_REQUIRE(torch < objects.size());
  CATCH_REQUIRE(stdcxx < objects.size());
  CATCH_CHECK(stdcxx < torch);

  // The overload that crashed binds to libstdc++'s definition.
  using remove_all_ec = std::uintmax_t (*)(const fs::path&, std::error_code&);
  const remove_all_ec fn = &fs::remove_all;
  Dl_info where{};
  CATCH_REQUIRE(dladdr(reinterpret_cast<void*>(fn), &where) != 0);
  CATCH_INFO("remove_all(path, ec) is defined in " << (where.dli_fname ? where.dli_fname : "?"));
  CATCH_CHECK(std::string(where.dli_fname ? where.dli_fname : "").find("libstdc++") != std::string::npos);

  // And it works: a tree of 2 folders and 3 files is removed, counted, without an error.
  const fs::path dir = fs::temp_directory_path() / ("longwave-test-fs-binding-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "a" / "b");
  for (const auto& f : {dir / "x", dir / "a" / "y", dir / "a" / "b" / "z"}) std::ofstream(f) << "data";
  std::error_code ec;
  const auto removed = fs::remove_all(dir, ec);
  CATCH_CHECK_FALSE(ec);
  CATCH_CHECK(removed == 6);  // 3 files, a, a/b and the scratch folder itself
  CATCH_CHECK_FALSE(fs::exists(dir));
}
