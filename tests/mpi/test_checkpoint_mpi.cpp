// Every rank of an MPI job opens the same checkpoint files at once and reads its own boxes, as the
// workers of a deployment do at start-up; values must equal the synthetic reference.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <filesystem>

#include "core/checks.hpp"
#include "core/log.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/models/model.hpp"
#include "weightbridge/checkpoint.hpp"

namespace wb::emu {
namespace {

std::filesystem::path shared_directory() {
  // Rank 0 names the directory (its pid), every rank uses it.
  int pid = static_cast<int>(::getpid());
  WB_CHECK_MPI(MPI_Bcast(&pid, 1, MPI_INT, 0, MPI_COMM_WORLD));
  return std::filesystem::temp_directory_path() / ("wb_mpi_checkpoint_" + std::to_string(pid));
}

class CheckpointUnderMpi : public ::testing::TestWithParam<CheckpointFormat> {};

TEST_P(CheckpointUnderMpi, AllRanksReadTheirBoxesConcurrently) {
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const ModelConfig model = scale_model(load_named_model_config("qwen3-30b-a3b"));
  const std::vector<TensorInfo> tensors = model_tensors(model);
  const auto dir = shared_directory();
  const auto path = dir / (GetParam() == CheckpointFormat::kHdf5 ? "model.h5" : "model.safetensors.index.json");
  if (rank == 0) {
    std::filesystem::create_directories(dir);
    CheckpointWriterOptions options;
    if (GetParam() == CheckpointFormat::kSafetensors) options.max_shard_bytes = 1 << 20;
    write_synthetic_checkpoint(path.string(), GetParam(), tensors, 42, options);
  }
  WB_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));

  auto reader = open_checkpoint(path.string());
  ASSERT_EQ(reader->tensors().size(), tensors.size());
  std::vector<std::byte> got, want;
  // Rank r reads row block r of every 2-D tensor (a TP shard) and checks it against the reference.
  for (std::size_t t = static_cast<std::size_t>(rank); t < tensors.size(); t += 3) {
    const TensorInfo& info = tensors[t];
    Box box = Box::whole(info.shape);
    if (info.shape.size() == 2 && info.shape[0] % size == 0) {
      box.extent[0] = info.shape[0] / size;
      box.offset[0] = box.extent[0] * rank;
    }
    got.resize(static_cast<std::size_t>(box.numel()) * dtype_size(info.dtype));
    want.resize(got.size());
    reader->read_box(info.name, box, got.data());
    fill_synthetic(info, box, 42, want.data());
    ASSERT_EQ(got, want) << info.name << box.to_string() << " on rank " << rank;
  }
  reader.reset();
  WB_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
  if (rank == 0) std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Formats, CheckpointUnderMpi,
                         ::testing::Values(CheckpointFormat::kHdf5, CheckpointFormat::kSafetensors),
                         [](const auto& info) { return info.param == CheckpointFormat::kHdf5 ? "hdf5" : "safetensors"; });

TEST(ChecksUnderMpi, ErrorsNameTheRank) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  try {
    WB_CHECK_MPI(MPI_Bcast(nullptr, -1, MPI_INT, 0, MPI_COMM_WORLD));
    FAIL() << "a negative count must fail";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("[rank " + std::to_string(rank) + "]"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("MPI_Bcast"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("MPI_ERR_COUNT"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("test_checkpoint_mpi.cpp:"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace wb::emu
