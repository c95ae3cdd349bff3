#include "cast_views.h"

#include "cast_match.h"
#include "spmd/ir/op_name.h"

#include <algorithm>
#include <string>

namespace spmd {
namespace {

// The ops this file matches (ir/op_name.h).
struct Ops {
  OpName fused = OpName::known("spmd::fused");
  OpName type_as = OpName::known("aten::type_as");
  OpName select = OpName::known("aten::select.int");
  std::vector<OpName> views = {OpName::known("aten::view"),         OpName::known("aten::reshape"),
                               OpName::known("aten::_unsafe_view"), OpName::known("aten::flatten.using_ints"),
                               OpName::known("aten::transpose.int"), OpName::known("aten::permute"),
                               OpName::known("aten::t"),            OpName::known("aten::unsqueeze")};
};
const Ops& ops() { return opTable<Ops>(); }

bool isHalfWidthFloat(c10::ScalarType t) { return t == c10::ScalarType::BFloat16 || t == c10::ScalarType::Half; }

// `n` again, reading `source` as its first argument, at the builder's
// insertion point, with n's source line and role; its result keeps the old
// name's stem.
ValueId viewAgain(GraphBuilder& builder, const Node& n, ValueId source) {
  builder.setMeta(n.meta);
  std::vector<Arg> args = n.args;
  args[0] = Arg::tensor(source);
  const std::string name = builder.graph().value(n.outputs[0]).name;  // a copy, as the call adds values
  return builder.call(n.qualifiedName(), args, name);
}

}  // namespace

bool isDtypeFreeView(const Node& n) {
  return n.outputs.size() == 1 && !n.args.empty() && n.args[0].kind == Arg::Kind::Value &&
         std::any_of(ops().views.begin(), ops().views.end(), [&](const OpName& v) { return n.is(v); });
}

bool isExactUpcast(const Graph& g, const Node& n) {
  if (isCastTo(n, c10::ScalarType::Float)) return isHalfWidthFloat(g.value(n.args[0].value).dtype);
  if (!n.is(ops().fused) || n.args.size() != 2 || n.args[0].kind != Arg::Kind::Values ||
      n.args[0].values.size() != 1 || n.outputs.size() != 1 || n.args[1].kind != Arg::Kind::Str) {
    return false;
  }
  return n.args[1].s == "t0:f32 = cast(in0); return t0" && isHalfWidthFloat(g.value(n.args[0].values[0]).dtype);
}

ValueId readThroughUpcast(GraphBuilder& builder, ValueId v) {
  const Graph& g = builder.graph();
  std::vector<const Node*> views;
  const Node* p = g.producer(v);
  while (p && (isDtypeFreeView(*p) || (p->is(ops().select) && p->args[0].kind == Arg::Kind::Value))) {
    views.push_back(p);
    p = g.producer(p->args[0].value);
  }
  if (!p || !isExactUpcast(g, *p)) return v;
  ValueId w = p->args[0].kind == Arg::Kind::Value ? p->args[0].value : p->args[0].values[0];
  for (auto it = views.rbegin(); it != views.rend(); ++it) w = viewAgain(builder, **it, w);
  return w;
}

std::optional<CastAfterViews> castAfterViews(const Graph& g, ValueId v) {
  CastAfterViews chain;
  for (const Node* n = g.soleReader(v); n && !g.isGraphOutput(v); n = g.soleReader(v)) {
    if (n->outputs.size() != 1) return std::nullopt;
    const c10::ScalarType from = g.value(v).dtype, to = g.value(n->outputs[0]).dtype;
    if (isCastTo(*n, to) && isHalfWidthFloat(to)) {
      chain.cast = n;
      return chain;
    }
    const bool alias = n->is(ops().type_as) && from == to;
    if (!alias && !(isDtypeFreeView(*n) && from == to)) return std::nullopt;
    chain.views.push_back(n);
    v = n->outputs[0];
  }
  return std::nullopt;
}

void castAfterViewsOf(GraphBuilder& builder, const CastAfterViews& chain, ValueId cast) {
  Graph& g = builder.graph();
  std::vector<const Node*> views;
  for (const Node* v : chain.views) {
    if (!v->is(ops().type_as)) views.push_back(v);
  }
  builder.setInsertionPoint(*chain.cast);
  for (size_t k = 0; k + 1 < views.size(); ++k) cast = viewAgain(builder, *views[k], cast);
  if (views.empty()) {
    // No view: the cast's value is `cast` itself.
    g.replaceAllUsesWith(chain.cast->outputs[0], cast);
    g.erase(*chain.cast);
  } else {
    std::vector<Arg> args = views.back()->args;
    args[0] = Arg::tensor(cast);
    builder.setMeta(chain.cast->meta);
    builder.replace(*chain.cast, views.back()->qualifiedName(), args);
  }
  for (auto it = chain.views.rbegin(); it != chain.views.rend(); ++it) g.erase(**it);
}

}  // namespace spmd
