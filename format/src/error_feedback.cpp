// Error feedback: the state file, and one step of encoding with residuals.
#include "gcz/error_feedback.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "error_feedback_step.h"
#include "file_util.h"
#include "gcz/codec_spec.h"
#include "gcz/convert.h"

namespace gcz {
namespace {

constexpr const char* kResidualPrefix = "residual/";
constexpr const char* kStatePrefix = "state/";
static_assert(kMaxErrorFeedbackNameBytes + std::char_traits<char>::length(kResidualPrefix) == kMaxNameBytes &&
              std::char_traits<char>::length(kStatePrefix) < std::char_traits<char>::length(kResidualPrefix));
constexpr const char* kMetaKey = "gcz.error_feedback";
constexpr const char* kStepsKey = "gcz.ef_steps";

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// out[i] = a[i] + b[i].
template <class T>
void add(const std::byte* a, const std::byte* b, std::byte* out, uint64_t n) {
  const T* pa = reinterpret_cast<const T*>(a);
  const T* pb = reinterpret_cast<const T*>(b);
  T* po = reinterpret_cast<T*>(out);
  for (uint64_t i = 0; i < n; ++i) po[i] = pa[i] + pb[i];
}

// out[i] = a[i] − b[i] where that is finite, else 0.
template <class T>
void finite_difference(const std::byte* a, const std::byte* b, std::byte* out, uint64_t n) {
  const T* pa = reinterpret_cast<const T*>(a);
  const T* pb = reinterpret_cast<const T*>(b);
  T* po = reinterpret_cast<T*>(out);
  for (uint64_t i = 0; i < n; ++i) {
    const T d = pa[i] - pb[i];
    po[i] = std::isfinite(d) ? d : T(0);
  }
}

}  // namespace

double CumulativeError::rel_l2() const {
  if (max_err == 0 && !std::isnan(err_sq)) return 0.0;
  if (!float64_squares_held(max_ref, 0, max_err)) return NAN;
  return ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : (err_sq > 0 ? INFINITY : 0.0);
}

void CumulativeError::merge(const CumulativeError& o) {
  err_sq += o.err_sq;
  ref_sq += o.ref_sq;
  max_err = std::max(max_err, o.max_err);
  max_ref = std::max(max_ref, o.max_ref);
}

const ErrorFeedback::Entry* ErrorFeedback::find(const std::string& name) const {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

ErrorFeedback::Entry* ErrorFeedback::find(const std::string& name) {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

std::vector<std::string> ErrorFeedback::names() const {
  std::vector<std::string> out;
  for (const auto& [name, e] : entries_) out.push_back(name);
  return out;
}

Result<ErrorFeedback> ErrorFeedback::load(const std::string& path) {
  ErrorFeedback ef;
  ef.file_path_ = path;
  GCZ_ASSIGN_OR_RETURN(ef.file_version_, FileVersion::of(path));
  if (!ef.file_version_.exists) return ef;
  GCZ_ASSIGN_OR_RETURN(auto reader, GczReader::open(path));
  const FileIndex& index = reader->index();
  auto meta = index.metadata.find(kMetaKey);
  if (meta == index.metadata.end() || meta->second != "1") {
    return invalid_argument(path + ": not an error-feedback state file (no metadata " + kMetaKey +
                            "=1; such files are written by gcz encode --ef-state)");
  }
  if (auto steps = index.metadata.find(kStepsKey); steps != index.metadata.end()) {
    const std::string& v = steps->second;
    if (v.empty() || v.size() > 19 || v.find_first_not_of("0123456789") != std::string::npos) {
      return format_error(path + ": metadata " + kStepsKey + " is '" + v + "', not a step count");
    }
    ef.steps_ = std::stoull(v);
  }
  for (std::size_t i = 0; i < index.tensors.size(); ++i) {
    const TensorInfo& t = index.tensors[i].info;
    GCZ_ASSIGN_OR_RETURN(ByteBuffer data, decode_tensor(*reader, i));
    if (starts_with(t.name, kResidualPrefix)) {
      if (t.dtype != DType::kFloat32 && t.dtype != DType::kFloat64) {
        return format_error(path + ": tensor '" + t.name + "': a residual must be float32 or float64");
      }
      Entry& e = ef.entries_[t.name.substr(std::char_traits<char>::length(kResidualPrefix))];
      e.dtype = t.dtype;
      e.shape = t.shape;
      e.residual = std::move(data);
    } else if (starts_with(t.name, kStatePrefix)) {
      if (t.dtype != DType::kFloat32) return format_error(path + ": tensor '" + t.name + "': codec state must be float32");
      CodecState st{t.shape, std::vector<float>(data.size() / 4)};
      std::memcpy(st.values.data(), data.data(), data.size());
      ef.entries_[t.name.substr(std::char_traits<char>::length(kStatePrefix))].state = std::move(st);
    } else {
      return format_error(path + ": tensor '" + t.name + "' is neither residual/NAME nor state/NAME");
    }
  }
  GCZ_ASSIGN_OR_RETURN(const FileVersion after, FileVersion::of(path));
  if (!(after == ef.file_version_)) {
    return io_error(path +
                    ": replaced by another process while it was read (another run sharing this state? each "
                    "would take the other's residuals: give each run a state of its own)");
  }
  return ef;
}

Status ErrorFeedback::save(const std::string& path, const std::string& residual_spec) {
  GCZ_ASSIGN_OR_RETURN(auto writer, write(path, residual_spec));
  GCZ_RETURN_IF_ERROR(writer->commit());
  saved(path, *writer);
  return Status::ok();
}

void ErrorFeedback::saved(const std::string& path, const GczWriter& writer) {
  file_path_ = path;
  file_version_ = writer.version();
}

Result<std::unique_ptr<GczWriter>> ErrorFeedback::write(const std::string& path, const std::string& residual_spec) {
  GCZ_ASSIGN_OR_RETURN(EncodingPlan residual_plan, check_encoding_plan(residual_spec));
  GCZ_ASSIGN_OR_RETURN(EncodingPlan lossless, parse_encoding_plan("none"));
  std::optional<FileVersion> replaces;
  if (!file_path_.empty() && detail::same_file(path, file_path_)) replaces = file_version_;
  GCZ_ASSIGN_OR_RETURN(auto writer, GczWriter::create(path, replaces));
  // A residual codec that draws random numbers draws afresh with each save, as the steps do.
  detail::TensorEncoder encoder(*writer, Backend::kCpu, /*seed=*/steps_, uint64_t{1} << 24);
  auto none = [](uint64_t) {};
  for (const auto& [name, e] : entries_) {
    if (!e.residual.empty() || !e.shape.empty()) {
      const TensorInfo info{kResidualPrefix + name, e.dtype, e.shape};
      // The codec's own choice for this residual (PowerSGD's fallback for a 1-D one), as for a gradient.
      EncodingPlan plan = residual_plan;
      auto stage = stage_for_tensor(info, plan.codec);
      if (!stage) return stage.status().with_context(path + ": tensor '" + info.name + "'");
      plan.codec = *stage;
      detail::MemorySource src(info, e.residual.data());
      GCZ_RETURN_IF_ERROR(encoder.encode(src, plan, none).status().with_context(path));
    }
    if (e.state) {
      detail::MemorySource src({kStatePrefix + name, DType::kFloat32, e.state->shape},
                               reinterpret_cast<const std::byte*>(e.state->values.data()));
      GCZ_RETURN_IF_ERROR(encoder.encode(src, lossless, none).status().with_context(path));
    }
  }
  GCZ_RETURN_IF_ERROR(
      writer->finish({{kMetaKey, "1"}, {kStepsKey, std::to_string(steps_)}}, /*in_place=*/false).status());
  return writer;
}

ErrorFeedback ErrorFeedback::trial_copy() const {
  ErrorFeedback copy;
  for (const auto& [name, e] : entries_) copy.entries_[name] = Entry{e.dtype, e.shape, e.residual, e.state, {}, {}};
  copy.feedback_ = feedback_;
  copy.steps_ = steps_;
  copy.file_path_ = file_path_;
  copy.file_version_ = file_version_;
  return copy;
}

Status ErrorFeedback::check_steps(const std::vector<std::pair<std::string, std::vector<TensorInfo>>>& steps) const {
  if (!feedback_) return Status::ok();
  struct Held {
    Shape shape;
    DType dtype;
    std::string where;
  };
  std::map<std::string, Held> held;  // the residual each tensor would have when its next step comes
  const std::string state = file_path_.empty() ? "the error-feedback state" : "the state " + file_path_;
  for (const auto& [name, e] : entries_) {
    if (!e.residual.empty()) held[name] = {e.shape, e.dtype, state};
  }
  for (const auto& [file, tensors] : steps) {
    for (const TensorInfo& t : tensors) {
      const DType w = detail::working_dtype(t.dtype);
      auto it = held.find(t.name);
      if (it != held.end() && (it->second.shape != t.shape || it->second.dtype != w)) {
        const Held& h = it->second;
        return invalid_argument(file + ": tensor '" + t.name + "': shape " + shape_to_string(t.shape) + " (" +
                                std::string(dtype_name(w)) + "), but " + shape_to_string(h.shape) + " (" +
                                std::string(dtype_name(h.dtype)) + ") in " + h.where +
                                "; a residual is not carried across a change of shape or dtype");
      }
      const auto numel = t.numel();
      if (numel && *numel > 0)
        held[t.name] = {t.shape, w, file};
      else
        held.erase(t.name);
    }
  }
  return Status::ok();
}

namespace detail {

DType working_dtype(DType d) { return d == DType::kFloat64 ? DType::kFloat64 : DType::kFloat32; }

DType encoded_dtype(DType d, const ErrorFeedback& ef) { return ef.feedback() ? working_dtype(d) : d; }

namespace {

// The whole tensor in the working dtype w: in place where the source holds it so, else read (and
// converted, a slice at a time) into `buf`.
Result<const std::byte*> working_values(TensorSource& src, DType w, uint64_t numel, ScratchBuffer& buf) {
  const DType d = src.info().dtype;
  if (d == w && numel > 0) {
    if (const std::byte* v = src.view(0, numel)) return v;
  }
  buf.resize(numel * dtype_size(w));
  if (d == w) {
    GCZ_RETURN_IF_ERROR(src.read(0, numel, buf.data()));
  } else {
    constexpr uint64_t kSlice = uint64_t{1} << 20;
    ByteBuffer raw(std::min(kSlice, numel) * dtype_size(d));
    for (uint64_t a = 0; a < numel; a += kSlice) {
      const uint64_t n = std::min(kSlice, numel - a);
      GCZ_RETURN_IF_ERROR(src.read(a, n, raw.data()));
      convert_elements(d, raw.data(), w, buf.data() + a * dtype_size(w), n);
    }
  }
  return static_cast<const std::byte*>(buf.data());
}

// Adds elements [0, n) of x and x̂ to the running sums, and their cumulative error to c, in element order.
template <class T>
void add_to_sums(const std::byte* x, const std::byte* xhat, double* sum_x, double* sum_xhat, uint64_t n,
                 CumulativeError& c) {
  const T* px = reinterpret_cast<const T*>(x);
  const T* py = reinterpret_cast<const T*>(xhat);
  for (uint64_t i = 0; i < n; ++i) {
    sum_x[i] += static_cast<double>(px[i]);
    sum_xhat[i] += static_cast<double>(py[i]);
    const double d = sum_xhat[i] - sum_x[i];
    if (std::isfinite(sum_x[i])) {
      c.err_sq += d * d;
      c.ref_sq += sum_x[i] * sum_x[i];
      c.max_err = std::max(c.max_err, std::fabs(d));  // NaN d: not kept, but err_sq is NaN
      c.max_ref = std::max(c.max_ref, std::fabs(sum_x[i]));
    }
  }
}

// The same for x and x̂ of dtype d: float16 and bfloat16 a block at a time through float32.
void add_to_sums(DType d, const std::byte* x, const std::byte* xhat, double* sum_x, double* sum_xhat, uint64_t n,
                 CumulativeError& c) {
  if (d == DType::kFloat64) return add_to_sums<double>(x, xhat, sum_x, sum_xhat, n, c);
  if (d == DType::kFloat32) return add_to_sums<float>(x, xhat, sum_x, sum_xhat, n, c);
  constexpr uint64_t kBlock = 4096;
  float wx[kBlock], wy[kBlock];
  const std::size_t size = dtype_size(d);
  for (uint64_t i = 0; i < n; i += kBlock) {
    const uint64_t m = std::min(kBlock, n - i);
    convert_elements(d, x + i * size, DType::kFloat32, wx, m);
    convert_elements(d, xhat + i * size, DType::kFloat32, wy, m);
    add_to_sums<float>(reinterpret_cast<const std::byte*>(wx), reinterpret_cast<const std::byte*>(wy), sum_x + i,
                       sum_xhat + i, m, c);
  }
}

}  // namespace

// Memory: x in place (or one copy in the working dtype), one buffer that holds x' and becomes the
// new residual chunk by chunk as the decoded values come, and the running sums, moved from the old
// entry rather than copied. With feedback off there is no residual, and x is encoded in its own dtype,
// as gcz encode would encode it.
Result<TensorReport> encode_with_feedback(TensorEncoder& encoder, TensorSource& src, const EncodingPlan& plan,
                                          ErrorFeedback& ef, const std::function<void(uint64_t)>& progress) {
  const TensorInfo& t = src.info();
  const DType w = encoded_dtype(t.dtype, ef);
  GCZ_ASSIGN_OR_RETURN(uint64_t numel, t.numel());
  const std::size_t wsize = dtype_size(w);
  ScratchBuffer x_buf;
  GCZ_ASSIGN_OR_RETURN(const std::byte* x, working_values(src, w, numel, x_buf));

  // x' = x + e_old, when there is a residual for this tensor; else x' is x itself.
  ErrorFeedback::Entry* old = ef.find(t.name);
  ErrorFeedback::Entry next{working_dtype(t.dtype), t.shape, ByteBuffer(ef.feedback() ? numel * wsize : 0),
                            std::nullopt,           {},      {}};
  const std::byte* xp = x;
  if (ef.feedback() && old && !old->residual.empty()) {
    if (old->shape != t.shape || old->dtype != w) {
      const std::string state = ef.path().empty() ? "the error-feedback state" : "the state " + ef.path();
      return invalid_argument("tensor '" + t.name + "': " + state + " holds a residual of shape " +
                              shape_to_string(old->shape) + " (" + std::string(dtype_name(old->dtype)) +
                              ") but the input is " + shape_to_string(t.shape) + " (" + std::string(dtype_name(w)) +
                              "); a residual is not carried across a change of shape or dtype: start a new state file");
    }
    if (w == DType::kFloat64) add<double>(x, old->residual.data(), next.residual.data(), numel);
    else add<float>(x, old->residual.data(), next.residual.data(), numel);
    xp = next.residual.data();
  }
  // The old residual is spent, and the sums so far move into the new entry (the sums of a tensor whose
  // shape changed, with feedback off, start again at zero). A failed step leaves the old entry
  // without them (ErrorFeedback: reload the state after a failure).
  if (old) ByteBuffer().swap(old->residual);
  CumulativeError cumulative;
  if (ef.track_sums()) {
    const bool carried = old && old->shape == t.shape && old->sum_x.size() == numel && old->sum_xhat.size() == numel;
    next.sum_x = carried ? std::move(old->sum_x) : std::vector<double>(numel, 0.0);
    next.sum_xhat = carried ? std::move(old->sum_xhat) : std::vector<double>(numel, 0.0);
  }

  std::optional<CodecState> state;
  EncodeExtras extras;
  extras.reference = x;
  extras.bytes_in = numel * dtype_size(t.dtype);
  // Each decoded chunk: e = x' − x̂, 0 where that is not finite (over x' where x' is this buffer: the
  // encoder is done with the chunk), and the sums.
  extras.on_decoded = [&](uint64_t first, uint64_t count, const std::byte* xhat) {
    const uint64_t at = first * wsize;
    if (!next.residual.empty()) {
      if (w == DType::kFloat64)
        finite_difference<double>(xp + at, xhat, next.residual.data() + at, count);
      else
        finite_difference<float>(xp + at, xhat, next.residual.data() + at, count);
    }
    if (!ef.track_sums()) return;
    add_to_sums(w, x + at, xhat, next.sum_x.data() + first, next.sum_xhat.data() + first, count, cumulative);
  };
  extras.state_in = ef.feedback() && old && old->state ? &*old->state : nullptr;
  extras.state_out = &state;
  MemorySource xsrc({t.name, w, t.shape}, xp);
  // The encoder counts bytes of x' (its dtype w); progress counts bytes of the input's dtype.
  const std::size_t in_size = dtype_size(t.dtype);
  auto input_progress = [&](uint64_t done) { progress(done / wsize * in_size); };
  GCZ_ASSIGN_OR_RETURN(TensorReport report, encoder.encode(xsrc, plan, input_progress, extras));
  report.dtype = t.dtype;
  if (ef.track_sums()) report.cumulative = cumulative;
  next.state = std::move(state);
  ef.put(t.name, std::move(next));
  return report;
}

}  // namespace detail
}  // namespace gcz
