// The `weightbridge._weightbridge` extension module: errors, the value types of the C++ API (options,
// tensor infos, summaries, statistics, poll results) and, from adapters.cpp, the two adapters.
#include <pybind11/stl.h>

#include <sstream>
#include <string>

#include "bindings.hpp"

#ifndef WB_PYTHON_VERSION
#error "WB_PYTHON_VERSION must be defined by the build (python/CMakeLists.txt)"
#endif

namespace wb::python {

std::string describe_python_error(py::error_already_set& error) {
  const py::handle type = error.type();
  std::string name = py::str(type.attr("__qualname__"));
  const std::string module = py::str(type.attr("__module__"));
  if (module != "builtins") name = module + "." + name;
  std::string text;
  try {
    text = py::str(error.value());
  } catch (py::error_already_set&) {
    text = "(str() of the exception failed)";
  }
  return text.empty() ? name : name + ": " + text;
}

namespace {

// weightbridge.Error(code, message, text): message is the C++ Status message, text what C++ what() gives.
// A message quotes names from files and callers; bytes there that are not UTF-8 are shown as \xNN instead
// of turning the error into a UnicodeDecodeError that names nothing.
py::str text_of(const std::string& message) {
  PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "backslashreplace");
  if (text == nullptr) throw py::error_already_set();  // out of memory
  return py::reinterpret_steal<py::str>(text);
}

py::object make_error(const Status& status) {
  py::object error_type = py::module_::import("weightbridge._error").attr("Error");
  return error_type(status.code(), text_of(status.message()), text_of(status.to_string()));
}

}  // namespace

void raise_error(const Status& status, py::object cause) {
  py::object error = make_error(status);
  if (cause) PyException_SetCause(error.ptr(), cause.release().ptr());  // steals the reference
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(error.ptr())), error.ptr());
  throw py::error_already_set();
}

namespace {

template <class T>
std::string optional_text(const std::optional<T>& value) {
  if (!value) return "None";
  std::ostringstream out;
  if constexpr (std::is_same_v<T, bool>)
    out << (*value ? "True" : "False");
  else if constexpr (std::is_same_v<T, std::string>)
    out << '\'' << *value << '\'';
  else
    out << *value;
  return out.str();
}

std::string names_text(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

std::string options_repr(const AdapterOptions& o) {
  return "AdapterOptions(sender_staging=" + optional_text(o.sender_staging) +
         ", receiver_staging=" + optional_text(o.receiver_staging) + ", buffer_bytes=" + optional_text(o.buffer_bytes) +
         ", pipeline_depth=" + optional_text(o.pipeline_depth) + ", transport=" + optional_text(o.transport) +
         ", timeout_seconds=" + optional_text(o.timeout_seconds) + ", verify=" + optional_text(o.verify) +
         ", node=" + optional_text(o.node) + ", trace=" + optional_text(o.trace) + ", not_loaded=[" + names_text(o.not_loaded) + "]" +
         (o.fp8 ? ", fp8=Fp8Engine(" + std::to_string(o.fp8->block_rows) + "x" + std::to_string(o.fp8->block_cols) + ", '" +
                      o.fp8->scale_rule + "')"
                : std::string()) +
         (o.join_address ? ", join_address='" + *o.join_address + "'" : std::string()) + ")";
}

py::tuple shape_tuple(const Shape& shape) {
  py::tuple out(shape.size());
  for (std::size_t i = 0; i < shape.size(); ++i) out[i] = py::int_(shape[i]);
  return out;
}

void bind_errors(py::module_& m) {
  py::enum_<ErrorCode>(m, "ErrorCode", "The code of a weightbridge.Error (status.hpp).")
      .value("OK", ErrorCode::kOk)
      .value("INVALID_ARGUMENT", ErrorCode::kInvalidArgument, "bad spec, bad setting, mismatched shapes")
      .value("NOT_FOUND", ErrorCode::kNotFound, "unknown tensor or parameter name, missing file")
      .value("CORRUPT_DATA", ErrorCode::kCorruptData, "truncated or malformed checkpoint, failed verification")
      .value("UNSUPPORTED", ErrorCode::kUnsupported, "feature or dtype not available in this build or machine")
      .value("TIMEOUT", ErrorCode::kTimeout, "a wait ran past its deadline")
      .value("RETRY_LATER", ErrorCode::kRetryLater, "back-pressure")
      .value("MPI", ErrorCode::kMpi, "an MPI call failed")
      .value("HDF5", ErrorCode::kHdf5, "an HDF5 call failed")
      .value("CUDA", ErrorCode::kCuda, "a CUDA runtime call failed")
      .value("IBVERBS", ErrorCode::kIbverbs, "an ibverbs call failed")
      .value("LIBFABRIC", ErrorCode::kLibfabric, "a libfabric call failed")
      .value("SYSTEM", ErrorCode::kSystem, "an operating-system call failed")
      .value("INTERNAL", ErrorCode::kInternal, "a broken invariant inside WeightBridge");
  m.def("error_code_name", [](ErrorCode code) { return std::string(error_code_name(code)); }, py::arg("code"),
        "The words C++ uses for an error code in messages: 'invalid argument', 'timeout', ...");

  py::class_<Status>(m, "Status",
                     "The outcome of an update as C++ returns it (wb::Status): ok, or a code and a message naming the\n"
                     "rank, what it was doing and the cause. bool(status) is True when ok; str(status) is the text a\n"
                     "weightbridge.Error of it would give.")
      .def_property_readonly("ok", &Status::is_ok)
      .def_property_readonly("code", &Status::code)
      .def_property_readonly("message", &Status::message)
      .def("__bool__", &Status::is_ok)
      .def("__str__", [](const Status& st) { return st.is_ok() ? std::string("ok") : st.to_string(); })
      .def("__repr__", [](const Status& st) {
        return st.is_ok() ? std::string("Status(ok)")
                          : "Status(" + std::string(error_code_name(st.code())) + ": " + st.message() + ")";
      });

  // C++ errors raised anywhere in the module (set-up code throws) become weightbridge.Error; bad Python
  // input found while converting becomes an invalid-argument weightbridge.Error.
  py::register_exception_translator([](std::exception_ptr pointer) {
    try {
      if (pointer) std::rethrow_exception(pointer);
    } catch (const Error& error) {
      try {
        raise_error(error.status());
      } catch (py::error_already_set& raised) {
        raised.restore();
      }
    } catch (const InputError& error) {
      try {
        raise_error(Status(ErrorCode::kInvalidArgument, error.what()));
      } catch (py::error_already_set& raised) {
        raised.restore();
      }
    }
  });
}

void bind_values(py::module_& m) {
  py::class_<TensorInfo>(m, "TensorInfo", "Name, dtype and shape of one checkpoint tensor (Hugging Face naming).")
      .def(py::init([](const py::str& text, py::handle dtype, Shape shape) {
             const std::string name = name_from_python(text, "TensorInfo: the name");
             return TensorInfo{name, dtype_from_python(dtype, "TensorInfo " + name), std::move(shape)};
           }),
           py::arg("name"), py::arg("dtype"), py::arg("shape"),
           "dtype: a torch.dtype, a numpy dtype or a name ('bf16', 'bfloat16', 'float32', ...).")
      .def_readonly("name", &TensorInfo::name)
      .def_property_readonly("dtype", [](const TensorInfo& t) { return std::string(dtype_name(t.dtype)); },
                             "WeightBridge's dtype name: 'bf16', 'f16', 'f32', ...")
      .def_property_readonly("shape", [](const TensorInfo& t) { return shape_tuple(t.shape); })
      .def_property_readonly("numel", &TensorInfo::numel)
      .def_property_readonly("nbytes", &TensorInfo::nbytes)
      .def("__eq__", [](const TensorInfo& a, const TensorInfo& b) { return a == b; })
      .def("__repr__", [](const TensorInfo& t) {
        return "TensorInfo('" + t.name + "', '" + std::string(dtype_name(t.dtype)) + "', " + shape_to_string(t.shape) + ")";
      });

  m.def(
      "read_tensor_list",
      [](const std::string& path) {
        std::unique_ptr<CheckpointReader> reader;
        {
          py::gil_scoped_release release;
          reader = open_checkpoint(path);
        }
        return reader->tensors();
      },
      py::arg("path"),
      "The tensor list (names, dtypes, shapes) of a checkpoint on disk: an HDF5 file, a .safetensors file, a\n"
      "model.safetensors.index.json with its shards, or a directory holding either. Reads headers only.");

  py::class_<Fp8Engine>(m, "Fp8Engine",
                        "An FP8 engine's quantization config (C++ wb::Fp8Engine, from its config.json's\n"
                        "quantization_config): AdapterOptions(fp8=Fp8Engine(...)) on the engine's ranks makes it load the\n"
                        "FP8 form of the trainers' BF16 checkpoint: each converted weight W in float8_e4m3fn (with a\n"
                        "torch that has no float8, as torch.uint8 holding the e4m3 codes) and W_scale_inv, float32, one\n"
                        "scale per block_rows x block_cols block. scale_rule: 'plain', 'per-block-cast' (SGLang,\n"
                        "DeepGEMM) or 'ue8m0'. modules_to_not_convert: a tensor whose name contains one stays as it\n"
                        "is; ignored_layers: a tensor of one of these modules (path + '.') stays as it is.")
      .def(py::init([](std::int64_t block_rows, std::int64_t block_cols, std::string scale_rule,
                       std::vector<std::string> modules_to_not_convert, std::vector<std::string> ignored_layers) {
             return Fp8Engine{block_rows, block_cols, std::move(scale_rule), std::move(modules_to_not_convert),
                              std::move(ignored_layers)};
           }),
           py::kw_only(), py::arg("block_rows") = 128, py::arg("block_cols") = 128,
           py::arg("scale_rule") = "per-block-cast", py::arg("modules_to_not_convert") = std::vector<std::string>{},
           py::arg("ignored_layers") = std::vector<std::string>{})
      .def_readwrite("block_rows", &Fp8Engine::block_rows)
      .def_readwrite("block_cols", &Fp8Engine::block_cols)
      .def_readwrite("scale_rule", &Fp8Engine::scale_rule)
      .def_readwrite("modules_to_not_convert", &Fp8Engine::modules_to_not_convert)
      .def_readwrite("ignored_layers", &Fp8Engine::ignored_layers);

  py::class_<AdapterOptions>(m, "AdapterOptions",
                             "The adapters' options (C++ wb::AdapterOptions). A field left None takes its setting:\n"
                             "the WB_<NAME> environment variable, else the default in parentheses.\n\n"
                             "sender_staging (WB_SENDER_STAGING, False): trainers copy their parameters to host\n"
                             "    staging and send_weights returns after that copy; the transfer runs on a\n"
                             "    background thread.\n"
                             "receiver_staging (WB_RECEIVER_STAGING, False): rollouts receive into host staging\n"
                             "    while generating with the previous version, and install at one later step.\n"
                             "buffer_bytes (WB_BUFFER_MIB, 1 GiB): transfer-buffer memory per worker.\n"
                             "pipeline_depth (WB_PIPELINE_DEPTH, 2): rounds in flight per worker.\n"
                             "transport (WB_TRANSPORT, 'auto'): 'auto', 'cma', 'cuda_ipc', 'ibverbs' or 'libfabric'.\n"
                             "timeout_seconds (WB_TIMEOUT_SECONDS, 120): deadline of every wait.\n"
                             "verify (WB_VERIFY, False): digest every update's bytes on both sides and fail on a mismatch.\n"
                             "trace (WB_TIMELINE, False): record this worker's timeline in AdapterStats.trace.\n"
                             "node (WB_NODE, -1): the node this worker is on, for the planner (-1: this machine).\n"
                             "not_loaded (no setting, []): names of parameters load_weights does not fill and no\n"
                             "    update writes (a rotary cache the engine computes itself). Any other rollout\n"
                             "    parameter load_weights never writes fails connect, naming it.\n"
                             "fp8 (no setting, None): rollouts: a weightbridge.Fp8Engine, to load the FP8 form.\n"
                             "join_address (WB_JOIN_ADDRESS, none): engines as jobs of their own. Trainers: the address\n"
                             "    file trainer rank 0 publishes its port in (mode 0600, with a secret); engines: the\n"
                             "    trainers' file, read to join them (world and engine_comm both the engine job's own).\n\n"
                             "The staged modes run a background thread: MPI must be initialized with\n"
                             "MPI_THREAD_MULTIPLE (mpi4py's default thread level, mpi4py.rc.thread_level).")
      .def(py::init([](std::optional<bool> sender_staging, std::optional<bool> receiver_staging,
                       std::optional<std::int64_t> buffer_bytes, std::optional<int> pipeline_depth,
                       std::optional<std::string> transport, std::optional<double> timeout_seconds,
                       std::optional<bool> verify, std::optional<int> node, std::optional<bool> trace,
                       std::vector<std::string> not_loaded, std::optional<Fp8Engine> fp8,
                       std::optional<std::string> join_address) {
             return AdapterOptions{sender_staging, receiver_staging, buffer_bytes, pipeline_depth,
                                   std::move(transport), timeout_seconds, verify, node, trace, std::move(not_loaded),
                                   std::move(join_address), std::move(fp8)};
           }),
           py::kw_only(), py::arg("sender_staging") = py::none(), py::arg("receiver_staging") = py::none(),
           py::arg("buffer_bytes") = py::none(), py::arg("pipeline_depth") = py::none(),
           py::arg("transport") = py::none(), py::arg("timeout_seconds") = py::none(), py::arg("verify") = py::none(),
           py::arg("node") = py::none(), py::arg("trace") = py::none(),
           py::arg("not_loaded") = std::vector<std::string>{}, py::arg("fp8") = py::none(),
           py::arg("join_address") = py::none())
      .def_readwrite("sender_staging", &AdapterOptions::sender_staging)
      .def_readwrite("receiver_staging", &AdapterOptions::receiver_staging)
      .def_readwrite("buffer_bytes", &AdapterOptions::buffer_bytes)
      .def_readwrite("pipeline_depth", &AdapterOptions::pipeline_depth)
      .def_readwrite("transport", &AdapterOptions::transport)
      .def_readwrite("timeout_seconds", &AdapterOptions::timeout_seconds)
      .def_readwrite("verify", &AdapterOptions::verify)
      .def_readwrite("trace", &AdapterOptions::trace)
      .def_readwrite("node", &AdapterOptions::node)
      .def_readwrite("not_loaded", &AdapterOptions::not_loaded)
      .def_readwrite("fp8", &AdapterOptions::fp8)
      .def_readwrite("join_address", &AdapterOptions::join_address)
      .def("__repr__", &options_repr);

  py::class_<StallInterval>(m, "StallInterval",
                            "A span during which a worker did not compute because of version `version`, in seconds\n"
                            "on the job's common clock (world rank 0's steady clock).")
      .def_readonly("version", &StallInterval::version)
      .def_readonly("begin_seconds", &StallInterval::begin_seconds)
      .def_readonly("end_seconds", &StallInterval::end_seconds)
      .def("__repr__", [](const StallInterval& s) {
        return "StallInterval(version=" + std::to_string(s.version) + ", " + std::to_string(s.end_seconds - s.begin_seconds) + " s)";
      });

  py::class_<LinkTraffic>(m, "LinkTraffic", "What this worker's writes carried to one peer over one transport.")
      .def_readonly("transport", &LinkTraffic::transport)
      .def_readonly("peer", &LinkTraffic::peer, "world rank")
      .def_readonly("bytes", &LinkTraffic::bytes)
      .def_readonly("batches", &LinkTraffic::batches);

  py::class_<TransferSummary>(m, "TransferSummary", "What connect planned; the same on every rank.")
      .def_readonly("workers", &TransferSummary::workers)
      .def_readonly("trainer_nodes", &TransferSummary::trainer_nodes)
      .def_readonly("rollout_nodes", &TransferSummary::rollout_nodes)
      .def_readonly("rounds", &TransferSummary::rounds)
      .def_readonly("model_bytes", &TransferSummary::model_bytes, "M: distinct bytes the rollouts need")
      .def_readonly("max_node_need_bytes", &TransferSummary::max_node_need_bytes, "the largest M_v")
      .def_readonly("bytes_per_update", &TransferSummary::bytes_per_update, "all one-sided writes of one update")
      .def_readonly("inter_node_bytes", &TransferSummary::inter_node_bytes)
      .def_readonly("t_min_seconds", &TransferSummary::t_min_seconds, "the lower bound on the planned topology")
      .def_readonly("simulated_seconds", &TransferSummary::simulated_seconds)
      .def_readonly("connect_seconds", &TransferSummary::connect_seconds,
                    "probe, exchange, plan, scatter, register (world rank 0)")
      .def_readonly("probe_seconds", &TransferSummary::probe_seconds,
                    "of which: to every worker's source map gathered (world rank 0)")
      .def_readonly("longest_probe_seconds", &TransferSummary::longest_probe_seconds,
                    "the longest probe of one worker (its load_weights passes, decode, checks)")
      .def_readonly("replica_wait_seconds", &TransferSummary::replica_wait_seconds,
                    "a joiner the fleet's replica served before the take: how long the replica took to take it")
      .def_readonly("fp8_amax_bytes", &TransferSummary::fp8_amax_bytes,
                    "FP8 engines: control bytes each trainer sends per update for the amaxes of shared blocks")
      .def_readonly("node_of_worker", &TransferSummary::node_of_worker)
      .def_readonly("node_ingress_bytes", &TransferSummary::node_ingress_bytes)
      .def_readonly("node_egress_bytes", &TransferSummary::node_egress_bytes)
      .def_readonly("node_need_bytes", &TransferSummary::node_need_bytes)
      .def("__repr__", [](const TransferSummary& s) {
        return "TransferSummary(workers=" + std::to_string(s.workers) + ", rounds=" + std::to_string(s.rounds) +
               ", model_bytes=" + std::to_string(s.model_bytes) + ", bytes_per_update=" + std::to_string(s.bytes_per_update) +
               ", connect_seconds=" + std::to_string(s.connect_seconds) + ")";
      });

  py::class_<TraceSpan>(m, "TraceSpan",
                        "One interval of this worker's timeline, in seconds on the job's common clock: `kind` is\n"
                        "'pack', 'write', 'credit wait', 'forward' or 'assemble', of `round` of `version`'s update.")
      .def_property_readonly("kind", [](const TraceSpan& s) { return std::string(s.kind); })
      .def_readonly("version", &TraceSpan::version)
      .def_readonly("round", &TraceSpan::round)
      .def_readonly("begin_seconds", &TraceSpan::begin_seconds)
      .def_readonly("end_seconds", &TraceSpan::end_seconds);

  py::class_<UpdateRecord>(m, "UpdateRecord",
                           "One transfer this worker took part in. On trainers, once every engine acknowledged the\n"
                           "version, the job's figures for it, from every worker's stall on the common clock:\n"
                           "ewtt_seconds (first worker's stall begin to last worker's stall end) and agst_seconds\n"
                           "(all stalls over the number of workers); None on rollouts and for a failed update.\n"
                           "Without staging on either side they are there when send_weights returns, otherwise\n"
                           "after the next send_weights, wait or shutdown.")
      .def_readonly("version", &UpdateRecord::version)
      .def_readonly("bytes_written", &UpdateRecord::bytes_written,
                    "by this worker's one-sided writes for this version (also when it failed)")
      .def_readonly("completed", &UpdateRecord::completed, "its part of the transfer finished (False: the update failed)")
      .def_readonly("ewtt_seconds", &UpdateRecord::ewtt_seconds)
      .def_readonly("agst_seconds", &UpdateRecord::agst_seconds)
      .def("__repr__", [](const UpdateRecord& u) {
        auto figure = [](const std::optional<double>& x) { return x ? std::to_string(*x) : std::string("None"); };
        return "UpdateRecord(version=" + std::to_string(u.version) + ", completed=" + (u.completed ? "True" : "False") +
               ", bytes_written=" + std::to_string(u.bytes_written) + ", ewtt_seconds=" + figure(u.ewtt_seconds) +
               ", agst_seconds=" + figure(u.agst_seconds) + ")";
      });

  py::class_<EngineRecord>(m, "EngineRecord", "One engine as the trainers see it (AdapterStats.engines).")
      .def_readonly("name", &EngineRecord::name, "'engine 0 (world ranks 2, 3)', 'joined engine 1 (2 workers, after version 3)'")
      .def_readonly("state", &EngineRecord::state, "'serving', 'left' (between updates) or 'dropped' (it failed)")
      .def_readonly("installed", &EngineRecord::installed, "the last version it acknowledged")
      .def_readonly("why", &EngineRecord::why, "left or dropped: the cause, as the trainers met it")
      .def_readonly("connect_seconds", &EngineRecord::connect_seconds,
                    "a joined engine: from the send_weights that took it to its link connected (its probe included)")
      .def_readonly("probe_seconds", &EngineRecord::probe_seconds, "a joined engine: of which its probe")
      .def_readonly("first_install_seconds", &EngineRecord::first_install_seconds,
                    "a joined engine: from the send_weights that took it to its first install acknowledged")
      .def("__repr__", [](const EngineRecord& e) {
        return "EngineRecord('" + e.name + "', '" + e.state + "', installed=" + std::to_string(e.installed) + ")";
      });

  py::class_<AdapterStats>(m, "AdapterStats", "This worker's counters, all updates so far.")
      .def_readonly("version", &AdapterStats::version, "sender: last sent; receiver: installed")
      .def_readonly("stalls", &AdapterStats::stalls, "one StallInterval per update this worker stalled for")
      .def_readonly("history", &AdapterStats::history, "one UpdateRecord per transfer this worker took part in, in order")
      .def_readonly("updates", &AdapterStats::updates)
      .def_readonly("bytes_written", &AdapterStats::bytes_written)
      .def_readonly("bytes_assembled", &AdapterStats::bytes_assembled)
      .def_readonly("registrations", &AdapterStats::registrations, "memory registrations, all made at connect")
      .def_readonly("staging_bytes", &AdapterStats::staging_bytes)
      .def_readonly("traffic", &AdapterStats::traffic, "LinkTraffic per transport and peer")
      .def_readonly("trace", &AdapterStats::trace, "TraceSpan per round step, all updates (AdapterOptions.trace)")
      .def_readonly("engines", &AdapterStats::engines, "trainers: every engine, built-in and joined (EngineRecord)");

  py::class_<PollResult> poll(m, "PollResult",
                              "What ReceiverAdapter.poll_requests did: `event` and the `version` now in the parameters.\n"
                              "A failure is raised as weightbridge.Error, except an update that failed after\n"
                              "before_update_hook ran for it: that one is returned once as Event.ABORTED, with\n"
                              "`aborted_version`, `status` (why) and `parameters_intact`, so that the caller can undo\n"
                              "what the hook did; the adapter stays failed (the next poll_requests raises).");
  py::enum_<PollResult::Event>(poll, "Event")
      .value("NONE", PollResult::Event::kNone, "nothing pending (or a staged transfer still arriving)")
      .value("CONNECTED", PollResult::Event::kConnected, "took part in connect")
      .value("RECEIVING", PollResult::Event::kReceiving,
             "a staged transfer started; the parameters still hold the installed version")
      .value("INSTALLED", PollResult::Event::kInstalled, "`version` is now in the parameters")
      .value("SHUTDOWN", PollResult::Event::kShutdown, "the trainers closed the connection; stop polling")
      .value("FAILED", PollResult::Event::kFailed, "never returned by Python's poll_requests, which raises instead")
      .value("ABORTED", PollResult::Event::kAborted,
             "the update to `aborted_version` failed after before_update_hook(aborted_version) ran: undo what the\n"
             "hook did (e.g. resume the scheduler); `status` says why. Returned once; the next call raises.");
  poll.def_readonly("event", &PollResult::event)
      .def_readonly("version", &PollResult::version, "the version installed in the parameters after this call")
      .def_readonly("status", &PollResult::status, "ok, or (Event.ABORTED) why the update failed")
      .def_readonly("aborted_version", &PollResult::aborted_version, "Event.ABORTED: the version given up (else 0)")
      .def_readonly("parameters_intact", &PollResult::parameters_intact,
                    "Event.ABORTED: the parameters still hold `version`, complete, and may serve. False only without\n"
                    "receiver staging, when the failed update had already written part of the aborted version into\n"
                    "the parameters: reload them (e.g. with load_weights from a checkpoint) before use.")
      .def("__repr__", [](const PollResult& r) {
        std::string text = std::string("PollResult(event=") + poll_event_name(r.event) + ", version=" + std::to_string(r.version);
        if (r.event == PollResult::Event::kAborted)
          text += ", aborted_version=" + std::to_string(r.aborted_version) +
                  ", parameters_intact=" + (r.parameters_intact ? "True" : "False") + ", status=" + r.status.to_string();
        return text + ")";
      });
  m.attr("Event") = poll.attr("Event");
}

}  // namespace
}  // namespace wb::python

PYBIND11_MODULE(_weightbridge, m) {
  namespace python = wb::python;
  m.doc() =
      "WeightBridge: moves model weights from RL trainer ranks to rollout (inference) ranks, whatever the\n"
      "two sides' parallel layouts. Layouts are learnt by probing each worker's own load_weights.\n\n"
      "Trainers: SenderAdapter(...).connect(), then send_weights(version) after each optimizer step.\n"
      "Rollouts: ReceiverAdapter(...), then poll_requests() between inference steps.\n"
      "Failures raise weightbridge.Error (code, message).";
  m.attr("__version__") = WB_PYTHON_VERSION;
  python::bind_errors(m);
  python::bind_values(m);
  python::bind_adapters(m);
}
