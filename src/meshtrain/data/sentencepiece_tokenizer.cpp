#include "meshtrain/data/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <array>
#include <unordered_map>
#include <utility>

#include "meshtrain/core/error.h"
#include "meshtrain/core/staged_file.h"
#include "meshtrain/data/spm_shim/spm_shim.h"
#include "meshtrain/data/tokenizer_files.h"

namespace meshtrain::data {
namespace {

namespace fs = std::filesystem;

// The module's functions, resolved once (spm_shim.h: why a module, loaded locally).
struct SpmApi {
  decltype(&mt_spm_load) load;
  decltype(&mt_spm_free) free;
  decltype(&mt_spm_piece_size) piece_size;
  decltype(&mt_spm_eos_id) eos_id;
  decltype(&mt_spm_bos_id) bos_id;
  decltype(&mt_spm_encode) encode;
  decltype(&mt_spm_decode) decode;
  decltype(&mt_spm_train) train;
};

template <typename Fn>
void resolve(void* handle, const char* name, Fn& fn, const fs::path& path) {
  fn = reinterpret_cast<Fn>(::dlsym(handle, name));
  if (fn == nullptr) {
    throw DataError(
        fmt::format("SentencePiece module '{}' lacks {}; rebuild meshtrain", path.string(), name));
  }
}

// Installed: <prefix>/lib/meshtrain/ beside <prefix>/bin/meshtrain; else the build tree's.
SpmApi open_module() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  const std::array<fs::path, 2> candidates = {
      exe.parent_path().parent_path() / "lib" / "meshtrain" / "libmeshtrain_spm.so",
      fs::path(MESHTRAIN_SPM_MODULE)};
  for (const fs::path& path : candidates) {
    if (!fs::is_regular_file(path, ec)) continue;
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      throw DataError(
          fmt::format("cannot load the SentencePiece module '{}': {}", path.string(), ::dlerror()));
    }
    SpmApi api{};
    resolve(handle, "mt_spm_load", api.load, path);
    resolve(handle, "mt_spm_free", api.free, path);
    resolve(handle, "mt_spm_piece_size", api.piece_size, path);
    resolve(handle, "mt_spm_eos_id", api.eos_id, path);
    resolve(handle, "mt_spm_bos_id", api.bos_id, path);
    resolve(handle, "mt_spm_encode", api.encode, path);
    resolve(handle, "mt_spm_decode", api.decode, path);
    resolve(handle, "mt_spm_train", api.train, path);
    return api;  // the handle stays open for the process's life
  }
  throw DataError(fmt::format(
      "SentencePiece support (libmeshtrain_spm.so) is neither in {} nor in {}; build or install "
      "meshtrain completely (cmake --build, cmake --install)",
      candidates[0].string(), candidates[1].string()));
}

const SpmApi& spm() {
  static const SpmApi api = open_module();  // thread-safe initialisation
  return api;
}

using Error = std::array<char, 1024>;

void assign_bytes(void* context, const char* bytes, std::size_t size) {
  static_cast<std::string*>(context)->assign(bytes, size);
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(std::string model_proto,
                                               const std::filesystem::path& path)
    : model_proto_(std::move(model_proto)) {
  Error error{};
  model_ = spm().load(model_proto_.data(), model_proto_.size(), error.data(), error.size());
  if (model_ == nullptr) {
    throw DataError(fmt::format(
        "SentencePiece model '{}' cannot be loaded ({}); expected a complete .model file "
        "written by SentencePiece (e.g. by `meshtrain tokenizer train`), not a truncated copy",
        path.string(), error.data()));
  }
  vocab_size_ = spm().piece_size(model_);
  eos_id_ = spm().eos_id(model_);
  bos_id_ = spm().bos_id(model_);
  if (eos_id_ < 0 || eos_id_ >= vocab_size_) {
    spm().free(model_);  // a constructor that throws never runs the destructor
    model_ = nullptr;
    throw DataError(fmt::format(
        "SentencePiece model '{}' has no eos piece, which meshtrain uses as the end-of-text id "
        "between documents; train the model with eos_id ≥ 0 (SentencePiece's default is 2)",
        path.string()));
  }
}

SentencePieceTokenizer::~SentencePieceTokenizer() {
  if (model_ != nullptr) spm().free(model_);
}

std::unique_ptr<SentencePieceTokenizer> SentencePieceTokenizer::load(
    const std::filesystem::path& model_file) {
  return std::make_unique<SentencePieceTokenizer>(
      read_tokenizer_file(model_file, "SentencePiece model"), model_file);
}

void SentencePieceTokenizer::encode(std::string_view text, std::vector<std::int32_t>& out) const {
  Error error{};
  const MtSpmIds append = [](void* context, const std::int32_t* ids, std::size_t count) {
    static_cast<std::vector<std::int32_t>*>(context)->insert(
        static_cast<std::vector<std::int32_t>*>(context)->end(), ids, ids + count);
  };
  if (spm().encode(model_, text.data(), text.size(), append, &out, error.data(), error.size()) !=
      0) {
    throw DataError(fmt::format("SentencePiece cannot encode the text: {}", error.data()));
  }
}

std::string SentencePieceTokenizer::decode(std::span<const std::int32_t> ids) const {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab_size_) {
      throw DataError(
          fmt::format("token id {} at position {} is outside the SentencePiece vocabulary [0, {})",
                      ids[i], i, vocab_size_));
    }
  }
  std::string text;
  Error error{};
  if (spm().decode(model_, ids.data(), ids.size(), assign_bytes, &text, error.data(),
                   error.size()) != 0) {
    throw DataError(fmt::format("SentencePiece cannot decode: {}", error.data()));
  }
  return text;
}

void SentencePieceTokenizer::save_files(const std::filesystem::path& dir) const {
  StagedFile(dir / "tokenizer.model", std::as_bytes(std::span<const char>(model_proto_))).commit();
}

namespace {

void check_train_args(const SentencePieceTrainArgs& args) {
  std::vector<ConfigIssue> issues;
  if (args.model_type != "bpe" && args.model_type != "unigram") {
    issues.push_back({"--model-type", args.model_type, "must be bpe or unigram",
                      "use --model-type bpe (GPT/Llama style) or unigram (T5 style)"});
  }
  if (args.vocab_size < 8 || args.vocab_size > 1'000'000) {
    issues.push_back({"--vocab-size", std::to_string(args.vocab_size), "must lie in [8, 1000000]",
                      "use e.g. --vocab-size 8000"});
  }
  if (!(args.character_coverage > 0.0 && args.character_coverage <= 1.0)) {
    issues.push_back({"--character-coverage", fmt::format("{}", args.character_coverage),
                      "must lie in (0, 1]", "use 1.0 for small alphabets, 0.9995 for CJK"});
  }
  if (args.inputs.empty()) {
    issues.push_back({"--input", "(none)", "needs at least one text file",
                      "pass e.g. --input data/tinyshakespeare.txt"});
  }
  if (!issues.empty()) throw ConfigError("the command line", std::move(issues));
  for (const std::filesystem::path& input : args.inputs) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(input, ec)) {
      throw DataError(
          fmt::format("training text '{}' is not a readable file; pass plain-text "
                      "files to --input",
                      input.string()));
    }
  }
}

}  // namespace

std::filesystem::path train_sentencepiece(const SentencePieceTrainArgs& args) {
  check_train_args(args);
  std::string inputs;
  for (const std::filesystem::path& input : args.inputs) {
    inputs += (inputs.empty() ? "" : ",") + input.string();
  }
  // Trained in memory (the serialized proto comes back), written atomically by us.
  const std::unordered_map<std::string, std::string> kwargs = {
      {"input", inputs},
      {"model_type", args.model_type},
      {"vocab_size", std::to_string(args.vocab_size)},
      {"character_coverage", fmt::format("{}", args.character_coverage)},
      {"model_prefix", ""},
      {"minloglevel", "1"},
      {"num_threads", "2"},
  };
  std::vector<const char*> keys;
  std::vector<const char*> values;
  for (const auto& [key, value] : kwargs) {
    keys.push_back(key.c_str());
    values.push_back(value.c_str());
  }
  std::string model;
  Error error{};
  if (spm().train(keys.data(), values.data(), keys.size(), assign_bytes, &model, error.data(),
                  error.size()) != 0) {
    throw DataError(fmt::format("SentencePiece training on {} failed: {}", inputs, error.data()));
  }
  // Created only now, so a failed training leaves no empty directory behind.
  std::error_code ec;
  std::filesystem::create_directories(args.out_dir, ec);
  if (ec || !std::filesystem::is_directory(args.out_dir)) {
    throw DataError(fmt::format("cannot create output directory '{}'; choose a writable one",
                                args.out_dir.string()));
  }
  const std::filesystem::path out = args.out_dir / "tokenizer.model";
  StagedFile(out, std::as_bytes(std::span<const char>(model))).commit();
  return out;
}

}  // namespace meshtrain::data
