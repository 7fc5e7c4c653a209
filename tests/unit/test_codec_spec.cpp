#include "gcz/codec_spec.h"
#include "gcz/detail/value_codec.h"

#include <gtest/gtest.h>

namespace gcz {
namespace {

TEST(CodecSpec, ParsesStagesAndTypedParams) {
  auto s = parse_codec_spec("fp16+zstd:level=3");
  ASSERT_TRUE(s) << s.status().message();
  ASSERT_EQ(s->stages.size(), 2u);
  EXPECT_EQ(s->stages[0].name, "fp16");
  EXPECT_TRUE(s->stages[0].params.empty());
  EXPECT_EQ(std::get<int64_t>(s->stages[1].params.at("level")), 3);

  auto t = parse_codec_spec("topk:ratio=0.01,values=(qsgd:bits=8,scale=max)+zstd");
  ASSERT_TRUE(t) << t.status().message();
  EXPECT_DOUBLE_EQ(std::get<double>(t->stages[0].params.at("ratio")), 0.01);
  EXPECT_EQ(std::get<std::string>(t->stages[0].params.at("values")), "qsgd:bits=8,scale=max");
  EXPECT_EQ(t->to_string(), "topk:ratio=0.01,values=(qsgd:bits=8,scale=max)+zstd");

  // Decimal numbers only (as the numpy reader reads them): a hex float, inf and nan are words.
  auto u = parse_codec_spec("topk:ratio=0x1p-3,a=inf,b=nan,c=.5,d=5e-1,e=-2");
  ASSERT_TRUE(u) << u.status().message();
  const Params& p = u->stages[0].params;
  for (const char* word : {"ratio", "a", "b"}) EXPECT_TRUE(std::holds_alternative<std::string>(p.at(word))) << word;
  EXPECT_EQ(std::get<double>(p.at("c")), 0.5);
  EXPECT_EQ(std::get<double>(p.at("d")), 0.5);
  EXPECT_EQ(std::get<int64_t>(p.at("e")), -2);
}

TEST(CodecSpec, RejectsMalformedSpecsWithPosition) {
  for (const char* bad : {"", "+zstd", "fp16+", "fp16:", "fp16:level", "fp16:level=", "fp16:a=1,a=2",
                          "fp16:v=(x", "fp16 zstd", "fp16;"}) {
    auto s = parse_codec_spec(bad);
    ASSERT_FALSE(s) << bad;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("codec spec '" + std::string(bad) + "'"), std::string::npos)
        << s.status().message();
  }
  for (const char* unbalanced : {"fp16:v=(x", "topk:values=(qsgd", "topk:values=((qsgd)"}) {
    auto s = parse_codec_spec(unbalanced);
    ASSERT_FALSE(s) << unbalanced;
    EXPECT_NE(s.status().message().find("unbalanced '('"), std::string::npos) << s.status().message();
  }
}

// A string value holding parentheses is written back inside one more pair, as it was given.
TEST(CodecSpec, ParenthesesInAValueSurviveAWriteBack) {
  for (const char* text : {"a:k=((x))", "a:k=(f(1))+b"}) {
    auto s = parse_codec_spec(text);
    ASSERT_TRUE(s) << s.status().message();
    EXPECT_EQ(s->to_string(), text);
  }
}

TEST(EncodingPlan, SplitsCodecAndZstd) {
  auto p = parse_encoding_plan("bf16+zstd");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->codec.name, "bf16");
  EXPECT_EQ(p->zstd_level, kDefaultZstdLevel);
  EXPECT_EQ(p->text, "bf16+zstd:level=3");
  auto q = parse_encoding_plan("none");
  ASSERT_TRUE(q);
  EXPECT_FALSE(q->zstd_level);
}

TEST(EncodingPlan, RejectsMisplacedOrBadStages) {
  EXPECT_FALSE(parse_encoding_plan("zstd"));
  EXPECT_FALSE(parse_encoding_plan("fp16+fp16"));
  EXPECT_FALSE(parse_encoding_plan("fp16+zstd+zstd"));
  EXPECT_FALSE(parse_encoding_plan("fp16+zstd:level=0"));
  EXPECT_FALSE(parse_encoding_plan("fp16+zstd:level=23"));
  EXPECT_TRUE(parse_encoding_plan("fp16+zstd:level=1"));  // the ends of 1..22
  EXPECT_TRUE(parse_encoding_plan("fp16+zstd:level=22"));
  EXPECT_FALSE(parse_encoding_plan("fp16+zstd:level=fast"));
  auto bad_key = parse_encoding_plan("fp16+zstd:lvl=3");
  ASSERT_FALSE(bad_key);
  EXPECT_NE(bad_key.status().message().find("lvl"), std::string::npos);
}

// What a command checks before any work: the plan, and the codec made with its parameters. Whatever
// fails is the user's usage error, an unknown codec too (which parse_encoding_plan lets through).
TEST(EncodingPlan, CheckMakesTheCodecAndCallsEveryFailureAUsageError) {
  auto ok = check_encoding_plan("qsgd:bits=4+zstd");
  ASSERT_TRUE(ok) << ok.status().message();
  EXPECT_EQ(ok->codec.name, "qsgd");
  EXPECT_EQ(ok->zstd_level, kDefaultZstdLevel);

  ASSERT_TRUE(parse_encoding_plan("fp17"));
  for (const char* bad : {"fp17", "qsgd:bits=9", "terngrad:group=4", "fp16:level=3", "zstd", "fp16+",
                          "fp16+zstd:level=0", "fp16+zstd:level=00", "fp16+zstd:level=(0)", "fp16+zstd:level=fast",
                          "fp16+zstd:lvl=3", "fp16+zstd+zstd", "fp16 + zstd:level=0"}) {
    auto r = check_encoding_plan(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad << ": " << r.status().message();
    // Once, at the start: the commands print it as it is.
    EXPECT_EQ(r.status().message().rfind("codec spec '" + std::string(bad) + "': ", 0), 0u) << r.status().message();
    EXPECT_EQ(r.status().message().find("codec spec", 1), std::string::npos) << r.status().message();
  }
  EXPECT_NE(check_encoding_plan("qsgd:bits=9").status().message().find("bits"), std::string::npos);
}

TEST(EncodingPlan, CheckRefusesACodecThatRefusesEveryTensor) {
  // Top-K hands its kept values, a vector, to the value codec; PowerSGD takes matrices only. As
  // PowerSGD's factors codec, PowerSGD gets no fallback: factors [n, 4] never shrink 2x at rank 4.
  for (const char* bad : {"topk:values=(powersgd)", "randomk:k=3,values=(powersgd:rank=1)",
                          "powersgd:factors=(powersgd)", "powersgd:rank=8,factors=(topk:values=(powersgd))"}) {
    auto r = check_encoding_plan(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(r.status().message().find("it fails on every tensor (a 256x256 and a 2048x2048"), std::string::npos)
        << r.status().message();
  }
  EXPECT_TRUE(check_encoding_plan("topk:values=(topk:values=(qsgd:bits=4))"));
  // Factors [n, 2] at rank 1 shrink 1.99x for n = 256 as for large n: a working spec is not refused.
  EXPECT_TRUE(check_encoding_plan("powersgd:rank=2,factors=(powersgd:rank=1,min_rate=1.9)"));
  // Factors [n, 4] at rank 1 shrink 3.95x only for n > 316: the 256 x 256 matrix's are refused, the
  // 2048 x 2048 one's are not, and so neither is the spec (a 2000 x 2000 tensor encodes with it).
  EXPECT_TRUE(check_encoding_plan("powersgd:rank=4,min_rate=1,factors=(powersgd:rank=1,min_rate=3.95)"));
}

TEST(MakeCodec, NumericParametersSayWhatIsWrong) {
  auto message = [](const char* spec) {
    auto r = check_encoding_plan(spec);
    EXPECT_FALSE(r) << spec;
    return r ? std::string() : r.status().message();
  };
  EXPECT_NE(message("qsgd:bits=4.5").find("'bits' must be an integer, got '4.5'"), std::string::npos);
  for (const char* whole : {"qsgd:bits=4.0", "qsgd:bits=4e0"}) {
    EXPECT_NE(message(whole).find("'bits' must be an integer, got the decimal number 4 (write it without a point"),
              std::string::npos)
        << whole;
  }
  // A whole number beyond int64 is read as a double: its range is what is wrong, not its being whole.
  const std::string range = "must be an integer of at most 9223372036854775807 in magnitude, got ";
  EXPECT_NE(message("topk:k=100000000000000000000000").find("'k' " + range + "1e23"), std::string::npos);
  EXPECT_NE(message("topk:k=9.3e18").find("'k' " + range + "9.3e18"), std::string::npos);  // just past 2^63
  EXPECT_NE(message("topk:k=6e18").find("'k' must be an integer, got the decimal number 6000000000000000000 ("),
            std::string::npos);
  EXPECT_NE(message("topk:k=10.0").find("'k' must be an integer, got the decimal number 10 ("), std::string::npos);
  EXPECT_NE(message("qsgd:bits=(4)").find("'bits' must be an integer, got '4', a word (a number in parentheses"),
            std::string::npos);
  EXPECT_NE(message("topk:ratio=(0.5)").find("'ratio' must be a number, got '0.5', a word"), std::string::npos);
  EXPECT_EQ(message("topk:ratio=1e-400").find("a word"), std::string::npos);
  EXPECT_NE(message("topk:ratio=1e-400").find("'ratio' must be a number float64 can hold"), std::string::npos);
  EXPECT_NE(message("topk:ratio=1e400").find("'ratio' must be a number float64 can hold"), std::string::npos);
  for (const char* plus :
       {"terngrad:clip=1e+30", "topk:values=(qsgd:bits=4e+0)", "powersgd:fallback=(topk:ratio=1e+0)"}) {
    EXPECT_NE(message(plus).find("write an exponent without it, 1e30 for 1e+30"), std::string::npos) << plus;
  }
  EXPECT_NE(message("topk:ratio=1.2.3").find("'ratio' must be a number, got '1.2.3'"), std::string::npos);
  EXPECT_NE(message("qsgd:group=-100000000000000000000000").find("'group' " + range + "-1e23"), std::string::npos);
}

TEST(MakeCodec, ValueCodecsNestAtMost64Deep) {
  auto value_spec = [](int levels) {  // `levels` value codecs, one inside the other, fp16 innermost
    std::string spec = "fp16";
    for (int i = 1; i < levels; ++i) spec = "topk:values=(" + spec + ")";
    return spec;
  };
  const int most = detail::kMaxValueCodecDepth;
  EXPECT_TRUE(check_encoding_plan("topk:values=(" + value_spec(most) + ")"));
  auto deep = check_encoding_plan("topk:values=(" + value_spec(most + 1) + ")");
  ASSERT_FALSE(deep);
  EXPECT_NE(deep.status().message().find("nest 65 deep, more than 64"), std::string::npos) << deep.status().message();
  // From a file's index as well, where the parameter holds the value codec's spec.
  EXPECT_TRUE(make_codec("topk", Params{{"values", value_spec(most)}}, Backend::kCpu));
  EXPECT_FALSE(make_codec("topk", Params{{"values", value_spec(most + 1)}}, Backend::kCpu));
  // A word in parentheses is no level; PowerSGD's fallback is one.
  EXPECT_EQ(nested_codec_depth("topk:values=(qsgd:scale=(max),rounding=(nearest))"), 1);
  EXPECT_EQ(nested_codec_depth("powersgd:factors=(bf16),fallback=(topk:values=(fp16))"), 2);
  // A bare codec is a level as its parenthesized spelling is (CODECS.md), the numpy reader counting so.
  EXPECT_EQ(nested_codec_depth("topk:values=fp16"), 1);
  EXPECT_EQ(nested_codec_depth("topk:values=(topk:values=fp16)"), 2);
  EXPECT_EQ(nested_codec_depth("powersgd:factors=bf16,fallback=fp16"), 1);
  EXPECT_EQ(nested_codec_depth("qsgd"), 0);
  std::string bare = "fp16";  // 65 levels with the innermost bare, as gcz writes a codec without parameters
  for (int i = 0; i < most; ++i) bare = "topk:values=" + (i == 0 ? bare : "(" + bare + ")");
  EXPECT_EQ(nested_codec_depth("topk:values=(" + bare + ")"), most + 1);
  EXPECT_FALSE(check_encoding_plan("topk:values=(" + bare + ")"));
  std::string deep_word = "qsgd:scale=(max)";
  for (int i = 1; i < most; ++i) deep_word = "topk:values=(" + deep_word + ")";
  EXPECT_TRUE(make_codec("topk", Params{{"values", deep_word}}, Backend::kCpu));
  EXPECT_TRUE(make_codec("powersgd", Params{{"fallback", value_spec(most)}}, Backend::kCpu));
  EXPECT_FALSE(make_codec("powersgd", Params{{"fallback", value_spec(most + 1)}}, Backend::kCpu));
}

TEST(MakeCodec, CodecsWriteAtMost1024Streams) {
  // PowerSGD's factors are P's and Q's value codec: each level doubles the streams, which the depth
  // limit alone leaves at 2^63. 10 levels write 1024 streams, 11 are refused, and 63 are refused as
  // fast (each level is made once, not once per factor: that took 3^depth).
  auto factors = [](int levels) {
    std::string spec = "fp16";
    for (int i = 0; i < levels; ++i) spec = "powersgd:factors=(" + spec + ")";
    return spec;
  };
  auto ok = make_codec("powersgd", Params{{"factors", factors(9)}}, Backend::kCpu);
  ASSERT_TRUE(ok) << ok.status().message();
  const std::vector<std::string> names = (*ok)->stream_names({});
  std::string first, last;
  for (int i = 0; i < 10; ++i) first += "p.", last += "q.";
  ASSERT_EQ(names.size(), detail::kMaxCodecStreams);
  EXPECT_EQ(names.front(), first + "values");
  EXPECT_EQ(names.back(), last + "values");
  for (int levels : {10, 62}) {
    auto many = make_codec("powersgd", Params{{"factors", factors(levels)}}, Backend::kCpu);
    ASSERT_FALSE(many);
    EXPECT_EQ(many.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(many.status().message().find("writes 2048 streams, more than 1024"), std::string::npos)
        << many.status().message();
  }
  // Top-K's indices are one stream more than its value codec's.
  auto topk = make_codec("topk", Params{{"values", factors(10)}}, Backend::kCpu);
  ASSERT_FALSE(topk);
  EXPECT_NE(topk.status().message().find("'topk' with its value codecs writes 1025 streams"), std::string::npos)
      << topk.status().message();
}

TEST(CodecSpec, BriefSpecLeavesOutDefaults) {
  EXPECT_EQ(brief_spec("qsgd:bits=8,group=128,rounding=stochastic,scale=max,scale_dtype=fp32"), "qsgd");
  EXPECT_EQ(brief_spec("qsgd:bits=4,group=128,rounding=nearest,scale=max,scale_dtype=fp32"),
            "qsgd:bits=4,rounding=nearest");
  EXPECT_EQ(brief_spec("topk:k=5,values=(qsgd:bits=8,group=128,rounding=stochastic,scale=max,scale_dtype=fp32)"),
            "topk:k=5,values=qsgd");
  EXPECT_EQ(brief_spec("topk:k=5,values=(qsgd:bits=4,group=128,rounding=stochastic,scale=max,scale_dtype=fp32)"),
            "topk:k=5,values=(qsgd:bits=4)");
  EXPECT_EQ(brief_spec("randomk:ratio=0.01,scale=none,values=fp32"), "randomk");
  EXPECT_EQ(brief_spec("powersgd:factors=bf16,fallback=fp16,iters=1,min_rate=2,rank=4,view=first"),
            "powersgd:factors=bf16");
  EXPECT_EQ(brief_spec("none+zstd:level=3"), "none+zstd");
  EXPECT_EQ(brief_spec("none+zstd:level=19"), "none+zstd:level=19");
  EXPECT_EQ(brief_spec("fp16"), "fp16");
  EXPECT_EQ(brief_spec("no such:spec("), "no such:spec(");  // not a spec: as it is
  // The brief spec is the same codec: its canonical form is the original's.
  auto canonical = [](const std::string& text) {
    auto spec = parse_codec_spec(text);
    auto codec = make_codec(spec->stages[0].name, spec->stages[0].params, Backend::kCpu);
    return CodecSpec{{{std::string((*codec)->name()), (*codec)->params()}}}.to_string();
  };
  for (const char* full : {"qsgd:bits=4,group=128,rounding=nearest,scale=max,scale_dtype=fp32",
                           "topk:k=5,values=(qsgd:bits=8,group=128,rounding=stochastic,scale=max,scale_dtype=fp32)",
                           "powersgd:factors=bf16,fallback=fp16,iters=1,min_rate=2,rank=4,view=first"}) {
    EXPECT_EQ(canonical(brief_spec(full)), full);
  }
}

TEST(MakeCodec, KnowsCastCodecsAndRejectsOthers) {
  for (const char* name : {"none", "fp32", "fp16", "bf16"}) {
    auto c = make_codec(name, {}, Backend::kCpu);
    ASSERT_TRUE(c) << name;
    EXPECT_EQ((*c)->name(), name);
  }
  auto unknown = make_codec("fp17", {}, Backend::kCpu);
  ASSERT_FALSE(unknown);
  EXPECT_EQ(unknown.status().code(), StatusCode::kUnsupported);
  EXPECT_NE(unknown.status().message().find("fp17"), std::string::npos);
  auto params = make_codec("fp16", {{"level", int64_t{3}}}, Backend::kCpu);
  ASSERT_FALSE(params);
  EXPECT_EQ(params.status().code(), StatusCode::kInvalidArgument);
}

TEST(Backend, ResolvesCpuAndExplainsMissingCuda) {
  EXPECT_EQ(*resolve_backend(DeviceRequest::kCpu), Backend::kCpu);
  auto cuda = resolve_backend(DeviceRequest::kCuda);
  if (cuda_status()) {
    EXPECT_EQ(*cuda, Backend::kCuda);
  } else {
    ASSERT_FALSE(cuda);
    EXPECT_EQ(cuda.status().code(), StatusCode::kDeviceError);
    EXPECT_FALSE(cuda.status().message().empty());
    EXPECT_EQ(*resolve_backend(DeviceRequest::kAuto), Backend::kCpu);
  }
}

}  // namespace
}  // namespace gcz
