#!/usr/bin/env bash
# Build llama.cpp's shared libraries with CUDA for one GPU architecture (default sm_90: H100/H200) from the
# llama.cpp that llama-cpp-python vendors, so the pure-Python llama_cpp package of the same version can
# load them (LLAMA_CPP_LIB_PATH). Packs the five stripped libraries into a zstd tarball.
#
# usage: scripts/build_llama_cuda.sh [options] [OUTDIR]
#
#   OUTDIR               where the tarball goes (default .carry): OUTDIR/llama-cuda-sm<ARCH>.tar.zst
#   -j, --jobs N         parallel compile jobs (default: all cores)
#   --configure-only     check the toolchain and run cmake configure, then stop
#   --target T           build only target T (for example one object:
#                        ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/arange.cu.o), then stop
#   --pack-source        write OUTDIR/llama-cpp-src.tar.zst (the source subset this build needs, a few MB,
#                        for building on a machine without network), then stop
#   --workdir DIR        scratch folder (default $BUILD_WORKDIR or /tmp/benchcal-llama-cuda)
#   -h, --help           this text
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  llama-cpp-python release whose vendored llama.cpp is built (default 0.3.36)
#   LLAMA_SRC                 a llama.cpp source folder to use as is
#   LLAMA_SRC_TARBALL         a source tarball made by --pack-source (default .carry/llama-cpp-src.tar.zst)
#   LLAMA_SDIST               the llama-cpp-python sdist (.tar.gz); else `pip download` fetches it
#   CUDA_HOME                 CUDA toolkit root (default: /usr/local/cuda, or found from nvcc)
#   CUBLAS_WHEEL              an nvidia-cublas wheel, used when neither the toolkit nor Python has cuBLAS
#   CUBLAS_SPEC               what `pip download` asks for then (default "nvidia-cublas==13.0.2.14", the
#                             cuBLAS of CUDA 13.0: headers no newer than the runtime library they meet)
#   CUDA_ARCH                 CMAKE_CUDA_ARCHITECTURES (default 90)
#   PYTHON                    interpreter for pip and for finding the nvidia packages (default python3)
#
# Sources are found in this order: LLAMA_SRC, LLAMA_SRC_TARBALL, LLAMA_SDIST, pip download.
# cuBLAS is found in this order: the toolkit itself, the Python nvidia-cublas package (nvidia/cu13 or
# nvidia/cublas), CUBLAS_WHEEL, pip download. When the toolkit lacks it, a copy of the toolkit gets the
# cuBLAS headers and libraries added (nvcc reads its include folder from its own location, so the copy
# is what makes cublas_v2.h visible to every compile).
#
# No libcuda stub is needed: GGML_CUDA_NO_VMM=ON keeps libggml-cuda from linking the driver library.
# The CPU backend is built without -march=native (GGML_NATIVE=OFF) so the libraries run on any x86-64
# with AVX2. Only the libraries are built (no tools, server, examples, tests, curl or OpenSSL).
#
# Timing: about 22 minutes on 2 cores for the full build; the CUDA kernels dominate, so 16 cores take a
# few minutes.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
LLAMA_CPP_PYTHON_VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CUDA_ARCH="${CUDA_ARCH:-90}"
PYTHON="${PYTHON:-python3}"
CUBLAS_SPEC="${CUBLAS_SPEC:-nvidia-cublas==13.0.2.14}"
LIBS=(ggml-base ggml-cpu ggml-cuda ggml llama)

jobs="$(nproc 2>/dev/null || echo 2)"
configure_only=0
pack_source=0
target=""
workdir="${BUILD_WORKDIR:-/tmp/benchcal-llama-cuda}"
outdir=""
while [ "$#" -gt 0 ]; do
    case "$1" in
        -j|--jobs) jobs="$2"; shift 2 ;;
        -j[0-9]*) jobs="${1#-j}"; shift ;;
        --configure-only) configure_only=1; shift ;;
        --target) target="$2"; shift 2 ;;
        --pack-source) pack_source=1; shift ;;
        --workdir) workdir="$2"; shift 2 ;;
        -h|--help) usage; exit 0 ;;
        -*) echo "build_llama_cuda: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) [ -z "$outdir" ] || { echo "build_llama_cuda: one OUTDIR only" >&2; exit 2; }; outdir="$1"; shift ;;
    esac
done
outdir="${outdir:-$REPO_ROOT/.carry}"
mkdir -p "$workdir" "$outdir"
workdir="$(cd "$workdir" && pwd)"
outdir="$(cd "$outdir" && pwd)"
LLAMA_SRC_TARBALL="${LLAMA_SRC_TARBALL:-$REPO_ROOT/.carry/llama-cpp-src.tar.zst}"
started_s=$SECONDS

say() { printf '[build_llama_cuda %4ds] %s\n' "$((SECONDS - started_s))" "$*" >&2; }
die() { say "error: $*"; exit 1; }

# ------------------------------------------------------------------------------------------------ source

find_source() {
    if [ -n "${LLAMA_SRC:-}" ]; then
        [ -f "$LLAMA_SRC/ggml/src/ggml-cuda/CMakeLists.txt" ] || die "LLAMA_SRC=$LLAMA_SRC is not a llama.cpp tree"
        echo "$LLAMA_SRC"; return
    fi
    local unpacked="$workdir/src/llama.cpp"
    if [ -f "$unpacked/ggml/src/ggml-cuda/CMakeLists.txt" ]; then
        echo "$unpacked"; return
    fi
    mkdir -p "$workdir/src"
    if [ -f "$LLAMA_SRC_TARBALL" ]; then
        say "unpacking $LLAMA_SRC_TARBALL"
        tar -I zstd -xf "$LLAMA_SRC_TARBALL" -C "$workdir/src"
        echo "$unpacked"; return
    fi
    local sdist="${LLAMA_SDIST:-}"
    if [ -z "$sdist" ]; then
        sdist="$workdir/llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION.tar.gz"
        if [ ! -f "$sdist" ]; then
            say "downloading the llama-cpp-python $LLAMA_CPP_PYTHON_VERSION sdist"
            "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps \
                "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -d "$workdir" \
                || die "could not download the sdist; set LLAMA_SDIST, LLAMA_SRC or LLAMA_SRC_TARBALL"
        fi
    fi
    [ -f "$sdist" ] || die "sdist $sdist not found"
    say "unpacking the vendored llama.cpp from $(basename "$sdist")"
    local top="llama_cpp_python-$LLAMA_CPP_PYTHON_VERSION"
    tar -xzf "$sdist" -C "$workdir/src" "$top/vendor/llama.cpp" "$top/CHANGELOG.md"
    mv "$workdir/src/$top/vendor/llama.cpp" "$unpacked"
    {
        echo "llama_cpp_python_version=$LLAMA_CPP_PYTHON_VERSION"
        # The first "update llama.cpp to ggml-org/llama.cpp@<commit>" line is the vendored commit.
        echo "llama_cpp_commit=$(sed -n 's/.*llama\.cpp@\([0-9a-f]*\).*/\1/p' "$workdir/src/$top/CHANGELOG.md" | head -n1)"
    } >"$unpacked/BENCHCAL_SOURCE_INFO"
    rm -rf "${workdir:?}/src/$top"
    echo "$unpacked"
}

# The parts of llama.cpp that a libraries-only CUDA build reads (other GPU backends, tools, models,
# docs and tests left out).
SOURCE_PARTS=(BENCHCAL_SOURCE_INFO CMakeLists.txt LICENSE cmake include src vendor licenses ggml/CMakeLists.txt ggml/cmake
              ggml/include ggml/src/CMakeLists.txt ggml/src/ggml-cpu ggml/src/ggml-cuda)

pack_source_tarball() {
    local src="$1" stage="$workdir/source-stage"
    rm -rf "$stage"
    mkdir -p "$stage/llama.cpp/ggml/src"
    local part
    for part in "${SOURCE_PARTS[@]}"; do
        [ -e "$src/$part" ] || continue
        mkdir -p "$stage/llama.cpp/$(dirname "$part")"
        cp -a "$src/$part" "$stage/llama.cpp/$part"
    done
    find "$src/ggml/src" -maxdepth 1 -type f -exec cp -a {} "$stage/llama.cpp/ggml/src/" \;
    local tarball="$outdir/llama-cpp-src.tar.zst"
    tar -I 'zstd -19 -T0' -cf "$tarball.partial" -C "$stage" llama.cpp
    mv "$tarball.partial" "$tarball"
    rm -rf "$stage"
    say "wrote $tarball ($(du -h "$tarball" | cut -f1))"
}

# ---------------------------------------------------------------------------------------------- toolkit

find_toolkit() {
    local candidate nvcc_real
    for candidate in "${CUDA_HOME:-}" "${CUDA_PATH:-}" /usr/local/cuda /usr/local/cuda-13.0; do
        if [ -n "$candidate" ] && [ -x "$candidate/bin/nvcc" ] && [ -f "$candidate/include/cuda_runtime.h" ]; then
            (cd "$candidate" && pwd -P); return
        fi
    done
    # nvcc may be a wrapper script: ask it where its files are (nvcc -v prints "#$ TOP=...").
    if command -v nvcc >/dev/null 2>&1; then
        nvcc_real="$(nvcc -v --version 2>&1 | sed -n 's/^#\$ TOP=//p' | head -n1)"
        if [ -n "$nvcc_real" ] && [ -f "$nvcc_real/include/cuda_runtime.h" ]; then
            (cd "$nvcc_real" && pwd -P); return
        fi
    fi
    die "no CUDA toolkit with nvcc found (set CUDA_HOME)"
}

toolkit_has_cublas() {
    [ -f "$1/include/cublas_v2.h" ] && { [ -e "$1/lib64/libcublas.so" ] || [ -e "$1/lib/libcublas.so" ]; }
}

# Folder holding include/cublas_v2.h and lib/libcublas.so.* from Python's nvidia packages, if any.
python_cublas_dir() {
    command -v "$PYTHON" >/dev/null 2>&1 || return 0
    "$PYTHON" - <<'PY' 2>/dev/null || true
import importlib.util, pathlib
spec = importlib.util.find_spec("nvidia")
for root in (spec.submodule_search_locations if spec else []):
    for sub in ("cu13", "cublas"):
        base = pathlib.Path(root) / sub
        if (base / "include" / "cublas_v2.h").is_file() and list((base / "lib").glob("libcublas.so.*")):
            print(base)
            raise SystemExit(0)
PY
}

# Unzip the include/ and lib/ folders of an nvidia-cublas wheel; prints the folder that holds them.
wheel_cublas_dir() {
    local wheel="${CUBLAS_WHEEL:-}" dest="$workdir/cublas"
    if [ -z "$wheel" ]; then
        wheel="$(find "$workdir/wheels" -maxdepth 1 -name 'nvidia_cublas-*.whl' 2>/dev/null | head -n1 || true)"
    fi
    if [ -z "$wheel" ]; then
        say "downloading $CUBLAS_SPEC"
        "$PYTHON" -m pip download --quiet --no-deps --only-binary :all: "$CUBLAS_SPEC" -d "$workdir/wheels" \
            || die "could not download $CUBLAS_SPEC; set CUBLAS_WHEEL"
        wheel="$(find "$workdir/wheels" -maxdepth 1 -name 'nvidia_cublas-*.whl' | head -n1)"
    fi
    [ -f "$wheel" ] || die "cuBLAS wheel $wheel not found"
    if [ ! -f "$dest/stamp" ] || [ "$(cat "$dest/stamp")" != "$(basename "$wheel")" ]; then
        rm -rf "$dest"
        mkdir -p "$dest"
        say "unzipping cuBLAS from $(basename "$wheel")"
        "$PYTHON" - "$wheel" "$dest" <<'PY'
import sys, zipfile, pathlib
wheel, dest = sys.argv[1], pathlib.Path(sys.argv[2])
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        parts = pathlib.PurePosixPath(name).parts
        for i, part in enumerate(parts[:-1]):
            if part in ("include", "lib") and parts[0] == "nvidia":
                target = dest / pathlib.Path(*parts[i:])
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(name))
                break
PY
        basename "$wheel" >"$dest/stamp"
    fi
    echo "$dest"
}

# A copy of the toolkit with cuBLAS headers and libraries added; prints its root.
toolkit_with_cublas() {
    local toolkit="$1" cublas="$2" copy="$workdir/cuda"
    local stamp="$toolkit|$cublas"
    if [ -f "$copy/.benchcal-stamp" ] && [ "$(cat "$copy/.benchcal-stamp")" = "$stamp" ]; then
        echo "$copy"; return
    fi
    rm -rf "$copy"
    say "copying the CUDA toolkit $toolkit to $copy and adding cuBLAS from $cublas"
    cp -a "$toolkit" "$copy"
    # Folders that are links out of the copy (an absolute link into the original toolkit) become real
    # copies, so nothing below writes into the original.
    local dir real
    for dir in include lib lib64 targets/*/include targets/*/lib; do
        [ -L "$copy/$dir" ] || continue
        real="$(readlink -f "$copy/$dir")"
        case "$real" in
            "$copy"/*) ;;
            *) rm "$copy/$dir"; cp -a "$real" "$copy/$dir" ;;
        esac
    done
    local lib_dir="$copy/lib64"
    [ -d "$lib_dir" ] || lib_dir="$copy/lib"
    lib_dir="$(cd "$lib_dir" && pwd -P)"
    cp -a "$cublas/include/." "$copy/include/"
    local so base
    for so in "$cublas"/lib/libcublas*.so.*; do
        base="${so##*/}"
        ln -sf "$so" "$lib_dir/$base"
        ln -sf "$base" "$lib_dir/${base%%.so.*}.so"
    done
    echo "$stamp" >"$copy/.benchcal-stamp"
    echo "$copy"
}

# Compile and link a tiny cuBLAS program for the target architecture: proves nvcc, the host compiler,
# the cuBLAS headers and the cuBLAS library work together (nothing is run: no GPU is needed).
check_toolchain() {
    local toolkit="$1" probe="$workdir/probe"
    mkdir -p "$probe"
    cat >"$probe/probe.cu" <<'CU'
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cstdio>
__global__ void scale(float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= a;
}
int main() {
    cublasHandle_t handle;
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) { std::puts("no GPU"); return 1; }
    scale<<<1, 32>>>(nullptr, 2.0f, 0);
    cublasDestroy(handle);
    return 0;
}
CU
    "$toolkit/bin/nvcc" -O2 -gencode "arch=compute_${CUDA_ARCH},code=sm_${CUDA_ARCH}" -o "$probe/probe" "$probe/probe.cu" \
        -L"$toolkit/lib64" -L"$toolkit/lib" -lcublas \
        || die "nvcc could not compile and link a cuBLAS program for sm_${CUDA_ARCH}"
    say "toolchain ok: nvcc $("$toolkit/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') compiled and linked a cuBLAS program for sm_${CUDA_ARCH}"
}

# ------------------------------------------------------------------------------------------------ build

configure() {
    local src="$1" toolkit="$2" build="$3"
    local generator=()
    command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
    say "cmake configure: $src -> $build"
    # shellcheck disable=SC2016  # $ORIGIN is for the dynamic loader, not the shell
    CUDACXX="$toolkit/bin/nvcc" cmake -S "$src" -B "$build" "${generator[@]}" \
        -DCMAKE_BUILD_TYPE=Release \
        -DCUDAToolkit_ROOT="$toolkit" \
        -DBUILD_SHARED_LIBS=ON \
        -DGGML_CUDA=ON \
        -DGGML_CUDA_NO_VMM=ON \
        -DGGML_CUDA_NCCL=OFF \
        -DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCH" \
        -DGGML_NATIVE=OFF \
        -DGGML_CCACHE=OFF \
        -DLLAMA_BUILD_COMMON=OFF \
        -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_TOOLS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF \
        -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF \
        -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON \
        -DCMAKE_INSTALL_RPATH='$ORIGIN' \
        -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=OFF \
        >"$build.configure.log" 2>&1 || { tail -n 40 "$build.configure.log" >&2; die "cmake configure failed"; }
    grep -E "CUDA Toolkit found|CUDA host compiler|Using CUDA architectures|Including CUDA backend" \
        "$build.configure.log" >&2 || true
}

pack_libraries() {
    local build="$1" toolkit="$2" cublas="$3" src="$4"
    local name="llama-cuda-sm${CUDA_ARCH}" stage="$workdir/stage"
    rm -rf "$stage"
    mkdir -p "$stage/$name/lib"
    local lib found
    for lib in "${LIBS[@]}"; do
        found="$(find "$build" -name "lib$lib.so*" -not -path '*/CMakeFiles/*' | head -n1)"
        [ -n "$found" ] || die "lib$lib.so was not built"
        cp -P "$(dirname "$found")"/lib"$lib".so* "$stage/$name/lib/"
    done
    find "$stage/$name/lib" -type f -name '*.so*' -exec strip --strip-unneeded {} \;
    {
        cat "$src/BENCHCAL_SOURCE_INFO" 2>/dev/null || echo "llama_cpp_python_version=$LLAMA_CPP_PYTHON_VERSION"
        echo "cuda_architectures=$CUDA_ARCH"
        echo "nvcc=$("$toolkit/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\), \(V[0-9.]*\).*/\1 \2/p')"
        echo "cublas=$cublas"
        echo "host_compiler=$(c++ --version | head -n1)"
        echo "glibc=$(ldd --version 2>&1 | head -n1)"
        echo "built_on=$(hostname) $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        # The newest glibc / libstdc++ symbol versions the libraries need (the host that loads them must
        # have at least these).
        echo "needs=$(objdump -T "$stage/$name"/lib/*.so 2>/dev/null | grep -o 'GLIBC_[0-9.]*\|GLIBCXX_[0-9.]*' \
            | sort -uV | awk -F_ '{last[$1] = $0} END {print last["GLIBC"], last["GLIBCXX"]}')"
        echo "cmake_flags=GGML_CUDA=ON GGML_CUDA_NO_VMM=ON GGML_CUDA_NCCL=OFF GGML_NATIVE=OFF BUILD_SHARED_LIBS=ON"
    } >"$stage/$name/BUILD_INFO.txt"
    local tarball="$outdir/$name.tar.zst"
    tar -I 'zstd -19 -T0' -cf "$tarball.partial" -C "$stage" "$name"
    mv "$tarball.partial" "$tarball"
    say "libraries: $(du -sh "$stage/$name/lib" | cut -f1) stripped; wrote $tarball ($(du -h "$tarball" | cut -f1))"
    rm -rf "$stage"
}

main() {
    local src
    src="$(find_source)"
    if [ "$pack_source" = 1 ]; then
        pack_source_tarball "$src"
        return
    fi
    local toolkit cublas=""
    toolkit="$(find_toolkit)"
    if toolkit_has_cublas "$toolkit"; then
        cublas="$toolkit (bundled)"
    else
        cublas="$(python_cublas_dir)"
        [ -n "$cublas" ] || cublas="$(wheel_cublas_dir)"
        toolkit="$(toolkit_with_cublas "$toolkit" "$cublas")"
    fi
    say "CUDA toolkit: $toolkit; cuBLAS: $cublas"
    check_toolchain "$toolkit"
    local build="$workdir/build-sm$CUDA_ARCH"
    configure "$src" "$toolkit" "$build"
    if [ "$configure_only" = 1 ]; then
        say "configured $build"
        return
    fi
    if [ -n "$target" ]; then
        cmake --build "$build" --target "$target" -j "$jobs"
        say "built $target"
        return
    fi
    say "building ${LIBS[*]} with $jobs jobs"
    cmake --build "$build" --target llama -j "$jobs"
    pack_libraries "$build" "$toolkit" "$cublas" "$src"
    say "done in $((SECONDS - started_s)) s"
}

main
