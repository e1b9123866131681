// The w4kernels operator library: schemas (schemas.h) and the Python module entry point.
// Kernels register themselves per backend in csrc/cpu/*.cpp and csrc/cuda/*.cu.
#include <Python.h>

#include "schemas.h"

TORCH_LIBRARY(w4kernels, m) {
  w4k::define_ops(m);
  w4k::define_cpu_only_ops(m);
}

// `import w4kernels._C` loads this shared object, which runs the registrations above.
extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", "w4kernels operator library", -1,
                               nullptr};
  return PyModule_Create(&module);
}
