// Operators by identity. An OpName is an interned "aten::add.Tensor" (the op
// and its overload; "aten::relu" for the default overload), compared as an
// integer: matching a node against an op builds no string. Code names the
// ops it matches once, at start-up, through OpName::known, which refuses
// (std::logic_error) a name the linked LibTorch and spmd's op library do not
// have, so a misspelt op fails the first run instead of never matching.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace spmd {

class OpName {
 public:
  OpName() = default;  // names no op
  // Interns `qualified` ("aten::add.Tensor"); any text, known to the dispatcher or not.
  static OpName of(std::string_view qualified);
  static OpName of(std::string_view op, std::string_view overload);
  // As of(), for names written in the code: throws std::logic_error when the
  // dispatcher has no such operator.
  static OpName known(std::string_view qualified);

  const std::string& str() const;  // "aten::add.Tensor"; "" for OpName()
  bool valid() const { return id_ != 0; }
  uint32_t id() const { return id_; }
  friend bool operator==(OpName a, OpName b) { return a.id_ == b.id_; }
  friend bool operator!=(OpName a, OpName b) { return a.id_ != b.id_; }
  friend bool operator<(OpName a, OpName b) { return a.id_ < b.id_; }

 private:
  explicit OpName(uint32_t id) : id_(id) {}
  uint32_t id_ = 0;
};

// A file's table of the ops it matches (a struct of OpName members, each
// OpName::known("...")), made once, at first use: spmd's own ops register
// with the dispatcher in static initializers, so no table is made before
// main runs.
template <typename Table>
const Table& opTable() {
  static const Table table;
  return table;
}

}  // namespace spmd
