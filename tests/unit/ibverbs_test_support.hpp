// Shared by the ibverbs transport's unit tests: the control functions of the fake libibverbs
// (tests/fake_ibverbs), reached through the same loaded library the transport uses, and the tests' scope
// that sets WB_* settings and puts them back (tests/support/setting_scope.hpp).
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../support/setting_scope.hpp"

namespace wb::ibv::testing {

using wb::testing::SettingScope;

/// What the fake recorded of a queue pair (struct wbfake_qp_info in fake_ibverbs.cpp).
struct FakeQpInfo {
  int state;
  int is_global;
  std::uint16_t dlid;
  std::uint8_t sgid_index;
  std::uint8_t port;
  std::uint16_t pkey_index;
  std::uint32_t dest_qp;
  std::uint32_t max_send_wr;
  std::uint8_t dgid[16];
};

/// The fake library at `path` (dlopen gives the transport's loader the same copy and state).
class FakeVerbs {
 public:
  explicit FakeVerbs(std::string path) : path_(std::move(path)) {
    handle_ = ::dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) return;
    bind(reset, "wbfake_reset");
    bind(add_device, "wbfake_add_device");
    bind(add_port, "wbfake_add_port");
    bind(set_gid, "wbfake_set_gid");
    bind(set_pkeys, "wbfake_set_pkeys");
    bind(fail_write, "wbfake_fail_write");
    bind(event, "wbfake_event");
    bind(qp_info, "wbfake_qp_info");
    bind(opcodes, "wbfake_opcodes");
    bind(log, "wbfake_log");
    bind(overruns, "wbfake_overruns");
    bind(mr_access, "wbfake_mr_access");
    bind(srq_receives, "wbfake_srq_receives");
  }
  bool loaded() const { return handle_ != nullptr && reset != nullptr; }
  const std::string& path() const { return path_; }

  void (*reset)() = nullptr;
  int (*add_device)(const char* name, const char* sysfs_dir, int fail_open, std::uint32_t max_srq_wr,
                    std::uint32_t max_cqe) = nullptr;
  int (*add_port)(int device, int state, int link_layer, std::uint16_t lid, std::uint8_t flags) = nullptr;
  void (*set_gid)(int device, int port, int index, int type, const std::uint8_t* gid) = nullptr;
  void (*set_pkeys)(int device, int port, const std::uint16_t* pkeys, int count) = nullptr;
  void (*fail_write)(std::uint32_t qp_num, int after, int status) = nullptr;
  int (*event)(int device, int type, std::uint32_t number) = nullptr;
  int (*qp_info)(std::uint32_t qp_num, FakeQpInfo* out) = nullptr;
  const char* (*opcodes)(std::uint32_t qp_num) = nullptr;
  const char* (*log)() = nullptr;
  std::uint64_t (*overruns)() = nullptr;
  int (*mr_access)(std::uint32_t key) = nullptr;
  int (*srq_receives)(std::uint32_t qp_num, std::uint32_t* capacity) = nullptr;

 private:
  template <class Fn>
  void bind(Fn& slot, const char* name) {
    slot = reinterpret_cast<Fn>(::dlsym(handle_, name));
  }
  std::string path_;
  void* handle_ = nullptr;
};

}  // namespace wb::ibv::testing
