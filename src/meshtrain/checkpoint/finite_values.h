// src/meshtrain/checkpoint/finite_values.h
//
// The one value check every reader and writer of weights applies (issue 17 item 8): resume
// (sharded checkpoints, CheckpointReader::fill), `meshtrain sample` (final checkpoints,
// load_model_parameters), `meshtrain export` (export_hf) and checkpoint.init_from
// (HfImport::check_values) refuse a NaN or an infinity with one message, naming where it was
// found, the tensor, the value and the row-major index of the first bad element in the
// logical tensor: enough to find it with any safetensors reader.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace meshtrain {

/// Index of the first NaN or ±inf of `values`, or −1 when every value is finite.
std::int64_t first_non_finite(std::span<const float> values) noexcept;

/// Throws DataError "<where>: tensor <tensor> holds a non-finite value (<value>) at element
/// <element>: <advice>". `element` is the row-major index in the logical tensor.
[[noreturn]] void throw_non_finite(std::string_view where, std::string_view tensor,
                                   std::int64_t element, float value, std::string_view advice);

/// What a run's own checkpoint holding a non-finite value most likely means.
inline constexpr std::string_view kDivergedAdvice =
    "the run diverged before this save, or the file is corrupt; use an earlier checkpoint";

/// throw_non_finite for the first bad element of `values`, a whole logical tensor; returns
/// when every value is finite.
void require_finite(std::span<const float> values, std::string_view where, std::string_view tensor,
                    std::string_view advice = kDivergedAdvice);

}  // namespace meshtrain
