// Probe → all-gather → correspondence under MPI, on several trainer/rollout layout pairs. Each rank is
// one emulated worker; the correspondence is checked against the checkpoint itself: at every position
// the correspondence names, the worker's loaded parameters hold exactly the checkpoint's element.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstring>

#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/described_map.hpp"
#include "emu/setup/emulated_rank.hpp"
#include "layout/probe.hpp"
#include "layout/source_map_exchange.hpp"
#include "weightbridge/correspondence.hpp"

namespace wb::emu {
namespace {

struct LayoutPair {
  std::string model;
  std::string trainer;
  std::string rollout;
};

class CorrespondenceUnderMpi : public ::testing::TestWithParam<LayoutPair> {};

TEST_P(CorrespondenceUnderMpi, ProbedCorrespondenceMatchesTheCheckpoint) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const EmulatedRank setup = emulated_rank({GetParam().model, 4, GetParam().trainer, GetParam().rollout}, rank, size);
  const std::vector<TensorInfo>& tensors = setup.tensors;
  const std::unique_ptr<EmulatedWorker>& worker = setup.worker;

  HostParameters params(worker->parameter_infos());
  const SourceMap mine = probe_source_map(tensors, params.parameters(),
                                          [&](const CheckpointReader& c, const ParameterSet& p) { worker->load_weights(c, p); });
  EXPECT_EQ(mine.copies, described_source_map(*worker, tensors).copies) << worker->describe();

  std::vector<SourceMap> maps = allgather_source_maps(mine, MPI_COMM_WORLD);
  ASSERT_EQ(static_cast<int>(maps.size()), size);
  EXPECT_EQ(maps[static_cast<std::size_t>(rank)].copies, mine.copies);
  const Correspondence correspondence = build_correspondence(tensors, std::move(maps), setup.deployment.sides());

  // Ground truth: the checkpoint, read directly, against this rank's parameters loaded from it.
  SyntheticCheckpoint checkpoint(tensors, 31337);
  worker->load_weights(checkpoint, params.parameters());
  std::int64_t needed_here = 0, checked = 0;
  std::vector<std::byte> expected;
  for (const Atom& atom : correspondence.atoms) {
    auto check = [&](const AtomEndpoint& endpoint) {
      if (endpoint.worker != rank) return;
      const TensorInfo& tensor = tensors[atom.tensor];
      const std::size_t element = dtype_size(tensor.dtype);
      expected.resize(static_cast<std::size_t>(atom.box.numel()) * element);
      checkpoint.read_box(tensor.name, atom.box, expected.data());
      const SliceCopy& copy = correspondence.maps[static_cast<std::size_t>(rank)].copies[endpoint.copy];
      const auto* param = static_cast<const std::byte*>(params.parameters()[copy.parameter].view.data);
      Shape index(atom.box.extent.size(), 0);
      for (std::int64_t k = 0; k < atom.box.numel(); ++k) {
        const std::int64_t at = correspondence.position(atom, endpoint, index);
        ASSERT_EQ(std::memcmp(param + at * static_cast<std::int64_t>(element), expected.data() + k * static_cast<std::int64_t>(element), element), 0)
            << worker->describe() << ": " << tensor.name << atom.box.to_string() << " element " << k;
        for (std::size_t a = index.size(); a-- > 0;) {
          if (++index[a] < atom.box.extent[a]) break;
          index[a] = 0;
        }
      }
      ++checked;
    };
    for (const AtomEndpoint& e : atom.holders) check(e);
    for (const AtomEndpoint& e : atom.needers) {
      check(e);
      if (e.worker == rank) needed_here += atom.box.numel();
    }
    ASSERT_FALSE(atom.holders.empty());
  }
  // A rollout needs exactly what its load_weights copies, each element once.
  if (!setup.deployment.is_trainer(rank)) {
    EXPECT_EQ(needed_here, mine.copied_elements()) << worker->describe();
  }
  EXPECT_GT(checked, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, CorrespondenceUnderMpi,
    ::testing::Values(LayoutPair{"qwen3-30b-a3b", "tp=2,ep=2,dp=2", "engines=2,tp=2,ep=2"},
                      LayoutPair{"moonlight-16b-a3b", "tp=2,pp=2", "engines=1,tp=4,ep=4,dp_attn=2,transpose=experts"},
                      LayoutPair{"qwen3-32b", "tp=4", "engines=2,tp=2"},
                      LayoutPair{"kimi-k2-instruct", "tp=2,dp=2,ep=4", "engines=1,tp=4,ep=4"}),
    [](const auto& info) { return "pair" + std::to_string(info.index); });

}  // namespace
}  // namespace wb::emu
