#include "meshtrain/checkpoint/sharded_checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <limits>
#include <regex>
#include <set>
#include <sstream>

#include "meshtrain/checkpoint/finite_values.h"
#include "meshtrain/checkpoint/safetensors.h"
#include "meshtrain/config/load.h"
#include "meshtrain/config/validate.h"
#include "meshtrain/core/error.h"
#include "meshtrain/core/file_name.h"
#include "meshtrain/core/staged_file.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr std::string_view kFormat = "meshtrain sharded checkpoint";
constexpr int kVersion = 1;
constexpr std::string_view kCompleteName = "COMPLETE";
constexpr std::string_view kMetadataName = "metadata.json";

std::string hex64(std::uint64_t h) { return fmt::format("{:016x}", h); }

std::uint64_t xxh64(std::span<const std::byte> bytes) {
  return XXH64(bytes.data(), bytes.size(), 0);
}

std::string key_of(const std::string& name, std::string_view field) {
  return field.empty() ? name : fmt::format("{}/{}", name, field);
}

json piece_json(const std::string& file, const std::string& name, const ShardPiece& p) {
  return {{"name", name},
          {"file", file},
          {"shape", p.slice.logical_shape},
          {"slice",
           {{"dim", p.slice.dim},
            {"parts", p.slice.parts},
            {"offset", p.slice.offset},
            {"length", p.slice.length},
            {"stride", p.slice.stride}}},
          {"begin", p.begin},
          {"end", p.end}};
}

// Piece `j` of a tensor of logical shape `shape` (checked by check_metadata: dimensions ≥ 0,
// product of at most kMaxElements). A piece must describe elements of its own local tensor: a
// hand-edited or foreign metadata file must not send the copy outside its buffers, and the
// checks are ordered so that no sum or product can overflow.
ShardPiece piece_of(const json& j, const Shape& shape, const std::string& name,
                    const fs::path& metadata) {
  if (j.at("shape").get<Shape>() != shape) {
    throw DataError(fmt::format("{}: a piece of {} has shape {}, the tensor {}", metadata.string(),
                                name, j.at("shape").dump(), fmt::join(shape, "×")));
  }
  const json& s = j.at("slice");
  ShardPiece p{.slice = {.dim = s.at("dim").get<int>(),
                         .parts = s.at("parts").get<std::int64_t>(),
                         .offset = s.at("offset").get<std::int64_t>(),
                         .length = s.at("length").get<std::int64_t>(),
                         .stride = s.at("stride").get<std::int64_t>(),
                         .logical_shape = shape},
               .begin = j.at("begin").get<std::int64_t>(),
               .end = j.at("end").get<std::int64_t>()};
  const ShardSlice& sl = p.slice;
  const bool slice_ok = !shape.empty() && sl.dim >= 0 && sl.dim < static_cast<int>(shape.size()) &&
                        sl.parts >= 1 && shape[static_cast<std::size_t>(sl.dim)] % sl.parts == 0;
  // A block's stride is at most the block (an even shard's padded length, ceil(n / ranks)).
  const std::int64_t block = slice_ok ? shape[static_cast<std::size_t>(sl.dim)] / sl.parts : 0;
  // Elements of the rank's tensor: the logical shape with dimension `dim` = parts · stride.
  const std::int64_t local = block == 0 ? 0 : shape_numel(shape) / block * sl.stride;
  const bool ok = slice_ok && sl.offset >= 0 && sl.length >= 0 && sl.length <= sl.stride &&
                  sl.stride <= block && sl.offset <= block - sl.length && p.begin >= 0 &&
                  p.begin <= p.end && p.end <= local;
  if (!ok) {
    throw DataError(fmt::format("{}: a piece of {} ({}) lies outside its tensor", metadata.string(),
                                name, j.dump()));
  }
  return p;
}

// The logical index of element `local` of a piece whose runs are `runs` (−1 for padding).
std::int64_t logical_of(const std::vector<ShardRun>& runs, std::int64_t local) {
  for (const ShardRun& r : runs) {
    if (local >= r.local && local < r.local + r.count) return r.logical + (local - r.local);
  }
  return -1;
}

json read_json_file(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw DataError(fmt::format("{}: missing or unreadable", path.string()));
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    throw DataError(fmt::format("{}: not valid JSON (truncated or corrupted)", path.string()));
  }
  return j;
}

// Largest logical tensor a checkpoint may describe: its f32 bytes fit in an int64.
constexpr std::int64_t kMaxElements = std::numeric_limits<std::int64_t>::max() / 4;

[[noreturn]] void bad_field(const fs::path& path, const std::string& field, const json& value,
                            std::string_view rule) {
  throw DataError(fmt::format(
      "{}: \"{}\" is {}, {}; the file was edited or damaged (restore it, or resume from "
      "another checkpoint)",
      path.string(), field, value.dump(), rule));
}

void check_shape(const json& shape, const std::string& field, const fs::path& path) {
  if (!shape.is_array()) bad_field(path, field, shape, "expected a list of dimensions");
  std::int64_t numel = 1;
  for (const json& d : shape) {
    if (!d.is_number_integer() || d.get<std::int64_t>() < 0) {
      bad_field(path, field, shape, "expected dimensions that are integers ≥ 0");
    }
    const std::int64_t n = d.get<std::int64_t>();
    if (n != 0 && numel > kMaxElements / n) {
      bad_field(path, field, shape, fmt::format("more than {} elements", kMaxElements));
    }
    numel *= n;
  }
}

// What the reader later uses without looking again, checked up front: the types of the
// top-level fields, every file name (a plain name inside the checkpoint directory, so that a
// hostile metadata.json cannot make the reader open files elsewhere), each file's size and
// hash, each tensor's shape and the files its pieces name. The pieces' slices are checked when
// read (piece_of).
void check_metadata(const json& m, const fs::path& path) {
  if (!m.at("step").is_number_integer() || m.at("step").get<std::int64_t>() < 0) {
    bad_field(path, "step", m.at("step"), "expected an integer ≥ 0");
  }
  if (!m.at("config").is_string()) bad_field(path, "config", m.at("config"), "expected TOML text");
  if (!m.at("state").is_object()) bad_field(path, "state", m.at("state"), "expected an object");
  const json& files = m.at("files");
  if (!files.is_object()) bad_field(path, "files", files, "expected an object");
  for (const auto& [name, file] : files.items()) {
    if (!is_plain_file_name(name)) {
      bad_field(path, "files", json(name),
                "expected file names inside the checkpoint directory (no \"/\", \"..\" or "
                "absolute path)");
    }
    if (!file.is_object() || !file.contains("bytes") || !file["bytes"].is_number_unsigned() ||
        !file.contains("xxh64") || !file["xxh64"].is_string()) {
      bad_field(path, "files." + name, file,
                "expected {\"bytes\": an integer ≥ 0, \"xxh64\": a hex string}");
    }
  }
  const json& tensors = m.at("tensors");
  if (!tensors.is_object()) bad_field(path, "tensors", tensors, "expected an object");
  for (const auto& [name, tensor] : tensors.items()) {
    const std::string field = "tensors." + name;
    if (!tensor.is_object() || !tensor.contains("shape") || !tensor.contains("pieces") ||
        !tensor["pieces"].is_array()) {
      bad_field(path, field, tensor, "expected {\"shape\": [...], \"pieces\": [...]}");
    }
    check_shape(tensor["shape"], field + ".shape", path);
    for (const json& piece : tensor["pieces"]) {
      if (!piece.is_object() || !piece.contains("file") || !piece["file"].is_string() ||
          !files.contains(piece["file"].get<std::string>())) {
        bad_field(path, field + ".pieces", piece,
                  "expected pieces whose \"file\" is listed in \"files\"");
      }
    }
  }
}

void write_text(const fs::path& path, const std::string& text) {
  StagedFile(path, std::as_bytes(std::span<const char>(text))).commit();
}

std::int64_t step_of_dir(const fs::path& dir) {
  static const std::regex pattern("step-([0-9]{8})");
  std::smatch m;
  const std::string name = dir.filename().string();
  if (!std::regex_match(name, m, pattern)) return -1;
  return std::stoll(m[1].str());
}

// A "key value" line of a checkpoint's COMPLETE marker ("" when the marker lacks it).
std::string completion_field(const fs::path& dir, std::string_view key) {
  std::ifstream in(dir / kCompleteName);
  std::string k, v;
  while (in >> k >> v) {
    if (k == key) return v;
  }
  return "";
}

std::int64_t completion_field_int(const fs::path& dir, std::string_view key) {
  const std::string v = completion_field(dir, key);
  try {
    return v.empty() ? 0 : std::stoll(v);
  } catch (const std::exception&) {
    return 0;
  }
}

// Keeps the newest `keep_last` complete checkpoints (by completion) and removes every
// incomplete directory: this runs when a save completes, and no other save is in flight then
// (a save waits for the previous one), so each is a crashed save that will never finish.
void prune(const fs::path& root, std::int64_t keep_last) {
  const std::vector<fs::path> complete = complete_checkpoints(root);
  std::error_code ec;
  for (std::size_t i = static_cast<std::size_t>(keep_last); i < complete.size(); ++i) {
    fs::remove_all(complete[i], ec);
  }
  remove_incomplete_checkpoints(root);
}

}  // namespace

std::vector<fs::path> remove_incomplete_checkpoints(const fs::path& root) {
  std::vector<fs::path> removed;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return removed;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (step_of_dir(entry.path()) >= 0 && !fs::exists(entry.path() / kCompleteName, ec)) {
      if (fs::remove_all(entry.path(), ec) != static_cast<std::uintmax_t>(-1)) {
        removed.push_back(entry.path());
      }
    }
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

fs::path checkpoint_path(const fs::path& root, std::int64_t step) {
  return root / fmt::format("step-{:08d}", step);
}

std::vector<fs::path> complete_checkpoints(const fs::path& root) {
  struct Found {
    fs::path dir;
    std::int64_t completed_ns, step;
  };
  std::vector<Found> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return {};
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::int64_t step = step_of_dir(entry.path());
    if (step >= 0 && fs::exists(entry.path() / kCompleteName, ec)) {
      found.push_back({entry.path(), completion_field_int(entry.path(), "completed_ns"), step});
    }
  }
  // Newest = completed last (a marker without the time, e.g. written by hand, counts as the
  // oldest); equal times by step.
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.completed_ns != b.completed_ns ? a.completed_ns > b.completed_ns : a.step > b.step;
  });
  std::vector<fs::path> out;
  for (Found& f : found) out.push_back(std::move(f.dir));
  return out;
}

void prepare_checkpoint_dir(const fs::path& root, std::int64_t step) {
  const fs::path dir = checkpoint_path(root, step);
  std::error_code ec;
  fs::remove_all(dir, ec);
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw DataError(fmt::format("cannot create the checkpoint directory {}: {}", dir.string(),
                                ec ? ec.message() : "not a directory"));
  }
}

CheckpointWriter::CheckpointWriter(CheckpointWriterOptions options)
    : options_(std::move(options)) {}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::save(RankSnapshot snapshot) {
  (void)wait();  // the caller read the previous result already (or did not care)
  error_.clear();
  if (!options_.async) {
    try {
      write(snapshot);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    return;
  }
  thread_ = std::thread([this, s = std::move(snapshot)] {
    try {
      write(s);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
  });
}

std::string CheckpointWriter::wait() {
  if (thread_.joinable()) thread_.join();
  return error_;
}

void CheckpointWriter::write(const RankSnapshot& snapshot) {
  const auto start = std::chrono::steady_clock::now();
  const fs::path dir = checkpoint_path(options_.root, snapshot.step);
  dir_ = dir;
  const std::string file = fmt::format("rank-{:05d}.safetensors", snapshot.rank);
  std::vector<NamedTensor> tensors;
  json pieces = json::array();
  for (const PieceState& p : snapshot.pieces) {
    tensors.push_back({key_of(p.name, kMasterField), p.master});
    tensors.push_back({key_of(p.name, kExpAvgField), p.exp_avg});
    tensors.push_back({key_of(p.name, kExpAvgSqField), p.exp_avg_sq});
    pieces.push_back(piece_json(file, p.name, p.piece));
  }
  const std::vector<std::byte> bytes = encode_safetensors(tensors);
  StagedFile(dir / file, bytes).commit();
  const json manifest = {{"rank", snapshot.rank},
                         {"file", file},
                         {"bytes", bytes.size()},
                         {"xxh64", hex64(xxh64(bytes))},
                         {"pieces", pieces}};
  write_text(dir / fmt::format("rank-{:05d}.json", snapshot.rank), manifest.dump());
  if (snapshot.rank != 0) {
    write_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    return;
  }

  // Rank 0 completes the checkpoint once every rank's manifest is there.
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.finalize_timeout_s);
  json tensors_json = json::object(), files = json::object();
  for (int r = 0; r < snapshot.world; ++r) {
    const fs::path path = dir / fmt::format("rank-{:05d}.json", r);
    while (!fs::exists(path)) {
      if (std::chrono::steady_clock::now() > deadline) {
        throw DataError(fmt::format(
            "checkpoint {} left incomplete: rank {} did not write its manifest within {} s",
            dir.string(), r, options_.finalize_timeout_s));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const json m = read_json_file(path);
    files[m.at("file").get<std::string>()] = {{"bytes", m.at("bytes")}, {"xxh64", m.at("xxh64")}};
    for (const json& p : m.at("pieces")) {
      json& t = tensors_json[p.at("name").get<std::string>()];
      if (t.is_null()) t = {{"shape", p.at("shape")}, {"dtype", "F32"}, {"pieces", json::array()}};
      t["pieces"].push_back(p);
    }
  }
  const json metadata = {{"format", kFormat},       {"version", kVersion},
                         {"step", snapshot.step},   {"config", snapshot.config_toml},
                         {"state", snapshot.state}, {"tensors", tensors_json},
                         {"files", files}};
  const std::string metadata_text = metadata.dump(1);
  write_text(dir / kMetadataName, metadata_text);
  sync_directory(dir);
  // The completion time orders checkpoints (complete_checkpoints): a run resumed from an older
  // checkpoint writes lower step numbers than an abandoned run left behind, and its saves must
  // count as the newest. The metadata's hash makes a hand-edited metadata.json a detected
  // corruption.
  const auto completed_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
  write_text(
      dir / kCompleteName,
      fmt::format("step {}\ncompleted_ns {}\nmetadata_xxh64 {}\n", snapshot.step, completed_ns,
                  hex64(xxh64(std::as_bytes(std::span<const char>(metadata_text))))));
  sync_directory(dir);
  sync_directory(options_.root);
  write_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  prune(options_.root, options_.keep_last);
}

CheckpointReader::CheckpointReader(fs::path dir) : dir_(std::move(dir)) {
  std::error_code ec;
  if (!fs::exists(dir_, ec)) {
    throw DataError(fmt::format(
        "checkpoint {}: no such directory; name an existing checkpoint folder "
        "(<checkpoint.dir>/checkpoints/step-N, the one holding COMPLETE)",
        dir_.string()));
  }
  if (!fs::is_directory(dir_, ec)) {
    throw DataError(fmt::format("checkpoint {}: not a directory", dir_.string()));
  }
  if (!fs::exists(dir_ / kCompleteName, ec)) {
    if (!complete_checkpoints(dir_ / "checkpoints").empty()) {  // a run's checkpoint.dir
      throw DataError(fmt::format(
          "{} is a run's checkpoint.dir, not a checkpoint: name one of its checkpoints/step-N "
          "directories, or use checkpoint.resume = \"auto\" with checkpoint.dir = {}",
          dir_.string(), dir_.string()));
    }
    if (!complete_checkpoints(dir_).empty()) {
      throw DataError(fmt::format(
          "{} holds checkpoints (step-N directories) but is not one: name a step-N directory, "
          "or use checkpoint.resume = \"auto\" with checkpoint.dir = {}",
          dir_.string(), dir_.parent_path().string()));
    }
    throw DataError(
        fmt::format("checkpoint {}: no {} marker, so its save never finished; it is not loaded",
                    dir_.string(), kCompleteName));
  }
  const fs::path path = dir_ / kMetadataName;
  if (const std::string want = completion_field(dir_, "metadata_xxh64"); !want.empty()) {
    if (const std::string got = hex64(xxh64(read_file_bytes(path))); got != want) {
      throw DataError(fmt::format(
          "{}: XXH64 {} does not match the {} marker's {} (the file was changed or corrupted)",
          path.string(), got, kCompleteName, want));
    }
  }
  metadata_ = read_json_file(path);
  const auto format = metadata_.find("format");
  if (format == metadata_.end() || *format != kFormat || !metadata_.contains("tensors") ||
      !metadata_.contains("files") || !metadata_.contains("state") || !metadata_.contains("step") ||
      !metadata_.contains("config")) {
    throw DataError(
        fmt::format("{}: not the metadata of a meshtrain sharded checkpoint", path.string()));
  }
  if (const auto version = metadata_.find("version");
      version == metadata_.end() || *version != kVersion) {
    throw DataError(fmt::format("{}: format version {}, this meshtrain reads version {}",
                                path.string(),
                                version == metadata_.end() ? "none" : version->dump(), kVersion));
  }
  check_metadata(metadata_, path);
}

std::int64_t CheckpointReader::step() const { return metadata_.at("step").get<std::int64_t>(); }

const json& CheckpointReader::state() const { return metadata_.at("state"); }

Config CheckpointReader::config() const {
  const fs::path path = dir_ / kMetadataName;
  try {
    return load_config_text(metadata_.at("config").get<std::string>(), path.string());
  } catch (const ConfigError& e) {
    throw DataError(fmt::format("{}: its config does not parse: {}", path.string(), e.what()));
  }
}

std::vector<std::string> CheckpointReader::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, entry] : metadata_.at("tensors").items()) names.push_back(name);
  return names;
}

const json& CheckpointReader::tensor_entry(const std::string& name) const {
  const json& tensors = metadata_.at("tensors");
  const auto it = tensors.find(name);
  if (it == tensors.end()) {
    throw DataError(fmt::format("checkpoint {}: no tensor {} (a checkpoint of another model?)",
                                dir_.string(), name));
  }
  return *it;
}

Shape CheckpointReader::logical_shape(const std::string& name) const {
  return tensor_entry(name).at("shape").get<Shape>();
}

const Tensor& CheckpointReader::stored(const std::string& file, const std::string& key) {
  auto it = files_.find(file);
  if (it == files_.end()) {
    const fs::path path = dir_ / file;
    const json& files = metadata_.at("files");
    if (!files.contains(file)) {
      throw DataError(fmt::format("{}: not listed in {}", path.string(), kMetadataName));
    }
    const std::vector<std::byte> bytes = read_file_bytes(path);
    const auto expected = files.at(file).at("bytes").get<std::uint64_t>();
    if (bytes.size() != expected) {
      throw DataError(fmt::format("{}: {} bytes, but {} says {} (truncated or replaced)",
                                  path.string(), bytes.size(), kMetadataName, expected));
    }
    const std::string hash = hex64(xxh64(bytes));
    if (hash != files.at(file).at("xxh64").get<std::string>()) {
      throw DataError(fmt::format("{}: XXH64 {} does not match {}'s {} (the file is corrupted)",
                                  path.string(), hash, kMetadataName,
                                  files.at(file).at("xxh64").get<std::string>()));
    }
    it = files_.emplace(file, decode_safetensors(bytes, path).tensors).first;
  }
  const auto t = it->second.find(key);
  if (t == it->second.end()) {
    throw DataError(fmt::format("{}: no tensor {}", (dir_ / file).string(), key));
  }
  return t->second;
}

void CheckpointReader::fill(const std::string& name, std::string_view field, const ShardPiece& dst,
                            std::span<float> out) {
  try {
    const json& entry = tensor_entry(name);
    const Shape shape = entry.at("shape").get<Shape>();
    if (shape != dst.slice.logical_shape) {
      throw DataError(fmt::format(
          "checkpoint {}: tensor {} has shape {} there, but this model's is {} (a checkpoint of "
          "another model?)",
          dir_.string(), name, fmt::join(shape, "×"), fmt::join(dst.slice.logical_shape, "×")));
    }
    std::fill(out.begin(), out.end(), 0.0f);
    const std::vector<ShardRun> want = logical_runs(dst);
    if (want.empty()) return;
    const std::int64_t want_lo = want.front().logical;
    const std::int64_t want_hi = want.back().logical + want.back().count;
    std::int64_t copied = 0;
    std::vector<std::uint8_t> written(out.size(), 0);
    for (const json& p : entry.at("pieces")) {
      const ShardPiece src = piece_of(p, shape, name, dir_ / kMetadataName);
      const std::vector<ShardRun> have = logical_runs(src);
      if (have.empty() || have.back().logical + have.back().count <= want_lo ||
          have.front().logical >= want_hi) {
        continue;  // no overlap: its file is not even read
      }
      const Tensor& t = stored(p.at("file").get<std::string>(), key_of(name, field));
      if (t.dtype() != DType::f32 || t.numel() != src.end - src.begin) {
        throw DataError(fmt::format("{}: {} holds {} elements, its piece {}",
                                    (dir_ / p.at("file").get<std::string>()).string(),
                                    key_of(name, field), t.numel(), src.end - src.begin));
      }
      copied += copy_overlap(src, t.span_f32(), dst, out, written);
    }
    const std::int64_t need = real_elements(dst);
    if (copied != need) {
      throw DataError(fmt::format(
          "checkpoint {}: its pieces of {} hold {} of the {} elements this rank needs (pieces "
          "missing)",
          dir_.string(), name, copied, need));
    }
    // Checksums vouch for the bytes, not for the values: a run that saved after diverging (or
    // a file signed again by hand) must not be resumed from without a word.
    if (const std::int64_t k = first_non_finite(out); k >= 0) {
      throw_non_finite(fmt::format("checkpoint {}", dir_.string()), key_of(name, field),
                       logical_of(want, k), out[static_cast<std::size_t>(k)], kDivergedAdvice);
    }
  } catch (const json::exception& e) {
    throw DataError(fmt::format("{}: malformed entry for {}: {}", (dir_ / kMetadataName).string(),
                                name, e.what()));
  }
}

Tensor CheckpointReader::read_logical(const std::string& name, std::string_view field) {
  const Shape shape = logical_shape(name);
  // Its pieces' files hold every element (and two moments each), so a shape that needs more
  // bytes than they have on disk is refused before the tensor is allocated.
  std::set<std::string> files;
  for (const json& p : tensor_entry(name).at("pieces"))
    files.insert(p.at("file").get<std::string>());
  std::uintmax_t on_disk = 0;
  for (const std::string& file : files) {
    std::error_code ec;
    const std::uintmax_t bytes = fs::file_size(dir_ / file, ec);
    on_disk += ec ? 0 : bytes;
  }
  if (static_cast<std::uintmax_t>(shape_numel(shape)) * sizeof(float) > on_disk) {
    throw DataError(fmt::format(
        "checkpoint {}: tensor {} of shape {} needs {} bytes, more than the {} bytes of the "
        "files holding it (metadata.json edited or damaged?)",
        dir_.string(), name, fmt::join(shape, "×"), shape_numel(shape) * 4, on_disk));
  }
  Tensor out = Tensor::empty(shape, MemCategory::other);
  const ShardPiece whole_piece{.slice = whole(shape), .begin = 0, .end = out.numel()};
  fill(name, field, whole_piece, out.span_f32());
  return out;
}

nlohmann::json checkpoint_mesh_json(const ParallelConfig& p, int world) {
  return {{"world", world},
          {"dp", p.dp},
          {"cp", p.cp},
          {"cp_comm", p.cp_comm},
          {"tp", p.tp},
          {"pp", p.pp},
          {"virtual_stages", p.virtual_stages},
          {"pp_schedule", p.pp_schedule},
          {"sequence_parallel", p.sequence_parallel},
          {"zero_stage", p.zero_stage},
          {"ep", p.ep}};
}

std::string model_difference(const ModelConfig& a, const ModelConfig& b) {
  const auto differ = [](std::string_view key, const auto& x, const auto& y) -> std::string {
    if (x == y) return "";
    return fmt::format("model.{}: {} vs {}", key, x, y);
  };
  for (const std::string& d :
       {differ("family", to_string(a.family), to_string(b.family)),
        differ("n_layer", a.n_layer, b.n_layer), differ("n_head", a.n_head, b.n_head),
        differ("n_kv_head", kv_heads_of(a), kv_heads_of(b)), differ("n_embd", a.n_embd, b.n_embd),
        differ("ffn_hidden", ffn_hidden_of(a), ffn_hidden_of(b)),
        differ("block_size", a.block_size, b.block_size),
        differ("vocab_size", a.vocab_size, b.vocab_size), differ("bias", a.bias, b.bias),
        differ("norm_eps", a.norm_eps, b.norm_eps),
        differ("rope_theta", a.rope_theta, b.rope_theta),
        // The experts change the parameter set (a dense checkpoint has none, a MoE one has
        // E per MoE block); top-k changes what they compute.
        differ("moe_experts", a.moe_experts, b.moe_experts)}) {
    if (!d.empty()) return d;
  }
  if (a.moe_experts == 0) return "";
  for (const std::string& d : {differ("moe_top_k", a.moe_top_k, b.moe_top_k),
                               differ("moe_ffn_hidden", moe_ffn_hidden_of(a), moe_ffn_hidden_of(b)),
                               differ("moe_layer_freq", a.moe_layer_freq, b.moe_layer_freq)}) {
    if (!d.empty()) return d;
  }
  return "";
}

}  // namespace meshtrain
