#!/usr/bin/env bash
# Installs the Debian packages WeightBridge needs to build, test and run. Idempotent: when every
# package is present it changes nothing and runs no apt-get at all.
set -euo pipefail

packages=(
  build-essential cmake pkg-config git
  openmpi-bin libopenmpi-dev
  libhdf5-openmpi-dev
  libboost-program-options-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  nlohmann-json3-dev
  libibverbs-dev
  libfabric-dev libfabric-bin
  iproute2 util-linux
  python3-matplotlib
  # h5py writes the HDF5 files the checkpoint tests read (only /usr/bin/python3 sees Debian's modules).
  python3-h5py python3-numpy
)
# The Python package (python/) and its tests: pybind11 and the headers to build it, Debian's torch (CPU),
# mpi4py and numpy to run it. They import only with Debian's /usr/bin/python3, which the build picks.
# libtorch-dev: torch's C++ headers, with which the check of the parameters before every update reads
# torch tensors in place (python/CMakeLists.txt).
if [[ "${WB_WITH_PYTHON:-1}" == "1" ]]; then
  packages+=(python3-dev pybind11-dev python3-numpy python3-mpi4py python3-torch libtorch-dev)
fi
# Slurm and munge for the srun tests and the sbatch scripts in slurm/.
if [[ "${WB_WITH_SLURM:-1}" == "1" ]]; then
  packages+=(slurm-wlm munge)
fi

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
