// wb-mixed-worker: the C++ half of a job that mixes C++ and Python adapters (tests/python/mixed_worker.py is
// the Python half, with the same model, layouts and values; check_mixed.py runs the two in one mpirun):
//
//   mpirun -n 2 python3 mixed_worker.py --role trainer : -n 2 wb-mixed-worker --role rollout
//   mpirun -n 2 wb-mixed-worker --role trainer --staging : -n 2 python3 mixed_worker.py --role rollout --staging
//
// Trainers are world ranks 0..T-1 (--trainers), the rest rollout engines of --tp ranks. Only the installed
// API (include/weightbridge) is used, as a C++ framework would. Every element of version v is a function of
// (tensor, flat index, v), computed alike in both languages; a rollout checks every parameter bit for bit
// after each install and prints "mixed: ... verified K of K versions"; exit 0 only then (trainers: when every
// send succeeded and stats().history gives each version's EWTT and AGST). --bad-input R: world rank R (a
// Python one) passes a bad argument, and every rank prints what its constructor refused with.
#include <mpi.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "weightbridge/adapter.hpp"

namespace {

using namespace wb;

// The checkpoint: (name, dtype, shape); a tensor's index in this list enters its values.
const std::vector<TensorInfo>& checkpoint_tensors() {
  static const std::vector<TensorInfo> tensors = {
      {"embed.weight", DType::kBF16, {48, 32}}, {"proj.weight", DType::kF32, {40, 24}}, {"norm.weight", DType::kF32, {24}}};
  return tensors;
}

std::int64_t code(int tensor, std::int64_t index, std::uint64_t version) {
  return index * 7919 + tensor * 104729 + static_cast<std::int64_t>(version) * 1000003;
}

// One parameter: a box of one checkpoint tensor (mixed_worker.py's LAYOUTS).
struct Piece {
  std::string name;
  int tensor;
  Shape offset, extent;
};

// Trainers: embed cut across its columns, proj by rows, norm on trainer 0 only. Rollouts: embed by rows,
// proj across its columns, norm on every rank.
std::vector<Piece> layout(bool trainer, int rank, int size) {
  std::vector<Piece> pieces;
  if (trainer) {
    const std::int64_t cols = 32 / size, rows = 40 / size;
    pieces.push_back({"embed", 0, {0, rank * cols}, {48, cols}});
    pieces.push_back({"proj", 1, {rank * rows, 0}, {rows, 24}});
    if (rank == 0) pieces.push_back({"norm", 2, {0}, {24}});
  } else {
    const std::int64_t rows = 48 / size, cols = 24 / size;
    pieces.push_back({"embed", 0, {rank * rows, 0}, {rows, 32}});
    pieces.push_back({"proj", 1, {0, rank * cols}, {40, cols}});
    pieces.push_back({"norm", 2, {0}, {24}});
  }
  return pieces;
}

// Version v of a piece, as bytes: bf16 bits (code mod 0x3f00, plus 0x100: finite, never zero), or float32
// (code mod 65521 over 65521, minus a half, in double and then rounded to float, as torch does).
std::vector<std::byte> values(const Piece& p, std::uint64_t version) {
  const TensorInfo& t = checkpoint_tensors()[static_cast<std::size_t>(p.tensor)];
  const std::int64_t n = shape_numel(p.extent);
  std::vector<std::byte> out(static_cast<std::size_t>(n) * dtype_size(t.dtype));
  for (std::int64_t e = 0; e < n; ++e) {
    // The element's flat index in the whole tensor.
    std::int64_t index = 0, rest = e;
    std::vector<std::int64_t> at(p.extent.size());
    for (std::size_t d = p.extent.size(); d-- > 0;) at[d] = rest % p.extent[d], rest /= p.extent[d];
    for (std::size_t d = 0; d < p.extent.size(); ++d) index = index * t.shape[d] + p.offset[d] + at[d];
    const std::int64_t c = code(p.tensor, index, version);
    if (t.dtype == DType::kBF16) {
      const auto bits = static_cast<std::uint16_t>(c % 0x3f00 + 0x100);
      std::memcpy(out.data() + 2 * e, &bits, 2);
    } else {
      const auto x = static_cast<float>(static_cast<double>(c % 65521) / 65521.0 - 0.5);
      std::memcpy(out.data() + 4 * e, &x, 4);
    }
  }
  return out;
}

struct Worker {
  std::vector<Piece> pieces;
  std::vector<std::vector<std::byte>> memory;
  ParameterSet params;

  Worker(bool trainer, int rank, int size) : pieces(layout(trainer, rank, size)) {
    for (const Piece& p : pieces) {
      const TensorInfo& t = checkpoint_tensors()[static_cast<std::size_t>(p.tensor)];
      memory.emplace_back(static_cast<std::size_t>(shape_numel(p.extent)) * dtype_size(t.dtype));
      params.add(p.name, TensorView::contiguous(memory.back().data(), t.dtype, p.extent));
    }
  }
  // In place: the adapters hold views of this memory.
  void set(std::uint64_t version) {
    for (std::size_t i = 0; i < pieces.size(); ++i) {
      const std::vector<std::byte> v = values(pieces[i], version);
      std::memcpy(memory[i].data(), v.data(), v.size());
    }
  }
  // The first parameter that is not version v, or "".
  std::string difference(std::uint64_t version) const {
    for (std::size_t i = 0; i < pieces.size(); ++i)
      if (memory[i] != values(pieces[i], version)) return pieces[i].name;
    return "";
  }
  // The worker's own loader: each parameter is a box of its tensor, read as is.
  LoadWeightsFn loader() const {
    return [this](const CheckpointReader& checkpoint, const ParameterSet& into) {
      for (const Piece& p : pieces) {
        const TensorInfo& t = checkpoint_tensors()[static_cast<std::size_t>(p.tensor)];
        checkpoint.read_box(t.name, Box{p.offset, p.extent}, into.at(p.name).view.data);
      }
    };
  }
};

int run(int argc, char** argv) {
  std::string role;
  bool staging = false;
  int trainers = 2, tp = 2, versions = 3, bad_input = -1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--role" && i + 1 < argc) role = argv[++i];
    else if (a == "--staging") staging = true;
    else if (a == "--trainers" && i + 1 < argc) trainers = std::stoi(argv[++i]);
    else if (a == "--tp" && i + 1 < argc) tp = std::stoi(argv[++i]);
    else if (a == "--versions" && i + 1 < argc) versions = std::stoi(argv[++i]);
    else if (a == "--bad-input" && i + 1 < argc) bad_input = std::stoi(argv[++i]);
    else {
      std::fprintf(stderr, "wb-mixed-worker: unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const bool trainer = role == "trainer";
  if (trainer != (rank < trainers) || (role != "trainer" && role != "rollout")) {
    std::fprintf(stderr, "wb-mixed-worker: world rank %d cannot be a %s with --trainers %d\n", rank, role.c_str(), trainers);
    return 2;
  }
  // As mixed_worker.py: one split of the world into trainers and rollouts, one of the rollouts into engines.
  MPI_Comm side = MPI_COMM_NULL, group = MPI_COMM_NULL;
  MPI_Comm_split(MPI_COMM_WORLD, trainer ? 0 : 1, rank, &side);
  int side_rank = 0;
  MPI_Comm_rank(side, &side_rank);
  if (trainer) group = side;
  else MPI_Comm_split(side, side_rank / tp, side_rank, &group);
  int group_rank = 0, group_size = 1;
  MPI_Comm_rank(group, &group_rank);
  MPI_Comm_size(group, &group_size);

  Worker worker(trainer, group_rank, group_size);
  worker.set(0);
  AdapterOptions options;
  options.timeout_seconds = 30;
  const std::string who = std::string(trainer ? "trainer " : "rollout ") + std::to_string(rank) + " (C++)";
  if (bad_input >= 0) {
    // World rank `bad_input` (a Python one) passes a bad argument: every rank must refuse to construct with
    // its message, none may wait for it. The ranks then meet once more, so that every line gets printed.
    try {
      if (trainer) SenderAdapter(MPI_COMM_WORLD, group, worker.params, checkpoint_tensors(), worker.loader(), options);
      else ReceiverAdapter(MPI_COMM_WORLD, group, worker.params, worker.loader(), options);
      std::printf("mixed: %s: constructed its adapter\n", who.c_str());
    } catch (const Error& error) {
      std::printf("mixed: %s: refused: %s\n", who.c_str(), error.what());
    }
    std::fflush(stdout);
    MPI_Barrier(MPI_COMM_WORLD);
    return 0;
  }
  if (trainer) {
    options.sender_staging = staging;
    SenderAdapter sender(MPI_COMM_WORLD, group, worker.params, checkpoint_tensors(), worker.loader(), options);
    sender.connect();
    for (int v = 1; v <= versions; ++v) {
      worker.set(static_cast<std::uint64_t>(v));
      if (const Status s = sender.send_weights(static_cast<std::uint64_t>(v)); !s) {
        std::printf("mixed: %s: %s\n", who.c_str(), s.to_string().c_str());
        return 1;
      }
      if (staging) worker.set(1000);  // the next step changes the parameters at once
    }
    if (const Status s = sender.shutdown(); !s) {
      std::printf("mixed: %s: %s\n", who.c_str(), s.to_string().c_str());
      return 1;
    }
    int figures = 0;
    for (const UpdateRecord& u : sender.stats().history)
      if (u.completed && u.ewtt_seconds && u.agst_seconds && *u.ewtt_seconds > 0 && *u.agst_seconds > 0 &&
          *u.agst_seconds <= *u.ewtt_seconds)
        ++figures;
    std::printf("mixed: %s: sent %d versions, EWTT and AGST for %d\n", who.c_str(), versions, figures);
    return figures == versions ? 0 : 1;
  }
  options.receiver_staging = staging;
  ReceiverAdapter receiver(MPI_COMM_WORLD, group, worker.params, worker.loader(), options);
  int verified = 0;
  const double deadline = MPI_Wtime() + 120;
  for (;;) {
    const PollResult result = receiver.poll_requests();
    if (result.event == PollResult::Event::kFailed || result.event == PollResult::Event::kAborted) {
      std::printf("mixed: %s: %s\n", who.c_str(), result.status.to_string().c_str());
      return 1;
    }
    if (result.event == PollResult::Event::kShutdown) break;
    if (result.event == PollResult::Event::kInstalled) {
      const std::string differs = worker.difference(result.version);
      if (result.version != static_cast<std::uint64_t>(verified) + 1)
        std::printf("mixed: %s: installed version %llu after %d\n", who.c_str(),
                    static_cast<unsigned long long>(result.version), verified);
      else if (differs.empty()) ++verified;
      else std::printf("mixed: %s: version %llu: parameter %s differs\n", who.c_str(),
                       static_cast<unsigned long long>(result.version), differs.c_str());
    }
    if (MPI_Wtime() > deadline) {
      std::printf("mixed: %s: no shutdown within 120 s\n", who.c_str());
      return 1;
    }
  }
  std::printf("mixed: %s: verified %d of %d versions\n", who.c_str(), verified, versions);
  return verified == versions ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int code = 1;
  try {
    code = run(argc, argv);
  } catch (const std::exception& error) {
    std::printf("mixed: C++ worker: %s\n", error.what());
    code = 1;
  }
  std::fflush(stdout);
  if (code != 0) MPI_Abort(MPI_COMM_WORLD, code);
  MPI_Finalize();
  return 0;
}
