# What scripts/build-windows-deps builds, and how: the libraries, what each
# needs built first, and a build_<library> function each, which installs into
# $prefix. Sourced by that script; its code (not its comments), with the
# libraries' versions, the cross-compiler's and cmake/mingw-w64-wine.cmake,
# keys the prefix, so a change here builds anew. What only schedules, caches
# or reports a build lives in the script and keys nothing.
#
# The functions run with: $root (the repository), $cache (the cache directory),
# $prefix (where they install), $jobs, $triple, and source_of LIBRARY (the
# unpacked, patched Debian source tree).

# Source package and version, from the Linux build's installed -dev packages;
# built in this order where their needs allow (the longest first: gRPC waits
# for OpenSSL and protobuf).
libraries=(openssl abseil zlib protobuf c-ares re2 grpc sqlite3 libzstd fmtlib spdlog curl)
declare -A dev_package=([zlib]=zlib1g-dev [c-ares]=libc-ares-dev [re2]=libre2-dev [openssl]=libssl-dev
  [abseil]=libabsl-dev [protobuf]=libprotobuf-dev [grpc]=libgrpc++-dev [sqlite3]=libsqlite3-dev
  [libzstd]=libzstd-dev [fmtlib]=libfmt-dev [spdlog]=libspdlog-dev [curl]=libcurl4-openssl-dev)
# What each library finds in the prefix when it is configured; the others
# build beside it.
declare -A needs=([protobuf]="zlib abseil" [grpc]="zlib c-ares re2 openssl abseil protobuf" [spdlog]=fmtlib)

# Compiles go through ccache where it is installed. Build trees and the prefix
# being built have paths that no version or key names (and ccache hashes them
# relative to the cache directory), so that a new key (a security update of
# one library) recompiles only what that change reaches.
ccache_program=$(command -v ccache || true)
cmake_launchers=()
[[ -z $ccache_program ]] ||
  cmake_launchers=(-DCMAKE_C_COMPILER_LAUNCHER="$ccache_program" -DCMAKE_CXX_COMPILER_LAUNCHER="$ccache_program")
export CCACHE_BASEDIR=$cache CCACHE_NOHASHDIR=1

# A CMake project, configured for mingw-w64 against what is already in the prefix.
cmake_build() {
  local name=$1 source=$2
  shift 2
  local build=$cache/build/$name
  rm -rf "$build"
  cmake -S "$source" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_launchers[@]}" \
    -DCMAKE_TOOLCHAIN_FILE="$root/cmake/mingw-w64-wine.cmake" -DKILN_WINDOWS_DEPS_PREFIX="$prefix" \
    -DCMAKE_INSTALL_PREFIX="$prefix" -DBUILD_SHARED_LIBS=OFF -DCMAKE_POSITION_INDEPENDENT_CODE=OFF "$@"
  cmake --build "$build" --parallel "$jobs"
  cmake --install "$build"
  rm -rf "$build"
}

build_zlib() {
  # The static library alone: Debian's source lacks win32/, which the DLL needs.
  local build=$cache/build/zlib
  rm -rf "$build"
  cmake -S "$(source_of zlib)" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release "${cmake_launchers[@]}" \
    -DCMAKE_TOOLCHAIN_FILE="$root/cmake/mingw-w64-wine.cmake"
  cmake --build "$build" --target zlibstatic --parallel "$jobs"
  mkdir -p "$prefix/include" "$prefix/lib"
  install -m 644 "$build/zconf.h" "$(source_of zlib)/zlib.h" "$prefix/include/"
  # Under the name FindZLIB looks for first, for gRPC and protobuf.
  install -m 644 "$build/libzlibstatic.a" "$prefix/lib/libz.a"
  rm -rf "$build"
}

build_c-ares() {
  # 1.18.1's inet_net_pton.c uses INADDRSZ, which only POSIX headers define
  # (upstream uses NS_INADDRSZ from 1.19 on): the size of an IPv4 address.
  cmake_build c-ares "$(source_of c-ares)" -DCARES_STATIC=ON -DCARES_SHARED=OFF -DCARES_BUILD_TOOLS=OFF \
    -DCARES_BUILD_TESTS=OFF -DCMAKE_C_FLAGS=-DINADDRSZ=4
}

build_re2() {
  # Debian's source drops the generated tables; made as its build makes them,
  # from the unicode-data package.
  local source
  source=$(source_of re2)
  perl "$source/re2/make_perl_groups.pl" >"$source/re2/perl_groups.cc"
  for table in casefold groups; do
    (cd "$source" && python3 "re2/make_unicode_$table.py" >"re2/unicode_$table.cc")
  done
  cmake_build re2 "$source" -DRE2_BUILD_TESTING=OFF
}

build_openssl() {
  local source build=$cache/build/openssl
  source=$(source_of openssl)
  rm -rf "$build"
  cp -r "$source" "$build"
  # libcrypto and libssl only: no tests, engines or the openssl tool (install_dev: no docs).
  (cd "$build" &&
    ./Configure mingw64 --prefix="$prefix" --libdir=lib no-shared no-tests no-engine no-module \
      CC="${ccache_program:+$ccache_program }$triple-gcc-posix" AR=$triple-ar RANLIB=$triple-ranlib RC=$triple-windres &&
    make -j"$jobs" build_libs && make install_dev)
  rm -rf "$build"
}

build_abseil() {
  cmake_build abseil "$(source_of abseil)" -DABSL_PROPAGATE_CXX_STD=ON -DCMAKE_CXX_STANDARD=17 \
    -DABSL_BUILD_TESTING=OFF -DBUILD_TESTING=OFF
}

build_protobuf() {
  cmake_build protobuf "$(source_of protobuf)" -Dprotobuf_BUILD_TESTS=OFF -Dprotobuf_BUILD_PROTOC_BINARIES=OFF \
    -Dprotobuf_BUILD_LIBPROTOC=OFF -Dprotobuf_WITH_ZLIB=ON -Dprotobuf_BUILD_SHARED_LIBS=OFF
}

# gRPC's libraries kilnd and kiln do not link: the insecure twins of grpc and
# grpc++ (each a second build of gRPC's core), ALTS, error details, and the
# code generators' library (which would need protobuf's libprotoc). gRPC's
# CMakeLists.txt has no option to leave them out.
grpc_unused_libraries=" grpc_unsecure grpc++_unsecure grpc++_alts grpc++_error_details grpc_plugin_support "

# Drops each unused library's block (add_library(NAME through the endif() of
# its install rule) from the CMakeLists.txt of gRPC's source tree `$1`.
trim_grpc() {
  local lists=$1/CMakeLists.txt
  awk -v unused="$grpc_unused_libraries" '
    /^add_library\(/ && index(unused, " " substr($0, 13) " ") { dropping = substr($0, 13) }
    dropping != "" {
      if (index($0, "install(TARGETS " dropping " EXPORT")) installing = 1
      else if (installing && $0 == "endif()") dropping = installing = ""
      next
    }
    { print }' "$lists" >"$lists.trimmed"
  mv "$lists.trimmed" "$lists"
}

build_grpc() {
  # A copy is trimmed: the unpacked Debian source stays as Debian ships it.
  local source=$cache/build/grpc-source
  rm -rf "$source"
  cp -r "$(source_of grpc)" "$source"
  trim_grpc "$source"
  cmake_build grpc "$source" -DCMAKE_CXX_STANDARD=17 -DgRPC_INSTALL=ON -DgRPC_BUILD_TESTS=OFF \
    -DgRPC_BUILD_CODEGEN=OFF -DgRPC_BUILD_CSHARP_EXT=OFF -DgRPC_BACKWARDS_COMPATIBILITY_MODE=OFF \
    -DgRPC_ABSL_PROVIDER=package -DgRPC_CARES_PROVIDER=package -DgRPC_PROTOBUF_PROVIDER=package \
    -DgRPC_RE2_PROVIDER=package -DgRPC_SSL_PROVIDER=package -DgRPC_ZLIB_PROVIDER=package \
    -DgRPC_PROTOBUF_PACKAGE_TYPE=CONFIG -DgRPC_BENCHMARK_PROVIDER=none \
    -D_gRPC_PROTOBUF_PROTOC_EXECUTABLE=/usr/bin/protoc
  rm -rf "$source"
}

build_sqlite3() {
  # The amalgamation (sqlite3.c) is made by the host's tools, then compiled for
  # Windows with the options Debian's own build uses.
  local source build=$cache/build/sqlite3
  source=$(source_of sqlite3)
  rm -rf "$build"
  mkdir -p "$build" "$prefix/include" "$prefix/lib"
  (cd "$build" && "$source/configure" --disable-tcl >/dev/null && make sqlite3.c >/dev/null &&
    ${ccache_program:+"$ccache_program"} $triple-gcc-posix -O2 -DSQLITE_ENABLE_COLUMN_METADATA -DSQLITE_ENABLE_FTS5 -DSQLITE_ENABLE_JSON1 \
      -DSQLITE_THREADSAFE=1 -DSQLITE_ENABLE_UNLOCK_NOTIFY -DSQLITE_ENABLE_DBSTAT_VTAB -c sqlite3.c &&
    $triple-ar rcs libsqlite3.a sqlite3.o)
  install -m 644 "$build/sqlite3.h" "$build/sqlite3ext.h" "$prefix/include/"
  install -m 644 "$build/libsqlite3.a" "$prefix/lib/"
  rm -rf "$build"
}

build_libzstd() {
  cmake_build libzstd "$(source_of libzstd)/build/cmake" -DZSTD_BUILD_SHARED=OFF -DZSTD_BUILD_STATIC=ON \
    -DZSTD_BUILD_PROGRAMS=OFF -DZSTD_BUILD_TESTS=OFF -DZSTD_MULTITHREAD_SUPPORT=ON
}

build_fmtlib() {
  cmake_build fmtlib "$(source_of fmtlib)" -DFMT_TEST=OFF -DFMT_DOC=OFF
}

build_spdlog() {
  cmake_build spdlog "$(source_of spdlog)" -DSPDLOG_FMT_EXTERNAL=ON -DSPDLOG_BUILD_EXAMPLE=OFF \
    -DSPDLOG_BUILD_TESTS=OFF -DSPDLOG_BUILD_SHARED=OFF
}

build_curl() {
  # HTTPS alone, over Schannel: Windows' own TLS, which checks certificates
  # against the Windows certificate store (the Linux build's libcurl uses
  # OpenSSL). Names resolve on libcurl's own thread; nothing else is linked.
  cmake_build curl "$(source_of curl)" -DCURL_USE_SCHANNEL=ON -DCURL_USE_OPENSSL=OFF -DHTTP_ONLY=ON \
    -DBUILD_CURL_EXE=OFF -DBUILD_TESTING=OFF -DENABLE_MANUAL=OFF -DCURL_USE_LIBSSH2=OFF -DUSE_NGHTTP2=OFF \
    -DCURL_ZLIB=OFF -DCURL_BROTLI=OFF -DCURL_ZSTD=OFF -DUSE_LIBIDN2=OFF -DENABLE_ARES=OFF \
    -DCURL_DISABLE_LDAP=ON -DENABLE_UNIX_SOCKETS=OFF
}
