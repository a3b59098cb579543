#include "emu/setup/emulated_connect.hpp"

#include <utility>

#include "core/checks.hpp"
#include "layout/probe.hpp"
#include "layout/source_map_exchange.hpp"
#include "plan/planned_schedules.hpp"
#include "plan/round_schedule_scatter.hpp"

namespace wb::emu {

EmulatedConnection emulated_connect(const EmulatedWorker& worker, const ParameterSet& params,
                                    const std::vector<TensorInfo>& tensors, const Deployment& deployment,
                                    const PlanOptions& options, MPI_Comm comm) {
  int rank = 0, size = 1;
  WB_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  WB_CHECK_MPI(MPI_Comm_size(comm, &size));
  const SourceMap mine = probe_source_map(
      tensors, params, [&worker](const CheckpointReader& checkpoint, const ParameterSet& p) { worker.load_weights(checkpoint, p); });
  std::vector<SourceMap> maps = allgather_source_maps(mine, comm);
  EmulatedConnection connection;
  std::vector<std::vector<std::byte>> serialized;
  if (rank == 0) {
    const Topology topology = Topology::uniform(size, deployment.gpus_per_node, setting_defaults::node_bandwidth(),
                                                setting_defaults::intra_node_bandwidth());
    PlannedSchedules planned = plan_round_schedules(tensors, std::move(maps), deployment.sides(), topology, options);
    connection.model_bytes = planned.plan.bound.model_bytes;
    serialized = std::move(planned.schedules);
  }
  connection.schedule = scatter_round_schedules(serialized, 0, comm);
  return connection;
}

}  // namespace wb::emu
