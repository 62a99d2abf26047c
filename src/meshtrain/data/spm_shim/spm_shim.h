// src/meshtrain/data/spm_shim/spm_shim.h
//
// A C interface to Debian's libsentencepiece, built as a separate loadable module
// (libmeshtrain_spm.so) that sentencepiece_tokenizer.cpp opens with dlopen(RTLD_LOCAL). Why:
// Debian's libsentencepiece.so 0.1.97 carries its own protobuf-lite 3.14 and exports its 1,600
// google::protobuf symbols; in a process that also has the system libprotobuf 3.21's symbols
// (TensorBoard's event records) either library binds to the other's copies and the process dies
// before main() (seen: a crash in libprotobuf's static initialisation; with libprotobuf first,
// SentencePiece aborts on its version check). So libprotobuf 3.21 is linked statically with
// its symbols kept out of the dynamic table (src/meshtrain/CMakeLists.txt), and libsentencepiece
// is loaded only here, locally: its protobuf references then find only its own copy, while the
// C++ runtime (std::cerr, which SentencePiece logs to) is the process's one. (Loading it
// RTLD_DEEPBIND instead bound SentencePiece to libstdc++'s unconstructed std::cerr — the
// executable has a copy-relocated one — and its first warning crashed.) Only C types cross.
#pragma once

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct MtSpm MtSpm;

// Receivers of results, called once with the whole result.
typedef void (*MtSpmIds)(void* context, const int32_t* ids, size_t count);
typedef void (*MtSpmBytes)(void* context, const char* bytes, size_t size);

// Each function that can fail returns 0 on success; otherwise it writes a NUL-terminated
// message into error[error_size] and returns non-zero (mt_spm_load: NULL).
MtSpm* mt_spm_load(const char* model_proto, size_t size, char* error, size_t error_size);
void mt_spm_free(MtSpm* model);
int mt_spm_piece_size(const MtSpm* model);
int mt_spm_eos_id(const MtSpm* model);
int mt_spm_bos_id(const MtSpm* model);  // -1: the model has no bos piece
int mt_spm_encode(const MtSpm* model, const char* text, size_t size, MtSpmIds sink, void* context,
                  char* error, size_t error_size);
int mt_spm_decode(const MtSpm* model, const int32_t* ids, size_t count, MtSpmBytes sink,
                  void* context, char* error, size_t error_size);
// SentencePieceTrainer::Train on keys[i] = values[i]; the serialized model goes to `sink`.
int mt_spm_train(const char* const* keys, const char* const* values, size_t count, MtSpmBytes sink,
                 void* context, char* error, size_t error_size);

#ifdef __cplusplus
}
#endif
