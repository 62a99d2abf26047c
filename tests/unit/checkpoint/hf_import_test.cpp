// checkpoint.init_from's reading of Hugging Face files (hf_weights.h, HfImport in hf_format.h,
// hf_config.h, safetensors.h): BF16/F16 tensors widened to f32, a sharded model through its
// index or its directory, config.json checked against model.*, and hostile or damaged files
// refused with a DataError naming the file, never a crash or a read outside the directory.
// (Files transformers itself wrote: tests/reference/hf_init_reference.py.)
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshtrain/checkpoint/hf_format.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/half.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;

ModelConfig tiny_gpt2() {
  ModelConfig m;
  m.n_layer = 1;
  m.n_head = 2;
  m.n_embd = 8;
  m.block_size = 4;
  m.vocab_size = 5;
  return m;
}

// A fresh directory, removed when the test ends.
struct TempDir {
  // The pid keeps concurrent runs (several checkouts on one machine) apart.
  explicit TempDir(const std::string& name)
      : path(fs::temp_directory_path() / (name + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  fs::path path;
};

// Every tensor of the HF file of `m` in its HF layout, element i of each = (i % 7 − 3) / 8 +
// k / 64 for the k-th tensor (exact in bf16 and f16, so a widened value compares with ==).
std::vector<NamedTensor> hf_model(const ModelConfig& m, DType dtype) {
  std::vector<NamedTensor> out;
  int k = 0;
  for (const HfTensor& spec : hf_tensors(m)) {
    Tensor t = Tensor::empty(spec.hf_shape(), MemCategory::other);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      t.f32()[i] = static_cast<float>(i % 7 - 3) / 8.0f + static_cast<float>(k) / 64.0f;
    }
    ++k;
    out.push_back({spec.hf_name, dtype == DType::f32 ? t : t.to(dtype, MemCategory::other)});
  }
  return out;
}

// A file at `path`: the 8-byte length `length`, then `header`, then `data_bytes` zero bytes.
void write_raw(const fs::path& path, std::uint64_t length, const std::string& header,
               std::size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&length), 8);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  const std::vector<char> zeros(data_bytes, 0);
  out.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
}
void write_raw(const fs::path& path, const std::string& header, std::size_t data_bytes) {
  write_raw(path, header.size(), header, data_bytes);
}

// HfImport(path, model) must throw a DataError whose message holds every one of `says`.
void expect_refused(const fs::path& path, const ModelConfig& model,
                    const std::vector<std::string>& says) {
  try {
    HfImport(path, model).check_values();
    ADD_FAILURE() << path << " was accepted; expected: " << says.front();
  } catch (const DataError& e) {
    for (const std::string& s : says) {
      EXPECT_NE(std::string(e.what()).find(s), std::string::npos)
          << "missing \"" << s << "\" in: " << e.what();
    }
  }
}

// Elements of parameter `name` as HfImport fills them (meshtrain's layout, tp = 1).
std::vector<float> filled(HfImport& import, const ModelConfig& m, const std::string& name) {
  for (const HfTensor& spec : hf_tensors(m)) {
    if (spec.name != name) continue;
    const Parameter p(name, spec.shape, InitKind::zeros, 0.0f, ParameterStorage::deferred);
    std::vector<float> out(static_cast<std::size_t>(shape_numel(spec.shape)));
    import.fill(p, 0, static_cast<std::int64_t>(out.size()), out.data());
    return out;
  }
  ADD_FAILURE() << name << " is not a parameter";
  return {};
}

TEST(HfImport, Bf16AndF16TensorsAreWidenedExactly) {
  const TempDir dir("meshtrain_hf_import_16bit");
  const ModelConfig m = tiny_gpt2();
  const std::vector<NamedTensor> f32 = hf_model(m, DType::f32);
  for (const DType dtype : {DType::bf16, DType::f16}) {
    const fs::path file =
        dir.path / (dtype == DType::bf16 ? "bf16.safetensors" : "f16.safetensors");
    write_safetensors(file, hf_model(m, dtype), {{"format", "pt"}});
    HfImport import(file, m);
    import.check_values();
    EXPECT_NE(import.summary().find(dtype == DType::bf16 ? "BF16" : "F16"), std::string::npos)
        << import.summary();
    // wpe [4, 8] is not transposed: element i is the file's element i.
    const std::vector<float> wpe = filled(import, m, "transformer.wpe.weight");
    const Tensor& want = f32[1].tensor;
    ASSERT_EQ(f32[1].name, "transformer.wpe.weight");
    for (std::size_t i = 0; i < wpe.size(); ++i) EXPECT_EQ(wpe[i], want.f32()[i]) << i;
    // c_attn [8, 24] in the file → [24, 8] in meshtrain: meshtrain (r, c) = file (c, r).
    const std::vector<float> c_attn = filled(import, m, "transformer.h.0.attn.c_attn.weight");
    const auto& file_c_attn = *std::find_if(f32.begin(), f32.end(), [](const NamedTensor& t) {
      return t.name == "transformer.h.0.attn.c_attn.weight";
    });
    EXPECT_EQ(c_attn[1 * 8 + 2], file_c_attn.tensor.f32()[2 * 24 + 1]);
  }
}

TEST(HfImport, ShardedModelThroughItsIndexOrItsDirectory) {
  const TempDir dir("meshtrain_hf_import_sharded");
  const ModelConfig m = tiny_gpt2();
  std::vector<NamedTensor> all = hf_model(m, DType::bf16);
  const std::vector<NamedTensor> first(all.begin(), all.begin() + 3);
  const std::vector<NamedTensor> second(all.begin() + 3, all.end());
  write_safetensors(dir.path / "model-00001-of-00002.safetensors", first, {{"format", "pt"}});
  write_safetensors(dir.path / "model-00002-of-00002.safetensors", second, {{"format", "pt"}});
  nlohmann::json index = {{"metadata", {{"total_size", 0}}},
                          {"weight_map", nlohmann::json::object()}};
  for (const NamedTensor& t : first)
    index["weight_map"][t.name] = "model-00001-of-00002.safetensors";
  for (const NamedTensor& t : second)
    index["weight_map"][t.name] = "model-00002-of-00002.safetensors";
  std::ofstream(dir.path / "model.safetensors.index.json") << index.dump(2);
  for (const fs::path& path : {dir.path / "model.safetensors.index.json", dir.path}) {
    HfImport import(path, m);
    import.check_values();
    EXPECT_NE(import.summary().find("2 shards"), std::string::npos) << import.summary();
    EXPECT_EQ(filled(import, m, "transformer.ln_f.bias")[2],
              all.back().tensor.to(DType::f32, MemCategory::other).f32()[2]);
  }
  // The index and its shards disagree: a listed tensor missing, a tensor not listed.
  nlohmann::json missing = index;
  missing["weight_map"]["transformer.ln_f.weight"] = "model-00001-of-00002.safetensors";
  std::ofstream(dir.path / "missing.index.json") << missing.dump();
  expect_refused(dir.path / "missing.index.json", m,
                 {"missing.index.json",
                  "shard model-00002-of-00002.safetensors holds tensor "
                  "transformer.ln_f.weight, which the index maps to "
                  "model-00001-of-00002.safetensors"});
  nlohmann::json unlisted = index;
  unlisted["weight_map"].erase("transformer.ln_f.bias");
  std::ofstream(dir.path / "unlisted.index.json") << unlisted.dump();
  expect_refused(dir.path / "unlisted.index.json", m, {"unlisted.index.json", "does not list"});
}

TEST(HfImport, IndexShardNamesOutsideItsDirectoryAreRefusedBeforeAnyRead) {
  const TempDir dir("meshtrain_hf_import_escape");
  const ModelConfig m = tiny_gpt2();
  // A valid model one level up: following "../" would load it, and the test would see no error.
  fs::create_directories(dir.path / "model");
  write_safetensors(dir.path / "outside.safetensors", hf_model(m, DType::f32), {{"format", "pt"}});
  for (const std::string& shard :
       {std::string("../outside.safetensors"), (dir.path / "outside.safetensors").string(),
        std::string(".."), std::string("sub\\x.safetensors"), std::string("")}) {
    nlohmann::json index = {{"weight_map", nlohmann::json::object()}};
    for (const HfTensor& s : hf_tensors(m)) index["weight_map"][s.hf_name] = shard;
    std::ofstream(dir.path / "model" / "model.safetensors.index.json") << index.dump();
    expect_refused(dir.path / "model", m,
                   {"model.safetensors.index.json", "\"" + shard + "\"",
                    "not a file name in the index's directory"});
  }
  std::ofstream(dir.path / "model" / "model.safetensors.index.json") << "{\"weight_map\": [1, 2]}";
  expect_refused(dir.path / "model", m,
                 {"model.safetensors.index.json", "not a safetensors index"});
  std::ofstream(dir.path / "model" / "model.safetensors.index.json") << "not json";
  expect_refused(dir.path / "model", m,
                 {"model.safetensors.index.json", "not a safetensors index"});
  fs::remove(dir.path / "model" / "model.safetensors.index.json");
  expect_refused(dir.path / "model", m, {"holds neither model.safetensors nor"});
  expect_refused(dir.path / "absent.safetensors", m, {"absent.safetensors", "no such file"});
}

TEST(HfImport, HostileHeadersAreDataErrorsNamingTheFile) {
  const TempDir dir("meshtrain_hf_import_hostile");
  const ModelConfig m = tiny_gpt2();
  const fs::path f = dir.path / "model.safetensors";
  const std::string w = "transformer.wte.weight";
  const struct {
    std::string header;
    std::size_t data;
    std::string says;
  } cases[] = {
      // data_offsets past the end of the file
      {R"({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8000]}})", 8,
       "outside the file"},
      // offsets inside the file but 8 bytes for a [2, 3] F32 (24 bytes)
      {R"({"x": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 8]}})", 64,
       "not matching its dtype and shape"},
      // a BF16 [4] is 8 bytes, not 16
      {R"({"x": {"dtype": "BF16", "shape": [4], "data_offsets": [0, 16]}})", 16,
       "not matching its dtype and shape"},
      // dims whose product overflows 64 bits
      {R"({"x": {"dtype": "F32", "shape": [4611686018427387904, 4611686018427387904], "data_offsets": [0, 0]}})",
       0, "needs more bytes than the file holds"},
      // after a 0 the byte bound holds any dimension; 2^64 − 1 would become −1 (found by
      // reading the parser for tests/fuzz; Tensor::empty then aborted the process)
      {R"({"x": {"dtype": "F32", "shape": [0, 18446744073709551615], "data_offsets": [0, 0]}})", 0,
       "has a dimension 18446744073709551615 above 2^63 − 1 in shape [0,18446744073709551615]"},
      {R"({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}})", 0,
       "not an integer ≥ 0"},
      {R"({"x": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 0]}})", 0,
       "not an integer ≥ 0"},
      {R"({"x": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}})", 8, "dtype F64"},
      {R"({"x": {"dtype": "F32", "shape": [1]}})", 4, "malformed entry for x"},
      {R"({"x": 1})", 4, "malformed entry for x"},
      {R"([1, 2])", 0, "malformed JSON header"},
      {"{\"x\": ", 0, "malformed JSON header"},
  };
  for (const auto& c : cases) {
    write_raw(f, c.header, c.data);
    expect_refused(f, m, {f.string(), c.says});
  }
  write_raw(f, std::uint64_t{1} << 62, "{}", 0);  // a length no file can have
  expect_refused(f, m, {f.string(), "exceeds safetensors' limit of 100000000 bytes"});
  write_raw(f, 1000, "{}", 0);  // a length past the end of this file
  expect_refused(f, m, {f.string(), "header length 1000 exceeds the file"});
  write_raw(f, 0, "", 0);
  std::filesystem::resize_file(f, 5);
  expect_refused(f, m, {f.string(), "too short"});
  // A well-formed file of the wrong content: an I32 weight, an unknown tensor.
  std::vector<NamedTensor> tensors = hf_model(m, DType::f32);
  tensors[0].tensor = Tensor::zeros(tensors[0].tensor.shape(), MemCategory::other, DType::i32);
  tensors.push_back({"transformer.h.0.attn.extra", Tensor::zeros({3}, MemCategory::other)});
  write_safetensors(f, tensors, {{"format", "pt"}});
  expect_refused(
      f, m,
      {f.string(),
       "tensor " + w + " has shape [5, 8] in the file; the model expects [5, 8] (the file's is I32",
       "tensor transformer.h.0.attn.extra (F32 [3], in model.safetensors) has no "
       "place in the model"});
}

TEST(HfImport, ConfigJsonBesideTheFileMustAgreeWithTheRunsModel) {
  const TempDir dir("meshtrain_hf_import_config");
  ModelConfig m = tiny_gpt2();
  m.family = ModelFamily::llama;
  m.bias = false;
  m.n_kv_head = 1;
  m.ffn_hidden = 12;
  m.rope_theta = 500000.0;
  Config config;
  config.model = m;
  export_hf(
      [&] {
        std::vector<NamedTensor> out;
        for (const HfTensor& s : hf_tensors(m))
          out.push_back({s.name, Tensor::zeros(s.shape, MemCategory::other)});
        return out;
      }(),
      config, dir.path / "model.safetensors");
  HfImport(dir.path, m).check_values();  // meshtrain's own config.json agrees
  ModelConfig other_theta = m;
  other_theta.rope_theta = 10000.0;
  expect_refused(dir.path, other_theta,
                 {"config.json: rope_theta 500000, the run has model.rope_theta = 10000"});
  ModelConfig other_eps = m;
  other_eps.norm_eps = 1e-6;
  expect_refused(dir.path, other_eps,
                 {"config.json: rms_norm_eps 1e-05, the run has model.norm_eps"});
  // A config.json of a model meshtrain cannot be: scaled RoPE, attention biases.
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir.path / "config.json"));
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  j["attention_bias"] = true;
  std::ofstream(dir.path / "config.json") << j.dump();
  expect_refused(dir.path, m, {"config.json: rope_scaling", "config.json: attention_bias true"});
  std::ofstream(dir.path / "config.json") << "[]";
  expect_refused(dir.path, m, {"config.json", "not a JSON object"});

  // GPT-2: an activation or attention scaling meshtrain does not have, another MLP width.
  const TempDir gpt2_dir("meshtrain_hf_import_config_gpt2");
  const ModelConfig g = tiny_gpt2();
  write_safetensors(gpt2_dir.path / "model.safetensors", hf_model(g, DType::f32),
                    {{"format", "pt"}});
  nlohmann::json gj = nlohmann::json::parse(hf_config_json(g));
  gj["activation_function"] = "relu";
  gj["scale_attn_weights"] = false;
  gj["n_inner"] = 64;
  std::ofstream(gpt2_dir.path / "config.json") << gj.dump();
  expect_refused(
      gpt2_dir.path, g,
      {"config.json: activation_function \"relu\"", "config.json: scale_attn_weights false",
       "config.json: n_inner 64, the run has model.ffn_hidden = 32"});
  gj = nlohmann::json::parse(hf_config_json(g));
  gj["n_inner"] = nullptr;  // null: 4·C, as transformers reads it
  std::ofstream(gpt2_dir.path / "config.json") << gj.dump();
  HfImport(gpt2_dir.path, g).check_values();
}

TEST(HfImport, ATiedLlamaStartsItsHeadFromTheEmbeddingOnlyWhenConfigJsonSaysSo) {
  const TempDir dir("meshtrain_hf_import_tied");
  ModelConfig m = tiny_gpt2();
  m.family = ModelFamily::llama;
  m.bias = false;
  m.n_kv_head = 1;
  m.ffn_hidden = 12;
  std::vector<NamedTensor> tensors = hf_model(m, DType::f32);
  std::erase_if(tensors, [](const NamedTensor& t) { return t.name == "lm_head.weight"; });
  write_safetensors(dir.path / "model.safetensors", tensors, {{"format", "pt"}});
  expect_refused(dir.path, m, {"tensor lm_head.weight is missing", "tie_word_embeddings"});
  nlohmann::json j = nlohmann::json::parse(hf_config_json(m));
  j["tie_word_embeddings"] = true;
  std::ofstream(dir.path / "config.json") << j.dump();
  HfImport import(dir.path, m);
  EXPECT_NE(import.summary().find("lm_head.weight from model.embed_tokens.weight"),
            std::string::npos);
  EXPECT_EQ(filled(import, m, "lm_head.weight"), filled(import, m, "model.embed_tokens.weight"));
}

}  // namespace
}  // namespace meshtrain
