#include "emu/setup/reference_ahead.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>

#include "emu/check/checkpoint_check.hpp"

namespace wb::emu {

// The checkpoint of one version as the helper reads it: every box waits for the gate first.
class ReferenceAhead::GatedReader : public CheckpointReader {
 public:
  GatedReader(ReferenceAhead& owner, const CheckpointReader& base) : owner_(owner), base_(base) {}
  const std::vector<TensorInfo>& tensors() const override { return base_.tensors(); }
  void read_box(std::string_view name, const Box& box, void* destination) const override {
    owner_.gate();
    base_.read_box(name, box, destination);
  }
  std::string source() const override { return base_.source(); }

 private:
  ReferenceAhead& owner_;
  const CheckpointReader& base_;
};

ReferenceAhead::ReferenceAhead(const EmulatedWorker& worker, const RunSetup& setup, double slice_ms)
    : worker_(worker), setup_(setup), slice_ms_(slice_ms), expected_(worker.parameter_infos()) {
  helper_ = std::thread([this] { loop(); });
}

ReferenceAhead::~ReferenceAhead() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  helper_.join();  // parked or idle: the loop never leaves the gate open
}

void ReferenceAhead::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stop_ || (target_ != loaded_ && gate_open_); });
    if (stop_) return;
    loading_ = target_;
    loaded_ = kNone;  // expected_ is being overwritten
    running_ = true;
    lock.unlock();
    bool cancelled = false;
    std::string error;
    try {
      for (const Parameter& p : expected_.parameters()) std::memset(p.view.data, 0, p.view.nbytes());
      const EngineVersion version(setup_, loading_, worker_.loads_fp8_form());
      worker_.load_weights(GatedReader(*this, version.reader()), expected_.parameters());
    } catch (const Cancelled&) {
      cancelled = true;
    } catch (const std::exception& e) {
      error = e.what();
    }
    lock.lock();
    running_ = false;
    if (!cancelled) {
      loaded_ = loading_;
      failure_ = error;
    }
    loading_ = kNone;
    changed_.notify_all();
  }
}

void ReferenceAhead::gate() {
  std::unique_lock<std::mutex> lock(mutex_);
  running_ = false;
  changed_.notify_all();
  changed_.wait(lock, [this] { return stop_ || gate_open_ || target_ != loading_; });
  if (stop_ || target_ != loading_) throw Cancelled{};
  running_ = true;
}

bool ReferenceAhead::run_helper(std::unique_lock<std::mutex>& lock, std::chrono::steady_clock::time_point until) {
  gate_open_ = true;
  changed_.notify_all();
  changed_.wait_until(lock, until, [this] { return loaded_ == target_; });
  gate_open_ = false;
  return changed_.wait_for(lock, std::chrono::seconds(kParkSeconds), [this] { return !running_; });
}

void ReferenceAhead::expect(std::uint64_t version) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (target_ == version) return;
    target_ = version;
  }
  changed_.notify_all();  // a load of another version stops at its next read
}

void ReferenceAhead::inference_step(double ms) {
  using clock = std::chrono::steady_clock;
  const clock::time_point began = clock::now();
  const auto after = [began](double at_ms) {
    return began + std::chrono::duration_cast<clock::duration>(std::chrono::duration<double, std::milli>(at_ms));
  };
  {
    std::unique_lock<std::mutex> lock(mutex_);
    // (A helper that did not stop within kParkSeconds runs on; the install's difference() waits for it.)
    if (target_ != loaded_) run_helper(lock, after(std::max(ms, slice_ms_)));
  }
  std::this_thread::sleep_until(after(ms));
}

bool ReferenceAhead::holds(std::uint64_t version) {
  std::lock_guard<std::mutex> lock(mutex_);
  return loaded_ == version;
}

std::string ReferenceAhead::difference(const ParameterSet& params, std::uint64_t version) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (target_ != version) {
    target_ = version;
    changed_.notify_all();
  }
  const std::string what = "the engine's own load_weights of version " + std::to_string(version);
  if (loaded_ != version) {
    const bool parked = run_helper(lock, std::chrono::steady_clock::now() + std::chrono::seconds(kLoadSeconds));
    if (loaded_ != version)
      return what + (parked ? " did not finish within " + std::to_string(kLoadSeconds) + " s"
                            : " did not stop at a read within " + std::to_string(kParkSeconds) + " s");
  }
  if (!failure_.empty()) return what + " failed: " + failure_;
  return first_difference(params, expected_.parameters());
}

}  // namespace wb::emu
