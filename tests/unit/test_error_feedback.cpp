// Error feedback across steps: the residual bookkeeping, the state file, and the property that the
// sum of decoded steps tracks the sum of true gradients.
#include "scratch_dir.h"
#include "gcz/error_feedback.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>

#include "gcz/container.h"
#include "gcz/pipeline.h"

namespace gcz {
namespace {

namespace fs = std::filesystem;

fs::path temp_dir(const std::string& name) { return gcz::testing::scratch_dir("ef_" + name); }

// Writes one step: tensors "w" (shape {rows, 16}) and "b" ({16}) of seeded Gaussian values.
fs::path write_step(const fs::path& dir, int step, uint64_t rows = 32) {
  std::mt19937 rng(static_cast<unsigned>(100 + step));
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  const fs::path p = dir / ("step_" + std::to_string(step) + ".safetensors");
  std::vector<TensorInfo> infos = {{"w", DType::kFloat32, {rows, 16}}, {"b", DType::kFloat32, {16}}};
  auto w = create_tensor_file(p.string(), infos, {});
  EXPECT_TRUE(w) << w.status().message();
  for (std::size_t i = 0; i < infos.size(); ++i) {
    std::vector<float> v(*infos[i].numel());
    for (float& x : v) x = normal(rng) * (1.0f + 0.5f * static_cast<float>(step % 3));
    EXPECT_TRUE((*w)->begin(i));
    EXPECT_TRUE((*w)->write(v.data(), v.size()));
    EXPECT_TRUE((*w)->end());
  }
  EXPECT_TRUE((*w)->finish());
  return p;
}

// Options whose error feedback only measures: sums tracked, nothing fed back.
EncodeOptions measuring(ErrorFeedback& ef) {
  ef.set_track_sums(true);
  ef.set_feedback(false);
  EncodeOptions o;
  o.spec = "bf16";
  o.error_feedback = &ef;
  return o;
}

double cumulative_rel(ErrorFeedback& ef, const std::vector<fs::path>& steps, const std::string& spec) {
  EncodeOptions o;
  o.spec = spec;
  o.device = DeviceRequest::kCpu;
  o.error_feedback = &ef;
  double rel = 0;
  for (const fs::path& p : steps) {
    auto r = encode_files({p.string()}, "", o);
    EXPECT_TRUE(r) << r.status().message();
    if (!r) return NAN;
    EXPECT_TRUE(r->cumulative.has_value());
    rel = r->cumulative->rel_l2();
  }
  return rel;
}

// The cumulative error of a sum that went NaN where the true sum is finite (its largest |difference|,
// which a NaN does not raise, stays 0) is not measured, not 0.
TEST(CumulativeError, ANanSumIsNotReportedAsNoError) {
  EXPECT_TRUE(std::isnan((CumulativeError{NAN, 1.0, 0.0, 1.0}.rel_l2())));
  EXPECT_EQ((CumulativeError{0.0, 1.0, 0.0, 1.0}.rel_l2()), 0.0);
  EXPECT_EQ((CumulativeError{0.25, 1.0, 0.5, 1.0}.rel_l2()), 0.5);
}

TEST(ErrorFeedback, DecodedSumTracksTrueSumAndResidualStaysBounded) {
  const fs::path d = temp_dir("bounded");
  std::vector<fs::path> steps;
  for (int s = 0; s < 12; ++s) steps.push_back(write_step(d, s));
  ErrorFeedback with, without;
  with.set_track_sums(true);
  without.set_track_sums(true);
  without.set_feedback(false);
  const double rel_with = cumulative_rel(with, steps, "bf16");
  const double rel_without = cumulative_rel(without, steps, "bf16");
  // With feedback, sum(x̂) - sum(x) = -e_T: one step's rounding error, so relative to a sum of 12
  // steps it is far smaller than the accumulated independent errors without feedback.
  EXPECT_LT(rel_with, 0.5 * rel_without) << rel_with << " vs " << rel_without;
  const ErrorFeedback::Entry* e = with.find("w");
  ASSERT_NE(e, nullptr);
  double sq = 0, sum_err = 0;
  const auto* r = reinterpret_cast<const float*>(e->residual.data());
  for (std::size_t i = 0; i < e->sum_x.size(); ++i) {
    sq += static_cast<double>(r[i]) * r[i];
    const double diff = e->sum_xhat[i] - e->sum_x[i];
    sum_err += diff * diff;
  }
  // Equal up to the float32 rounding of x' = x + e each step (~2^-24 |x| against a bf16 residual of
  // ~2^-9 |x|: relative 2^-15 per step).
  EXPECT_NEAR(std::sqrt(sum_err), std::sqrt(sq), 1e-4 * std::sqrt(sq));
}

TEST(ErrorFeedback, SparsifiedSumsConvergeWithFeedbackOnly) {
  const fs::path d = temp_dir("topk");
  std::vector<fs::path> steps;
  for (int s = 0; s < 12; ++s) steps.push_back(write_step(d, s));
  ErrorFeedback with, without;
  with.set_track_sums(true);
  without.set_track_sums(true);
  without.set_feedback(false);
  // Top-10% drops 90% of every step without feedback; with it, dropped mass is sent later.
  const double rel_with = cumulative_rel(with, steps, "topk:ratio=0.1");
  const double rel_without = cumulative_rel(without, steps, "topk:ratio=0.1");
  EXPECT_GT(rel_without, 0.5);
  EXPECT_LT(rel_with, 0.6 * rel_without) << rel_with << " vs " << rel_without;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

TEST(ErrorFeedback, PowerSgdQIsSavedAndWarmStartsTheNextStep) {
  const fs::path d = temp_dir("powersgd");
  ErrorFeedback ef;
  EncodeOptions o;
  o.spec = "powersgd:rank=2";
  o.error_feedback = &ef;
  ASSERT_TRUE(encode_files({write_step(d, 0, 64).string()}, "", o));
  const ErrorFeedback::Entry* w = ef.find("w");
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->state.has_value());
  EXPECT_EQ(w->state->shape, (Shape{16, 2}));
  EXPECT_FALSE(ef.find("b")->state.has_value());  // 1-D: the fallback codec carries no state
  ASSERT_TRUE(ef.save((d / "ef.gcz").string()));
  auto reader = GczReader::open((d / "ef.gcz").string());
  ASSERT_TRUE(reader) << reader.status().message();
  EXPECT_NE((*reader)->find("state/w"), nullptr);
  auto back = ErrorFeedback::load((d / "ef.gcz").string());
  ASSERT_TRUE(back);
  EXPECT_EQ(back->find("w")->state->values, w->state->values);

  // The next step warm-starts from that Q: from the same residuals it encodes otherwise once the Q is
  // gone (the encode then starts from Q0), and the same again with it.
  const fs::path step = write_step(d, 1, 64);
  auto encode_step = [&](bool keep_q, const std::string& out) {
    auto ef = ErrorFeedback::load((d / "ef.gcz").string());
    EXPECT_TRUE(ef) << ef.status().message();
    if (!keep_q) ef->find("w")->state.reset();
    o.error_feedback = &*ef;
    EXPECT_TRUE(encode_files({step.string()}, (d / out).string(), o));
    return file_bytes(d / out);
  };
  const std::string warm = encode_step(true, "warm.gcz");
  EXPECT_NE(encode_step(false, "cold.gcz"), warm);
  EXPECT_EQ(encode_step(true, "warm_again.gcz"), warm);
}

TEST(ErrorFeedback, StateFileRoundTripsAndIsAnOrdinaryGcz) {
  const fs::path d = temp_dir("state");
  const fs::path state = d / "ef.gcz";
  auto ef = ErrorFeedback::load(state.string());
  ASSERT_TRUE(ef) << ef.status().message();
  EXPECT_EQ(ef->size(), 0u);
  EncodeOptions o;
  o.spec = "fp16";
  o.error_feedback = &*ef;
  ASSERT_TRUE(encode_files({write_step(d, 0).string()}, (d / "s0.gcz").string(), o));
  ASSERT_TRUE(ef->save(state.string()));
  auto back = ErrorFeedback::load(state.string());
  ASSERT_TRUE(back) << back.status().message();
  ASSERT_EQ(back->size(), 2u);
  EXPECT_EQ(back->find("w")->residual, ef->find("w")->residual);
  EXPECT_EQ(back->find("w")->shape, (Shape{32, 16}));
  auto reader = GczReader::open(state.string());
  ASSERT_TRUE(reader);
  EXPECT_NE((*reader)->find("residual/w"), nullptr);
  EXPECT_TRUE((*reader)->verify(nullptr));
}

TEST(ErrorFeedback, ShapeChangeIsAClearErrorAndOtherFilesAreRefused) {
  const fs::path d = temp_dir("mismatch");
  ErrorFeedback ef;
  EncodeOptions o;
  o.error_feedback = &ef;
  ASSERT_TRUE(encode_files({write_step(d, 0, 32).string()}, "", o));
  const fs::path other = temp_dir("mismatch2");
  auto r = encode_files({write_step(other, 1, 8).string()}, "", o);
  ASSERT_FALSE(r);
  EXPECT_NE(r.status().message().find("tensor 'w'"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("[32, 16]"), std::string::npos) << r.status().message();
  // A .gcz that is not a state file.
  ASSERT_TRUE(encode_files({write_step(d, 2).string()}, (d / "plain.gcz").string(), {}));
  auto bad = ErrorFeedback::load((d / "plain.gcz").string());
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.status().message().find("not an error-feedback state file"), std::string::npos);
}

TEST(ErrorFeedback, TensorsAbsentFromAStepKeepTheirResidual) {
  const fs::path d = temp_dir("absent");
  ErrorFeedback ef;
  EncodeOptions o;
  o.spec = "bf16";
  o.error_feedback = &ef;
  ASSERT_TRUE(encode_files({write_step(d, 0).string()}, "", o));
  const ByteBuffer before = ef.find("b")->residual;
  // A step with only "w".
  const fs::path only_w = d / "only_w.safetensors";
  {
    auto w = create_tensor_file(only_w.string(), {{"w", DType::kFloat32, {32, 16}}}, {});
    ASSERT_TRUE(w);
    std::vector<float> v(512, 1e-3f);
    ASSERT_TRUE((*w)->begin(0) && (*w)->write(v.data(), v.size()) && (*w)->end() && (*w)->finish());
  }
  ASSERT_TRUE(encode_files({only_w.string()}, "", o));
  EXPECT_EQ(ef.find("b")->residual, before);
}

// A step reads float32 input in place (a view of the mapped file) and converts other dtypes a slice
// of 2^20 elements at a time, and it folds each decoded chunk into the residual and the running sums
// as it arrives. bfloat16 input and its exact float32 widening must then leave the same residuals,
// sums and errors, over two steps, whatever the chunking, for a chunked and a whole-tensor codec.
TEST(ErrorFeedback, InPlaceConvertedAndChunkedStepsAgree) {
  const fs::path d = temp_dir("paths");
  const uint64_t n = (uint64_t{1} << 20) + 3001;  // two slices of the conversion
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1e-2f);
  std::vector<uint16_t> h(n);
  std::vector<float> f(n);
  for (uint64_t i = 0; i < n; ++i) {
    uint32_t bits;
    const float v = normal(rng);
    std::memcpy(&bits, &v, 4);
    h[i] = static_cast<uint16_t>(bits >> 16);
    bits = uint32_t{h[i]} << 16;
    std::memcpy(&f[i], &bits, 4);
  }
  auto write = [&](const std::string& name, DType dtype, const void* data) {
    const fs::path p = d / name;
    auto w = create_tensor_file(p.string(), {{"w", dtype, {n}}}, {});
    EXPECT_TRUE(w) << w.status().message();
    EXPECT_TRUE((*w)->begin(0) && (*w)->write(data, n) && (*w)->end() && (*w)->finish());
    return p.string();
  };
  const std::string bf16 = write("bf16.safetensors", DType::kBFloat16, h.data());
  const std::string f32 = write("f32.safetensors", DType::kFloat32, f.data());
  for (const char* spec : {"qsgd:bits=4", "topk:ratio=0.01"}) {
    struct Run {
      std::string input;
      uint64_t chunk;
      ErrorFeedback ef;
      double cumulative = 0, rel_l2 = 0;
    } runs[3] = {{f32, uint64_t{1} << 24, {}}, {f32, 300000, {}}, {bf16, 300000, {}}};
    for (Run& r : runs) {
      r.ef.set_track_sums(true);
      EncodeOptions o;
      o.spec = spec;
      o.device = DeviceRequest::kCpu;
      o.chunk_elements = r.chunk;
      o.error_feedback = &r.ef;
      for (int step = 0; step < 2; ++step) {
        auto rep = encode_files({r.input}, "", o);
        ASSERT_TRUE(rep) << rep.status().message();
        r.cumulative = rep->cumulative->rel_l2();
        r.rel_l2 = rep->tensors[0].metrics.rel_l2;
      }
    }
    const ErrorFeedback::Entry* a = runs[0].ef.find("w");
    ASSERT_NE(a, nullptr);
    ASSERT_EQ(a->residual.size(), 4 * n);
    for (int k = 1; k < 3; ++k) {
      const ErrorFeedback::Entry* b = runs[k].ef.find("w");
      ASSERT_NE(b, nullptr);
      EXPECT_TRUE(a->residual == b->residual) << spec << " run " << k;
      EXPECT_TRUE(a->sum_x == b->sum_x) << spec << " run " << k;
      EXPECT_TRUE(a->sum_xhat == b->sum_xhat) << spec << " run " << k;
      EXPECT_EQ(runs[0].cumulative, runs[k].cumulative) << spec << " run " << k;
      EXPECT_EQ(runs[0].rel_l2, runs[k].rel_l2) << spec << " run " << k;
    }
    EXPECT_GT(runs[0].cumulative, 0.0) << spec;
  }
}

// Without feedback nothing checks a tensor's shape against the state; when it grows, the running
// sums start again at zero rather than being indexed past their end.
TEST(ErrorFeedback, SumsRestartWhenAShapeChangesWithoutFeedback) {
  const fs::path d = temp_dir("regrow");
  ErrorFeedback ef;
  const EncodeOptions o = measuring(ef);
  ASSERT_TRUE(encode_files({write_step(d, 0, 8).string()}, "", o));
  const fs::path step1 = write_step(temp_dir("regrow2"), 1, 32);
  auto r = encode_files({step1.string()}, "", o);
  ASSERT_TRUE(r) << r.status().message();
  const ErrorFeedback::Entry* w = ef.find("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->sum_x.size(), 32u * 16u);
  // Only this step is in the sums: they hold this step's x exactly.
  auto reader = open_tensor_file(step1.string(), {});
  ASSERT_TRUE(reader);
  auto src = (*reader)->open(0);
  ASSERT_TRUE(src);
  ASSERT_EQ((*src)->info().name, "w");
  std::vector<float> x(32 * 16);
  ASSERT_TRUE((*src)->read(0, x.size(), x.data()));
  for (std::size_t i = 0; i < x.size(); ++i) ASSERT_EQ(w->sum_x[i], static_cast<double>(x[i])) << i;
}

// A tensor "w" of the given shape holding `v`, or 0.001, 0.002, ... when `v` is empty.
fs::path write_w(const fs::path& dir, const std::string& stem, const Shape& shape, std::vector<float> v = {}) {
  const fs::path p = dir / (stem + ".safetensors");
  std::vector<TensorInfo> infos = {{"w", DType::kFloat32, shape}};
  auto w = create_tensor_file(p.string(), infos, {});
  EXPECT_TRUE(w) << w.status().message();
  if (v.empty()) {
    v.resize(*infos[0].numel());
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = 1e-3f * static_cast<float>(i + 1);
  }
  EXPECT_TRUE((*w)->begin(0));
  EXPECT_TRUE((*w)->write(v.data(), v.size()));
  EXPECT_TRUE((*w)->end());
  EXPECT_TRUE((*w)->finish());
  return p;
}

TEST(ErrorFeedback, SumsRestartWhenTheShapeChangesButNotTheElementCount) {
  const fs::path d = temp_dir("reshape");
  ErrorFeedback ef;
  const EncodeOptions o = measuring(ef);
  ASSERT_TRUE(encode_files({write_w(d, "a", {8, 4}).string()}, "", o));
  ASSERT_TRUE(encode_files({write_w(d, "b", {4, 8}).string()}, "", o));
  const ErrorFeedback::Entry* w = ef.find("w");
  ASSERT_NE(w, nullptr);
  ASSERT_EQ(w->sum_x.size(), 32u);
  // Only the second step is in the sums (carried across the reshape, each would be twice x).
  for (std::size_t i = 0; i < 32; ++i) {
    ASSERT_EQ(w->sum_x[i], static_cast<double>(1e-3f * static_cast<float>(i + 1))) << i;
  }
}

// Two runs that use one state file at once both start from the same state: the first to save
// updates it, and the second is refused rather than replacing that update.
TEST(ErrorFeedback, SaveRefusesToLoseAnotherRunsUpdate) {
  const fs::path d = temp_dir("race");
  const std::string state = (d / "ef.gcz").string();
  const std::string step = write_step(d, 0).string();
  auto run = [&](ErrorFeedback& ef) {
    EncodeOptions o;
    o.spec = "topk:ratio=0.25";
    o.error_feedback = &ef;
    ASSERT_TRUE(encode_files({step}, "", o));
  };
  auto expect_refused = [&](ErrorFeedback& ef, const std::string& words) {
    const std::string before = fs::exists(state) ? file_bytes(state) : "(none)";
    Status s = ef.save(state);
    ASSERT_FALSE(s);
    EXPECT_EQ(s.code(), StatusCode::kIoError);
    EXPECT_NE(s.message().find(state + ": " + words + " by another process"), std::string::npos) << s.message();
    EXPECT_EQ(fs::exists(state) ? file_bytes(state) : "(none)", before);  // the other run's update stands
    std::vector<std::string> left;
    for (const auto& e : fs::directory_iterator(d)) left.push_back(e.path().filename().string());
    std::sort(left.begin(), left.end());
    EXPECT_EQ(left, fs::exists(state) ? std::vector<std::string>({"ef.gcz", "step_0.safetensors"})
                                      : std::vector<std::string>({"step_0.safetensors"}));  // no temporary
  };

  // No state yet: the first save creates it, the second does not replace it.
  auto a = ErrorFeedback::load(state), b = ErrorFeedback::load(state);
  ASSERT_TRUE(a && b);
  run(*a);
  run(*b);
  ASSERT_TRUE(a->save(state));
  expect_refused(*b, "created");

  // A state both read: the first save replaces it, the second does not.
  a = ErrorFeedback::load(state);
  b = ErrorFeedback::load(state);
  ASSERT_TRUE(a && b);
  run(*a);
  run(*b);
  ASSERT_TRUE(a->save(state));
  expect_refused(*b, "replaced or removed");
  ASSERT_TRUE(a->save(state));  // the file it wrote itself is the one it may replace
  auto back = ErrorFeedback::load(state);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->steps(), 2u);

  // Changed in place (a new inode may even reuse the old one's number): the change time tells.
  fs::permissions(state, fs::perms::owner_read | fs::perms::owner_write);
  expect_refused(*a, "replaced or removed");
  a = ErrorFeedback::load(state);
  ASSERT_TRUE(a);
  EXPECT_TRUE(a->save((d / "." / "ef.gcz").string()));  // the same file, spelled otherwise
  b = ErrorFeedback::load(state);
  ASSERT_TRUE(b);
  ASSERT_TRUE(a->save(state));
  expect_refused(*b, "replaced or removed");
  // Removed meanwhile: not written again (whoever removed it meant to start over).
  fs::remove(state);
  expect_refused(*a, "replaced or removed");
  // Saved to another path, it writes there: only the file it read is guarded.
  EXPECT_TRUE(b->save((d / "other.gcz").string()));
}

// encode_files with ef_state_path writes the step's file and the state, and puts both in place or
// neither: where another run updated the state meanwhile, the step's file is not written either (it
// was encoded from a state that is no longer the file's), and no temporary is left.
TEST(ErrorFeedback, StepFileAndStateArePutInPlaceTogether) {
  const fs::path d = temp_dir("together");
  const std::string state = (d / "ef.gcz").string(), out = (d / "out.gcz").string();
  const std::string step = write_step(d, 0).string();
  auto options = [&](ErrorFeedback& ef) {
    EncodeOptions o;
    o.spec = "topk:ratio=0.25";
    o.error_feedback = &ef;
    o.ef_state_path = state;
    return o;
  };
  auto listing = [&] {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(d)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  auto a = ErrorFeedback::load(state), b = ErrorFeedback::load(state);
  ASSERT_TRUE(a && b);
  auto r = encode_files({step}, out, options(*a));
  ASSERT_TRUE(r) << r.status().message();
  EXPECT_EQ(listing(), (std::vector<std::string>{"ef.gcz", "out.gcz", "step_0.safetensors"}));
  auto saved = ErrorFeedback::load(state);
  ASSERT_TRUE(saved);
  EXPECT_EQ(saved->steps(), 1u);
  ASSERT_TRUE(saved->find("w") != nullptr);
  EXPECT_EQ(saved->find("w")->residual.size(), 32u * 16u * 4u);

  // b read no state; a has created one since: b's step is refused whole, and the OUTPUT it would
  // have replaced gets its old file back.
  { std::ofstream(out, std::ios::binary) << "an older output"; }
  const std::string before = file_bytes(state);
  auto refused = encode_files({step}, out, options(*b));
  ASSERT_FALSE(refused);
  EXPECT_EQ(refused.status().code(), StatusCode::kIoError);
  EXPECT_NE(refused.status().message().find(state + ": created by another process"), std::string::npos)
      << refused.status().message();
  EXPECT_NE(refused.status().message().find("; " + out + " was not written either"), std::string::npos)
      << refused.status().message();
  EXPECT_EQ(file_bytes(state), before);
  EXPECT_EQ(file_bytes(out), "an older output");
  EXPECT_EQ(listing(), (std::vector<std::string>{"ef.gcz", "out.gcz", "step_0.safetensors"}));  // no temporary
  // Where there was no OUTPUT, none is left.
  fs::remove(out);
  ASSERT_FALSE(encode_files({step}, out, options(*b)));
  EXPECT_EQ(listing(), (std::vector<std::string>{"ef.gcz", "step_0.safetensors"}));

  // a wrote the state it now holds: its next step replaces both.
  ASSERT_TRUE(encode_files({step}, out, options(*a)));
  auto second = ErrorFeedback::load(state);
  ASSERT_TRUE(second);
  EXPECT_EQ(second->steps(), 2u);
  EXPECT_EQ(listing(), (std::vector<std::string>{"ef.gcz", "out.gcz", "step_0.safetensors"}));
}

TEST(ErrorFeedback, StepsAreCountedSavedAndSeedEachStep) {
  const fs::path d = temp_dir("steps");
  const fs::path state = d / "ef.gcz";
  auto ef = ErrorFeedback::load(state.string());
  ASSERT_TRUE(ef);
  EXPECT_EQ(ef->steps(), 0u);
  EncodeOptions o;
  o.spec = "randomk:ratio=0.25";
  o.seed = 41;
  o.error_feedback = &*ef;
  for (uint64_t s = 0; s < 2; ++s) {
    auto r = encode_files({write_step(d, static_cast<int>(s)).string()}, (d / "out.gcz").string(), o);
    ASSERT_TRUE(r) << r.status().message();
    EXPECT_EQ(r->seed, 41 + s);
    auto reader = GczReader::open((d / "out.gcz").string());
    ASSERT_TRUE(reader);
    for (const TensorRecord& t : (*reader)->index().tensors) EXPECT_EQ(t.seed, 41 + s) << t.info.name;
  }
  EXPECT_EQ(ef->steps(), 2u);
  ASSERT_TRUE(ef->save(state.string()));
  auto back = ErrorFeedback::load(state.string());
  ASSERT_TRUE(back) << back.status().message();
  EXPECT_EQ(back->steps(), 2u);
  o.error_feedback = &*back;
  auto r = encode_files({write_step(d, 2).string()}, "", o);
  ASSERT_TRUE(r);
  EXPECT_EQ(r->seed, 43u);
}

TEST(ErrorFeedback, ResidualsThatWouldNotBeFiniteAreZero) {
  const fs::path p = write_w(temp_dir("nonfinite"), "x", {6}, {1.0f, NAN, INFINITY, -INFINITY, 3e38f, 0.1f});
  ErrorFeedback ef;
  EncodeOptions o;
  o.spec = "fp16";  // 3e38 becomes +Inf in float16: its error is not finite either
  o.error_feedback = &ef;
  ASSERT_TRUE(encode_files({p.string()}, "", o));
  const auto* e = reinterpret_cast<const float*>(ef.find("w")->residual.data());
  EXPECT_EQ(e[0], 0.0f);  // 1 is exact in float16
  for (int i = 1; i <= 4; ++i) EXPECT_EQ(e[i], 0.0f) << i;
  EXPECT_TRUE(std::isfinite(e[5]) && e[5] != 0.0f) << e[5];  // 0.1's float16 rounding error is kept
  // A step later the same NaN and infinities are not added again: the residual stays finite.
  ASSERT_TRUE(encode_files({p.string()}, "", o));
  const auto* e2 = reinterpret_cast<const float*>(ef.find("w")->residual.data());
  for (int i = 0; i < 6; ++i) EXPECT_TRUE(std::isfinite(e2[i])) << i;
}

}  // namespace
}  // namespace gcz
