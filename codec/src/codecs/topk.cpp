#include "codecs/topk.h"

#include "codecs/sparse_indices.h"
#include "gcz/detail/select.h"
#include "parallel.h"

namespace gcz::codecs {

std::vector<uint64_t> select_top_k(DType dtype, const void* src, uint64_t n, uint64_t k, unsigned threads) {
  using detail::select_smallest;
  const unsigned parts = detail::parts_for(threads, n, detail::kMinPartElements);
  const detail::RunEach run;
  // Keys straight from the element bits: no converted copy of the tensor is made.
  switch (dtype) {
    case DType::kFloat16: {
      const auto* b = static_cast<const uint16_t*>(src);
      return select_smallest<uint32_t>(
          n, k, [b](uint64_t i) { return detail::magnitude_key_f16(b[i]); }, parts, run);
    }
    case DType::kBFloat16: {
      const auto* b = static_cast<const uint16_t*>(src);
      return select_smallest<uint32_t>(
          n, k, [b](uint64_t i) { return detail::magnitude_key_bf16(b[i]); }, parts, run);
    }
    case DType::kFloat32: {
      const auto* b = static_cast<const uint32_t*>(src);
      return select_smallest<uint32_t>(
          n, k, [b](uint64_t i) { return detail::magnitude_key_f32(b[i]); }, parts, run);
    }
    case DType::kFloat64: {
      const auto* b = static_cast<const uint64_t*>(src);
      return select_smallest<uint64_t>(
          n, k, [b](uint64_t i) { return detail::magnitude_key_f64(b[i]); }, parts, run);
    }
  }
  return {};
}

Params TopKCodec::params() const {
  Params p;
  count_.add_params(p);
  p["values"] = values_.spec();
  return p;
}

std::vector<std::string> TopKCodec::stream_names(const TensorInfo&) const {
  std::vector<std::string> names = {"indices"};
  for (std::string& v : values_.stream_names()) names.push_back(std::move(v));
  return names;
}

Result<uint64_t> TopKCodec::stream_size(const TensorInfo& t, std::size_t stream, uint64_t, uint64_t) const {
  if (stream > values_.stream_count()) return internal_error("topk: no stream " + std::to_string(stream));
  GCZ_ASSIGN_OR_RETURN(uint64_t n, t.numel());
  if (n == 0) return uint64_t{0};  // an empty tensor writes no bytes at all
  const uint64_t k = count_.k(n);
  if (stream == 0) return indices_size_bound(n, k);
  return values_.stream_size({k}, stream - 1);
}

Status TopKCodec::encode(const TensorInfo& t, const void* src, uint64_t first, uint64_t count,
                         std::vector<ByteBuffer>& out) {
  GCZ_ASSIGN_OR_RETURN(uint64_t n, whole_tensor(t, first, count, name()));
  if (out.size() != 1 + values_.stream_count()) return internal_error("topk: wrong number of output streams");
  if (n == 0) return Status::ok();
  const uint64_t k = count_.k(n);
  const std::vector<uint64_t> idx = select_top_k(t.dtype, src, n, k, threads());
  if (idx.size() != k) {  // the selection's passes saw different values
    return io_error("topk: the tensor changed while it was read (was its file rewritten meanwhile?)");
  }
  encode_indices(idx, n, out[0]);
  const std::vector<float> values = gather_values(t.dtype, src, idx, 1.0f);
  return values_.encode({k}, values.data(), out.data() + 1, context_).with_context("topk");
}

Status TopKCodec::decode(const TensorInfo& t, const std::vector<ByteSpan>& in, uint64_t first, uint64_t count,
                         void* dst) {
  GCZ_ASSIGN_OR_RETURN(uint64_t n, whole_tensor(t, first, count, name()));
  if (in.size() != 1 + values_.stream_count()) return internal_error("topk: wrong number of input streams");
  if (n == 0) {
    for (const ByteSpan& s : in) {
      if (!s.empty()) return format_error("topk: an empty tensor must have empty streams");
    }
    return Status::ok();
  }
  const uint64_t k = count_.k(n);
  auto idx = decode_indices(in[0], n, k);
  if (!idx) return idx.status().with_context("topk");
  std::vector<float> values(k);
  GCZ_RETURN_IF_ERROR(values_.decode({k}, in.data() + 1, values.data(), context_).with_context("topk"));
  scatter_values(t.dtype, *idx, values.data(), n, dst);
  return Status::ok();
}

Result<std::unique_ptr<Codec>> make_topk(const Params& params, Backend) {
  GCZ_RETURN_IF_ERROR(check_param_keys(params, "topk", {"ratio", "k", "values"}));
  GCZ_ASSIGN_OR_RETURN(SparseCount count, SparseCount::parse(params, "topk"));
  GCZ_ASSIGN_OR_RETURN(detail::ValueCodec values,
                       detail::ValueCodec::make("topk", params, "values", "fp32", Backend::kCpu));
  return std::unique_ptr<Codec>(new TopKCodec(count, std::move(values)));
}

}  // namespace gcz::codecs
