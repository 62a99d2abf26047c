// src/meshtrain/parallel/dp/zero_groups.h
//
// ZeRO over each replica group a model's parameters use (layers/parameter.h, ReplicaGroup):
// one ZeroSharding for the dense weights over dp × cp and one for the experts' weights over the
// expert-data-parallel group, each slicing its own parameters' optimizer state over its own
// ranks (Megatron-core's distributed optimizer keeps expert and dense buffers apart the same
// way). To its callers it is one ZeroSharding: one list of optimizer shards, one set of
// parameter hooks; a model without experts has one group and behaves exactly as ZeroSharding.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "meshtrain/parallel/dp/zero.h"

namespace meshtrain {

/// Where one replica group's ZeRO runs. `mean_over`: how many ranks' contributions the reduced
/// gradient averages. A dense weight's is its group's size; an expert's owner has already
/// summed the tokens of its whole ep group (the all-to-all brought them), so its gradient is
/// the mean over dp × cp ranks, ep times its expert-data-parallel group (dividing by the edp
/// size alone is the "expert gradients × ep" bug).
struct ZeroGroup {
  ProcessGroup& ranks;
  int mean_over;
};

class ZeroGroups final : public ParameterHooks {
 public:
  /// As ZeroSharding's constructor, for `params` of any replica groups: the parameters (and
  /// each unit) are split by p.placement.replicas, and the ZeroSharding of group g runs over
  /// `group_of(g).ranks`. Collective over each group that has parameters, dense first.
  ZeroGroups(const ParameterList& params, const std::vector<ParameterList>& units,
             const std::function<ZeroGroup(ReplicaGroup)>& group_of, const ZeroOptions& options);

  /// Every group's shards, dense first (the order AdamW's moments and checkpoints follow).
  /// Handles to the groups' own tensors: stepping them updates the groups' masters.
  OptimizerShards& shards() noexcept { return shards_; }
  int stage() const noexcept { return stage_; }

  /// ZeroSharding's, on every group in order (each collective over its own group); then each
  /// group's shards are scaled from the mean over its ranks to the mean over `mean_over`.
  void reduce_gradients();
  void publish_parameters();
  void zero_grad(bool shards_zeroed = false);
  /// Σ over the groups of ZeroSharding::buckets_posted_in_backward.
  std::size_t buckets_posted_in_backward() const noexcept;
  /// Σ over the groups of ZeroSharding::reduce_seconds_in_backward.
  double reduce_seconds_in_backward() const noexcept;
  /// ZeroSharding's, on p's group (collective over it).
  Tensor gather_master(const Parameter& p);
  Tensor gather_grad(const Parameter& p);

  void before_forward(const ParameterList& unit, const ParameterList* next) override;
  void after_forward(const ParameterList& unit) override;
  void before_backward(const ParameterList& unit, const ParameterList* next) override;
  void after_backward(const ParameterList& unit) override;

 private:
  struct Group {
    ReplicaGroup kind;
    std::unique_ptr<ZeroSharding> zero;
    float rescale;  // group size / mean_over
  };
  /// The part of `unit` (a model's unit list, by address) in group i: cached, so a hook sees
  /// the same list object every time (ZeroSharding matches its stage-3 prefetch by address).
  const ParameterList* part(const ParameterList* unit, std::size_t i);
  ZeroSharding& of(const Parameter& p);
  /// call(zero, part, i) for each group i holding some of `unit`.
  template <typename Call>
  void each_part(const ParameterList& unit, Call&& call);

  int stage_;
  std::vector<Group> groups_;
  OptimizerShards shards_;
  std::map<std::pair<const ParameterList*, std::size_t>, ParameterList> parts_;
};

}  // namespace meshtrain
