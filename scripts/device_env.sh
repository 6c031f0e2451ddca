#!/usr/bin/env bash
# Helpers that make the harness run llama.cpp on a GPU machine that has Python, torch and the CUDA runtime
# but neither llama-cpp-python nor gguf: the pure-Python llama_cpp and gguf packages travel in a folder
# (".carry/site"), the CUDA build of llama.cpp's libraries travels as a tarball made by
# scripts/build_llama_cuda.sh, and the CUDA runtime and cuBLAS come from the machine's Python nvidia packages.
#
# Run it to prepare what travels (on a machine where .venv has llama-cpp-python and gguf):
#
#   bash scripts/device_env.sh prepare [CARRY_DIR]   # site/ and llama-cpp-src.tar.zst in CARRY_DIR (.carry)
#   bash scripts/device_env.sh site DEST             # only the site folder
#   bash scripts/device_env.sh check [CARRY_DIR]     # what is there, and the total size that would travel
#
# or source it for its functions (scripts/device_calibrate.sh does):
#
#   benchcal_prepare_site DEST [PYTHON]     llama_cpp (without its lib/*.so), gguf, diskcache -> DEST
#   benchcal_pack_libs LIBDIR NAME FILE     LIBDIR's libggml*/libllama* as NAME/lib/ in a zstd tarball FILE
#   benchcal_unpack_libs FILE DEST          unpack such a tarball into DEST; prints the lib folder
#   benchcal_cuda_lib_dirs PYTHON           folders holding libcudart.so.13 / libcublas.so.13, colon-joined
#   benchcal_llama_env SITE LIBDIR PYTHON   export PYTHONPATH, LLAMA_CPP_LIB_PATH, LD_LIBRARY_PATH
#   benchcal_llama_check PYTHON [gpu]       import llama_cpp through that environment; with "gpu", require
#                                           a library that can offload to a GPU; prints the system info
#
# llama-cpp-python 0.3.36 loads ``libllama.so`` from ``$LLAMA_CPP_LIB_PATH`` when that variable is set
# (llama_cpp/llama_cpp.py, through load_shared_library in llama_cpp/_ctypes_extensions.py), else from
# its own lib/ folder. libllama's RUNPATH is $ORIGIN, so the ggml libraries beside it are found; the
# CUDA runtime and cuBLAS are found through LD_LIBRARY_PATH.

BENCHCAL_REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BENCHCAL_SITE_PACKAGES=(llama_cpp gguf diskcache)
BENCHCAL_LIB_NAMES=(libggml-base libggml-cpu libggml-cuda libggml libllama)

benchcal_prepare_site() {
    local dest="$1" python="${2:-$BENCHCAL_REPO_ROOT/.venv/bin/python}"
    [ -n "$dest" ] || { echo "benchcal_prepare_site: DEST missing" >&2; return 2; }
    rm -rf "$dest"
    mkdir -p "$dest"
    "$python" - "$dest" "${BENCHCAL_SITE_PACKAGES[@]}" <<'PY'
import importlib.metadata as md
import importlib.util
import pathlib
import shutil
import sys

dest = pathlib.Path(sys.argv[1])
lines = []
for name in sys.argv[2:]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"benchcal_prepare_site: package {name} not found for {sys.executable}")
    source = pathlib.Path(list(spec.submodule_search_locations)[0])
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.so.*", "*.dylib", "*.dll")
    shutil.copytree(source, dest / name, ignore=ignore)
    distribution = {"llama_cpp": "llama-cpp-python"}.get(name, name)
    try:
        version = md.version(distribution)
    except md.PackageNotFoundError:
        version = "unknown"
    lines.append(f"{distribution}=={version}")
(dest / "SITE_INFO.txt").write_text("\n".join(lines) + f"\nprepared_with={sys.version.split()[0]}\n")
print("\n".join(lines))
PY
}

benchcal_pack_libs() {
    local libdir="$1" name="$2" file="$3" stage
    stage="$(mktemp -d)"
    mkdir -p "$stage/$name/lib"
    local base found=0
    for base in "${BENCHCAL_LIB_NAMES[@]}"; do
        if compgen -G "$libdir/$base.so*" >/dev/null; then
            cp -P "$libdir/$base".so* "$stage/$name/lib/"
            found=$((found + 1))
        fi
    done
    echo "packed from $libdir" >"$stage/$name/BUILD_INFO.txt"
    mkdir -p "$(dirname "$file")"
    tar -I zstd -cf "$file" -C "$stage" "$name"
    rm -rf "$stage"
    [ "$found" -gt 0 ] || { echo "benchcal_pack_libs: no llama/ggml libraries in $libdir" >&2; return 1; }
}

benchcal_unpack_libs() {
    local file="$1" dest="$2" top
    [ -f "$file" ] || { echo "benchcal_unpack_libs: $file not found" >&2; return 1; }
    mkdir -p "$dest"
    top="$(tar -I zstd -tf "$file" | head -n1 | cut -d/ -f1)"
    [ -n "$top" ] || { echo "benchcal_unpack_libs: $file is empty" >&2; return 1; }
    rm -rf "${dest:?}/$top"
    tar -I zstd -xf "$file" -C "$dest" || return 1
    [ -e "$dest/$top/lib/libllama.so" ] || { echo "benchcal_unpack_libs: no lib/libllama.so in $file" >&2; return 1; }
    echo "$dest/$top/lib"
}

benchcal_cuda_lib_dirs() {
    local python="$1"
    "$python" - <<'PY' 2>/dev/null || true
import importlib.util
import pathlib

wanted = ("libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13")
folders = []
spec = importlib.util.find_spec("nvidia")
roots = [pathlib.Path(p) for p in (spec.submodule_search_locations if spec else [])]
for root in roots:
    for name in wanted:
        for hit in sorted(root.glob(f"*/lib/{name}")):
            if str(hit.parent) not in folders:
                folders.append(str(hit.parent))
for toolkit in (pathlib.Path("/usr/local/cuda/lib64"), pathlib.Path("/usr/local/cuda/lib")):
    if any((toolkit / name).exists() for name in wanted) and str(toolkit) not in folders:
        folders.append(str(toolkit))
print(":".join(folders))
PY
}

benchcal_llama_env() {
    local site="$1" libdir="$2" python="$3" cuda_dirs
    cuda_dirs="$(benchcal_cuda_lib_dirs "$python")"
    export PYTHONPATH="$site:$BENCHCAL_REPO_ROOT${PYTHONPATH:+:$PYTHONPATH}"
    export LLAMA_CPP_LIB_PATH="$libdir"
    export LD_LIBRARY_PATH="$libdir${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}

benchcal_llama_check() {
    local python="$1" want="${2:-}"
    "$python" - "$want" <<'PY'
import os
import sys

import llama_cpp

gpu = bool(llama_cpp.llama_supports_gpu_offload())
info = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
print(f"llama_cpp {llama_cpp.__version__} from {os.path.dirname(llama_cpp.__file__)}")
print(f"library folder: {os.environ.get('LLAMA_CPP_LIB_PATH')}")
print(f"gpu offload: {gpu}; system info: {info}")
import gguf  # noqa: F401  the synthetic checkpoint writer needs it

sys.exit(0 if gpu or sys.argv[1] != "gpu" else 3)
PY
}

# ------------------------------------------------------------------------------------------ command line

_benchcal_check() {
    local carry="$1" path
    for path in "$carry/site/SITE_INFO.txt" "$carry/llama-cuda-sm90.tar.zst" "$carry/llama-cpp-src.tar.zst"; do
        if [ -e "$path" ]; then
            echo "present  $(du -sh "$path" | cut -f1)  $path"
        else
            echo "MISSING           $path"
        fi
    done
    [ -f "$carry/site/SITE_INFO.txt" ] && sed 's/^/  site: /' "$carry/site/SITE_INFO.txt"
    local tree_bytes carry_bytes
    tree_bytes="$(cd "$BENCHCAL_REPO_ROOT" && { git ls-files; git ls-files --others --exclude-standard; } | sort -u \
        | while read -r f; do [ -f "$f" ] && stat -c %s "$f"; done | awk '{s += $1} END {print s + 0}')"
    carry_bytes="$(du -sb "$carry" 2>/dev/null | cut -f1)"
    echo "working tree $((tree_bytes / 1048576)) MiB + carry $((${carry_bytes:-0} / 1048576)) MiB" \
         "(the device call takes 64 MiB in all)"
}

_benchcal_main() {
    local command="${1:-}" carry="${2:-$BENCHCAL_REPO_ROOT/.carry}"
    case "$command" in
        site)
            [ -n "${2:-}" ] || { echo "usage: $0 site DEST" >&2; return 2; }
            benchcal_prepare_site "$2" ;;
        prepare)
            benchcal_prepare_site "$carry/site" || return 1
            if [ ! -f "$carry/llama-cpp-src.tar.zst" ]; then
                bash "$BENCHCAL_REPO_ROOT/scripts/build_llama_cuda.sh" --pack-source "$carry" || return 1
            fi
            _benchcal_check "$carry" ;;
        check)
            _benchcal_check "$carry" ;;
        *)
            sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
            [ "$command" = "-h" ] || [ "$command" = "--help" ] ;;
    esac
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    _benchcal_main "$@"
fi
