// tests/dist/equivalence_harness.cpp — see equivalence_harness.h.
#include "equivalence_harness.h"

#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "dist_env.h"
#include "meshtrain/parallel/tp/gather.h"

namespace meshtrain::test {

void expect_equivalent(const TrainedRun& want, const ParameterList& want_params,
                       const TrainedRun& got, const ParameterList& got_params,
                       const Tolerances& tolerances) {
  EXPECT_NEAR(got.grad_norm_step1, want.grad_norm_step1,
              tolerances.norm_rtol * want.grad_norm_step1)
      << "step 1's grad norm";

  // A layout holds some of the parameters (a pipeline stage) in its own order: match by name.
  std::map<std::string, std::size_t> index;
  for (std::size_t j = 0; j < want_params.size(); ++j) index[want_params[j]->name] = j;
  ASSERT_EQ(want.grads_step1.size(), want_params.size());
  ASSERT_EQ(got.grads_step1.size(), got_params.size());
  int compared = 0;
  for (std::size_t i = 0; i < got_params.size(); ++i) {
    const std::string& name = got_params[i]->name;
    const auto found = index.find(name);
    if (found == index.end()) {
      ADD_FAILURE() << name << " has no parameter of that name in the reference";
      continue;
    }
    const Tensor& ref = want.grads_step1[found->second];
    const double scale = max_abs(ref);
    EXPECT_LE(max_abs_diff(got.grads_step1[i], ref), tolerances.grad_rtol * scale)
        << name << " (max |g| " << scale << ")";
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(got_params.size()));

  ASSERT_EQ(got.losses.size(), want.losses.size());
  for (std::size_t s = 0; s < want.losses.size(); ++s) {
    EXPECT_NEAR(got.losses[s], want.losses[s], tolerances.loss_rtol * std::abs(want.losses[s]))
        << "step " << s + 1;
  }
}

Equivalence::Equivalence(const Config& single, const Config& layout)
    : self_(runtime().self_group()), world_(runtime().world_group()) {
  reference_ = std::make_unique<Trainer>(single, *self_, quiet());
  parallel_ = std::make_unique<Trainer>(layout, *world_, quiet());
}

void Equivalence::expect_same_initial_weights(InitialWeights source) {
  std::map<std::string, const Parameter*> by_name;
  for (const Parameter* r : reference_->parameters()) by_name[r->name] = r;
  ProcessGroup& tp = parallel_->mesh().group(Axis::tp);
  bool same = true;
  // Every parameter is gathered (collectives: every rank calls them in the same order) before
  // any verdict, so a mismatch on one rank cannot leave the others waiting.
  for (const Parameter* p : parallel_->parameters()) {
    const Tensor full =
        gather_logical(*p, source == InitialWeights::zero_masters ? parallel_->zero().gather_master(*p)
                                                                 : p->value,
                       tp);
    const auto found = by_name.find(p->name);
    if (found == by_name.end()) {
      ADD_FAILURE() << p->name << " has no parameter of that name in the reference";
      same = false;
      continue;
    }
    const Tensor& r = found->second->value;
    if (full.shape() != r.shape()) {
      ADD_FAILURE() << p->name << ": logical shape differs from the reference's";
      same = false;
      continue;
    }
    if (std::memcmp(full.f32(), r.f32(), static_cast<std::size_t>(full.bytes())) != 0) {
      ADD_FAILURE() << p->name << ": initial weights are not the reference's (the slices of "
                    << "the single-process tensor), bit for bit";
      same = false;
    }
  }
  if (!same) FAIL() << "initial weights differ from the single process";
}

void Equivalence::train(int steps) {
  want_ = train_steps(*reference_, steps);
  got_ = train_steps(*parallel_, steps);
}

void Equivalence::expect_equivalent(const Tolerances& tolerances) const {
  test::expect_equivalent(want_, reference_->parameters(), got_, parallel_->parameters(),
                          tolerances);
}

}  // namespace meshtrain::test
