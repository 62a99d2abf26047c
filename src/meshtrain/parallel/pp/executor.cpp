#include "meshtrain/parallel/pp/executor.h"

#include <chrono>

namespace meshtrain::pp {
namespace {

bool is_compute(ActionKind k) {
  return k == ActionKind::forward || k == ActionKind::backward || k == ActionKind::backward_input ||
         k == ActionKind::backward_weight;
}
bool is_recv(ActionKind k) {
  return k == ActionKind::recv_activation || k == ActionKind::recv_grad;
}

// Key of what a compute action consumes or produces: (is gradient, microbatch, chunk).
using Key = std::tuple<bool, int, int>;

}  // namespace

PipelineExecutor::PipelineExecutor(const ScheduleSpec& spec, ProcessGroup& pp)
    : spec_(spec), pp_(pp), actions_(schedule_for(spec, pp.rank())) {
  MT_CHECK(spec.pp == pp.size(), "schedule for {} stages on a pp group of {}", spec.pp, pp.size());
}

// Messages are matched by (peer, tag); the tag names the receiving chunk, the micro-batch and
// the direction, so both sides compute it from their own action.
int PipelineExecutor::tag_of(const Action& a) const {
  const int global = a.chunk * spec_.pp + pp_.rank();
  int target = global;  // the receiving chunk
  if (a.kind == ActionKind::send_activation) target = global + 1;
  if (a.kind == ActionKind::send_grad) target = global - 1;
  const bool grad = a.kind == ActionKind::send_grad || a.kind == ActionKind::recv_grad;
  return (a.microbatch * spec_.pp * spec_.v + target) * 2 + (grad ? 1 : 0);
}

void PipelineExecutor::post_receives_before(std::size_t next_compute, std::size_t from) {
  for (std::size_t i = std::max(from, posted_until_); i < next_compute; ++i) {
    const Action& a = actions_[i];
    if (!is_recv(a.kind)) continue;
    Tensor buffer = Tensor::empty(boundary_, MemCategory::activations);
    auto request = pp_.irecv(buffer.span_f32(), a.peer, tag_of(a));
    receives_.emplace(i, std::make_pair(std::move(buffer), std::move(request)));
  }
  posted_until_ = std::max(posted_until_, next_compute);
}

std::vector<ExecutedAction> PipelineExecutor::run_step(StageRunner& runner) {
  boundary_ = runner.boundary_shape();
  receives_.clear();
  sends_.clear();
  posted_until_ = 0;
  std::map<Key, Tensor> inputs, outputs;
  std::vector<ExecutedAction> timeline;
  const auto step_start = std::chrono::steady_clock::now();
  auto now = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
  };
  auto next_compute_after = [&](std::size_t i) {
    std::size_t j = i + 1;
    while (j < actions_.size() && !is_compute(actions_[j].kind)) ++j;
    return j;
  };
  // The first compute's receives, then, before each compute, the next compute's.
  std::size_t first = 0;
  while (first < actions_.size() && !is_compute(actions_[first].kind)) ++first;
  post_receives_before(first, 0);

  for (std::size_t i = 0; i < actions_.size(); ++i) {
    const Action& a = actions_[i];
    ExecutedAction done{a, now(), 0.0};
    if (is_compute(a.kind)) post_receives_before(next_compute_after(i), i + 1);
    const int slot = slot_of(a.microbatch, a.chunk);
    switch (a.kind) {
      case ActionKind::recv_activation:
      case ActionKind::recv_grad: {
        post_receives_before(i + 1, i);  // a list that receives before any compute
        auto it = receives_.find(i);
        it->second.second->wait();
        inputs[{a.kind == ActionKind::recv_grad, a.microbatch, a.chunk}] =
            std::move(it->second.first);
        receives_.erase(it);
        break;
      }
      case ActionKind::forward: {
        const Key in{false, a.microbatch, a.chunk};
        const Tensor input = inputs.count(in) ? inputs[in] : Tensor();
        inputs.erase(in);
        outputs[{false, a.microbatch, a.chunk}] =
            runner.forward(a.microbatch, a.chunk, slot, input);
        break;
      }
      case ActionKind::backward:
      case ActionKind::backward_input: {
        const Key in{true, a.microbatch, a.chunk};
        const Tensor grad = inputs.count(in) ? inputs[in] : Tensor();
        inputs.erase(in);
        outputs[{true, a.microbatch, a.chunk}] =
            runner.backward(a.microbatch, a.chunk, slot, grad, a.kind == ActionKind::backward);
        break;
      }
      case ActionKind::backward_weight:
        runner.backward_weight(a.microbatch, a.chunk, slot);
        break;
      case ActionKind::send_activation:
      case ActionKind::send_grad: {
        const Key out{a.kind == ActionKind::send_grad, a.microbatch, a.chunk};
        auto it = outputs.find(out);
        MT_CHECK(it != outputs.end() && it->second.defined(),
                 "pipeline rank {}: {} has nothing to send (schedule out of order)", pp_.rank(),
                 to_string(a));
        Tensor payload = std::move(it->second);
        outputs.erase(it);
        auto request = pp_.isend(payload.span_f32(), a.peer, tag_of(a));
        sends_.emplace_back(std::move(payload), std::move(request));
        break;
      }
    }
    done.end_s = now();
    timeline.push_back(done);
    // Free the buffers of sends that have completed, so a long step does not hold one
    // activation per micro-batch it has sent (1F1B's memory bound counts on it).
    std::erase_if(sends_, [](auto& send) { return send.second->test(); });
  }
  for (auto& [payload, request] : sends_) request->wait();
  sends_.clear();
  MT_CHECK(receives_.empty() && inputs.empty(),
           "pipeline rank {}: {} receives and {} inputs left unused after the step", pp_.rank(),
           receives_.size(), inputs.size());
  return timeline;
}

}  // namespace meshtrain::pp
