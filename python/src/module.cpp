// The extension module ddp_torch._C: what torch.distributed calls to create
// a group of the backend "ddp" (ddp_torch/__init__.py registers it), and a
// description of such a group for logs and tests.
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>

#include "python/src/c10d_bridge.hpp"

namespace py = pybind11;

PYBIND11_MODULE(_C, m) {
  m.doc() = "The ddp framework's collectives as a c10d ProcessGroup (backend \"ddp\" of torch.distributed)";
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size, std::chrono::duration<double> timeout) {
        return ddp::python::C10dBridge::create(store, rank, size,
                                               std::chrono::duration_cast<std::chrono::milliseconds>(timeout));
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>(),
      "A ProcessGroup over ddp's gloo backend, rendezvousing through `store` (torch.distributed's signature for a "
      "registered backend's creator)");
  m.def(
      "describe",
      [](const c10::intrusive_ptr<c10d::ProcessGroup>& group) -> py::object {
        auto* bridge = dynamic_cast<ddp::python::C10dBridge*>(group.get());
        if (!bridge) return py::none();
        const auto& ours = bridge->group();
        std::string text = ours->backendName();
        const std::string endpoint = ours->describeEndpoint();
        if (!endpoint.empty()) text += ": " + endpoint;
        return py::str(text);
      },
      py::arg("group"), "What a \"ddp\" group runs on (None for a group of another backend)");
}
