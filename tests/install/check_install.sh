#!/usr/bin/env bash
# Installs the build into a scratch prefix, then configures, builds and runs a downstream project that
# uses find_package(weightbridge).
set -euo pipefail
build=$1
source_dir=$2
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
cmake --install "$build" --prefix "$scratch/prefix" >/dev/null
cmake -S "$source_dir/consumer" -B "$scratch/consumer" -DCMAKE_PREFIX_PATH="$scratch/prefix" >/dev/null
cmake --build "$scratch/consumer" >/dev/null
LD_LIBRARY_PATH="$scratch/prefix/lib:${LD_LIBRARY_PATH:-}" "$scratch/consumer/consumer"
# The HDF5 checker the library starts on every HDF5 file: installed where the library looks for it, and
# finding the installed library by itself (its RUNPATH). On a file that is not HDF5 its walk refuses it
# with a line "e CODE MESSAGE" and kCheckerFoundError (86).
checker=$(find "$scratch/prefix" -path '*/libexec/weightbridge/wb-hdf5-check' | head -1)
[[ -x "$checker" ]] || { echo "check_install: no libexec/weightbridge/wb-hdf5-check under the prefix" >&2; exit 1; }
echo "not hdf5" > "$scratch/not.h5"
set +e
line=$(env -u LD_LIBRARY_PATH "$checker" "$scratch/not.h5" 2>/dev/null)
status=$?
set -e
[[ $status -eq 86 && $line == "e "* ]] || { echo "check_install: $checker on a non-HDF5 file: exit $status, '$line'" >&2; exit 1; }
echo "check_install: $checker refuses a non-HDF5 file as the library's reader does"
