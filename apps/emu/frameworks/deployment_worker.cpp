// A deployment's worker by world rank, for every program and test that lays the ranks out as wb-replay does.
#include "emu/frameworks/backend.hpp"

namespace wb::emu {

std::unique_ptr<EmulatedWorker> make_worker(const ModelConfig& model, const Deployment& deployment, int world_rank) {
  return deployment.is_trainer(world_rank)
             ? make_trainer_worker(model, deployment.trainer, world_rank)
             : make_rollout_worker(model, deployment.rollout, world_rank - deployment.trainer.world_size());
}

}  // namespace wb::emu
