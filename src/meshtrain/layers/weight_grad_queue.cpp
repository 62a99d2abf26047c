#include "meshtrain/layers/weight_grad_queue.h"

#include <utility>

#include "meshtrain/core/error.h"

namespace meshtrain {
void WeightGradQueue::push(int slot, WeightGradTask task) {
  MT_CHECK(task.weight != nullptr && task.x.defined() && task.dy.defined(),
           "weight-gradient task without weight, input or gradient");
  by_slot_[slot].push_back(std::move(task));
}

void WeightGradQueue::run(int slot) {
  auto it = by_slot_.find(slot);
  if (it == by_slot_.end()) return;
  // Taken out first: the tasks (and the tensors they keep) are freed even if one throws.
  const std::vector<WeightGradTask> tasks = std::move(it->second);
  by_slot_.erase(it);
  for (const WeightGradTask& t : tasks) {
    Parameter& w = *t.weight;
    MT_CHECK(w.grad.numel() == t.dims.out_features * t.dims.in_features,
             "{}: grad {} for a deferred [{}, {}] weight gradient", w.name,
             to_string(w.grad.shape()), t.dims.out_features, t.dims.in_features);
    if (t.x.dtype() == DType::f32) {
      kernels::linear_backward(t.x.f32(), w.value.f32(), t.dy.f32(), nullptr, w.grad.f32(), nullptr,
                               t.dims);
    } else {  // mixed precision: 16-bit x and dy, kept by the B that pushed the task
      kernels::linear_backward_16bit(t.x.u16(), nullptr, t.dy.u16(), nullptr, w.grad.f32(), t.dims,
                                     t.x.dtype());
    }
  }
}

std::size_t WeightGradQueue::pending(int slot) const {
  const auto it = by_slot_.find(slot);
  return it == by_slot_.end() ? 0 : it->second.size();
}

std::size_t WeightGradQueue::pending() const {
  std::size_t n = 0;
  for (const auto& [slot, tasks] : by_slot_) n += tasks.size();
  return n;
}

void WeightGradQueue::clear() { by_slot_.clear(); }

void linear_backward_or_defer(const Tensor& x, Parameter& weight, const Tensor& dy, float* dx,
                              float* db, const kernels::LinearDims& dims,
                              const MicroBatchContext& ctx) {
  WeightGradQueue* queue = ctx.defer_weight_grads;
  float* dw = queue != nullptr ? nullptr : weight.grad.f32();
  const DType dtype = weight.value.dtype();
  if (dtype == DType::f32) {
    kernels::linear_backward(x.f32(), weight.value.f32(), dy.f32(), dx, dw, db, dims);
    if (queue != nullptr) {
      queue->push(ctx.slot, WeightGradTask{.x = x, .dy = dy, .weight = &weight, .dims = dims});
    }
    return;
  }
  MT_CHECK(x.dtype() == dtype, "{}: kept input is {}, weight {}", weight.name, to_string(x.dtype()),
           to_string(dtype));
  if (db != nullptr) kernels::bias_backward(dy.f32(), db, dims.tokens, dims.out_features);
  const Tensor dy_16 = dy.to(dtype, MemCategory::activations);
  kernels::linear_backward_16bit(x.u16(), weight.value.u16(), dy_16.u16(), dx, dw, dims, dtype);
  if (queue != nullptr) {
    queue->push(ctx.slot, WeightGradTask{.x = x, .dy = dy_16, .weight = &weight, .dims = dims});
  }
}

}  // namespace meshtrain
