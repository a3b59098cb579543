// ReferenceAhead (the engine job's check of each install): the version expected next is loaded only in the
// engine's inference steps, the check then finds every byte that differs, and a version other than the one
// prepared is loaded at the check.
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>

#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/models/model.hpp"
#include "emu/setup/reference_ahead.hpp"
#include "emu/setup/run_setup.hpp"

namespace wb::emu {
namespace {

struct Engine {
  RunSetup setup;
  std::unique_ptr<EmulatedWorker> worker;
  std::unique_ptr<HostParameters> params;

  Engine() {
    setup.model = scale_model(load_named_model_config("qwen3-30b-a3b"));
    setup.checkpoint = std::make_unique<SyntheticCheckpoint>(model_tensors(setup.model), 7);
    RolloutSpec spec;
    spec.engines = 1;
    spec.tp = 2;
    worker = make_rollout_worker(setup.model, spec, 1);
    params = std::make_unique<HostParameters>(worker->parameter_infos());
  }
  // What an install of `version` leaves in the parameters.
  void install(std::uint64_t version) {
    worker->load_weights(EngineVersion(setup, version, false).reader(), params->parameters());
  }
};

TEST(ReferenceAhead, LoadsTheNextVersionInInferenceStepsOnly) {
  Engine engine;
  ReferenceAhead reference(*engine.worker, engine.setup);
  reference.expect(3);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // a load takes about 10 ms here
  EXPECT_FALSE(reference.holds(3));  // nothing runs outside a step
  int steps = 0;
  while (!reference.holds(3) && steps < 10000) {
    reference.inference_step(0);
    ++steps;
  }
  ASSERT_TRUE(reference.holds(3)) << "not loaded after " << steps << " inference steps";
  engine.install(3);
  EXPECT_EQ(reference.difference(engine.params->parameters(), 3), "");
  // Another version than the one prepared: loaded at the check, and it differs from what is installed.
  EXPECT_NE(reference.difference(engine.params->parameters(), 4), "");
  EXPECT_TRUE(reference.holds(4));
}

TEST(ReferenceAhead, FindsAByteThatDiffers) {
  Engine engine;
  ReferenceAhead reference(*engine.worker, engine.setup);
  engine.install(2);
  reference.expect(2);
  reference.inference_step(1);
  const Parameter& last = engine.params->parameters()[engine.params->parameters().size() - 1];
  static_cast<unsigned char*>(last.view.data)[last.view.nbytes() - 1] ^= 0x40;
  const std::string difference = reference.difference(engine.params->parameters(), 2);
  EXPECT_NE(difference.find(last.name), std::string::npos) << difference;
  EXPECT_NE(difference.find("1 of"), std::string::npos) << difference;
}

TEST(ReferenceAhead, AnotherVersionWantedMidLoadIsTheOneChecked) {
  Engine engine;
  ReferenceAhead reference(*engine.worker, engine.setup, 0);  // a slice of one read at a time
  engine.install(5);
  reference.expect(6);
  reference.inference_step(0);
  EXPECT_FALSE(reference.holds(6));  // stopped at its second read
  EXPECT_EQ(reference.difference(engine.params->parameters(), 5), "");
  EXPECT_TRUE(reference.holds(5));
  reference.expect(6);
  EXPECT_NE(reference.difference(engine.params->parameters(), 6), "");
}

}  // namespace
}  // namespace wb::emu
