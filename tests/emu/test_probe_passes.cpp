// Probe pass counts of the shipped model configs: how many load_weights passes the probe needs for each
// full-size tensor list (the library knows no model; the counts are checked here, beside the models).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "emu/models/model.hpp"
#include "layout/probe_code.hpp"

namespace wb::emu {
namespace {

using layout::ProbePlan;

TEST(ProbePasses, ShippedModels) {
  struct Row {
    std::string model;
    int bf16_passes;  // key digits in base 61,440 (bf16 codes of either sign)
    int fp8_passes;   // the same tensor list stored as f8e4m3 (base 192, whole digits per inner axis)
  };
  // A pass tells 61,440 bf16 keys apart: two passes up to 3.8e9 keys (about Π (extent + 1) summed over the
  // tensors), three up to 2.3e14, which is every shipped model.
  const std::vector<Row> rows = {{"kimi-k2-instruct", 3, 6},
                                 {"moonlight-16b-a3b", 3, 6},
                                 {"qwen3-235b-a22b", 3, 6},
                                 {"qwen3-30b-a3b", 3, 6},
                                 {"qwen3-32b", 3, 5}};
  for (const Row& row : rows) {
    const ModelConfig config = load_named_model_config(row.model);
    std::vector<TensorInfo> tensors = model_tensors(config);
    for (TensorInfo& t : tensors) t.dtype = DType::kBF16;
    const ProbePlan bf16(tensors);
    for (TensorInfo& t : tensors) t.dtype = DType::kF8E4M3;
    const ProbePlan fp8(tensors);
    std::printf("  %-20s %6zu tensors, %.3g keys  bf16: %d passes;  f8e4m3: %d passes\n", config.name.c_str(),
                tensors.size(), static_cast<double>(bf16.key_range(DType::kBF16)), bf16.num_passes(),
                fp8.num_passes());
    EXPECT_EQ(bf16.num_passes(), row.bf16_passes) << row.model;
    EXPECT_EQ(fp8.num_passes(), row.fp8_passes) << row.model;
  }
}

}  // namespace
}  // namespace wb::emu
