// gradswitch._core: a thin nanobind layer over the C++ worker (src/worker).
//
// Arrays arrive as nb::ndarray (numpy through the buffer protocol / DLPack, torch through
// DLPack; torch is never imported here). The GIL is released while a call blocks.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>

#include "common/feedback_round.h"
#include "gradswitch/wire.h"
#include "worker/group.h"

namespace nb = nanobind;
using namespace nb::literals;
using namespace gradswitch::worker;

namespace {

PyObject* g_error = nullptr;    // GradswitchError(RuntimeError)
PyObject* g_timeout = nullptr;  // GradswitchTimeout(GradswitchError, TimeoutError)
PyObject* g_aborted = nullptr;  // JobAborted(GradswitchError)
PyObject* g_lost = nullptr;     // SwitchLost(JobAborted): the switch stopped or closed the connection

struct PyGroup {
  std::unique_ptr<Group> g;
  Group& get() {
    if (!g) throw Error("gradswitch: the group is closed");
    return *g;
  }
};

struct PyHandle {
  Handle h;
};

// Validates a CPU, C-contiguous float32/float64/int32 array; returns its data pointer, size and type.
void* check_array(const nb::ndarray<>& a, size_t* count, DType* dt) {
  if (a.device_type() != nb::device::cpu::value)
    throw InvalidArgument("gradswitch: allreduce needs a CPU tensor (got device type " +
                          std::to_string(a.device_type()) + "); copy it to the CPU first");
  if (a.dtype() == nb::dtype<float>())
    *dt = DType::kFloat32;
  else if (a.dtype() == nb::dtype<double>())
    *dt = DType::kFloat64;
  else if (a.dtype() == nb::dtype<int32_t>())
    *dt = DType::kInt32;
  else
    throw UnsupportedType(
        "gradswitch: allreduce supports float32, float64 and int32 arrays only (got dtype code " +
        std::to_string(a.dtype().code) + " with " + std::to_string(a.dtype().bits) + " bits)");
  int64_t expect = 1;
  for (size_t i = a.ndim(); a.size() > 0 && i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect)
      throw InvalidArgument(
          "gradswitch: allreduce needs a C-contiguous array (reduce x.copy() / "
          "x.contiguous() and copy the result back)");
    expect *= a.shape(i);
  }
  *count = a.size();
  return a.data();
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "gradswitch native worker: allreduce through a gradswitch switch";

  g_error = PyErr_NewException("gradswitch.GradswitchError", PyExc_RuntimeError, nullptr);
  {
    PyObject* bases = PyTuple_Pack(2, g_error, PyExc_TimeoutError);
    g_timeout = PyErr_NewException("gradswitch.GradswitchTimeout", bases, nullptr);
    Py_DECREF(bases);
  }
  g_aborted = PyErr_NewException("gradswitch.JobAborted", g_error, nullptr);
  m.attr("GradswitchError") = nb::borrow(g_error);
  m.attr("GradswitchTimeout") = nb::borrow(g_timeout);
  g_lost = PyErr_NewException("gradswitch.SwitchLost", g_aborted, nullptr);
  m.attr("JobAborted") = nb::borrow(g_aborted);
  m.attr("SwitchLost") = nb::borrow(g_lost);

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const TimeoutError& e) {
      PyErr_SetString(g_timeout, e.what());
    } catch (const AbortedError& e) {
      PyObject* type = dynamic_cast<const SwitchLostError*>(&e) ? g_lost : g_aborted;
      PyObject* inst = PyObject_CallFunction(type, "s", e.what());
      if (!inst) return;
      PyObject* reason = PyLong_FromLong(e.reason());
      PyObject* rank = e.rank() == GS_RANK_ALL ? (Py_INCREF(Py_None), Py_None) : PyLong_FromLong(e.rank());
      PyObject_SetAttrString(inst, "reason", reason);
      PyObject_SetAttrString(inst, "rank", rank);
      Py_XDECREF(reason);
      Py_XDECREF(rank);
      PyErr_SetObject(type, inst);
      Py_DECREF(inst);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const UnsupportedType& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(g_error, e.what());
    }
  });

  nb::class_<PyHandle>(m, "Handle", "Completion of one queued allreduce.")
      .def(
          "wait",
          [](PyHandle& h) {
            // Wake up now and then to let Python handle signals (Ctrl-C); the operation itself
            // goes on in the background (gradswitch.Group keeps its tensor alive).
            for (;;) {
              bool done;
              {
                nb::gil_scoped_release rel;
                done = h.h.wait_for(0.1);
              }
              if (done) break;
              if (PyErr_CheckSignals() != 0) throw nb::python_error();
            }
            h.h.wait();
          },
          "Blocks until the allreduce finished; raises its error.")
      .def(
          "done", [](PyHandle& h) { return h.h.done(); }, "True once the allreduce finished (or failed).")
      .def(
          "missed", [](PyHandle& h) { return h.h.missed(); },
          "Once finished: the contributions its rounds lacked (bounded-time rounds).");

  nb::class_<PyGroup>(m, "Group", "A worker's membership in a gradswitch job.")
      .def(
          "__init__",
          [](PyGroup* self, const std::string& switch_addr, const std::string& job, unsigned rank,
             unsigned world, const std::string& wire, double timeout, double drop_rate, uint64_t seed,
             const std::string& token, double join_timeout, double connect_timeout, uint64_t shuffle_seed,
             double rto_initial, double rto_max, const std::string& optimizer, uint64_t params,
             const std::vector<std::pair<std::string, std::string>>& optimizer_keys,
             const std::string& algorithm, const std::vector<std::string>& peers, nb::object peer_exchange,
             unsigned ring_slots, uint32_t ring_payload, const std::string& bind_ip,
             const std::string& tenant, const std::string& secret, const std::string& types,
             uint32_t deadline_us, unsigned quorum, bool rescale, unsigned straggler_report, bool concede,
             double concede_keep) {
            Options o;
            o.switch_addr = switch_addr;
            o.job = job;
            o.rank = rank;
            o.world = world;
            o.wire = wire;
            o.timeout_s = timeout;
            o.drop_rate = drop_rate;
            o.seed = seed;
            o.token = token;
            o.join_timeout_s = join_timeout;
            o.connect_timeout_s = connect_timeout;
            o.shuffle_seed = shuffle_seed;
            o.rto_initial_s = rto_initial;
            o.rto_max_s = rto_max;
            o.optimizer = optimizer;
            o.params = params;
            o.optimizer_keys = optimizer_keys;
            o.algorithm = algorithm;
            o.peers = peers;
            o.ring_slots = ring_slots;
            o.ring_payload_bytes = ring_payload;
            o.bind_ip = bind_ip;
            o.tenant = tenant;
            o.secret = secret;
            o.types = types;
            o.deadline_us = deadline_us;
            o.quorum = quorum;
            o.rescale = rescale;
            o.straggler_report = straggler_report;
            o.concede = concede;
            o.concede_keep = concede_keep;
            if (!peer_exchange.is_none()) {
              // Called on this thread during connect only; the caller keeps the callable alive.
              PyObject* fn = peer_exchange.ptr();
              o.exchange_peers = [fn](uint16_t port) {
                nb::gil_scoped_acquire gil;
                nb::object r = nb::borrow(fn)(port);
                return nb::cast<std::vector<std::string>>(r);
              };
            }
            std::unique_ptr<Group> g;
            {
              nb::gil_scoped_release rel;
              g = Group::connect(o);
            }
            new (self) PyGroup{std::move(g)};
          },
          "switch"_a, "job"_a, "rank"_a, "world_size"_a, "wire"_a = "float32", "timeout"_a = 30.0,
          "drop_rate"_a = 0.0, "seed"_a = 0, "token"_a = "", "join_timeout"_a = 120.0,
          "connect_timeout"_a = 5.0, "shuffle_seed"_a = 0, "rto_initial"_a = 0.004, "rto_max"_a = 0.2,
          "optimizer"_a = "", "params"_a = 0,
          "optimizer_keys"_a = std::vector<std::pair<std::string, std::string>>(), "algorithm"_a = "switch",
          "peers"_a = std::vector<std::string>(), "peer_exchange"_a = nb::none(), "ring_slots"_a = 256,
          "ring_payload"_a = 1440, "bind_ip"_a = "", "tenant"_a = "", "secret"_a = "", "types"_a = "",
          "deadline_us"_a = 0, "quorum"_a = 0, "rescale"_a = true, "straggler_report"_a = 10,
          "concede"_a = false, "concede_keep"_a = -1.0)
      .def(
          "allreduce",
          [](PyGroup& self, nb::ndarray<> x) {
            size_t n = 0;
            DType dt;
            void* p = check_array(x, &n, &dt);
            Group& g = self.get();
            nb::gil_scoped_release rel;
            g.allreduce(p, n, dt);
          },
          "x"_a.noconvert(), "Sums x over all ranks, in place (blocking).")
      .def(
          "allreduce_async",
          [](PyGroup& self, nb::ndarray<> x, std::optional<nb::ndarray<>> unsummed) {
            size_t n = 0;
            DType dt;
            void* p = check_array(x, &n, &dt);
            // The caller keeps x (and unsummed) alive until the handle completes (gradswitch.Group does).
            if (!unsummed) return PyHandle{self.get().allreduce_async(p, n, dt)};
            size_t un = 0;
            DType udt;
            void* u = check_array(*unsummed, &un, &udt);
            if (dt != DType::kFloat32 || udt != DType::kFloat32 || un != n)
              throw InvalidArgument(
                  "gradswitch: unsummed= needs float32 x and unsummed of the same size (got " +
                  std::to_string(n) + " and " + std::to_string(un) + " elements)");
            return PyHandle{self.get().allreduce_async(p, n, static_cast<float*>(u))};
          },
          "x"_a.noconvert(), "unsummed"_a.noconvert() = nb::none(),
          "Queues an in-place allreduce of x; the caller keeps x alive until wait(). `unsummed` (float32, "
          "x's size; deadline jobs): receives this rank's values of the chunks whose sum lacks them, less "
          "the rescaled sum's estimate of them.")
      .def(
          "upload_params",
          [](PyGroup& self, nb::ndarray<> x) {
            size_t n = 0;
            DType dt;
            void* p = check_array(x, &n, &dt);
            if (dt != DType::kFloat32)
              throw UnsupportedType("gradswitch: upload_params needs float32 parameters");
            Group& g = self.get();
            nb::gil_scoped_release rel;
            g.upload_params(static_cast<const float*>(p), n);  // blocks: x stays alive
          },
          "x"_a.noconvert(),
          "Rank 0, before the first allreduce: sends the initial fp32 parameters (PARAMS).")
      .def(
          "set_lr",
          [](PyGroup& self, float lr) {
            Group& g = self.get();
            nb::gil_scoped_release rel;
            return g.set_lr(lr);
          },
          "lr"_a, "SETLR between allreduces; returns the learning rate stored at the switch.")
      .def(
          "state_get",
          [](PyGroup& self) {
            Group& g = self.get();
            std::vector<uint8_t> blob;
            {
              nb::gil_scoped_release rel;
              blob = g.state_get();
            }
            return nb::bytes(reinterpret_cast<const char*>(blob.data()), blob.size());
          },
          "STATE_GET: the checkpoint blob (bytes).")
      .def(
          "state_set",
          [](PyGroup& self, nb::bytes blob) {
            Group& g = self.get();
            const uint8_t* p = static_cast<const uint8_t*>(blob.data());
            size_t n = blob.size();
            nb::gil_scoped_release rel;  // `blob` is kept alive by the caller's reference
            g.state_set(p, n);
          },
          "blob"_a, "Rank 0: STATE_SET with a blob from state_get().")
      .def_prop_ro("optimizer", [](PyGroup& s) { return s.get().join_info().optimizer; })
      .def_prop_ro("params", [](PyGroup& s) { return s.get().join_info().params; })
      .def_prop_ro("chunk", [](PyGroup& s) { return s.get().join_info().chunk; })
      .def_prop_ro("state_bytes", [](PyGroup& s) { return s.get().join_info().state_bytes; })
      .def(
          "close",
          [](PyGroup& self, bool abort) {
            if (self.g) self.g->close(abort);
          },
          "abort"_a = false, nb::call_guard<nb::gil_scoped_release>(),
          "Finishes queued operations and leaves the job; abort=True cancels them and drops the "
          "control connection instead (the switch then aborts the job for every rank).")
      .def("stats",
           [](PyGroup& self) {
             Stats s = self.get().stats();
             nb::dict d;
             d["allreduces"] = s.allreduces;
             d["packets_sent"] = s.packets_sent;
             d["bytes_sent"] = s.bytes_sent;
             d["packets_received"] = s.packets_received;
             d["bytes_received"] = s.bytes_received;
             d["retransmissions"] = s.retransmissions;
             d["retx_rack"] = s.retx_rack;
             d["retx_timeout"] = s.retx_timeout;
             d["retx_probe"] = s.retx_probe;
             d["retx_asked"] = s.retx_asked;
             d["spurious_retransmissions"] = s.spurious_retransmissions;
             d["held_answers"] = s.held_answers;
             d["window_delay_cuts"] = s.window_delay_cuts;
             d["window_loss_cuts"] = s.window_loss_cuts;
             d["window_undos"] = s.window_undos;
             d["injected_drops"] = s.injected_drops;
             d["ignored"] = s.ignored;
             d["unicast_results"] = s.unicast_results;
             d["bootstrap_rounds"] = s.bootstrap_rounds;
             d["ring_allreduces"] = s.ring_allreduces;
             d["fallbacks"] = s.fallbacks;
             d["fallback_held"] = s.fallback_held;
             d["dropped_foreign"] = s.dropped_foreign;
             d["unconfirmed_aborts"] = s.unconfirmed_aborts;
             d["partial_results"] = s.partial_results;
             d["missed_contributions"] = s.missed_contributions;
             d["straggler_reports"] = s.straggler_reports;
             d["conceded_rounds"] = s.conceded_rounds;
             return d;
           })
      .def_prop_ro("rank", [](PyGroup& s) { return s.get().options().rank; })
      .def_prop_ro("world_size", [](PyGroup& s) { return s.get().options().world; })
      .def_prop_ro("job", [](PyGroup& s) { return s.get().options().job; })
      .def_prop_ro("wire", [](PyGroup& s) { return s.get().options().wire; })
      .def_prop_ro("job_id", [](PyGroup& s) { return s.get().join_info().job_id; })
      .def_prop_ro("algorithm", [](PyGroup& s) { return s.get().algorithm(); })
      .def_prop_ro("slots", [](PyGroup& s) { return s.get().join_info().slots; })
      .def_prop_ro("payload_bytes", [](PyGroup& s) { return s.get().join_info().payload_bytes; })
      .def_prop_ro("closed", [](PyGroup& s) { return !s.g || s.g->closed(); });

  // Error feedback's step (src/common/feedback_round.h), for gradswitch.torch.error_feedback.
  m.def(
      "feedback_round",
      [](nb::ndarray<> grad, nb::ndarray<> residual, bool add, const std::string& wire) {
        size_t n = 0, rn = 0;
        DType gt{}, rt{};
        auto* g = static_cast<float*>(check_array(grad, &n, &gt));
        auto* r = static_cast<float*>(check_array(residual, &rn, &rt));
        if (gt != DType::kFloat32 || rt != DType::kFloat32)
          throw UnsupportedType("gradswitch: feedback_round needs float32 grad and residual arrays");
        if (rn != n)
          throw InvalidArgument("gradswitch: feedback_round: the residual has " + std::to_string(rn) +
                                " elements, the gradient " + std::to_string(n));
        const uint8_t elem = parse_wire(wire);
        nb::gil_scoped_release rel;
        if (!gradswitch::feedback_round(g, r, n, add, elem))
          throw InvalidArgument(
              "gradswitch: feedback_round needs a wire of the worker's (mx8, float16, bfloat16, float32, "
              "fixed32), not " +
              wire);
      },
      "grad"_a, "residual"_a, "add"_a, "wire"_a,
      "In place, on CPU float32 C-contiguous arrays of one size: grad += residual when add, then residual "
      "= grad - what `wire` (mx8, float16, bfloat16) delivers of grad, non-finite differences as 0 "
      "(float32, fixed32: 0; a deadline job's unsummed values fill it).");
  // The timeline of a rank (src/worker/timeline.h), for gradswitch.timeline.
  m.def(
      "timeline_span",
      [](unsigned rank, const std::string& lane, const std::string& name, int64_t begin_ns, int64_t end_ns,
         const std::string& args, bool overlapping) {
        std::shared_ptr<Timeline> t = Timeline::for_rank(rank);
        if (t) t->span(lane, name, begin_ns, end_ns, args, overlapping ? t->new_async_id() : -1);
        return t != nullptr;
      },
      "rank"_a, "lane"_a, "name"_a, "begin_ns"_a, "end_ns"_a, "args"_a = "", "overlapping"_a = false,
      "Adds a span (time.monotonic_ns() times; args: JSON object members; overlapping: spans of the lane "
      "may overlap without nesting) to the rank's timeline; False when GRADSWITCH_TIMELINE is unset.");
  m.def(
      "timeline_path",
      [](unsigned rank) {
        std::shared_ptr<Timeline> t = Timeline::for_rank(rank);
        return t ? t->path() : std::string();
      },
      "rank"_a, "The rank's timeline file (opened now if needed); '' when GRADSWITCH_TIMELINE is unset.");
  m.def(
      "timeline_flush",
      [](unsigned rank) {
        if (std::shared_ptr<Timeline> t = Timeline::for_rank(rank)) t->flush();
      },
      "rank"_a, "Writes the rank's buffered timeline events to its file.");
}
