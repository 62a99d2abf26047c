// Tests of the per-micro-batch activation slots (layers/activation_slots.h) and the deferred
// weight gradients (layers/weight_grad_queue.h) that pipeline schedules need: a tiny GPT-2-like
// and Llama-like model (embedding, two TransformerBlocks, final norm, LM head) over a one-rank
// tp group runs F/B/W of two micro-batches in pipeline orders, and its parameter and input
// gradients are compared with the plain F0 B0 F1 B1 order.
//
// Bitwise or not: every parameter gradient starts at zero. Most take one addition per element
// per backward (a GEMM with beta = 1, the column sums of column-parallel biases and norms); with
// two micro-batches 0 + a + b and 0 + b + a are the same float (addition commutes), so
// reordering whole backwards keeps them bitwise. A few take one addition per token: the
// embedding's scatter-add (a row per occurrence of its id, so also a tied LM head) and the
// row-parallel biases (c_proj, added row by row after the reduction); reordering reorders
// their sums, equal within rounding.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/placements.h"
#include "meshtrain/comm/single_rank_group.h"
#include "meshtrain/core/allocator.h"
#include "meshtrain/layers/norms.h"
#include "meshtrain/layers/weight_grad_queue.h"
#include "meshtrain/parallel/tp/vocab_parallel.h"
#include "meshtrain/transformer/attention.h"
#include "meshtrain/transformer/mlp.h"
#include "meshtrain/transformer/transformer_block.h"

namespace meshtrain {
namespace {

TEST(ActivationSlots, TheDefaultContextIsSlotZeroWithAFusedBackward) {
  const MicroBatchContext ctx;
  EXPECT_EQ(ctx.slot, 0);
  EXPECT_EQ(ctx.defer_weight_grads, nullptr);
}

TEST(ActivationSlots, SavedKeepsOneStatePerSlot) {
  struct State {
    int value = 7;
  };
  Saved<State> saved;
  EXPECT_FALSE(saved.has(0));
  EXPECT_EQ(saved.at(0).value, 7) << "default-constructed on first use";
  saved.at(0).value = 1;
  EXPECT_FALSE(saved.has(1));
  saved.at(1).value = 2;
  EXPECT_EQ(saved.live_slots(), 2U);
  EXPECT_EQ(saved.at(0).value, 1);
  EXPECT_EQ(saved.take(0).value, 1);
  EXPECT_FALSE(saved.has(0));
  EXPECT_TRUE(saved.has(1));
  EXPECT_EQ(saved.at(1).value, 2);
  saved.release(1);
  EXPECT_FALSE(saved.has(1));
  EXPECT_EQ(saved.live_slots(), 0U);
}

TEST(ActivationSlots, AnEmptyWeightGradQueueRunsNothing) {
  WeightGradQueue a;
  EXPECT_EQ(a.pending(), 0U);
  a.run(4);  // nothing pending: nothing to do
  EXPECT_EQ(a.pending(4), 0U);
}

// ---------------------------------------------------------------------------------------------
// A tiny causal LM built from the layers as model/causal_lm.cpp assembles them.

constexpr std::int64_t kVocab = 61, kEmbd = 32, kSequences = 2, kSeqLen = 8;
constexpr std::int64_t kTokens = kSequences * kSeqLen;
constexpr float kLossScale = 0.5f;  // two micro-batches

// The records of TinyLm's tensors (the layers allocate from them).
PlacementTable tiny_records(bool llama) {
  std::vector<test::Records> r{test::vocab_records(
      llama ? "model.embed_tokens.weight" : "transformer.wte.weight", kVocab, kEmbd)};
  for (int i = 0; i < 2; ++i) {
    const std::string p = (llama ? "model.layers." : "transformer.h.") + std::to_string(i);
    r.push_back(test::norm_records(p + (llama ? ".input_layernorm" : ".ln_1"), kEmbd, !llama));
    r.push_back(test::attention_records(p + (llama ? ".self_attn" : ".attn"), kEmbd, 4,
                                        llama ? 2 : 4, !llama, !llama));
    r.push_back(
        test::norm_records(p + (llama ? ".post_attention_layernorm" : ".ln_2"), kEmbd, !llama));
    r.push_back(test::mlp_records(p + ".mlp", kEmbd, llama ? 88 : 4 * kEmbd, !llama, llama));
  }
  r.push_back(test::norm_records(llama ? "model.norm" : "transformer.ln_f", kEmbd, !llama));
  if (llama) r.push_back(test::vocab_records("lm_head.weight", kVocab, kEmbd));
  return test::records_table(std::move(r));
}

struct TinyLm {
  explicit TinyLm(bool llama)
      : group(single_rank_group("tp")),
        tp{*group},
        records(tiny_records(llama)),
        embed(records.at(llama ? "model.embed_tokens.weight" : "transformer.wte.weight"), 0.02f,
              tp) {
    params.push_back(&embed.weight());
    const AttentionShape attn{.n_embd = kEmbd,
                              .n_head = 4,
                              .n_kv_head = llama ? 2 : 4,
                              .init_std = 0.2f,
                              .proj_init_std = 0.2f,
                              .rope_theta = llama ? 10000.0f : 0.0f,
                              .fused_qkv = !llama};
    const MlpInit mlp{.init_std = 0.2f, .proj_init_std = 0.2f};
    for (int i = 0; i < 2; ++i) {
      const std::string p = (llama ? "model.layers." : "transformer.h.") + std::to_string(i);
      if (llama) {
        blocks.push_back(std::make_unique<TransformerBlock>(
            std::make_unique<RmsNorm>(p + ".input_layernorm", records, 1e-5f),
            std::make_unique<CausalSelfAttention>(p + ".self_attn", attn, records, tp),
            std::make_unique<RmsNorm>(p + ".post_attention_layernorm", records, 1e-5f),
            std::make_unique<SwiGluMlp>(p + ".mlp", mlp, records, tp)));
      } else {
        blocks.push_back(std::make_unique<TransformerBlock>(
            std::make_unique<LayerNorm>(p + ".ln_1", records, 1e-5f),
            std::make_unique<CausalSelfAttention>(p + ".attn", attn, records, tp),
            std::make_unique<LayerNorm>(p + ".ln_2", records, 1e-5f),
            std::make_unique<GeluMlp>(p + ".mlp", mlp, records, tp)));
      }
      for (Parameter* q : blocks.back()->parameters()) params.push_back(q);
    }
    if (llama) {
      final_norm = std::make_unique<RmsNorm>("model.norm", records, 1e-5f);
    } else {
      final_norm = std::make_unique<LayerNorm>("transformer.ln_f", records, 1e-5f);
    }
    for (Parameter* q : final_norm->parameters()) params.push_back(q);
    if (llama) {
      lm_head.emplace(vocab_shard_parameter(records.at("lm_head.weight"), 0.02f, *group));
      params.push_back(&*lm_head);
    }
    head = std::make_unique<VocabParallelLmHead>(llama ? *lm_head : embed.weight(), tp);
    for (Parameter* q : params) initialize(*q, 1234);
    // Non-trivial norm weights and biases, so that their gradients matter downstream.
    for (Parameter* q : params) {
      if (q->init == InitKind::normal) continue;
      for (std::int64_t i = 0; i < q->value.numel(); ++i) {
        q->value.f32()[i] += 0.1f * std::sin(static_cast<float>(i));
      }
    }
    for (int mb = 0; mb < 2; ++mb) {
      std::mt19937 rng(static_cast<unsigned>(100 + mb));
      std::uniform_int_distribution<std::int32_t> id(0, kVocab - 1);
      std::vector<std::int32_t>& ids = tokens.emplace_back();
      std::vector<std::int32_t>& tgt = targets.emplace_back();
      for (std::int64_t t = 0; t < kTokens; ++t) {
        ids.push_back(id(rng));
        tgt.push_back(id(rng));
      }
    }
  }

  // The blocks' parameters (not the embedding, final norm or head).
  bool in_block(const Parameter* p) const {
    return p->name.find(".h.") != std::string::npos ||
           p->name.find(".layers.") != std::string::npos;
  }
  bool tied(const Parameter* p) const { return !lm_head && p == &embed.weight(); }

  // Micro-batch mb in activation slot mb.
  float forward(int mb) {
    const MicroBatchContext ctx{.slot = mb};
    Tensor x = embed.forward(tokens[static_cast<std::size_t>(mb)].data(), kTokens, ctx);
    const SequenceBatch batch{kSequences, kSeqLen};
    for (auto& b : blocks) x = b->forward(x, batch, ctx);
    return head->forward(final_norm->forward(x, batch, ctx),
                         targets[static_cast<std::size_t>(mb)].data(), ctx);
  }

  // Returns the gradient of the loss with respect to the first block's input. With `queue` the
  // matmul weights' gradients are deferred into it.
  std::vector<float> backward(int mb, WeightGradQueue* queue = nullptr) {
    const MicroBatchContext ctx{.slot = mb, .defer_weight_grads = queue};
    Tensor dx = final_norm->backward(head->backward(kLossScale, ctx), ctx);
    for (auto it = blocks.rbegin(); it != blocks.rend(); ++it) dx = (*it)->backward(dx, ctx);
    embed.backward(dx, ctx);
    return {dx.f32(), dx.f32() + dx.numel()};
  }

  std::unique_ptr<ProcessGroup> group;
  TensorParallel tp;
  PlacementTable records;
  VocabParallelEmbedding embed;
  std::optional<Parameter> lm_head;
  std::vector<std::unique_ptr<TransformerBlock>> blocks;
  std::unique_ptr<Module> final_norm;
  std::unique_ptr<VocabParallelLmHead> head;
  ParameterList params;
  std::vector<std::vector<std::int32_t>> tokens, targets;
};

struct Result {
  std::vector<std::vector<float>> grads;        // per parameter
  std::vector<std::vector<float>> input_grads;  // per micro-batch
  std::vector<float> losses;                    // per micro-batch
};

// Runs `order`, e.g. "F0 F1 B0 B1 W0 W1", from zero gradients. Bs defer their weight gradients
// into `queue` when it is given; W<m> runs queue->run(m).
Result run(TinyLm& lm, const std::string& order, WeightGradQueue* queue = nullptr) {
  for (Parameter* p : lm.params) p->grad.zero();
  Result r;
  r.input_grads.resize(2);
  r.losses.resize(2);
  std::istringstream steps(order);
  std::string step;
  while (steps >> step) {
    const int mb = step[1] - '0';
    const auto i = static_cast<std::size_t>(mb);
    if (step[0] == 'F') {
      r.losses[i] = lm.forward(mb);
    } else if (step[0] == 'B') {
      r.input_grads[i] = lm.backward(mb, queue);
    } else {
      queue->run(mb);
    }
  }
  for (Parameter* p : lm.params) {
    r.grads.emplace_back(p->grad.f32(), p->grad.f32() + p->grad.numel());
  }
  return r;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// max |a − b| / max |b| over the tensor.
double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0.0, scale = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale == 0.0 ? diff : diff / scale;
}

enum class Expect { bitwise, close };

// Compares every parameter gradient (how: per parameter) and every input gradient (bitwise:
// an input gradient never depends on what other micro-batches accumulated).
void expect_same(const TinyLm& lm, const Result& got, const Result& want,
                 const std::function<Expect(const Parameter*)>& how) {
  for (std::size_t i = 0; i < lm.params.size(); ++i) {
    const Parameter* p = lm.params[i];
    SCOPED_TRACE(p->name);
    double norm = 0.0;
    for (float g : want.grads[i]) norm += static_cast<double>(g) * g;
    EXPECT_GT(norm, 0.0) << "a gradient that is all zero would prove nothing";
    if (how(p) == Expect::bitwise) {
      EXPECT_TRUE(bitwise_equal(got.grads[i], want.grads[i]))
          << "relative difference " << relative_difference(got.grads[i], want.grads[i]);
    } else {
      EXPECT_LE(relative_difference(got.grads[i], want.grads[i]), 1e-6);
    }
  }
  for (std::size_t m = 0; m < 2; ++m) {
    EXPECT_TRUE(bitwise_equal(got.input_grads[m], want.input_grads[m])) << "micro-batch " << m;
    EXPECT_EQ(got.losses[m], want.losses[m]) << "micro-batch " << m;
  }
}

class SlotsTest : public ::testing::TestWithParam<bool> {  // true: llama-like, false: gpt2-like
 protected:
  TinyLm lm_{GetParam()};
  // Weight-gradient GEMMs per backward: qkv (1 fused, or q/k/v), out proj, MLP in (c_fc, or
  // gate and up), MLP out, per block; and the LM head.
  std::size_t deferred_per_backward() const { return GetParam() ? 2 * 7 + 1 : 2 * 4 + 1; }
};

// (a) 1F1B-like order: the forward of micro-batch 1 runs before the backward of 0. The
// gradients accumulate in the same order (B0, then B1), so everything is bitwise equal.
TEST_P(SlotsTest, InterleavedForwardsGiveBitwiseTheGradientsOfSequentialOrder) {
  const Result want = run(lm_, "F0 B0 F1 B1");
  const Result got = run(lm_, "F0 F1 B0 B1");
  expect_same(lm_, got, want, [](const Parameter*) { return Expect::bitwise; });
}

// (b) Backwards in reverse order: each gradient sums the same contributions in another order.
// Bitwise for every parameter that takes one addition per backward (0 + a + b == 0 + b + a);
// within 1e-6 relative (max-norm) for those that take one per token: the embedding (and so a
// tied head) and the row-parallel biases. Input gradients do not depend on the order: bitwise.
TEST_P(SlotsTest, ReversedBackwardsGiveTheSameGradients) {
  const Result want = run(lm_, "F0 B0 F1 B1");
  const Result got = run(lm_, "F0 F1 B1 B0");
  const TinyLm& lm = lm_;
  expect_same(lm_, got, want, [&lm](const Parameter* p) {
    const bool row_parallel_bias = p->name.ends_with(".c_proj.bias") ||
                                   p->name.ends_with(".o_proj.bias") ||
                                   p->name.ends_with(".down_proj.bias");
    return p == &lm.embed.weight() || row_parallel_bias ? Expect::close : Expect::bitwise;
  });
}

// (c) Zero-bubble split: B computes input gradients, W the weight gradients later. One
// micro-batch and two (F0 F1 B0 B1 W0 W1) equal the fused backward bitwise, except a tied
// head/embedding weight, whose embedding part B adds before W adds the head part.
TEST_P(SlotsTest, DeferredWeightGradientsEqualTheFusedBackward) {
  const TinyLm& lm = lm_;
  const auto how = [&lm](const Parameter* p) {
    return lm.tied(p) ? Expect::close : Expect::bitwise;
  };
  {
    const Result fused = run(lm_, "F0 B0 F1 B1");
    WeightGradQueue queue;
    const Result split = run(lm_, "F0 B0 W0 F1 B1 W1", &queue);
    expect_same(lm_, split, fused, how);
  }
  const Result fused = run(lm_, "F0 F1 B0 B1");
  WeightGradQueue queue;
  for (Parameter* p : lm_.params) p->grad.zero();
  lm_.forward(0);
  lm_.forward(1);
  lm_.backward(0, &queue);
  EXPECT_EQ(queue.pending(0), deferred_per_backward());
  EXPECT_EQ(queue.pending(1), 0U);
  lm_.backward(1, &queue);
  EXPECT_EQ(queue.pending(1), deferred_per_backward());
  EXPECT_EQ(queue.pending(), 2 * deferred_per_backward());
  for (const Parameter* p : lm_.params) {  // before W, the matmul weights' gradients are zero
    if (p->value.ndim() == 2 && p != &lm_.embed.weight()) {
      EXPECT_TRUE(std::all_of(p->grad.f32(), p->grad.f32() + p->grad.numel(), [](float g) {
        return g == 0.0f;
      })) << p->name;
    }
  }
  queue.run(0);
  EXPECT_EQ(queue.pending(0), 0U);
  EXPECT_EQ(queue.pending(1), deferred_per_backward());
  queue.run(1);
  EXPECT_EQ(queue.pending(), 0U);
  Result split;
  for (Parameter* p : lm_.params) {
    split.grads.emplace_back(p->grad.f32(), p->grad.f32() + p->grad.numel());
  }
  split.input_grads = fused.input_grads;  // compared in the first half
  split.losses = fused.losses;
  expect_same(lm_, split, fused, how);
}

// (d) Nothing stays behind per slot: after every B (and W) the live activation bytes are back
// where they were before the first forward; a forward repeated in a slot replaces what it kept.
TEST_P(SlotsTest, BackwardAndWeightGradientsFreeEverySlotsActivations) {
  const TrackedAllocator& alloc = TrackedAllocator::instance();
  const auto live = [&alloc] { return alloc.stats(MemCategory::activations).current_bytes; };
  const std::int64_t before = live();
  lm_.forward(0);
  const std::int64_t one_slot = live();
  EXPECT_GT(one_slot, before);
  lm_.forward(0);
  EXPECT_EQ(live(), one_slot) << "a second forward in slot 0 replaces the first one's state";
  lm_.forward(1);
  EXPECT_EQ(live() - before, 2 * (one_slot - before));
  lm_.backward(1);
  EXPECT_EQ(live(), one_slot);
  lm_.backward(0);
  EXPECT_EQ(live(), before);

  WeightGradQueue queue;
  lm_.forward(0);
  lm_.forward(1);
  lm_.backward(0, &queue);
  lm_.backward(1, &queue);
  const std::int64_t pending_w = live();
  EXPECT_GT(pending_w, before) << "the queue keeps the inputs and output gradients of W";
  queue.run(1);
  EXPECT_LT(live(), pending_w);
  queue.run(0);
  EXPECT_EQ(live(), before);
  EXPECT_EQ(queue.pending(), 0U);
}

INSTANTIATE_TEST_SUITE_P(Families, SlotsTest, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& param) {
                           return param.param ? std::string("Llama") : std::string("Gpt2");
                         });

TEST(ActivationSlotsDeathTest, BackwardInASlotWithoutAForwardNamesTheSlot) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TinyLm lm(false);
  lm.forward(0);
  EXPECT_DEATH(lm.backward(1), "backward without a forward in activation slot 1");
}

}  // namespace
}  // namespace meshtrain
