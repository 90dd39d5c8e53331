# LibTorch for Longwave: Debian's 1.13 (CPU) by default, the default and CI's build; with LONGWAVE_CUDA (the
# "cuda" preset) a GPU user's CUDA LibTorch 2.x with the C++11 ABI, from Torch_DIR or from the pip torch that
# python3 imports. A LibTorch the cuda build cannot use is refused here, with one line saying why.
option(LONGWAVE_CUDA "Build against a CUDA LibTorch 2.x (Torch_DIR, or python3's pip torch)" OFF)

if(LONGWAVE_CUDA AND NOT Torch_DIR)
  execute_process(COMMAND python3 -c "import torch; print(torch.utils.cmake_prefix_path)"
    OUTPUT_VARIABLE lw_torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE lw_torch_rc ERROR_QUIET)
  if(NOT lw_torch_rc EQUAL 0 OR NOT lw_torch_prefix)
    message(FATAL_ERROR "longwave: LONGWAVE_CUDA needs a CUDA LibTorch 2.x: set -DTorch_DIR=<libtorch>/share/"
      "cmake/Torch, or install a pip torch that `python3 -c 'import torch'` finds")
  endif()
  list(APPEND CMAKE_PREFIX_PATH "${lw_torch_prefix}")
endif()

find_package(Torch REQUIRED)  # Debian's reports 1.13.0: no version is pinned

# A LibTorch whose headers need a newer C++ than ours (2.14's ATen.h: "C++20 or later ... is required") says
# so on its imported target only, which does not reach our targets: every target takes that standard.
get_target_property(lw_torch_std torch CXX_STANDARD)
if(lw_torch_std MATCHES "^[0-9]+$" AND lw_torch_std GREATER CMAKE_CXX_STANDARD)
  message(STATUS "longwave: C++${lw_torch_std}, as LibTorch ${Torch_VERSION} asks")
  set(CMAKE_CXX_STANDARD ${lw_torch_std})
endif()

if(LONGWAVE_CUDA)
  if(Torch_VERSION VERSION_LESS 2.0)
    message(FATAL_ERROR "longwave: LibTorch ${Torch_VERSION} at ${Torch_DIR} is older than 2.0: the cuda build "
      "needs LibTorch 2.x")
  endif()
  if(TORCH_CXX_FLAGS MATCHES "_GLIBCXX_USE_CXX11_ABI=0")
    message(FATAL_ERROR "longwave: the LibTorch at ${Torch_DIR} uses the pre-C++11 ABI, which Debian's "
      "libraries cannot link with: take a cxx11-ABI LibTorch (a pip wheel, or pytorch.org's cxx11 ABI zip)")
  endif()
  if(NOT TORCH_CUDA_LIBRARIES)
    message(FATAL_ERROR "longwave: the LibTorch ${Torch_VERSION} at ${Torch_DIR} is built without CUDA: the "
      "cuda build needs a CUDA LibTorch")
  endif()
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    message(FATAL_ERROR "longwave: no CUDA toolkit found for the cuda build: set -DCUDAToolkit_ROOT "
      "(e.g. /usr/local/cuda)")
  endif()
  # NCCL from beside this LibTorch (a wheel's nvidia/nccl, or the LibTorch's own lib/), so that one process
  # never loads two NCCLs. The NCCL block of CMakeLists.txt takes the cached NCCL_LIBRARY.
  get_filename_component(lw_torch_root "${Torch_DIR}/../../.." ABSOLUTE)
  find_library(NCCL_LIBRARY NAMES nccl libnccl.so.2
    HINTS "${lw_torch_root}/../nvidia/nccl/lib" "${lw_torch_root}/lib" NO_DEFAULT_PATH)
  find_path(NCCL_INCLUDE_DIR nccl.h
    HINTS "${lw_torch_root}/../nvidia/nccl/include" "${lw_torch_root}/include" NO_DEFAULT_PATH)
  if(NOT NCCL_LIBRARY)
    message(WARNING "longwave: no NCCL beside the LibTorch at ${lw_torch_root}: the NCCL backend takes the "
      "system's, and a process may then load two NCCLs")
  else()
    # Every executable loads this NCCL before LibTorch does, from a DT_RPATH (searched before
    # LD_LIBRARY_PATH): on an H200 image whose LD_LIBRARY_PATH named the system's NCCL 2.28.3, LibTorch's
    # libtorch_cuda.so (DT_RUNPATH) and our backend both took that one instead of the wheel's 2.28.9.
    get_filename_component(lw_nccl_dir "${NCCL_LIBRARY}" DIRECTORY)
    list(APPEND CMAKE_BUILD_RPATH "${lw_nccl_dir}")
    list(APPEND CMAKE_INSTALL_RPATH "${lw_nccl_dir}")
    set(lw_nccl_first "${NCCL_LIBRARY}")  # linked after libstdc++, below
  endif()
  message(STATUS "longwave: cuda build on LibTorch ${Torch_VERSION} (${Torch_DIR}), CUDA "
    "${CUDAToolkit_VERSION}, NCCL ${NCCL_LIBRARY}")
endif()

# A pip wheel's libtorch.so exports its own copy of std::filesystem; an executable that lists libtorch.so
# before libstdc++.so.6 binds to it, and remove_all(path, error_code&) there jumps to address 0. Every
# executable names libstdc++ first (tests/unit/filesystem_binding_test.cpp checks the call and the order),
# by its path: a compiler outside /usr (a GPU image's /opt/gcc) may ship no libstdc++.so, and there a bare
# -lstdc++ left the executable taking std:: from libtorch.so with no libstdc++ entry at all.
execute_process(COMMAND ${CMAKE_CXX_COMPILER} -print-file-name=libstdc++.so
  OUTPUT_VARIABLE lw_stdcxx OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
if(NOT IS_ABSOLUTE "${lw_stdcxx}" OR NOT EXISTS "${lw_stdcxx}")
  find_library(LW_STDCXX_LIBRARY NAMES libstdc++.so.6 stdc++
    PATHS /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64 /usr/lib)
  set(lw_stdcxx "${LW_STDCXX_LIBRARY}")
endif()
if(NOT lw_stdcxx)
  message(FATAL_ERROR "longwave: no libstdc++.so found for ${CMAKE_CXX_COMPILER}: set -DLW_STDCXX_LIBRARY=<path to "
    "libstdc++.so.6>")
endif()
add_link_options("LINKER:--push-state,--no-as-needed" "${lw_stdcxx}" "LINKER:--pop-state")
if(lw_nccl_first)
  add_link_options("LINKER:--disable-new-dtags"
    "LINKER:--push-state,--no-as-needed" "${lw_nccl_first}" "LINKER:--pop-state")
endif()
