// The floors lltm-core's plumbing is measured against: lltm-cpu's operators called through the
// dispatcher from C++ torch::autograd::Function nodes, with no checks, no backend choice and no
// Python autograd.Function.  autograd_floor.py times the cell's node (and the same node with no
// kernels), core_overhead.py the sequence's; both build this file with torch's cpp_extension.load.
// The operators must be registered first: lltm_core.get_backend("cpu") loads lltm-cpu's library.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/extension.h>

namespace {
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using Tensor = at::Tensor;

c10::OperatorHandle lltm_cpu_op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "");
}

// --- the cell: lltm_cpu::forward and lltm_cpu::backward ---------------------------------------

struct CellNode : torch::autograd::Function<CellNode> {
  static variable_list forward(AutogradContext* ctx, Tensor input, Tensor weights, Tensor bias, Tensor old_h,
                               Tensor old_cell) {
    static const auto op = lltm_cpu_op("lltm_cpu::forward").typed<
        std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&,
                                                           const Tensor&, const Tensor&)>();
    auto [new_h, new_cell, X, gates, tanh_cell] = op.call(input, weights, bias, old_h, old_cell);
    ctx->save_for_backward({weights, X, gates, tanh_cell});
    return {new_h, new_cell};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = lltm_cpu_op("lltm_cpu::backward").typed<
        std::tuple<Tensor, Tensor, Tensor, Tensor>(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                                   const Tensor&, const Tensor&, bool)>();
    const auto saved = ctx->get_saved_variables();
    const bool needs_grad_X = ctx->needs_input_grad(0) || ctx->needs_input_grad(3);
    auto [grad_X, grad_weights, grad_bias, grad_old_cell] =
        op.call(grads[0], grads[1], saved[0], saved[1], saved[2], saved[3], needs_grad_X);
    Tensor grad_input, grad_old_h;
    if (needs_grad_X) {
      const int64_t state_size = grads[0].size(1);
      auto parts = grad_X.split_with_sizes({state_size, grad_X.size(1) - state_size}, 1);
      grad_old_h = parts[0];
      grad_input = parts[1];
    }
    return {grad_input, grad_weights, grad_bias, grad_old_h, grad_old_cell};
  }
};

// The same node with no kernels: outputs and gradients of the right shapes, never computed.
struct NoKernelsNode : torch::autograd::Function<NoKernelsNode> {
  static variable_list forward(AutogradContext* ctx, Tensor input, Tensor weights, Tensor bias, Tensor old_h,
                               Tensor old_cell) {
    ctx->save_for_backward({weights, bias});
    return {at::empty_like(old_h), at::empty_like(old_cell)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {Tensor(), at::empty_like(saved[0]), at::empty_like(saved[1]), Tensor(), Tensor()};
  }
};

// --- the sequence: lltm_cpu::sequence_forward and sequence_backward, saving what lltm-core's
// sequence Function saves (input, weights, h0, output, gates, tanh_cell) --------------------------

struct SequenceNode : torch::autograd::Function<SequenceNode> {
  static variable_list forward(AutogradContext* ctx, Tensor input, Tensor weights, Tensor bias, Tensor zeros) {
    static const auto op = lltm_cpu_op("lltm_cpu::sequence_forward");
    std::vector<c10::IValue> stack{input, weights, bias, zeros, zeros, c10::IValue(), false, true};
    op.callBoxed(stack);
    ctx->save_for_backward({input, weights, zeros, stack[0].toTensor(), stack[3].toTensor(), stack[4].toTensor()});
    return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor()};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto op = lltm_cpu_op("lltm_cpu::sequence_backward");
    const variable_list saved = ctx->get_saved_variables();  // input, weights, zeros, output, gates, tanh_cell
    auto defined = [](const Tensor& grad, const Tensor& like) { return grad.defined() ? grad : at::zeros_like(like); };
    std::vector<c10::IValue> stack{defined(grads[0], saved[3]), defined(grads[1], saved[2]), defined(grads[2], saved[2]),
                                   saved[1], saved[0], saved[2], saved[3], c10::IValue(), saved[4], saved[5], false, true};
    op.callBoxed(stack);
    return {stack[0].toTensor(), stack[1].toTensor(), stack[2].toTensor(), Tensor()};
  }
};
}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("lltm", [](Tensor input, Tensor weights, Tensor bias, Tensor old_h, Tensor old_cell) {
    return CellNode::apply(input, weights, bias, old_h, old_cell);
  }, "the cell through lltm-cpu's operators in a C++ autograd node");
  m.def("no_kernels", [](Tensor input, Tensor weights, Tensor bias, Tensor old_h, Tensor old_cell) {
    return NoKernelsNode::apply(input, weights, bias, old_h, old_cell);
  }, "the same node computing nothing");
  m.def("sequence", [](Tensor input, Tensor weights, Tensor bias, Tensor zeros) {
    return SequenceNode::apply(input, weights, bias, zeros);
  }, "a sequence from a zero state through lltm-cpu's sequence operators in a C++ autograd node");
}
