// The C side of spm_shim.h over sentencepiece's C++ API. No exception leaves it.
#include "meshtrain/data/spm_shim/spm_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

struct MtSpm {
  sentencepiece::SentencePieceProcessor processor;
};

namespace {

int fail(const std::string& message, char* error, size_t error_size) {
  if (error_size > 0) {
    const size_t n = std::min(message.size(), error_size - 1);
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return 1;
}

}  // namespace

extern "C" {

MtSpm* mt_spm_load(const char* model_proto, size_t size, char* error, size_t error_size) {
  try {
    // Owned until returned: LoadFromSerializedProto also throws (a hostile model's pieces).
    auto model = std::make_unique<MtSpm>();
    const auto status = model->processor.LoadFromSerializedProto(std::string(model_proto, size));
    if (status.ok()) return model.release();
    fail(status.ToString(), error, error_size);
  } catch (const std::exception& e) {
    fail(e.what(), error, error_size);
  }
  return nullptr;
}

void mt_spm_free(MtSpm* model) { delete model; }

int mt_spm_piece_size(const MtSpm* model) { return model->processor.GetPieceSize(); }

int mt_spm_eos_id(const MtSpm* model) { return model->processor.eos_id(); }

int mt_spm_bos_id(const MtSpm* model) { return model->processor.bos_id(); }

int mt_spm_encode(const MtSpm* model, const char* text, size_t size, MtSpmIds sink, void* context,
                  char* error, size_t error_size) {
  try {
    std::vector<int> ids;
    const auto status = model->processor.Encode(std::string_view(text, size), &ids);
    if (!status.ok()) return fail(status.ToString(), error, error_size);
    const std::vector<int32_t> out(ids.begin(), ids.end());
    sink(context, out.data(), out.size());
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), error, error_size);
  }
}

int mt_spm_decode(const MtSpm* model, const int32_t* ids, size_t count, MtSpmBytes sink,
                  void* context, char* error, size_t error_size) {
  try {
    std::string text;
    const auto status = model->processor.Decode(std::vector<int>(ids, ids + count), &text);
    if (!status.ok()) return fail(status.ToString(), error, error_size);
    sink(context, text.data(), text.size());
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), error, error_size);
  }
}

int mt_spm_train(const char* const* keys, const char* const* values, size_t count, MtSpmBytes sink,
                 void* context, char* error, size_t error_size) {
  try {
    std::unordered_map<std::string, std::string> kwargs;
    for (size_t i = 0; i < count; ++i) kwargs[keys[i]] = values[i];
    std::string model;
    const auto status = sentencepiece::SentencePieceTrainer::Train(kwargs, nullptr, &model);
    if (!status.ok()) return fail(status.ToString(), error, error_size);
    if (model.empty()) return fail("no model came back", error, error_size);
    sink(context, model.data(), model.size());
    return 0;
  } catch (const std::exception& e) {
    return fail(e.what(), error, error_size);
  }
}

}  // extern "C"
