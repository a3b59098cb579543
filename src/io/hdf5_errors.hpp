// What libhdf5's error stack says about the call that just failed, for messages: the innermost entry, the
// function that detected the problem ("truncated file: eof = ..."), not the API entry's "unable to open file".
#pragma once

#include <hdf5.h>

#include <string>

namespace wb::detail {

struct Hdf5Failure {
  bool found = false;
  std::string text;
  hid_t minor = H5I_INVALID_HID;  // H5E_NOTHDF5, H5E_TRUNCATED, ... for classifying the failure
};

/// The innermost entry of this thread's default error stack ("HDF5 reported no details" when empty).
Hdf5Failure innermost_hdf5_failure();

}  // namespace wb::detail
