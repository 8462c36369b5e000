// The operator schemas of lltm-core's backend contract (lltm_core/backend.py): the one
// declaration of them.  A compiled backend defines its operators with these strings,
//
//   STABLE_TORCH_LIBRARY(my_backend, m) { m.def(LLTM_SCHEMA_FORWARD); ... }
//
// and lltm_core.extension.register_fake_kernels reads this file for the same strings, to check a
// loaded library against them and to bind its fake kernels' arguments by name.  lltm-cpu and
// lltm-cuda link this file into their csrc/ (a plain file in their sdists).  Keep each
// definition a #define of adjacent string literals: that is what the Python side parses.
#pragma once

// The step.  forward returns the two results, then what backward needs, in the order of the
// backend's saved_layout; backward's needs_grad_X false returns an empty grad_X.
#define LLTM_SCHEMA_FORWARD                                                             \
  "forward(Tensor input, Tensor weights, Tensor bias, Tensor old_h, Tensor old_cell)" \
  " -> (Tensor new_h, Tensor new_cell, Tensor X, Tensor gates, Tensor tanh_cell)"

#define LLTM_SCHEMA_BACKWARD                                                   \
  "backward(Tensor grad_new_h, Tensor grad_new_cell, Tensor weights,"         \
  " Tensor X, Tensor gates, Tensor tanh_cell, bool needs_grad_X)"             \
  " -> (Tensor grad_X, Tensor grad_weights, Tensor grad_bias, Tensor grad_old_cell)"

// One layer, one direction, over a sequence (interface versions 2 and 3): sequence_forward
// returns output, h_n, c_n, then what sequence_backward needs, in the order of the backend's
// sequence_saved_layout.  With needs_backward false (version 3, inference) those are empty
// tensors; its default keeps version 2's seven-argument call working.
#define LLTM_SCHEMA_SEQUENCE_FORWARD                                                                  \
  "sequence_forward(Tensor input, Tensor weights, Tensor bias, Tensor h0, Tensor c0, Tensor? lengths," \
  " bool reverse, bool needs_backward=True)"                                                          \
  " -> (Tensor output, Tensor h_n, Tensor c_n, Tensor gates, Tensor tanh_cell)"

#define LLTM_SCHEMA_SEQUENCE_BACKWARD                                                                 \
  "sequence_backward(Tensor grad_output, Tensor grad_h_n, Tensor grad_c_n, Tensor weights, Tensor input," \
  " Tensor h0, Tensor output, Tensor? lengths, Tensor gates, Tensor tanh_cell, bool reverse,"          \
  " bool needs_grad_input)"                                                                            \
  " -> (Tensor grad_input, Tensor grad_weights, Tensor grad_bias, Tensor grad_h0, Tensor grad_c0)"
