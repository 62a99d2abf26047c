#include "meshtrain/train/model_stage.h"

#include "meshtrain/layers/parameter.h"
#include "meshtrain/parallel/pp/simulator.h"
#include "meshtrain/parallel/pp/tied_embeddings.h"

namespace meshtrain {
namespace {

// How this rank cuts a global batch into micro-batches and tokens (the one place the mesh
// coordinates reach the data path).
MicroBatching micro_batching(const Config& config, const DeviceMesh& mesh) {
  const ProcessGroup& dp = mesh.group(Axis::dp);
  return MicroBatching{.micro_batch = config.training.micro_batch,
                       .seq_len = config.model.block_size,
                       .microbatches = config.training.accumulation,
                       .dp_rank = dp.rank(),
                       .dp_size = dp.size(),
                       .tp_size = mesh.group(Axis::tp).size(),
                       .sequence_parallel = config.parallel.sequence_parallel,
                       .cp_rank = mesh.group(Axis::cp).rank(),
                       .cp_size = mesh.group(Axis::cp).size()};
}

pp::ScheduleSpec schedule_of(const Config& config) {
  const ParallelConfig& par = config.parallel;
  return {.name = par.pp_schedule,
          .pp = static_cast<int>(par.pp),
          .v = static_cast<int>(par.virtual_stages),
          .m = static_cast<int>(config.training.accumulation)};
}

// The ranks holding parts of one micro-batch: cp, with tp under sequence parallelism.
MoeTokenGroup moe_token_group(const Config& config, const DeviceMesh& mesh) {
  ProcessGroup& g = config.parallel.sequence_parallel ? mesh.tp_cp_group() : mesh.group(Axis::cp);
  return {g.size() > 1 ? &g : nullptr, mesh.group(Axis::cp).size()};
}

}  // namespace

ModelStage::ModelStage(const Config& config, const DeviceMesh& mesh,
                       const data::GlobalBatchSampler& train, const data::GlobalBatchSampler& val)
    : config_(config), mesh_(mesh), batching_(micro_batching(config, mesh)) {
  ProcessGroup& pp = mesh.group(Axis::pp);
  {
    const ParallelGroups groups(
        TensorParallel{mesh.group(Axis::tp), config.parallel.sequence_parallel},
        ContextParallel{&mesh.group(Axis::cp), config.parallel.cp_comm},
        ExpertParallel{&mesh.group(Axis::ep)}, moe_token_group(config, mesh));
    // No storage: ZeroSharding allocates and initialises what this rank keeps (zero.h).
    stage_ =
        std::make_unique<PipelineStage>(config, static_cast<std::uint64_t>(config.training.seed),
                                        groups, pp.rank(), ParameterStorage::deferred);
  }
  const pp::ScheduleSpec schedule = schedule_of(config);
  executor_ = std::make_unique<pp::PipelineExecutor>(schedule, pp);
  predicted_bubble_ = pp::simulate(schedule).bubble_fraction;
  runner_ = std::make_unique<StageRunner>(*stage_, train, batching_);
  pp::ScheduleSpec eval = schedule;
  eval.pass = pp::Pass::eval;
  eval_executor_ = std::make_unique<pp::PipelineExecutor>(eval, pp);
  eval_runner_ = std::make_unique<EvalRunner>(*stage_, val, batching_);
  if (pp.size() > 1 && config.model.family == ModelFamily::gpt2) {
    tied_group_ = tied_embedding_group(pp);
  }
  // Each stage holds its own parameters, each ep rank its own experts (once per ep group).
  std::int64_t count = 0, experts = 0;
  for (const Parameter* p : stage_->parameters()) {
    if (p->placement.tied_copy) continue;
    (p->placement.replicas == ReplicaGroup::expert ? experts : count) += p->logical_numel();
  }
  mesh.group(Axis::ep).all_reduce_sum(std::span<std::int64_t>(&experts, 1));
  count += experts;
  pp.all_reduce_sum(std::span<std::int64_t>(&count, 1));
  logical_parameters_ = count;
}

std::vector<pp::ExecutedAction> ModelStage::run_step(std::int64_t step, float loss_scale) {
  runner_->begin_step(step);
  runner_->set_loss_scale(loss_scale);
  std::vector<pp::ExecutedAction> actions = executor_->run_step(*runner_);
  measure_bubble(actions);
  return actions;
}

void ModelStage::measure_bubble(const std::vector<pp::ExecutedAction>& actions) {
  ProcessGroup& pp = mesh_.group(Axis::pp);
  double busy = 0.0;
  for (const pp::ExecutedAction& a : actions) {
    const pp::ActionKind k = a.action.kind;
    if (k == pp::ActionKind::forward || k == pp::ActionKind::backward ||
        k == pp::ActionKind::backward_input || k == pp::ActionKind::backward_weight) {
      busy += a.end_s - a.start_s;
    }
  }
  // Idle = the step's pipeline time (the longest stage's action list: a stage that finished
  // early waits for it) minus this stage's compute; averaged over the stages.
  float span = actions.empty() ? 0.0f : static_cast<float>(actions.back().end_s);
  pp.all_reduce_max(std::span<float>(&span, 1));
  last_bubble_ = span > 0.0f ? 1.0 - busy / static_cast<double>(span) : 0.0;
  pp.all_reduce_sum(std::span<double>(&last_bubble_, 1));
  last_bubble_ /= pp.size();
}

double ModelStage::evaluate_sum(std::int64_t batches) {
  for (std::int64_t b = 0; b < batches; ++b) {
    eval_runner_->begin_batch(b);
    eval_executor_->run_step(*eval_runner_);
  }
  return eval_runner_->take_loss_sum();
}

}  // namespace meshtrain
