# Cross-compiling for aarch64 with Debian's g++-aarch64-linux-gnu and multiarch arm64 libraries
# (/usr/lib/aarch64-linux-gnu). The target is Kunpeng 920 class: ARMv8.2-A with dot product,
# no i8mm, no SVE. Used by scripts/test-arm.sh (make test-arm).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_C_FLAGS_INIT "-march=armv8.2-a+dotprod")
set(CMAKE_CXX_FLAGS_INIT "-march=armv8.2-a+dotprod")
# Find arm64 libraries and CMake packages only in the multiarch and extra prefixes, never the host's.
set(CMAKE_FIND_ROOT_PATH "/usr/aarch64-linux-gnu")
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
# pkg-config (FindOpenSSL asks it first) must see the arm64 .pc files, not the host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
# Test binaries run under qemu (gtest discovery at build time, and ctest).
if(DEFINED ENV{ARMADA_ARM_EMULATOR})
  string(REPLACE " " ";" _emu "$ENV{ARMADA_ARM_EMULATOR}")
  set(CMAKE_CROSSCOMPILING_EMULATOR ${_emu})
endif()
