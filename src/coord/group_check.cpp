#include "coord/group_check.hpp"

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "comm/collectives.hpp"
#include "core/checks.hpp"

namespace wb::coord {
namespace {

struct Member {
  bool trainer = false;
  std::vector<int> group;  // world ranks, by group rank; -1 for a rank outside the world
};

std::string ranks_text(const std::vector<int>& ranks) {
  constexpr std::size_t kShown = 8;
  std::string text = "[";
  for (std::size_t i = 0; i < ranks.size() && i < kShown; ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > kShown) text += ", ... (" + std::to_string(ranks.size()) + " ranks)";
  return text + "]";
}

const char* comm_name(bool trainer) { return trainer ? "trainer_comm" : "engine_comm"; }
const char* adapter_name(bool trainer) { return trainer ? "a SenderAdapter" : "a ReceiverAdapter"; }

// The first disagreement, in world rank order: every rank finds the same one.
std::string first_disagreement(const std::vector<Member>& members) {
  for (std::size_t r = 0; r < members.size(); ++r) {
    const Member& mine = members[r];
    const std::string who = "world rank " + std::to_string(r) + " (" + adapter_name(mine.trainer) + ")";
    for (const int m : mine.group) {
      if (m < 0 || static_cast<std::size_t>(m) >= members.size())
        return who + " passes a " + comm_name(mine.trainer) + " with ranks outside the world communicator";
      const Member& theirs = members[static_cast<std::size_t>(m)];
      if (theirs.trainer != mine.trainer)
        return who + " passes a " + comm_name(mine.trainer) + " that holds world rank " + std::to_string(m) +
               ", which constructs " + adapter_name(theirs.trainer) + ": the " + comm_name(mine.trainer) +
               " holds " + (mine.trainer ? "the trainers only (not the world communicator)" : "one engine's workers only");
      if (theirs.group != mine.group)
        return "world ranks " + std::to_string(r) + " and " + std::to_string(m) + " disagree about their " +
               comm_name(mine.trainer) + ": world rank " + std::to_string(r) + "'s holds world ranks " +
               ranks_text(mine.group) + ", world rank " + std::to_string(m) + "'s holds " + ranks_text(theirs.group) +
               " (MPI_COMM_SELF on one of them?): every " + (mine.trainer ? "trainer" : "worker of one engine") +
               " passes the same communicator";
    }
  }
  return {};
}

}  // namespace

void check_groups(MPI_Comm world, MPI_Comm group, bool trainer, const comm::Waiter& waiter, const Status& caller) {
  std::vector<std::int32_t> record{trainer ? 1 : 0};
  if (caller.is_ok()) {
    int group_size = 0;
    WB_CHECK_MPI(MPI_Comm_size(group, &group_size));
    MPI_Group world_group = MPI_GROUP_NULL, own_group = MPI_GROUP_NULL;
    WB_CHECK_MPI(MPI_Comm_group(world, &world_group));
    WB_CHECK_MPI(MPI_Comm_group(group, &own_group));
    std::vector<int> ranks(static_cast<std::size_t>(group_size)), in_world(ranks.size());
    for (int i = 0; i < group_size; ++i) ranks[static_cast<std::size_t>(i)] = i;
    WB_CHECK_MPI(MPI_Group_translate_ranks(own_group, group_size, ranks.data(), world_group, in_world.data()));
    WB_CHECK_MPI(MPI_Group_free(&own_group));
    WB_CHECK_MPI(MPI_Group_free(&world_group));
    for (const int r : in_world) record.push_back(r == MPI_UNDEFINED ? -1 : r);
  }
  const std::vector<std::vector<std::byte>> all = comm::allgather(
      std::as_bytes(std::span(record)), world, waiter,
      std::string("constructing the adapter: every world rank's ") + comm_name(trainer) +
          " (some rank did not construct its adapter, or passed another world communicator)",
      caller);
  std::vector<Member> members(all.size());
  for (std::size_t r = 0; r < all.size(); ++r) {
    std::vector<std::int32_t> values(all[r].size() / sizeof(std::int32_t));
    if (values.empty()) throw Error(ErrorCode::kCorruptData, "constructing the adapter: world rank " + std::to_string(r) + " sent no group");
    std::memcpy(values.data(), all[r].data(), values.size() * sizeof(std::int32_t));
    members[r].trainer = values[0] != 0;
    members[r].group.assign(values.begin() + 1, values.end());
  }
  if (const std::string disagreement = first_disagreement(members); !disagreement.empty())
    throw Error(ErrorCode::kInvalidArgument, "constructing the adapters: " + disagreement);
}

}  // namespace wb::coord
