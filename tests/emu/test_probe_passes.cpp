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

std::string digits_text(const ProbePlan& plan) {
  std::string text;
  for (int f = 0; f < plan.num_fields(); ++f)
    text += (f ? " + " : "") + std::to_string(plan.field_digits(f)) + " (" + ProbePlan::field_name(f) + ")";
  return text;
}

TEST(ProbePasses, ShippedModels) {
  struct Row {
    std::string model;
    int bf16_passes;  // (tensor index, axis 0, axis 1) digits in base 32512
    int fp8_passes;   // the same tensor list stored as f8e4m3 (base 119)
  };
  // bf16: vocab > 32512 always takes two axis-0 digits; more than 32512 tensors take two id digits.
  const std::vector<Row> rows = {{"kimi-k2-instruct", 5, 9},
                                 {"moonlight-16b-a3b", 4, 7},
                                 {"qwen3-235b-a22b", 5, 8},
                                 {"qwen3-30b-a3b", 4, 8},
                                 {"qwen3-32b", 4, 8}};
  for (const Row& row : rows) {
    const ModelConfig config = load_named_model_config(row.model);
    std::vector<TensorInfo> tensors = model_tensors(config);
    for (TensorInfo& t : tensors) t.dtype = DType::kBF16;
    const ProbePlan bf16(tensors);
    for (TensorInfo& t : tensors) t.dtype = DType::kF8E4M3;
    const ProbePlan fp8(tensors);
    std::printf("  %-20s %6zu tensors  bf16: %d passes = %s;  f8e4m3: %d passes = %s\n", config.name.c_str(),
                tensors.size(), bf16.num_passes(), digits_text(bf16).c_str(), fp8.num_passes(),
                digits_text(fp8).c_str());
    EXPECT_EQ(bf16.num_passes(), row.bf16_passes) << row.model;
    EXPECT_EQ(fp8.num_passes(), row.fp8_passes) << row.model;
  }
  // The expectation for Kimi-K2 in bf16: 2 (id) + 2 (axis 0) + 1 (axis 1).
  std::vector<TensorInfo> kimi = model_tensors(load_named_model_config("kimi-k2-instruct"));
  for (TensorInfo& t : kimi) t.dtype = DType::kBF16;
  const ProbePlan plan(kimi);
  ASSERT_EQ(plan.num_fields(), 3);
  EXPECT_EQ(plan.field_digits(layout::kTensorField), 2);
  EXPECT_EQ(plan.field_digits(layout::axis_field(0)), 2);
  EXPECT_EQ(plan.field_digits(layout::axis_field(1)), 1);
}

}  // namespace
}  // namespace wb::emu
