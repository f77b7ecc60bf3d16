// The math a driver-backend capture's device would have done, as torch.utils.flop_counter counts
// it (the fake-tensor backend's `# flops:` line): a RecordFunction callback sees every ATen op
// PyTorch's CUDA path runs (the script's, autograd's on its device thread, Inductor's extern
// kernels) and applies flop_counter's formulas to the ops it has one for. Only the outermost
// counted op of a thread counts (flash attention's SDPA wrapper calls _flash_attention_forward,
// convolution calls _convolution: parts, not more work), only ops on a CUDA device, per device,
// and neither the fake tensors Inductor traces with nor the runs its autotuning times. Varlen attention (cumulative sequence offsets: values the fake card does not hold) is
// not counted.
#include <ATen/record_function.h>
#include <ATen/core/ivalue.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <string_view>
#include <vector>

namespace {

using Shape = std::vector<int64_t>;

// torch.utils.flop_counter's formulas.
int64_t bmm_flop(int64_t b, int64_t m, int64_t k, int64_t n) { return b * m * n * 2 * k; }

int64_t prod(const Shape& s, size_t from) {
  int64_t p = 1;
  for (size_t i = from; i < s.size(); i++) p *= s[i];
  return p;
}

// conv_flop_count: per point of the output (the input when transposed), the filter times the
// channels, times the batch; bias not counted.
int64_t conv_flop_count(const Shape& x, const Shape& w, const Shape& out, bool transposed) {
  const Shape& conv = transposed ? x : out;
  if (x.empty() || w.size() < 2 || conv.size() < 2) return 0;
  return prod(conv, 2) * prod(w, 2) * x[0] * w[0] * w[1] * 2;
}

Shape swap01(Shape s) {
  if (s.size() >= 2) std::swap(s[0], s[1]);
  return s;
}

// sdpa_flop_count on (b, h, s, d) shapes: scores, then their product with v.
int64_t sdpa_flop(const Shape& q, const Shape& k, const Shape& v) {
  if (q.size() != 4 || k.size() != 4 || v.size() != 4) return 0;
  int64_t b = q[0], h = q[1], sq = q[2], dq = q[3], sk = k[2], dv = v[3];
  return bmm_flop(b * h, sq, dq, sk) + bmm_flop(b * h, sq, sk, dv);
}

// sdpa_backward_flop_count: the scores recomputed, then four products.
int64_t sdpa_backward_flop(const Shape& g, const Shape& q, const Shape& k, const Shape& v) {
  if (q.size() != 4 || k.size() != 4 || v.size() != 4 || g.size() != 4) return 0;
  int64_t b = q[0], h = q[1], sq = q[2], dq = q[3], sk = k[2], dv = v[3];
  return bmm_flop(b * h, sq, dq, sk) + bmm_flop(b * h, sq, dv, sk) + bmm_flop(b * h, sk, sq, dv) + bmm_flop(b * h, sq, sk, dq) +
         bmm_flop(b * h, dq, sq, sk);
}

// (b, s, h, d) -> (b, h, s, d), as flop_counter transposes flash's dense inputs.
Shape heads_first(Shape s) {
  if (s.size() == 4) std::swap(s[1], s[2]);
  return s;
}

// The shape of input `i` when it is a tensor, else empty.
Shape shape(const c10::ArrayRef<const c10::IValue>& in, size_t i) {
  if (i >= in.size() || !in[i].isTensor()) return {};
  return in[i].toTensor().sizes().vec();
}

bool is_none(const c10::ArrayRef<const c10::IValue>& in, size_t i) { return i >= in.size() || in[i].isNone(); }

std::vector<int64_t> ints(const c10::ArrayRef<const c10::IValue>& in, size_t i) {
  if (i >= in.size() || !in[i].isIntList()) return {};
  return in[i].toIntVector();
}

// A convolution's output shape from its input, weight, stride, padding and dilation.
Shape conv_out(const Shape& x, const Shape& w, const std::vector<int64_t>& stride, const std::vector<int64_t>& pad,
               const std::vector<int64_t>& dil) {
  Shape out{x.empty() ? 0 : x[0], w.empty() ? 0 : w[0]};
  for (size_t d = 2; d < x.size() && d < w.size(); d++) {
    size_t i = d - 2;
    int64_t s = stride.empty() ? 1 : stride[std::min(i, stride.size() - 1)];
    int64_t p = pad.empty() ? 0 : pad[std::min(i, pad.size() - 1)];
    int64_t dl = dil.empty() ? 1 : dil[std::min(i, dil.size() - 1)];
    out.push_back((x[d] + 2 * p - dl * (w[d] - 1) - 1) / s + 1);
  }
  return out;
}

enum class Op { None, Mm, Addmm, Bmm, Baddbmm, ScaledMm, Conv, ConvBackward, Sdpa, SdpaBackward, FlashForward, FlashBackward,
                EfficientForward, EfficientBackward };

Op op_of(std::string_view name) {
  static const std::pair<std::string_view, Op> table[] = {
      {"aten::mm", Op::Mm},
      {"aten::addmm", Op::Addmm},
      {"aten::bmm", Op::Bmm},
      {"aten::baddbmm", Op::Baddbmm},
      {"aten::_scaled_mm", Op::ScaledMm},
      {"aten::convolution", Op::Conv},
      {"aten::_convolution", Op::Conv},
      {"aten::cudnn_convolution", Op::Conv},
      {"aten::_slow_conv2d_forward", Op::Conv},
      {"aten::convolution_overrideable", Op::Conv},
      {"aten::convolution_backward", Op::ConvBackward},
      {"aten::_scaled_dot_product_efficient_attention", Op::Sdpa},
      {"aten::_scaled_dot_product_flash_attention", Op::Sdpa},
      {"aten::_scaled_dot_product_flash_attention_for_cpu", Op::Sdpa},
      {"aten::_scaled_dot_product_cudnn_attention", Op::Sdpa},
      {"aten::_scaled_dot_product_efficient_attention_backward", Op::SdpaBackward},
      {"aten::_scaled_dot_product_flash_attention_backward", Op::SdpaBackward},
      {"aten::_scaled_dot_product_flash_attention_for_cpu_backward", Op::SdpaBackward},
      {"aten::_scaled_dot_product_cudnn_attention_backward", Op::SdpaBackward},
      {"aten::_flash_attention_forward", Op::FlashForward},
      {"aten::_flash_attention_backward", Op::FlashBackward},
      {"aten::_efficient_attention_forward", Op::EfficientForward},
      {"aten::_efficient_attention_backward", Op::EfficientBackward},
  };
  if (name.rfind("aten::", 0) != 0) return Op::None;
  for (auto& [n, op] : table)
    if (n == name) return op;
  return Op::None;
}

// flop_counter's formula for `op` on these inputs (0 where it has none or cannot read them).
int64_t flops(Op op, const c10::ArrayRef<const c10::IValue>& in) {
  switch (op) {
    case Op::Mm:
    case Op::ScaledMm: {
      Shape a = shape(in, 0), b = shape(in, 1);
      return a.size() == 2 && b.size() == 2 ? bmm_flop(1, a[0], a[1], b[1]) : 0;
    }
    case Op::Addmm: {
      Shape a = shape(in, 1), b = shape(in, 2);
      return a.size() == 2 && b.size() == 2 ? bmm_flop(1, a[0], a[1], b[1]) : 0;
    }
    case Op::Bmm:
    case Op::Baddbmm: {
      size_t at = op == Op::Bmm ? 0 : 1;
      Shape a = shape(in, at), b = shape(in, at + 1);
      return a.size() == 3 && b.size() == 3 ? bmm_flop(a[0], a[1], a[2], b[2]) : 0;
    }
    case Op::Conv: {
      // (input, weight, bias, stride, padding, dilation, transposed, ...): flop_counter reads
      // `transposed` positionally, so a signature without a bool there is not counted.
      if (in.size() <= 6 || !in[6].isBool()) return 0;
      bool transposed = in[6].toBool();
      Shape x = shape(in, 0), w = shape(in, 1);
      // cudnn_convolution: (input, weight, padding, stride, dilation, ...).
      bool cudnn = in[2].isIntList();
      auto out = cudnn ? conv_out(x, w, ints(in, 3), ints(in, 2), ints(in, 4)) : conv_out(x, w, ints(in, 3), ints(in, 4), ints(in, 5));
      return conv_flop_count(x, w, out, transposed);
    }
    case Op::ConvBackward: {
      // (grad_out, input, weight, bias_sizes, stride, padding, dilation, transposed,
      // output_padding, groups, output_mask): grad_input has the input's shape, grad_weight
      // the weight's.
      if (in.size() <= 10 || !in[7].isBool() || !in[10].isBoolList()) return 0;
      bool transposed = in[7].toBool();
      auto mask = in[10].toBoolList();
      Shape g = shape(in, 0), x = shape(in, 1), w = shape(in, 2);
      int64_t total = 0;
      if (mask.size() > 0 && mask.get(0)) total += conv_flop_count(g, w, x, !transposed);
      if (mask.size() > 1 && mask.get(1))
        total += transposed ? conv_flop_count(swap01(g), swap01(x), swap01(w), false) : conv_flop_count(swap01(x), swap01(g), swap01(w), false);
      return total;
    }
    case Op::Sdpa:
      return sdpa_flop(shape(in, 0), shape(in, 1), shape(in, 2));
    case Op::SdpaBackward:
      return sdpa_backward_flop(shape(in, 0), shape(in, 1), shape(in, 2), shape(in, 3));
    case Op::FlashForward:  // (query, key, value, cum_seq_q, ...)
      return is_none(in, 3) ? sdpa_flop(heads_first(shape(in, 0)), heads_first(shape(in, 1)), heads_first(shape(in, 2))) : 0;
    case Op::FlashBackward:  // (grad_out, query, key, value, out, logsumexp, cum_seq_q, ...)
      return is_none(in, 6) ? sdpa_backward_flop(heads_first(shape(in, 0)), heads_first(shape(in, 1)), heads_first(shape(in, 2)),
                                                 heads_first(shape(in, 3)))
                            : 0;
    case Op::EfficientForward:  // (query, key, value, bias, cu_seqlens_q, ...): shapes as given
      return is_none(in, 4) ? sdpa_flop(shape(in, 0), shape(in, 1), shape(in, 2)) : 0;
    case Op::EfficientBackward:  // (grad_out, query, key, value, bias, out, cu_seqlens_q, ...)
      return is_none(in, 6) ? sdpa_backward_flop(shape(in, 0), shape(in, 1), shape(in, 2), shape(in, 3)) : 0;
    case Op::None:
      break;
  }
  return 0;
}

constexpr int kDevices = 64;
std::array<std::atomic<uint64_t>, kDevices> counted{};
thread_local int depth = 0;  // counted ops running on this thread
std::atomic<int> paused{0};  // Inductor's benchmarks running: its timing runs are not the program's
std::mutex registration;
std::optional<at::CallbackHandle> handle;

// A counted op's FLOPs, added when it returns: an op that raises did no work (a checkpoint's
// recomputation stops by raising in the op whose inputs are the last it needs).
struct Counted : at::ObserverContext {
  int device = -1;
  int64_t flops = 0;
  int exceptions = 0;
};

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  Op op = op_of(fn.name());
  if (op == Op::None) return nullptr;
  auto ctx = std::make_unique<Counted>();
  if (depth++ > 0 || paused.load() > 0) return ctx;
  auto in = fn.inputs();
  // The first tensor argument says where the op runs; a tensor subclass handled in Python
  // (the fake tensors Dynamo and AOTAutograd trace with) runs nothing on the device.
  for (const auto& v : in) {
    if (!v.isTensor()) continue;
    const auto& t = v.toTensor();
    bool traced = t.key_set().has(c10::DispatchKey::Python) || t.key_set().has(c10::DispatchKey::Functionalize);
    if (t.is_cuda() && !traced && t.device().index() >= 0 && t.device().index() < kDevices) {
      ctx->device = t.device().index();
      ctx->flops = flops(op, in);
      ctx->exceptions = std::uncaught_exceptions();
    }
    break;
  }
  return ctx;
}

void on_end(const at::RecordFunction&, at::ObserverContext* ctx) {
  if (ctx == nullptr) return;
  depth--;
  auto* c = static_cast<Counted*>(ctx);
  if (c->flops > 0 && std::uncaught_exceptions() == c->exceptions) counted[c->device] += static_cast<uint64_t>(c->flops);
}

}  // namespace

extern "C" {

// Starts counting (once per process).
void allocbench_flops_start(void) {
  std::lock_guard<std::mutex> g(registration);
  if (handle) return;
  handle = at::addGlobalCallback(at::RecordFunctionCallback(on_start, on_end).needsInputs(true).scopes({at::RecordScope::FUNCTION}));
}

// The FLOPs counted on CUDA device `device` so far.
uint64_t allocbench_flops(int device) { return device >= 0 && device < kDevices ? counted[device].load() : 0; }

// Pauses (+1) or resumes (-1) counting, around Inductor's autotuning benchmarks.
void allocbench_flops_pause(int delta) { paused += delta; }

// Stops counting.
void allocbench_flops_stop(void) {
  std::lock_guard<std::mutex> g(registration);
  if (handle) at::removeCallback(*handle);
  handle.reset();
}
}
