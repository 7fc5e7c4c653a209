// gcz/error_feedback.h — error feedback across steps (docs/CODECS.md, "Error feedback"): for every
// tensor, the residual e = (x + e_old) − decode(encode(x + e_old)) and the codec's carried state
// (PowerSGD's Q), kept in memory between steps and saved to / loaded from an ordinary .gcz file that
// `gcz info`, `gcz decode` and the numpy reader can read.
//
//   auto ef = gcz::ErrorFeedback::load("state.gcz");        // a missing file is an empty state
//   opt.error_feedback = &*ef;
//   gcz::encode_files({"step_0042.safetensors"}, "step_0042.gcz", opt);
//   ef->save("state.gcz", "none");                          // atomically
//
// (gcz encode sets EncodeOptions::ef_state_path instead: the state and the step's file are then put
// in place together.)
//
// In the state file, tensor NAME's residual is the tensor "residual/NAME" (float32, or float64 for
// float64 gradients) and its codec state "state/NAME" (float32); the file's metadata has
// gcz.error_feedback = 1 and gcz.ef_steps = the number of steps it has seen. A residual element that
// would not be finite (x + e_old or its error is NaN or infinite) is 0: a NaN or Inf in a gradient is
// not carried into later steps. A step that fails leaves the state in memory partly updated (its tensors'
// old residuals spent): load it again from the file (gcz encode saves it only after a whole step).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "gcz/codec.h"
#include "gcz/container.h"
#include "gcz/status.h"
#include "gcz/tensor.h"

namespace gcz {

// The longest tensor name error feedback takes: its state file stores the residual as "residual/NAME".
inline constexpr std::size_t kMaxErrorFeedbackNameBytes = kMaxNameBytes - 9;

class ErrorFeedback {
 public:
  struct Entry {
    DType dtype = DType::kFloat32;  // the working dtype: float64 for float64 gradients, else float32
    Shape shape;
    ByteBuffer residual;            // prod(shape) elements of dtype
    std::optional<CodecState> state;
    // Running sums of x and x̂ over the steps seen (only when sums are tracked).
    std::vector<double> sum_x, sum_xhat;
  };

  // Loads a state file written by save(); a path that does not exist gives an empty state.
  static Result<ErrorFeedback> load(const std::string& path);
  // Writes every entry to `path` atomically, residuals with `residual_spec` (lossless "none" by
  // default; a lossy codec makes a smaller file whose residuals are approximate). Saved to the file
  // it was last loaded from or saved to (however spelled), it replaces only the file it read or wrote there (or, if
  // there was none, creates the file only if none has appeared): when another process has updated
  // the state meanwhile, it fails with kIoError and leaves that update in place, rather than lose it.
  Status save(const std::string& path, const std::string& residual_spec = "none");
  // save() in two steps, to put the state in place together with the step's file
  // (GczWriter::commit_together, as encode_files does): write() leaves the file complete under its
  // temporary name; saved() records it once it is in place.
  Result<std::unique_ptr<GczWriter>> write(const std::string& path, const std::string& residual_spec = "none");
  void saved(const std::string& path, const GczWriter& writer);

  // Keep the running sums of x and x̂ so reports can say how far Σx̂ is from Σx (gcz eval --steps).
  void set_track_sums(bool on) { track_sums_ = on; }
  bool track_sums() const { return track_sums_; }

  // With feedback off, residuals are measured and sums tracked but nothing is added to the next step:
  // the baseline that error feedback is compared against.
  void set_feedback(bool on) { feedback_ = on; }
  bool feedback() const { return feedback_; }

  // With feedback on, checks before any step runs that every tensor of `steps` (each step's file and
  // its tensors, in order) keeps the shape and working dtype of its residual in the state and in the
  // steps before it: what encoding the steps in turn would find only at the step that changes one.
  Status check_steps(const std::vector<std::pair<std::string, std::vector<TensorInfo>>>& steps) const;

  // A copy to try a step on (adaptive compression): the residuals, codec states and step count, but no
  // running sums, and none tracked.
  ErrorFeedback trial_copy() const;

  const Entry* find(const std::string& name) const;
  Entry* find(const std::string& name);
  void put(const std::string& name, Entry entry) { entries_[name] = std::move(entry); }
  void erase(const std::string& name) { entries_.erase(name); }
  std::size_t size() const { return entries_.size(); }
  std::vector<std::string> names() const;  // of the tensors held, in byte order
  // Steps encoded with this state so far (saved in the file as gcz.ef_steps): encode_files encodes
  // step s with seed + s, then counts it.
  uint64_t steps() const { return steps_; }
  // The path the state was last loaded from or saved to (empty for one made in memory).
  const std::string& path() const { return file_path_; }
  void count_step() { ++steps_; }

 private:
  std::map<std::string, Entry> entries_;
  bool track_sums_ = false;
  bool feedback_ = true;
  uint64_t steps_ = 0;
  std::string file_path_;  // the path last loaded or saved, and the file it named then
  FileVersion file_version_;
};

}  // namespace gcz
