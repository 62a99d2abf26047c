// tests/support/placements.h — placement records (mesh/placement.h) for tests that build
// layers on their own, outside a model's table: the layers allocate every parameter from its
// record, so such a test lists the records its layer reads, with the same names, logical
// shapes and tp splits model/causal_lm.cpp's table gives them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/mesh/placement.h"

namespace meshtrain::test {

using Records = std::vector<ParamPlacement>;

/// ColumnParallelLinear's `<prefix>.weight` [out, in] and, with bias, `<prefix>.bias` [out],
/// sharded over tp along out in `parts` blocks.
inline Records column_records(const std::string& prefix, std::int64_t out, std::int64_t in,
                              bool bias, std::int64_t parts = 1) {
  Records r{ParamPlacement::tp_shard(prefix + ".weight", {out, in}, 0, parts)};
  if (bias) r.push_back(ParamPlacement::tp_shard(prefix + ".bias", {out}, 0, parts));
  return r;
}

/// RowParallelLinear's `<prefix>.weight` [out, in] sharded along in and, with bias, the
/// replicated `<prefix>.bias` [out].
inline Records row_records(const std::string& prefix, std::int64_t out, std::int64_t in,
                           bool bias) {
  Records r{ParamPlacement::tp_shard(prefix + ".weight", {out, in}, 1)};
  if (bias) r.push_back(ParamPlacement::whole(prefix + ".bias", {out}));
  return r;
}

/// A norm's `<prefix>.weight` [C] and, with bias, `<prefix>.bias` [C], replicated.
inline Records norm_records(const std::string& prefix, std::int64_t features, bool bias) {
  Records r{ParamPlacement::whole(prefix + ".weight", {features})};
  if (bias) r.push_back(ParamPlacement::whole(prefix + ".bias", {features}));
  return r;
}

/// A vocabulary table `name` [V, C] sharded over tp along V.
inline Records vocab_records(const std::string& name, std::int64_t vocab, std::int64_t n_embd) {
  return {ParamPlacement::tp_shard(name, {vocab, n_embd}, 0)};
}

/// GeluMlp's (`<prefix>.c_fc`, `.c_proj`) or SwiGluMlp's (`.gate_proj`, `.up_proj`,
/// `.down_proj`) linears for C → F → C.
inline Records mlp_records(const std::string& prefix, std::int64_t n_embd, std::int64_t hidden,
                           bool bias, bool swiglu) {
  Records r;
  auto add = [&r](Records more) {
    for (ParamPlacement& p : more) r.push_back(std::move(p));
  };
  if (swiglu) {
    add(column_records(prefix + ".gate_proj", hidden, n_embd, bias));
    add(column_records(prefix + ".up_proj", hidden, n_embd, bias));
    add(row_records(prefix + ".down_proj", n_embd, hidden, bias));
  } else {
    add(column_records(prefix + ".c_fc", hidden, n_embd, bias));
    add(row_records(prefix + ".c_proj", n_embd, hidden, bias));
  }
  return r;
}

/// CausalSelfAttention's projections: fused `<prefix>.c_attn` [3C, C] (3 parts) and `.c_proj`,
/// or `.q_proj`, `.k_proj`, `.v_proj` and `.o_proj` for H heads and Hkv kv heads.
inline Records attention_records(const std::string& prefix, std::int64_t n_embd,
                                 std::int64_t n_head, std::int64_t n_kv_head, bool bias,
                                 bool fused_qkv) {
  Records r;
  auto add = [&r](Records more) {
    for (ParamPlacement& p : more) r.push_back(std::move(p));
  };
  const std::int64_t d = n_embd / n_head;
  if (fused_qkv) {
    add(column_records(prefix + ".c_attn", 3 * n_embd, n_embd, bias, 3));
    add(row_records(prefix + ".c_proj", n_embd, n_embd, bias));
    return r;
  }
  add(column_records(prefix + ".q_proj", n_head * d, n_embd, bias));
  add(column_records(prefix + ".k_proj", n_kv_head * d, n_embd, bias));
  add(column_records(prefix + ".v_proj", n_kv_head * d, n_embd, bias));
  add(row_records(prefix + ".o_proj", n_embd, n_head * d, bias));
  return r;
}

/// SparseMoeBlock's router `<prefix>.block_sparse_moe.gate.weight` [E, C] and experts
/// `.experts.{j}.{w1, w3, w2}.weight`, expert j owned by ep rank j div (E/ep).
inline Records moe_records(const std::string& prefix, std::int64_t experts, std::int64_t n_embd,
                           std::int64_t hidden, int ep = 1) {
  Records r{ParamPlacement::whole(prefix + ".block_sparse_moe.gate.weight", {experts, n_embd})};
  for (std::int64_t j = 0; j < experts; ++j) {
    const std::string e = prefix + ".block_sparse_moe.experts." + std::to_string(j);
    for (auto [w, shape] : {std::pair{".w1.weight", Shape{hidden, n_embd}},
                            std::pair{".w3.weight", Shape{hidden, n_embd}},
                            std::pair{".w2.weight", Shape{n_embd, hidden}}}) {
      ParamPlacement p = ParamPlacement::whole(e + w, shape);
      p.axes[static_cast<std::size_t>(Axis::ep)] = {
          .kind = PlacementKind::owned, .owner = static_cast<int>(j / (experts / ep))};
      r.push_back(std::move(p));
    }
  }
  return r;
}

/// The table of `records` concatenated (a mesh of one rank: the layers read only the records).
inline PlacementTable records_table(std::vector<Records> parts) {
  Records all;
  for (Records& part : parts) {
    for (ParamPlacement& p : part) all.push_back(std::move(p));
  }
  return PlacementTable(MeshShape{}, std::move(all));
}

}  // namespace meshtrain::test
