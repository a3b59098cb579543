// SenderAdapter and ReceiverAdapter for Python.
//
// The GIL: every call that may wait (construction, connect, send_weights, wait, shutdown, poll_requests)
// releases it, and the C++ side takes it back only to call Python: load_weights while connect probes, the
// before_update_hook while a version is installed. Both run on the calling thread; the staged modes'
// background threads run the transfer only and never touch Python.
//
// Lifetimes: the C++ adapter keeps raw pointers into the parameters, so each Python adapter holds the
// tensors (and their DLPack capsules) until it is destroyed; the callbacks hold the Python callables
// through a struct the Python adapter owns, so no Python reference is copied or dropped without the GIL.
#include <mpi4py/mpi4py.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "bindings.hpp"
#include "calls.hpp"
#include "coord/binding_checks.hpp"

namespace wb::python {
namespace {

// ---- communicators ----------------------------------------------------------------------------------

MPI_Comm comm_from_python(py::handle comm, const std::string& what) {
  static bool imported = false;
  if (!imported) {
    if (import_mpi4py() < 0) throw py::error_already_set();
    imported = true;
  }
  MPI_Comm* handle = PyMPIComm_Get(comm.ptr());
  if (handle == nullptr) {
    PyErr_Clear();
    throw InputError(what + " is a " + std::string(py::str(py::type::handle_of(comm).attr("__qualname__"))) +
                     ", not an mpi4py.MPI.Comm");
  }
  if (*handle == MPI_COMM_NULL) throw InputError(what + " is MPI.COMM_NULL");
  return *handle;
}

int world_rank(MPI_Comm world) {
  int rank = -1;
  MPI_Comm_rank(world, &rank);
  return rank;
}

// ---- callbacks ----------------------------------------------------------------------------------------

struct Callbacks {
  py::object load_weights;
  py::object hook;
  py::object error;  // what a callback raised last: the __cause__ of the weightbridge.Error it leads to

  py::object take_error() { return std::exchange(error, py::object()); }
};

// The checkpoint that C++ hands load_weights, readable only during that call.
struct ReaderSlot {
  const CheckpointReader* reader = nullptr;
};

class CheckpointView {
 public:
  explicit CheckpointView(std::shared_ptr<ReaderSlot> slot) : slot_(std::move(slot)) {}

  const CheckpointReader& reader() const {
    if (slot_->reader == nullptr)
      throw Error(ErrorCode::kInvalidArgument,
                  "the checkpoint given to load_weights is readable only during that call (its (name, tensor) pairs "
                  "were iterated after load_weights returned)");
    return *slot_->reader;
  }

  py::list tensors() const {
    py::list out;
    for (const TensorInfo& t : reader().tensors()) {
      py::tuple shape(t.shape.size());
      for (std::size_t i = 0; i < t.shape.size(); ++i) shape[i] = py::int_(t.shape[i]);
      out.append(py::make_tuple(t.name, std::string(dtype_name(t.dtype)), shape));
    }
    return out;
  }

  // Reads tensor `name` straight into `destination` (contiguous host memory of its dtype and shape).
  void read_into(const std::string& name, const py::object& destination) const {
    const CheckpointReader& checkpoint = reader();
    const TensorInfo& info = checkpoint.info(name);
    py::list keep_alive;
    const TensorView view = view_of(destination, "the destination of " + name, keep_alive);
    // FP8 tensors may be read into uint8 (a torch without float8 types): the same bytes, the e4m3 codes.
    const bool fp8_codes = view.dtype == DType::kU8 && (info.dtype == DType::kF8E4M3 || info.dtype == DType::kF8E5M2);
    if (view.memory != MemoryKind::kHost || !view.is_contiguous() || (view.dtype != info.dtype && !fp8_codes) ||
        view.shape != info.shape)
      throw InputError("read_into(" + name + "): the destination must be contiguous host memory of " +
                       std::string(dtype_name(info.dtype)) + " " + shape_to_string(info.shape) + ", not " +
                       std::string(dtype_name(view.dtype)) + " " + shape_to_string(view.shape) +
                       (view.is_contiguous() ? "" : " (strided)"));
    py::gil_scoped_release release;
    checkpoint.read(name, view.data);
  }

  std::string source() const { return reader().source(); }

 private:
  std::shared_ptr<ReaderSlot> slot_;
};

// "a, b, c" for up to 64 names, then how many more.
std::string parameter_names(const ParameterSet& params) {
  std::string out;
  for (std::size_t i = 0; i < params.size() && i < 64; ++i) out += (i == 0 ? "" : ", ") + params[i].name;
  if (params.size() > 64) out += " and " + std::to_string(params.size() - 64) + " more";
  return out;
}

// load_weights(checkpoint, params) for C++: the Python callable gets the checkpoint's (name, tensor) pairs
// through weightbridge._loader. Its own parameters are the ones the adapter holds, so `params` serves only
// to name them. A loader whose call ran none of its body (a generator function) is refused here, in those
// words: it writes nothing on any rank.
LoadWeightsFn make_load_weights(Callbacks* callbacks) {
  return [callbacks](const CheckpointReader& checkpoint, const ParameterSet& params) {
    py::gil_scoped_acquire gil;
    auto slot = std::make_shared<ReaderSlot>();
    slot->reader = &checkpoint;
    struct Close {
      ReaderSlot& slot;
      ~Close() { slot.reader = nullptr; }
    } close{*slot};
    py::object ran_nothing;
    try {
      ran_nothing = py::module_::import("weightbridge._loader").attr("call_load_weights")(callbacks->load_weights,
                                                                                          CheckpointView(slot));
    } catch (py::error_already_set& error) {
      callbacks->error = error.value();
      // Not a wb::Error: the probe adds the rank and the cause; this is only what Python said.
      throw std::runtime_error("load_weights raised " + describe_python_error(error));
    }
    if (!ran_nothing.is_none())
      throw Error(ErrorCode::kInvalidArgument,
                  "load_weights is " + ran_nothing.cast<std::string>() +
                      ": calling it returned an object that nothing iterates, and ran none of its body (a stray yield?), so it wrote nothing on "
                      "this rank: no update would reach its " + std::to_string(params.size()) + " parameters (" +
                      parameter_names(params) + ")");
  };
}

BeforeUpdateHook make_hook(Callbacks* callbacks) {
  if (callbacks->hook.is_none()) return {};
  return [callbacks](std::uint64_t version) {
    py::gil_scoped_acquire gil;
    try {
      callbacks->hook(version);
    } catch (py::error_already_set& error) {
      callbacks->error = error.value();
      throw std::runtime_error(describe_python_error(error));
    }
  };
}

// ---- construction ---------------------------------------------------------------------------------------

// What both constructors convert. A conversion that failed leaves `checks` failed and the rest as far as it
// got; the C++ constructor is called all the same, inside a coord::BindingChecks scope, and puts the failure
// into its first exchange over the world, so that every rank raises it: Python ranks agreeing on their own
// would wait for the C++ ranks of a mixed job, which never join them.
struct Input {
  MPI_Comm world = MPI_COMM_NULL;
  MPI_Comm group = MPI_COMM_NULL;
  ParameterSet params;
  std::vector<TensorInfo> checkpoint_tensors;
  AdapterOptions options;
  Status checks;
};

template <class Convert>
Input convert_input(py::handle world, bool trainer, py::handle options, const py::kwargs& overrides, Convert convert) {
  Input in;
  in.world = comm_from_python(world, "world");  // without a world there is nobody to tell
  const std::string who = std::string(trainer ? "trainer" : "rollout") + " (world rank " +
                          std::to_string(world_rank(in.world)) + "): ";
  try {
    in.options = options_from_python(options, overrides);
    convert(in);
  } catch (const InputError& error) {
    in.checks = Status(ErrorCode::kInvalidArgument, who + error.what());
  } catch (py::error_already_set& error) {
    in.checks = Status(ErrorCode::kInvalidArgument, who + describe_python_error(error));
  } catch (const py::cast_error& error) {
    in.checks = Status(ErrorCode::kInvalidArgument, who + error.what());
  }
  if (!in.checks) in.options = AdapterOptions{};  // a half-converted value must not fail before the exchange
  return in;
}

ParameterSet uint8_as_e4m3(const ParameterSet& params) {
  ParameterSet out;
  for (const Parameter& p : params) {
    TensorView view = p.view;
    if (view.dtype == DType::kU8) view.dtype = DType::kF8E4M3;
    out.add(p.name, view);
  }
  return out;
}

void require_callable(py::handle f, const std::string& what) {
  if (!PyCallable_Check(f.ptr()))
    throw InputError(what + " is a " + std::string(py::str(py::type::handle_of(f).attr("__qualname__"))) +
                     ", not callable");
}

// The watch handed to the adapter over `watched`'s parameters (none when the arguments failed to convert).
coord::ParameterWatch watch_of(WatchedParameters* watched) {
  if (watched == nullptr) return {};
  return [watched](std::vector<coord::MovedParameter>& moved) { return watched->check(moved); };
}

// Destroys an adapter without the GIL (its destructor may wait for peers), or leaks it when MPI is
// already finalized (mpi4py finalizes at exit) and no MPI call may be made any more.
template <class Adapter>
void destroy(std::unique_ptr<Adapter>& adapter) {
  if (!adapter) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    (void)adapter.release();
    return;
  }
#if PY_VERSION_HEX >= 0x030D0000
  const bool finalizing = Py_IsFinalizing();
#else
  const bool finalizing = _Py_IsFinalizing();
#endif
  if (finalizing) {
    adapter.reset();  // never waits for Python: holding the GIL is harmless
    return;
  }
  py::gil_scoped_release release;
  adapter.reset();
}

// ---- the adapters -------------------------------------------------------------------------------------

class PySenderAdapter {
 public:
  PySenderAdapter(const py::object& world, const py::object& trainer_comm, const py::object& params,
                  const py::object& checkpoint_tensors, const py::object& load_weights, const py::object& options,
                  const py::kwargs& overrides) {
    Input in = convert_input(world, true, options, overrides, [&](Input& i) {
      i.group = comm_from_python(trainer_comm, "trainer_comm");
      i.params = parameters_from_python(params, keep_alive_);
      i.checkpoint_tensors = tensor_infos_from_python(checkpoint_tensors);
      require_callable(load_weights, "load_weights");
    });
    callbacks_->load_weights = py::reinterpret_borrow<py::object>(load_weights);
    if (in.checks) watched_ = std::make_unique<WatchedParameters>(in.params, keep_alive_);
    const coord::BindingChecks checks(in.checks, watch_of(watched_.get()));
    py::gil_scoped_release release;
    adapter_ = std::make_unique<SenderAdapter>(in.world, in.group, std::move(in.params), std::move(in.checkpoint_tensors),
                                               make_load_weights(callbacks_.get()), in.options);
  }
  ~PySenderAdapter() { destroy(adapter_); }
  PySenderAdapter(const PySenderAdapter&) = delete;
  PySenderAdapter& operator=(const PySenderAdapter&) = delete;

  void connect() {
    check(gate_.run("connect", [&] {
      try {
        adapter_->connect();
      } catch (const Error& error) {
        return error.status();
      }
      return Status::ok();
    }));
  }

  void send_weights(std::uint64_t version, std::uintptr_t cuda_stream) {
    check(gate_.run("send_weights", [&] { return adapter_->send_weights(version, reinterpret_cast<void*>(cuda_stream)); }));
  }
  void wait() { check(gate_.run("wait", [&] { return adapter_->wait(); })); }
  void shutdown() { check(gate_.run("shutdown", [&] { return adapter_->shutdown(); })); }
  bool connected() const { return adapter_->connected(); }
  int engines() const { return adapter_->engines(); }
  TransferSummary summary() const { return adapter_->summary(); }
  AdapterStats stats() const { return adapter_->stats(); }
  WatchedParameters& watched() { return *watched_; }

 private:
  void check(const Status& status) {
    if (!status) raise_error(status, callbacks_->take_error());
  }

  std::unique_ptr<Callbacks> callbacks_ = std::make_unique<Callbacks>();
  CallGate gate_{"SenderAdapter"};
  py::list keep_alive_;
  std::unique_ptr<WatchedParameters> watched_;
  std::unique_ptr<SenderAdapter> adapter_;
};

class PyReceiverAdapter {
 public:
  PyReceiverAdapter(const py::object& world, const py::object& engine_comm, const py::object& params,
                    const py::object& load_weights, const py::object& options, const py::object& before_update_hook,
                    const py::kwargs& overrides) {
    Input in = convert_input(world, false, options, overrides, [&](Input& i) {
      i.group = comm_from_python(engine_comm, "engine_comm");
      i.params = parameters_from_python(params, keep_alive_);
      require_callable(load_weights, "load_weights");
      if (!before_update_hook.is_none()) require_callable(before_update_hook, "before_update_hook");
    });
    if (in.checks) watched_ = std::make_unique<WatchedParameters>(in.params, keep_alive_);  // as Python has them
    // An FP8 engine's uint8 parameters hold e4m3 codes (torch without float8 types): they are its fp8 weights.
    if (in.options.fp8) in.params = uint8_as_e4m3(in.params);
    callbacks_->load_weights = py::reinterpret_borrow<py::object>(load_weights);
    callbacks_->hook = py::reinterpret_borrow<py::object>(before_update_hook);
    BeforeUpdateHook hook = make_hook(callbacks_.get());
    const coord::BindingChecks checks(in.checks, watch_of(watched_.get()));
    py::gil_scoped_release release;
    adapter_ = std::make_unique<ReceiverAdapter>(in.world, in.group, std::move(in.params),
                                                 make_load_weights(callbacks_.get()), in.options, std::move(hook));
  }
  ~PyReceiverAdapter() { destroy(adapter_); }
  PyReceiverAdapter(const PyReceiverAdapter&) = delete;
  PyReceiverAdapter& operator=(const PyReceiverAdapter&) = delete;

  PollResult poll_requests(std::uintptr_t cuda_stream) {
    const PollResult result =
        gate_.run("poll_requests", [&] { return adapter_->poll_requests(reinterpret_cast<void*>(cuda_stream)); });
    if (result.event == PollResult::Event::kFailed) raise_error(result.status, callbacks_->take_error());
    return result;
  }

  void leave() {
    const Status status = gate_.run("leave", [&] {
      try {
        adapter_->leave();
      } catch (const Error& error) {
        return error.status();
      }
      return Status::ok();
    });
    if (!status) raise_error(status);
  }
  std::uint64_t installed_version() const { return adapter_->installed_version(); }
  bool connected() const { return adapter_->connected(); }
  bool closed() const { return adapter_->closed(); }
  TransferSummary summary() const { return adapter_->summary(); }
  AdapterStats stats() const { return adapter_->stats(); }
  WatchedParameters& watched() { return *watched_; }

 private:
  std::unique_ptr<Callbacks> callbacks_ = std::make_unique<Callbacks>();
  CallGate gate_{"ReceiverAdapter"};
  py::list keep_alive_;
  std::unique_ptr<WatchedParameters> watched_;
  std::unique_ptr<ReceiverAdapter> adapter_;
};

// For the benchmark (bench/parameter_check.py): the check every update runs first, without following
// anything; the indices of the parameters that moved, and how many parameters are read in place.
template <class Adapter>
py::tuple check_parameters(Adapter& adapter) {
  std::vector<coord::MovedParameter> moved;
  const Status status = adapter.watched().check(moved, false);
  if (!status) raise_error(status);
  py::list names;
  for (const coord::MovedParameter& m : moved) names.append(py::int_(m.index));
  return py::make_tuple(names, adapter.watched().read_in_place());
}

constexpr const char* kOptionNames[] = {"sender_staging", "receiver_staging", "buffer_bytes", "pipeline_depth",
                                        "transport",      "timeout_seconds",  "verify",       "node",
                                        "trace",          "not_loaded",       "fp8",          "join_address"};

}  // namespace

AdapterOptions options_from_python(py::handle options, const py::kwargs& overrides) {
  py::object merged = py::cast(AdapterOptions{});
  auto set = [&](py::handle key, py::handle value) {
    const std::string name = py::str(key);
    bool known = false;
    for (const char* option : kOptionNames) known = known || name == option;
    if (!known) {
      std::string list;
      for (const char* option : kOptionNames) list += (list.empty() ? "" : ", ") + std::string(option);
      throw InputError("unknown option '" + name + "' (AdapterOptions has " + list + ")");
    }
    if (name == "not_loaded" && py::isinstance<py::list>(value))  // pybind11's own cast would name nothing
      for (py::handle item : value)
        if (py::isinstance<py::str>(item)) (void)name_from_python(item, "not_loaded: the name");
    merged.attr(key) = value;
  };
  if (py::isinstance<AdapterOptions>(options)) {
    merged = py::cast(options.cast<AdapterOptions>());
  } else if (py::isinstance<py::dict>(options)) {
    for (auto [key, value] : py::reinterpret_borrow<py::dict>(options)) set(key, value);
  } else if (!options.is_none()) {
    throw InputError("options is a " + std::string(py::str(py::type::handle_of(options).attr("__qualname__"))) +
                     ", neither weightbridge.AdapterOptions nor a dict");
  }
  for (auto [key, value] : overrides) set(key, value);
  return merged.cast<AdapterOptions>();
}

void bind_adapters(py::module_& m) {
  py::class_<CheckpointView>(m, "_CheckpointView",
                             "The checkpoint C++ gives load_weights (internal: weightbridge._loader turns it into\n"
                             "(name, tensor) pairs). Readable only during that load_weights call.")
      .def("tensors", &CheckpointView::tensors, "[(name, dtype name, shape)] in the checkpoint's order")
      .def("read_into", &CheckpointView::read_into, py::arg("name"), py::arg("destination"),
           "Reads tensor `name` into `destination` (contiguous host tensor of its dtype and shape).")
      .def_property_readonly("source", &CheckpointView::source);

  py::class_<PySenderAdapter>(
      m, "SenderAdapter",
      "The trainer side of WeightBridge: one per trainer rank.\n\n"
      "    sender = SenderAdapter(world, trainer_comm, params, checkpoint_tensors, load_weights,\n"
      "                           sender_staging=False)\n"
      "    sender.connect()                      # once, at start-up\n"
      "    for step in range(1, steps + 1):\n"
      "        train_step()\n"
      "        sender.send_weights(step)         # after each optimizer step; versions increase\n"
      "    sender.shutdown()\n\n"
      "Failures raise weightbridge.Error; after a failed update every later call raises the same error.\n\n"
      "One call at a time: a call made while another thread is inside this adapter (connect, send_weights,\n"
      "wait, shutdown) is refused at once with RuntimeError naming both calls, never queued (the calls are\n"
      "collective: a queued one could run in another order than on the other ranks). Ctrl-C during a call\n"
      "is noticed within 100 ms: the update fails on every rank as after a timeout (the rollouts get\n"
      "Event.ABORTED naming this rank's interruption) and KeyboardInterrupt is raised here.")
      .def(py::init<py::object, py::object, py::object, py::object, py::object, py::object, py::kwargs>(),
           py::arg("world"), py::arg("trainer_comm"), py::arg("params"), py::arg("checkpoint_tensors"),
           py::arg("load_weights"), py::arg("options") = py::none(),
           "Collective over `world` (every trainer and rollout rank constructs its adapter).\n\n"
           "world: mpi4py communicator of all trainers and rollouts.\n"
           "trainer_comm: mpi4py communicator of the trainers (the same on every trainer).\n"
           "params: this rank's parameters, name -> tensor (dict, state_dict or named_parameters()):\n"
           "    torch.Tensor or any object with __dlpack__, contiguous host memory for now, bf16 included.\n"
           "    The adapter keeps them alive and reads them in place at every send_weights, after checking that\n"
           "    each is where and what it was: one rebound to new memory of the same dtype, shape and strides\n"
           "    (p.data = p.data.clone()) is followed; any other change (resize_() to a new shape, a new dtype, a\n"
           "    freed storage) fails that update on every rank, naming the parameter, with nothing sent.\n"
           "checkpoint_tensors: the canonical checkpoint's tensor list: TensorInfo objects, (name, dtype,\n"
           "    shape) tuples, or a mapping name -> tensor (meta tensors will do); see read_tensor_list.\n"
           "load_weights: this rank's loader, load_weights(weights) with `weights` an iterable of\n"
           "    (name, torch.Tensor) pairs in checkpoint naming, as in SGLang and vLLM. It must fill `params`\n"
           "    by copying (narrow, chunk, copy_): connect calls it on a probe checkpoint to learn the layout.\n"
           "options: an AdapterOptions or a dict; keyword arguments (sender_staging=True, ...) override it.")
      .def("connect", &PySenderAdapter::connect,
           "Once, collective over the trainers; the rollouts join at their next poll_requests. Calls every\n"
           "worker's load_weights on a probe checkpoint, plans the transfer, registers the buffers and connects\n"
           "the transports. Raises weightbridge.Error on every rank when any of it fails (a load_weights that\n"
           "computes instead of copying is named with its parameter; one that raises gives its exception as\n"
           "the error's __cause__ on its own rank). The parameters' contents are restored afterwards.")
      .def("send_weights", &PySenderAdapter::send_weights, py::arg("version"), py::arg("cuda_stream") = 0,
           "Sends the parameters as `version` (greater than the last). Collective over the trainers. Waits\n"
           "for the previous version to be installed everywhere first. Returns when the parameters may be\n"
           "changed: without staging after every rollout installed it (or, when the rollouts stage, after this\n"
           "trainer's writes); with sender staging once they are copied to host staging. The GIL is released\n"
           "meanwhile. CUDA parameters are read after the work enqueued so far on `cuda_stream` (an int, e.g.\n"
           "torch.cuda.current_stream().cuda_stream; 0: the legacy default stream), so the trainer need not\n"
           "synchronize its device. Called from a second thread while a call runs: RuntimeError naming both.")
      .def("wait", &PySenderAdapter::wait,
           "Waits until the version in flight is installed on every rollout (collective over the trainers).")
      .def("shutdown", &PySenderAdapter::shutdown,
           "Waits for the version in flight, then tells every engine to close (their poll_requests return\n"
           "Event.SHUTDOWN). Collective over the trainers. Also done when the adapter is destroyed.")
      .def_property_readonly("connected", &PySenderAdapter::connected)
      .def_property_readonly("engines", &PySenderAdapter::engines,
                             "engines served now: the world's and the joined ones that neither left nor were dropped")
      .def("_check_parameters", &check_parameters<PySenderAdapter>,
           "The check of the parameters every send_weights runs first, without following anything: (indices of\n"
           "the parameters rebound to new memory, parameters read in place). Raises weightbridge.Error where an\n"
           "update would be refused. For the benchmark (bench/parameter_check.py).")
      .def("summary", &PySenderAdapter::summary, "What connect planned (TransferSummary); the same on every rank.")
      .def("stats", &PySenderAdapter::stats,
           "This worker's counters and stall intervals (AdapterStats); its history holds each update's EWTT and\n"
           "AGST once every engine acknowledged it.");

  py::class_<PyReceiverAdapter>(
      m, "ReceiverAdapter",
      "The rollout side of WeightBridge: one per rank of every inference engine.\n\n"
      "    receiver = ReceiverAdapter(world, engine_comm, params, model.load_weights,\n"
      "                               before_update_hook=lambda v: flush_cache())\n"
      "    while True:\n"
      "        result = receiver.poll_requests()     # between two inference steps\n"
      "        if result.event == weightbridge.Event.SHUTDOWN:\n"
      "            break\n"
      "        generate_step()                        # result.version is in the parameters\n\n"
      "Failures raise weightbridge.Error; after one every later poll_requests raises the same error. An update\n"
      "that fails after before_update_hook ran for it is returned once as Event.ABORTED instead (undo what the\n"
      "hook did; result.status says why, result.parameters_intact whether the parameters may serve).\n\n"
      "One call at a time: poll_requests while another thread is inside it is refused at once with\n"
      "RuntimeError naming both calls, never queued. Ctrl-C during an update is noticed within 100 ms: the\n"
      "update fails on every rank as after a timeout and KeyboardInterrupt is raised here.")
      .def(py::init<py::object, py::object, py::object, py::object, py::object, py::object, py::kwargs>(),
           py::arg("world"), py::arg("engine_comm"), py::arg("params"), py::arg("load_weights"),
           py::arg("options") = py::none(), py::arg("before_update_hook") = py::none(),
           "Collective over `world` (every trainer and rollout rank constructs its adapter).\n\n"
           "world: mpi4py communicator of all trainers and rollouts; for an engine that is an MPI job of its\n"
           "    own and joins the trainers by address (join_address), its own job's, as engine_comm.\n"
           "engine_comm: mpi4py communicator of this engine's ranks (one model replica, e.g. one TP group).\n"
           "params: this rank's parameters, name -> tensor (dict, state_dict or named_parameters()):\n"
           "    torch.Tensor or any object with __dlpack__, contiguous host memory for now, bf16 included.\n"
           "    The adapter keeps them alive and writes every new version into them in place, checked before each\n"
           "    update as for SenderAdapter: a rebound parameter is followed (the memory it left is never written\n"
           "    again), any other change fails the update on every rank with nothing written.\n"
           "load_weights: the engine's own loader, load_weights(weights) with `weights` an iterable of\n"
           "    (name, torch.Tensor) pairs in checkpoint naming (model.load_weights of SGLang and vLLM).\n"
           "options: an AdapterOptions or a dict; keyword arguments (receiver_staging=True, ...) override it.\n"
           "before_update_hook: called as hook(version) on every rank once per version, before it is\n"
           "    installed, with the parameters still holding the previous one (flush a prefix cache, ...).")
      .def("poll_requests", &PyReceiverAdapter::poll_requests, py::arg("cuda_stream") = 0,
           "Services what the trainers asked for since the last call and returns a PollResult (event,\n"
           "version). Collective over the engine: every rank calls it at the same inference steps. Never\n"
           "waits for the trainers when nothing is pending. Without receiver staging an update is received\n"
           "and installed inside this call (the GIL is released meanwhile); CUDA parameters are written after\n"
           "the work enqueued so far on `cuda_stream` (an int; 0: the legacy default stream), and the install is\n"
           "complete on the device when the call returns. Raises weightbridge.Error when connect or an update\n"
           "failed, except once for an update that failed after before_update_hook ran for it: Event.ABORTED,\n"
           "with aborted_version, status and parameters_intact (the next call raises).")
      .def("leave", &PyReceiverAdapter::leave,
           "An engine that joined by address (join_address) leaves the trainers, best between updates, on\n"
           "every rank of its job after the same poll_requests (collective over the engine): it tells them\n"
           "and lets go of its link; poll_requests then returns\n"
           "Event.SHUTDOWN. Also done when such an adapter is destroyed after a clean stop. weightbridge.Error\n"
           "for an engine of the trainers' own world (it cannot leave without ending the job).")
      .def_property_readonly("installed_version", &PyReceiverAdapter::installed_version)
      .def_property_readonly("connected", &PyReceiverAdapter::connected)
      .def_property_readonly("closed", &PyReceiverAdapter::closed, "shut down or failed")
      .def("_check_parameters", &check_parameters<PyReceiverAdapter>,
           "The check of the parameters every update runs first, without following anything (as\n"
           "SenderAdapter._check_parameters).")
      .def("summary", &PyReceiverAdapter::summary, "What connect planned (TransferSummary); the same on every rank.")
      .def("stats", &PyReceiverAdapter::stats, "This worker's counters and stall intervals (AdapterStats).");
}

}  // namespace wb::python
